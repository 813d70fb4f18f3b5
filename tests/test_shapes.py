"""The response shapes (both servers) with logprobs, parsed back with the openai package's types."""

import json

import pytest
from openai.lib.streaming.chat import ChatCompletionStreamState
from openai.types import Completion as OaiCompletion
from openai.types.chat import ChatCompletion as OaiChat
from openai.types.chat import ChatCompletionChunk as OaiChunk

from engine.entrypoints.openai.protocol import Usage
from engine.entrypoints.openai.shapes import ChatShape, Ended, TextShape
from engine.outputs import Logprob, TokenLogprobs

USAGE = Usage.of(5, 2)


def entry(token: str, value: float, alt: str) -> TokenLogprobs:
    chosen = Logprob(1, token, token.encode(), value)
    return TokenLogprobs(chosen, [chosen, Logprob(2, alt, alt.encode(), value - 1)])


ENTRIES = [entry("Hel", -0.5, "Hi"), entry("lo", -0.25, "p")]


def sse_json(event: bytes) -> dict:
    text = event.decode()
    assert text.startswith("data: ") and text.endswith("\n\n")
    return json.loads(text[len("data: ") :])


def test_chat_whole_and_delta_carry_logprobs() -> None:
    shape = ChatShape("m")
    whole = OaiChat.model_validate_json(shape.whole([Ended("Hello", "stop", ENTRIES)], USAGE))
    content = whole.choices[0].logprobs.content
    assert [(c.token, c.logprob, bytes(c.bytes)) for c in content] == [
        ("Hel", -0.5, b"Hel"),
        ("lo", -0.25, b"lo"),
    ]
    assert [t.token for t in content[0].top_logprobs] == ["Hel", "Hi"]
    chunk = OaiChunk.model_validate(sse_json(shape.delta("lo", ENTRIES[1:])))
    assert chunk.choices[0].logprobs.content[0].top_logprobs[1].logprob == -1.25
    plain = OaiChat.model_validate_json(shape.whole([Ended("x", "stop")], USAGE))
    assert plain.choices[0].logprobs is None
    assert "logprobs" not in json.dumps(sse_json(shape.delta("x"))["choices"][0]["delta"])


def test_text_offsets_continue_across_stream_chunks() -> None:
    shape = TextShape("m")
    # (the openai type wants a finish reason on every choice; its stream reader does not check)
    first = sse_json(shape.delta("Hel", ENTRIES[:1]))["choices"][0]["logprobs"]
    second = sse_json(shape.delta("lo", ENTRIES[1:]))["choices"][0]["logprobs"]
    assert (first["tokens"], first["text_offset"]) == (["Hel"], [0])
    assert (second["tokens"], second["text_offset"]) == (["lo"], [3])
    whole = OaiCompletion.model_validate_json(shape.whole([Ended("Hello", "stop", ENTRIES)], USAGE))
    lp = whole.choices[0].logprobs
    assert (lp.tokens, lp.token_logprobs, lp.text_offset) == (["Hel", "lo"], [-0.5, -0.25], [0, 3])
    assert lp.top_logprobs == [{"Hel": -0.5, "Hi": -1.5}, {"lo": -0.25, "p": -1.25}]


@pytest.mark.parametrize("shape", [ChatShape("m"), TextShape("m")])
def test_logprobs_asked_but_none_produced_is_an_empty_list(shape: ChatShape | TextShape) -> None:
    # e.g. an answer that is only a stop token: logprobs were asked, so the key is present
    body = json.loads(shape.whole([Ended("", "stop", [])], USAGE))
    assert body["choices"][0]["logprobs"] is not None


CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'


