"""The stream translators on chat chunks as OpenAI sends them (text, then tool calls with id
and name first and argument fragments after, two calls in parallel; an error mid-stream):
every event validates as the openai / anthropic SDK's own event type, in the documented
order. The SDK types are the oracle; the chunks are what the chat pipeline streams."""

import json
from typing import Any

import pytest
from anthropic.types import RawMessageStreamEvent
from openai.types.responses import ResponseStreamEvent
from pydantic import BaseModel, TypeAdapter

from gateway.api.messages_output import whole_message
from gateway.api.messages_stream import MessagesEvents
from gateway.api.responses_output import ResponseHead, whole_response
from gateway.api.responses_request import ResponsesRequest
from gateway.api.responses_stream import ResponsesEvents


def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
    return {"choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}


def call(index: int, fragment: str, call_id: str | None = None, name: str | None = None) -> dict:
    first = {"id": call_id, "type": "function", "function": {"name": name, "arguments": ""}}
    later = {"function": {"arguments": fragment}}
    return {"index": index, **(first if call_id else later)}


CHUNKS = [
    chunk({"role": "assistant", "content": ""}),
    chunk({"content": "Checking"}),
    chunk({"content": " both."}),
    chunk({"tool_calls": [call(0, "", "call_a", "get_weather")]}),
    chunk({"tool_calls": [call(0, '{"city": ')]}),
    chunk({"tool_calls": [call(0, '"Paris"}')]}),
    chunk({"tool_calls": [call(1, "", "call_b", "get_weather")]}),
    chunk({"tool_calls": [call(1, '{"city": "Oslo"}')]}),
    chunk({}, "tool_calls"),
    {"choices": [], "usage": {"prompt_tokens": 9, "completion_tokens": 7, "total_tokens": 16}},
]
ERROR = {"error": {"message": "upstream cut", "type": "server_error", "code": None}}


def _by_type(union: Any) -> dict[str, type[BaseModel]]:
    members = union.__origin__.__args__ if hasattr(union, "__origin__") else union.__args__
    return {m.model_fields["type"].annotation.__args__[0]: m for m in members}


def check(event: dict[str, Any], union: Any) -> None:
    """`event` validates as the SDK's class for its type (errors name that class only)."""
    TypeAdapter(_by_type(union)[event["type"]]).validate_python(event)


def events(raw: bytes) -> list[dict[str, Any]]:
    out = []
    for block in raw.decode().strip().split("\n\n"):
        kind, data = block.split("\n")
        event = json.loads(data.removeprefix("data: "))
        assert kind == f"event: {event['type']}"
        out.append(event)
    return out


def run(translator: Any, chunks: list[dict[str, Any]], end: bool = True) -> list[dict]:
    raw = translator.start() + b"".join(translator.chunk(c) for c in chunks)
    return events(raw + (translator.end() if end else b""))


def test_responses_events_validate_in_order() -> None:
    body = ResponsesRequest(model="m", input="hi")
    sent = run(ResponsesEvents(ResponseHead(body)), CHUNKS)
    for event in sent:
        check(event, ResponseStreamEvent)
    kinds = [e["type"] for e in sent]
    assert kinds[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    assert kinds.count("response.output_item.done") == 3 and kinds[-1] == "response.completed"
    assert [e["sequence_number"] for e in sent] == list(range(len(sent)))
    final = sent[-1]["response"]
    assert [item["type"] for item in final["output"]] == ["message", *["function_call"] * 2]
    assert final["output"][0]["content"][0]["text"] == "Checking both."
    args = [json.loads(i["arguments"]) for i in final["output"][1:]]
    assert args == [{"city": "Paris"}, {"city": "Oslo"}]
    assert final["usage"]["input_tokens"] == 9 and final["usage"]["output_tokens"] == 7


def test_responses_error_midway_fails_the_response() -> None:
    body = ResponsesRequest(model="m", input="hi")
    translator = ResponsesEvents(ResponseHead(body))
    sent = run(translator, [*CHUNKS[:3], ERROR])
    for event in sent:
        check(event, ResponseStreamEvent)
    assert [e["type"] for e in sent[-2:]] == ["error", "response.failed"]
    assert sent[-1]["response"]["status"] == "failed" and translator.final is None


def test_messages_events_validate_in_order() -> None:
    sent = run(MessagesEvents("m"), CHUNKS)
    for event in sent:
        check(event, RawMessageStreamEvent)
    kinds = [e["type"] for e in sent]
    assert kinds[0] == "message_start" and kinds[-2:] == ["message_delta", "message_stop"]
    starts = [e["content_block"] for e in sent if e["type"] == "content_block_start"]
    assert [b["type"] for b in starts] == ["text", "tool_use", "tool_use"]
    assert kinds.count("content_block_stop") == 3
    deltas = [e for e in sent if e["type"] == "content_block_delta"]
    json_parts = [d["delta"]["partial_json"] for d in deltas if d["index"] == 1]
    assert json.loads("".join(json_parts)) == {"city": "Paris"}
    delta = sent[-2]
    assert delta["delta"]["stop_reason"] == "tool_use" and delta["usage"]["output_tokens"] == 7


def test_messages_error_midway_is_an_error_event() -> None:
    sent = run(MessagesEvents("m"), [*CHUNKS[:3], ERROR])
    assert sent[-1] == {"type": "error", "error": {"type": "api_error", "message": "upstream cut"}}
    assert "message_stop" not in [e["type"] for e in sent]


def test_whole_answers_validate_as_the_sdks_objects() -> None:
    from anthropic.types import Message
    from openai.types.responses import Response

    calls = [{"id": "call_a", "type": "function", "function": {"name": "f", "arguments": "{}"}}]
    message = {"role": "assistant", "content": "Hi.", "tool_calls": calls}
    completion = {
        "choices": [{"index": 0, "message": message, "finish_reason": "tool_calls"}],
        "usage": CHUNKS[-1]["usage"],
    }
    body = ResponsesRequest(model="m", input="hi", text={"format": {"type": "json_object"}})
    response = Response.model_validate(whole_response(ResponseHead(body), completion))
    assert [item.type for item in response.output] == ["message", "function_call"]
    anthropic_message = Message.model_validate(whole_message("m", completion))
    assert anthropic_message.stop_reason == "tool_use"
    assert [block.type for block in anthropic_message.content] == ["text", "tool_use"]


def test_chat_errors_name_the_callers_fields() -> None:
    from engine.entrypoints.openai.errors import OpenAIError
    from gateway.api import messages_request, responses_request

    ask = [{"role": "user", "content": "x"}]
    body = messages_request.MessagesRequest(
        model="m", max_tokens=4, messages=ask, stop_sequences=list("abcde")
    )
    with pytest.raises(OpenAIError) as stops:
        messages_request.to_chat(body)
    assert "'stop_sequences'" in stops.value.message and stops.value.param == "stop_sequences"
    call = {"type": "function_call", "call_id": "c", "name": "f", "arguments": {"a": 1}}
    with pytest.raises(OpenAIError) as arguments:
        responses_request.to_chat(ResponsesRequest(model="m", input=[call]), [])
    assert arguments.value.status == 400 and arguments.value.param == "input[0]"
