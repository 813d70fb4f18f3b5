"""OpenAI protocol models: what is accepted, what is refused and with which message."""

import subprocess
import sys
from typing import Any

import openai.types as oai
import openai.types.chat as oai_chat
import pytest
from pydantic import ValidationError

from engine.entrypoints.openai.error_bodies import error_response_body, validation_error_message
from engine.entrypoints.openai.protocol import (
    AssistantMessage,
    ChatChoice,
    ChatCompletion,
    ChatCompletionChunk,
    ChatCompletionRequest,
    ChunkChoice,
    Completion,
    CompletionChoice,
    CompletionRequest,
    DeltaMessage,
    Usage,
    chat_completion_id,
    completion_id,
    to_sampling_params,
)

USER = [{"role": "user", "content": "hi"}]


def refusal(model: type, body: dict[str, Any]) -> tuple[str, str | None]:
    with pytest.raises(ValidationError) as info:
        model.model_validate(body)
    return validation_error_message(info.value)


def test_import_is_light() -> None:
    # The gateway imports this module on its hot path; it must not drag in torch or FastAPI.
    code = (
        "import sys, engine.entrypoints.openai.protocol; "
        "print('torch' in sys.modules, 'fastapi' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]


def test_chat_request_accepts_openai_body_with_extras() -> None:
    req = ChatCompletionRequest.model_validate(
        {
            "model": "m",
            "messages": [
                {"role": "developer", "content": "be brief"},
                {
                    "role": "user",
                    "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
                },
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [{"id": "t1", "type": "function"}],
                },
                {"role": "tool", "content": "42", "tool_call_id": "t1"},
            ],
            "n": 1,
            "logprobs": False,
            "stream": True,
            "stream_options": {"include_usage": True},
            "tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}],
            "tool_choice": "auto",
            "response_format": {"type": "json_object"},
            "presence_penalty": 0.5,
            "vendor_extra": {"x": 1},
        }
    )
    assert req.include_usage
    assert req.model_extra == {"vendor_extra": {"x": 1}}
    assert [m.template_dict() for m in req.messages] == [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "ab"},
        {"role": "assistant", "content": "", "tool_calls": [{"id": "t1", "type": "function"}]},
        {"role": "tool", "content": "42", "tool_call_id": "t1"},
    ]


