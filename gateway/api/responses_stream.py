"""The chat pipeline's SSE chunks as the Responses API's event sequence.

    response.created, response.in_progress,
    per text:  output_item.added, content_part.added, output_text.delta..., output_text.done,
               content_part.done, output_item.done
    per call:  output_item.added, function_call_arguments.delta..., ...arguments.done,
               output_item.done
    response.completed (with usage) | error, response.failed

Tool calls are read from the chunks' `tool_calls` deltas as OpenAI streams them (id and
name first, argument fragments after); a text item closes when a call starts.
"""

import json
from dataclasses import dataclass
from typing import Any

from gateway.api.responses_output import ResponseHead, call_item, message_item, new_id, usage_of


@dataclass
class _Item:
    index: int  # output_index
    item: dict[str, Any]
    open: bool = True
    text: str = ""  # a message's text so far


class ResponsesEvents:
    """One streamed response: feed it the chat chunks, it answers with the events."""

    def __init__(self, head: ResponseHead) -> None:
        self.head = head
        self.items: list[_Item] = []
        self._text: _Item | None = None
        self._calls: dict[int, _Item] = {}  # by the chat delta's tool call index
        self._seq = 0
        self._usage: dict[str, Any] | None = None
        self._finish: str | None = None
        self._failed = False  # the error events replace response.completed
        self.final: dict[str, Any] | None = None  # the completed response, once sent

    def _event(self, kind: str, **fields: Any) -> bytes:
        data = {"type": kind, "sequence_number": self._seq, **fields}
        self._seq += 1
        return f"event: {kind}\ndata: {json.dumps(data)}\n\n".encode()

    def start(self) -> bytes:
        response = self.head.response("in_progress", [])
        created = self._event("response.created", response=response)
        return created + self._event("response.in_progress", response=response)

    def chunk(self, data: dict[str, Any]) -> bytes:
        if "error" in data:
            return self.failed(data["error"])
        self._usage = usage_of(data.get("usage")) or self._usage
        out = b""
        for choice in data.get("choices") or []:
            if choice.get("index", 0) != 0:
                continue  # one output per response: n is not a Responses field
            delta = choice.get("delta") or {}
            if delta.get("content"):
                out += self._text_delta(delta["content"])
            for call in delta.get("tool_calls") or []:
                out += self._call_delta(call)
            self._finish = choice.get("finish_reason") or self._finish
        return out

    def _text_delta(self, text: str) -> bytes:
        out = b""
        if self._text is None:
            out += self._close_all()
            self._text = self._add(message_item(new_id("msg"), "", "in_progress"))
            out += self._added(self._text)
            part = {"type": "output_text", "text": "", "annotations": []}
            out += self._event("response.content_part.added", **self._where(self._text), part=part)
        self._text.text += text
        return out + self._event(
            "response.output_text.delta", **self._where(self._text), delta=text, logprobs=[]
        )

    def _call_delta(self, call: dict[str, Any]) -> bytes:
        out, index = b"", call.get("index", 0)
        function = call.get("function") or {}
        item = self._calls.get(index)
        if item is None:
            out += self._close_all()
            name, call_id = function.get("name") or "", call.get("id") or new_id("call")
            item = self._add(call_item(new_id("fc"), call_id, name, "", "in_progress"))
            self._calls[index] = item
            out += self._added(item)
        if fragment := function.get("arguments"):
            item.item["arguments"] += fragment
            where = {"item_id": item.item["id"], "output_index": item.index}
            out += self._event("response.function_call_arguments.delta", **where, delta=fragment)
        return out

    def end(self) -> bytes:
        if self._failed:
            return b""
        out = self._close_all()
        output = [i.item for i in self.items]
        self.final = self.head.response("completed", output, self._usage, self._finish)
        return out + self._event("response.completed", response=self.final)

    def failed(self, error: dict[str, Any]) -> bytes:
        self._failed = True
        code, message = error.get("code") or error.get("type"), error.get("message", "")
        out = self._event("error", code=code, message=message, param=error.get("param"))
        response = self.head.response("failed", [i.item for i in self.items if not i.open])
        response["error"] = {"code": code or "server_error", "message": message}
        return out + self._event("response.failed", response=response)

    # ---- items
    def _add(self, item: dict[str, Any]) -> _Item:
        added = _Item(len(self.items), item)
        self.items.append(added)
        return added

    def _where(self, item: _Item) -> dict[str, Any]:
        return {"item_id": item.item["id"], "output_index": item.index, "content_index": 0}

    def _added(self, item: _Item) -> bytes:
        return self._event("response.output_item.added", output_index=item.index, item=item.item)

    def _close_all(self) -> bytes:
        out = b"".join(self._close(item) for item in self.items if item.open)
        self._text, self._calls = None, {}
        return out

    def _close(self, item: _Item) -> bytes:
        item.open, out = False, b""
        if item.item["type"] == "message":
            item.item = message_item(item.item["id"], item.text)
            where, part = self._where(item), item.item["content"][0]
            out += self._event("response.output_text.done", **where, text=item.text, logprobs=[])
            out += self._event("response.content_part.done", **where, part=part)
        else:
            item.item["status"] = "completed"
            where = {"item_id": item.item["id"], "output_index": item.index}
            out += self._event(
                "response.function_call_arguments.done",
                **where,
                name=item.item["name"],
                arguments=item.item["arguments"],
            )
        done = self._event("response.output_item.done", output_index=item.index, item=item.item)
        return out + done