def test_chat_shape_with_tools_answers_tool_calls_whole() -> None:
    shape = ChatShape("m", {"get_weather"})
    reply = OaiChat.model_validate_json(shape.whole([Ended(f"On it.\n{CALL}", "stop")], USAGE))
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content == "On it."
    (call,) = choice.message.tool_calls
    assert (call.function.name, json.loads(call.function.arguments)) == (
        "get_weather",
        {"city": "Paris"},
    )
    plain = OaiChat.model_validate_json(ChatShape("m").whole([Ended(CALL, "stop")], USAGE))
    assert plain.choices[0].message.content == CALL and plain.choices[0].finish_reason == "stop"


def events(sse: bytes) -> list[dict]:
    return [json.loads(e) for e in sse.decode().split("data: ")[1:]]


def test_chat_shape_with_tools_streams_tool_call_deltas() -> None:
    shape = ChatShape("m", {"get_weather"})
    text = f"On it.\n{CALL}"
    chunks = [c for i in range(0, len(text), 5) for c in events(shape.delta(text[i : i + 5]))]
    chunks += events(shape.finish("stop"))
    parsed = [OaiChunk.model_validate(c) for c in chunks]
    state = ChatCompletionStreamState()  # the openai SDK's own assembly of a stream
    for chunk in parsed:
        state.handle_chunk(chunk)
    (whole,) = state.get_final_completion().choices[0].message.tool_calls
    assert (whole.type, whole.function.name, whole.function.arguments) == (
        "function",
        "get_weather",
        '{"city": "Paris"}',
    )
    content = "".join(c.choices[0].delta.content or "" for c in parsed)
    assert content == "On it.\n"
    assert parsed[-1].choices[0].finish_reason == "tool_calls"
    # as OpenAI streams a call: its id and name first, the arguments after
    head, args = [d for c in parsed for d in c.choices[0].delta.tool_calls or []]
    assert (head.index, head.type, head.function.name) == (0, "function", "get_weather")
    assert head.id.startswith("call_") and head.function.arguments == ""
    assert (args.index, args.id, args.function.name) == (0, None, None)
    assert json.loads(args.function.arguments) == {"city": "Paris"}


def test_choices_stream_apart_with_their_own_tool_calls_and_offsets() -> None:
    shape = ChatShape("m", {"get_weather"})
    opening = [json.loads(e) for e in shape.opening(2).decode().split("data: ")[1:]]
    assert [c["choices"][0]["index"] for c in opening] == [0, 1]
    first_half, second_half = CALL[:20], CALL[20:]
    held = [shape.delta(first_half, index=1), shape.delta("Plain ", index=0)]
    assert sse_json(held[0])["choices"][0]["delta"]["content"] == ""  # choice 1's call waits
    assert sse_json(held[1])["choices"][0]["delta"]["content"] == "Plain "
    call = OaiChunk.model_validate(events(shape.delta(second_half, index=1))[0]).choices[0]
    assert call.index == 1 and call.delta.tool_calls[0].function.name == "get_weather"
    end = OaiChunk.model_validate(sse_json(shape.finish("stop", 1))).choices[0]
    assert (end.index, end.finish_reason) == (1, "tool_calls")
    plain = OaiChunk.model_validate(sse_json(shape.finish("stop", 0))).choices[0]
    assert (plain.index, plain.finish_reason, plain.delta.tool_calls) == (0, "stop", None)
    whole = OaiChat.model_validate_json(
        shape.whole([Ended("Plain text", "stop"), Ended(CALL, "stop")], USAGE)
    )
    assert [(c.index, c.finish_reason) for c in whole.choices] == [(0, "stop"), (1, "tool_calls")]
    text = TextShape("m")
    text.delta("Hel", ENTRIES[:1], index=1)
    zero = sse_json(text.delta("Hel", ENTRIES[:1], index=0))["choices"][0]
    one = sse_json(text.delta("lo", ENTRIES[1:], index=1))["choices"][0]
    assert (zero["index"], zero["logprobs"]["text_offset"]) == (0, [0])  # its own offsets
    assert (one["index"], one["logprobs"]["text_offset"]) == (1, [3])