@pytest.mark.parametrize(
    ("extra", "param", "fragment"),
    [
        ({"temperature": 5}, "temperature", "less than or equal to 2"),
        ({"top_p": 0}, "top_p", "greater than 0"),
        ({"max_tokens": 0}, "max_tokens", "greater than or equal to 1"),
        ({"max_completion_tokens": -1}, "max_completion_tokens", "greater than or equal to 1"),
        ({"n": 17}, "n", "n must be 1..16"),
        ({"n": 0}, "n", "n must be 1..16"),
        ({"logprobs": 2}, "logprobs", "valid boolean"),
        ({"top_logprobs": 2}, "top_logprobs", "logprobs must be true"),
        ({"logprobs": True, "top_logprobs": 21}, "top_logprobs", "less than or equal to 20"),
        ({"presence_penalty": 2.5}, "presence_penalty", "less than or equal to 2"),
        ({"frequency_penalty": -3}, "frequency_penalty", "greater than or equal to -2"),
        ({"repetition_penalty": 0}, "repetition_penalty", "greater than 0"),
        ({"logit_bias": {"abc": 1}}, "logit_bias", "keys must be token ids"),
        ({"logit_bias": {"5": 101}}, "logit_bias", "[-100, 100]"),
        ({"logit_bias": {str(i): 1 for i in range(301)}}, "logit_bias", "at most 300"),
        ({"min_tokens": -1}, "min_tokens", "greater than or equal to 0"),
        ({"stop_token_ids": [-1]}, "stop_token_ids[0]", "greater than or equal to 0"),
        ({"stop": 5}, "stop", "valid string"),
        ({"top_k": 2**63}, "top_k", "less than or equal to"),
        ({"seed": 2**64}, "seed", "less than or equal to"),
        ({"seed": -(2**63) - 1}, "seed", "greater than or equal to"),
        ({"max_tokens": 2**40}, "max_tokens", "less than or equal to"),
        ({"temperature": float("nan")}, "temperature", "(got nan)"),
        ({"stop": ["a", "b", "c", "d", "e"]}, "stop", "at most 4 stop sequences"),
        ({"stop": "x" * 1001}, "stop", "at most 1000 characters"),
        ({"messages": []}, "messages", "at least 1 item"),
        ({"messages": [{"role": "bot", "content": "x"}]}, "messages[0].role", "'user'"),
        (
            {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
            "messages[0].content[0].type",
            "'text'",
        ),
    ],
)
def test_chat_request_refusals_name_the_field(
    extra: dict[str, Any], param: str, fragment: str
) -> None:
    message, got_param = refusal(ChatCompletionRequest, {"model": "m", "messages": USER, **extra})
    assert got_param == param
    assert f"'{param}'" in message
    assert fragment in message


def test_missing_field_message() -> None:
    assert refusal(ChatCompletionRequest, {"model": "m"}) == (
        "Missing required parameter: 'messages'.",
        "messages",
    )


def test_fastapi_style_error_list_and_json_error() -> None:
    errors = [{"type": "greater_than", "loc": ("body", "top_p"), "msg": "bad", "input": 0}]
    assert validation_error_message(errors) == ("Invalid value for 'top_p': bad (got 0).", "top_p")
    assert (
        validation_error_message([{"type": "json_invalid", "loc": ("body", 1), "msg": "x"}])[1]
        is None
    )


def test_completion_prompt_forms() -> None:
    def prompt(value: Any) -> Any:
        return CompletionRequest.model_validate({"model": "m", "prompt": value}).prompt

    assert prompt("abc") == "abc"
    assert prompt(["abc"]) == "abc"
    assert prompt([1, 2, 3]) == [1, 2, 3]
    assert refusal(CompletionRequest, {"model": "m", "prompt": ["a", "b"]})[1] == "prompt"
    assert refusal(CompletionRequest, {"model": "m", "prompt": []})[1] == "prompt"
    assert refusal(CompletionRequest, {"model": "m", "prompt": "a", "echo": True})[1] == "echo"
    assert refusal(CompletionRequest, {"model": "m", "prompt": "a", "suffix": "end"}) == (
        "Invalid value for 'suffix': suffix is not supported (got 'end').",
        "suffix",
    )
    CompletionRequest.model_validate({"model": "m", "prompt": "a", "best_of": 1, "suffix": None})
    for bad in (21, True, -1):
        body = {"model": "m", "prompt": "a", "logprobs": bad}
        assert refusal(CompletionRequest, body)[1] == "logprobs"


def test_best_of_bounds_and_streaming() -> None:
    def body(**fields: object) -> dict:
        return {"model": "m", "prompt": "a", **fields}

    assert refusal(CompletionRequest, body(best_of=2, n=3)) == (
        "Invalid value for 'best_of': best_of must be n (3)..16 (got 2).",
        "best_of",
    )
    for bad in (0, 17):
        assert refusal(CompletionRequest, body(best_of=bad))[1] == "best_of"
    message, param = refusal(CompletionRequest, body(best_of=3, n=2, stream=True))
    assert param == "best_of" and "cannot be streamed" in message
    streamed = CompletionRequest.model_validate(body(best_of=2, n=2, stream=True))
    assert streamed.candidates() == 2  # best_of == n streams: nothing to pick
    assert CompletionRequest.model_validate(body(best_of=5, n=2)).candidates() == 5
    assert CompletionRequest.model_validate(body(n=4)).candidates() == 4


def test_min_tokens_above_max_tokens_is_refused() -> None:
    body = {"model": "m", "prompt": "a", "min_tokens": 5, "max_tokens": 4}
    message, _ = refusal(CompletionRequest, body)
    assert "min_tokens (5) exceeds max_tokens (4)" in message


def test_new_sampling_fields_reach_the_engine_params() -> None:
    chat = ChatCompletionRequest.model_validate(
        {
            "model": "m",
            "messages": USER,
            "logprobs": True,
            "top_logprobs": 3,
            "presence_penalty": 0.5,
            "frequency_penalty": -0.25,
            "repetition_penalty": 1.3,
            "logit_bias": {"7": -100, "9": 2.5},
            "min_tokens": 4,
            "stop_token_ids": [11, 12],
        }
    )
    p = to_sampling_params(chat)
    assert (p.logprobs, p.presence_penalty, p.frequency_penalty) == (3, 0.5, -0.25)
    assert (p.repetition_penalty, p.min_tokens, p.stop_token_ids) == (1.3, 4, [11, 12])
    assert p.logit_bias == {7: -100, 9: 2.5}
    logprobs_only = {"model": "m", "messages": USER, "logprobs": True}
    assert to_sampling_params(ChatCompletionRequest.model_validate(logprobs_only)).logprobs == 0
    plain_body = {"model": "m", "messages": USER}
    plain = to_sampling_params(ChatCompletionRequest.model_validate(plain_body))
    assert plain.logprobs is None and not plain.adjusts_logits
    text = CompletionRequest.model_validate({"model": "m", "prompt": "x", "logprobs": 2})
    assert to_sampling_params(text).logprobs == 2


def test_to_sampling_params() -> None:
    chat = ChatCompletionRequest.model_validate(
        {"model": "m", "messages": USER, "stop": "\n", "max_tokens": 9, "temperature": 0, "seed": 3}
    )
    params = to_sampling_params(chat)
    assert (params.stop, params.max_tokens, params.temperature, params.seed) == (["\n"], 9, 0, 3)
    chat = ChatCompletionRequest.model_validate(
        {"model": "m", "messages": USER, "max_completion_tokens": 5, "max_tokens": 9, "top_k": -1}
    )
    assert to_sampling_params(chat).max_tokens == 5
    assert to_sampling_params(chat).top_k == 0
    text = CompletionRequest.model_validate({"model": "m", "prompt": "x", "stop": ["a", "b"]})
    params = to_sampling_params(text, default_max_tokens=77)
    assert (params.stop, params.max_tokens, params.temperature, params.top_p) == (
        ["a", "b"],
        77,
        1.0,
        1.0,
    )


def test_responses_parse_with_the_openai_types() -> None:
    usage = Usage.of(prompt_tokens=5, completion_tokens=2, cached_tokens=4)
    chat = ChatCompletion(
        id=chat_completion_id(),
        model="m",
        choices=[ChatChoice(message=AssistantMessage(content="hi"), finish_reason="stop")],
        usage=usage,
    )
    parsed = oai_chat.ChatCompletion.model_validate(chat.model_dump())
    assert parsed.id.startswith("chatcmpl-")
    assert parsed.usage.total_tokens == 7
    assert parsed.usage.prompt_tokens_details.cached_tokens == 4

    chunk = ChatCompletionChunk(
        id="chatcmpl-1", model="m", choices=[ChunkChoice(delta=DeltaMessage())]
    )
    assert chunk.model_dump()["choices"][0]["delta"] == {}
    oai_chat.ChatCompletionChunk.model_validate(chunk.model_dump())

    text = Completion(
        id=completion_id(), model="m", choices=[CompletionChoice(text="a", finish_reason="length")]
    )
    assert oai.Completion.model_validate(text.model_dump()).id.startswith("cmpl-")


def test_error_body_shape() -> None:
    assert error_response_body(429, "busy") == {
        "error": {"message": "busy", "type": "rate_limit_error", "param": None, "code": None}
    }
    body = error_response_body(
        400, "long", "invalid_request_error", "messages", "context_length_exceeded"
    )
    assert body["error"]["code"] == "context_length_exceeded"
    assert body["error"]["param"] == "messages"
