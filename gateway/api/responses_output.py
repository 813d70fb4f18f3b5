"""Responses API objects from the chat pipeline's answer: the `response` object, its output
items (an assistant message, function calls) and usage, whole or built up by the stream.

A chat completion's choice 0 becomes the output: its text one `message` item, each tool call
one `function_call` item. `finish_reason: length` is OpenAI's `incomplete` status with
reason `max_output_tokens`.
"""

import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from gateway.api.responses_request import ResponsesRequest


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


def usage_of(chat_usage: dict[str, Any] | None) -> dict[str, Any] | None:
    if not chat_usage:
        return None
    cached = (chat_usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
    return {
        "input_tokens": chat_usage["prompt_tokens"],
        "input_tokens_details": {"cached_tokens": cached, "cache_write_tokens": 0},
        "output_tokens": chat_usage["completion_tokens"],
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": chat_usage["total_tokens"],
    }


def message_item(item_id: str, text: str, status: str = "completed") -> dict[str, Any]:
    part = {"type": "output_text", "text": text, "annotations": [], "logprobs": []}
    content = [part] if status == "completed" else []
    return {
        "id": item_id,
        "type": "message",
        "role": "assistant",
        "status": status,
        "content": content,
    }


def call_item(item_id: str, call_id: str, name: str, arguments: str, status: str) -> dict:
    return {
        "id": item_id,
        "type": "function_call",
        "call_id": call_id,
        "name": name,
        "arguments": arguments,
        "status": status,
    }


@dataclass
class ResponseHead:
    """What the response object repeats from the request, and its id and time."""

    body: ResponsesRequest
    id: str = field(default_factory=lambda: new_id("resp"))
    created_at: int = field(default_factory=lambda: int(time.time()))

    def response(
        self,
        status: str,
        output: list[dict[str, Any]],
        usage: dict[str, Any] | None = None,
        finish_reason: str | None = None,
    ) -> dict[str, Any]:
        body = self.body
        incomplete = {"reason": "max_output_tokens"} if finish_reason == "length" else None
        if incomplete is not None and status == "completed":
            status = "incomplete"
        choice = body.tool_choice
        shown_choice = choice.model_dump() if hasattr(choice, "model_dump") else choice or "auto"
        return {
            "id": self.id,
            "object": "response",
            "created_at": self.created_at,
            "status": status,
            "error": None,
            "incomplete_details": incomplete,
            "instructions": body.instructions,
            "max_output_tokens": body.max_output_tokens,
            "metadata": body.metadata or {},
            "model": body.model,
            "output": output,
            "parallel_tool_calls": body.parallel_tool_calls is not False,
            "previous_response_id": body.previous_response_id,
            "store": body.store,
            "temperature": body.temperature,
            "text": {"format": _format_of(body)},
            "tool_choice": shown_choice,
            "tools": [t.model_dump(exclude_none=True) for t in body.tools or []],
            "top_p": body.top_p,
            "truncation": "disabled",
            "usage": usage,
            "user": body.user,
        }


def _format_of(body: ResponsesRequest) -> dict[str, Any]:
    form = body.text.format if body.text is not None else None
    if form is None:
        return {"type": "text"}
    return form.model_dump(by_alias=True, exclude_none=True)


def output_of(message: dict[str, Any]) -> list[dict[str, Any]]:
    """A chat answer's message as output items: the text first, then each call."""
    items = []
    if message.get("content"):
        items.append(message_item(new_id("msg"), message["content"]))
    for call in message.get("tool_calls") or []:
        function = call["function"]
        name, arguments = function["name"], function.get("arguments") or ""
        items.append(call_item(new_id("fc"), call["id"], name, arguments, "completed"))
    return items


def whole_response(head: ResponseHead, completion: dict[str, Any]) -> dict[str, Any]:
    """The response object for a whole chat completion (its first choice)."""
    choice = completion["choices"][0]
    output = output_of(choice["message"])
    usage = usage_of(completion.get("usage"))
    return head.response("completed", output, usage, choice.get("finish_reason"))


def _function(item: dict[str, Any]) -> dict[str, str]:
    return {"name": item["name"], "arguments": item["arguments"]}


def as_chat_messages(output: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Output items as the chat messages a next turn sends back (previous_response_id)."""
    text = "".join(
        part["text"] for item in output if item["type"] == "message" for part in item["content"]
    )
    calls = [
        {"id": i["call_id"], "type": "function", "function": _function(i)}
        for i in output
        if i["type"] == "function_call"
    ]
    if not text and not calls:
        return []
    message: dict[str, Any] = {"role": "assistant", "content": text or None}
    if calls:
        message["tool_calls"] = calls
    return [message]
