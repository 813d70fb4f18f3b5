"""The chat pipeline's SSE chunks as Anthropic's Messages stream:

    message_start, then per block: content_block_start, content_block_delta (text_delta or
    input_json_delta)..., content_block_stop; message_delta (stop_reason, usage),
    message_stop | error

A text block closes when a tool call starts; each call is one tool_use block, its argument
fragments the input_json_delta's partial_json.
"""

import json
from typing import Any

from gateway.api.messages_output import head, message_id, stop_reason, usage_of


def _event(kind: str, **fields: Any) -> bytes:
    return f"event: {kind}\ndata: {json.dumps({'type': kind, **fields})}\n\n".encode()


class MessagesEvents:
    """One streamed message: feed it the chat chunks, it answers with the events."""

    def __init__(self, model: str) -> None:
        self.model = model
        self._blocks = 0  # blocks started
        self._open: int | None = None  # the block being written
        self._calls: dict[int, int] = {}  # chat tool call index -> block index
        self._text_open = False
        self._usage: dict[str, Any] | None = None
        self._finish: str | None = None
        self._failed = False

    def start(self) -> bytes:
        usage = {"input_tokens": 0, "output_tokens": 0}  # the real counts come at the end
        return _event("message_start", message=head(self.model, message_id(), usage))

    def chunk(self, data: dict[str, Any]) -> bytes:
        if "error" in data:
            self._failed = True
            error = data["error"]
            kind = "overloaded_error" if error.get("code") == "queue_full" else "api_error"
            return _event("error", error={"type": kind, "message": error.get("message", "")})
        self._usage = data.get("usage") or self._usage
        out = b""
        for choice in data.get("choices") or []:
            if choice.get("index", 0) != 0:
                continue
            delta = choice.get("delta") or {}
            if delta.get("content"):
                out += self._text(delta["content"])
            for call in delta.get("tool_calls") or []:
                out += self._call(call)
            self._finish = choice.get("finish_reason") or self._finish
        return out

    def _start_block(self, block: dict[str, Any]) -> bytes:
        out = self._stop_block()
        self._open = self._blocks
        self._blocks += 1
        return out + _event("content_block_start", index=self._open, content_block=block)

    def _stop_block(self) -> bytes:
        if self._open is None:
            return b""
        index, self._open, self._text_open = self._open, None, False
        return _event("content_block_stop", index=index)

    def _text(self, text: str) -> bytes:
        out = b""
        if not self._text_open:
            out += self._start_block({"type": "text", "text": ""})
            self._text_open = True
        delta = {"type": "text_delta", "text": text}
        return out + _event("content_block_delta", index=self._open, delta=delta)

    def _call(self, call: dict[str, Any]) -> bytes:
        out, function = b"", call.get("function") or {}
        index = call.get("index", 0)
        if index not in self._calls:
            block = {
                "type": "tool_use",
                "id": call.get("id") or f"toolu_{message_id()[4:]}",
                "name": function.get("name") or "",
                "input": {},
            }
            out += self._start_block(block)
            self._calls[index] = self._open  # type: ignore[assignment]
        if fragment := function.get("arguments"):
            delta = {"type": "input_json_delta", "partial_json": fragment}
            out += _event("content_block_delta", index=self._calls[index], delta=delta)
        return out

    def end(self) -> bytes:
        if self._failed:
            return b""
        out = self._stop_block()
        delta = {"stop_reason": stop_reason(self._finish), "stop_sequence": None}
        usage = usage_of(self._usage)
        out += _event("message_delta", delta=delta, usage=usage)
        return out + _event("message_stop")
