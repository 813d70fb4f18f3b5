"""Anthropic Messages objects from the chat pipeline's answer: the message, its content
blocks (text, tool_use), stop reason and usage; and Anthropic's error shape.

OpenAI's finish reasons map to Anthropic's stop reasons (`stop`: end_turn, `length`:
max_tokens, `tool_calls`: tool_use). The chat API does not say whether a stop sequence
ended the text, so `stop_sequence` stays null and the reason end_turn.
"""

import json
import uuid
from typing import Any

STOP_REASONS = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use"}
# Anthropic's error types by HTTP status; other 4xx are invalid requests, other 5xx api_error
ERROR_TYPES = {
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    503: "overloaded_error",
    529: "overloaded_error",
}


def message_id() -> str:
    return f"msg_{uuid.uuid4().hex}"


def error_body(status: int, message: str) -> dict[str, Any]:
    default = "invalid_request_error" if status < 500 else "api_error"
    kind = ERROR_TYPES.get(status, default)
    return {"type": "error", "error": {"type": kind, "message": message}}


def stop_reason(finish_reason: str | None) -> str:
    return STOP_REASONS.get(finish_reason or "stop", "end_turn")


def usage_of(chat_usage: dict[str, Any] | None) -> dict[str, int]:
    if not chat_usage:
        return {"input_tokens": 0, "output_tokens": 0}
    cached = (chat_usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
    return {
        "input_tokens": chat_usage["prompt_tokens"],
        "output_tokens": chat_usage["completion_tokens"],
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": cached,
    }


def tool_input(arguments: str) -> dict[str, Any]:
    """A call's arguments as tool_use input: an object (arguments that are not one: {})."""
    try:
        value = json.loads(arguments or "{}")
    except json.JSONDecodeError:
        return {}
    return value if isinstance(value, dict) else {}


def content_of(message: dict[str, Any]) -> list[dict[str, Any]]:
    blocks: list[dict[str, Any]] = []
    if message.get("content"):
        blocks.append({"type": "text", "text": message["content"]})
    for call in message.get("tool_calls") or []:
        function = call["function"]
        input_ = tool_input(function.get("arguments") or "")
        blocks.append(
            {"type": "tool_use", "id": call["id"], "name": function["name"], "input": input_}
        )
    return blocks


def head(model: str, msg_id: str, usage: dict[str, int]) -> dict[str, Any]:
    """The message as message_start sends it: no content yet."""
    return {
        "id": msg_id,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
        "usage": usage,
    }


def whole_message(model: str, completion: dict[str, Any]) -> dict[str, Any]:
    """The message for a whole chat completion (its first choice)."""
    choice = completion["choices"][0]
    message = head(model, message_id(), usage_of(completion.get("usage")))
    message["content"] = content_of(choice["message"])
    message["stop_reason"] = stop_reason(choice.get("finish_reason"))
    return message
