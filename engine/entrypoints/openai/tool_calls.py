"""Tool calls out of a model's answer, as OpenAI `tool_calls`, whole or while streaming.

Qwen2.5 (and Hermes-style templates) write each call as a JSON object between
`<tool_call>` and `</tool_call>`; small models often write the bare object (or a list of
them, or one in a ```json fence) instead, which counts only when the name is a declared
tool. A complete block whose JSON does not parse stays plain content (nothing is lost); a
block the answer's end cut (max_tokens, a stop string) is no call and is dropped.

Streamed, a tagged call goes out once its closing tag arrives, as OpenAI sends calls: a
delta with the call's id and name, then one with its arguments (`ToolCallDelta`).
"""

import json
import re
import uuid
from collections.abc import Collection, Iterable
from dataclasses import dataclass, field
from typing import Any

from engine.structured_output.constraints import CLOSE, OPEN

_FENCE = re.compile(r"\A```(?:json)?\s*(.*?)\s*```\Z", re.DOTALL)


@dataclass
class ToolCallDelta:
    """One streamed piece of tool call `index`: its first has the id and name, later ones
    argument fragments (OpenAI's `choices[].delta.tool_calls[]`)."""

    index: int
    id: str | None = None
    name: str | None = None
    arguments: str = ""

    def openai(self) -> dict[str, Any]:
        function = {"arguments": self.arguments}
        if self.name is not None:
            function = {"name": self.name, **function}
        head = {"id": self.id, "type": "function"} if self.id is not None else {}
        return {"index": self.index, **head, "function": function}


@dataclass
class ParsedAnswer:
    content: str | None  # the text around the calls; None when there is none
    tool_calls: list[dict[str, Any]] = field(default_factory=list)  # OpenAI's shape


def call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


def _call(obj: Any, names: Collection[str]) -> dict[str, Any] | None:
    if not isinstance(obj, dict) or obj.get("name") not in names:
        return None
    args = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(args, str):  # some models send the arguments already encoded
        try:
            args = json.loads(args)
        except ValueError:
            return None
    if not isinstance(args, dict):
        return None
    return {
        "id": call_id(),
        "type": "function",
        "function": {"name": obj["name"], "arguments": json.dumps(args, ensure_ascii=False)},
    }


def _calls(text: str, names: Collection[str]) -> list[dict[str, Any]] | None:
    """The calls one JSON text holds (an object or a list of them); None if not all parse."""
    try:
        obj = json.loads(text)
    except ValueError:
        return None
    objs = obj if isinstance(obj, list) and obj else [obj]
    calls = [_call(o, names) for o in objs]
    return None if any(c is None for c in calls) else calls  # type: ignore[return-value]


def _bare_calls(text: str, names: Collection[str]) -> list[dict[str, Any]] | None:
    bare = text.strip()
    fenced = _FENCE.match(bare)
    return _calls(fenced.group(1) if fenced else bare, names)


class ToolCallStream:
    """Splits an answer as it streams: text that cannot be part of a call goes out at once;
    a tagged call is held from its tag and goes out as calls when it closes; an answer that
    opens like JSON (a bare call?) is held and parsed at the end."""

    def __init__(self, names: Collection[str]) -> None:
        self._names = names
        self._held = ""
        self._bare = False  # holding an answer that opened like JSON, to the end
        self._started = False  # some non-blank text has gone out or been judged
        self.calls = 0  # calls found so far

    def feed(self, text: str) -> tuple[str, list[dict[str, Any]]]:
        """New text in; the text that can be shown now and the calls completed, out."""
        self._held += text
        if self._bare:
            return "", []
        out, calls = "", []
        while (tag := self._held.find(OPEN)) >= 0:
            close = self._held.find(CLOSE, tag)
            if close < 0:
                out += self._loose(self._held[:tag])
                self._held = self._held[tag:]
                return out, calls
            block = self._held[tag + len(OPEN) : close]
            found = _calls(block.strip(), self._names)
            end = close + len(CLOSE)
            # a block that does not parse stays content: nothing is lost
            out += self._loose(self._held[:tag] + ("" if found else self._held[tag:end]))
            calls += self._counted(found or [])
            self._held = self._held[end:]
        return out + self._plain(), calls

    def _loose(self, text: str) -> str:
        """Text outside any block; blank text after a call is the calls' separator."""
        if self.calls and not text.strip():
            return ""
        if text.strip():
            self._started = True
        return text

    def _counted(self, calls: list[dict[str, Any]]) -> list[dict[str, Any]]:
        self.calls += len(calls)
        return calls

    def _plain(self) -> str:
        """What of the held text (no tag in it) can go out now."""
        if not self._started:
            lead = self._held.lstrip()
            if not lead or OPEN.startswith(lead):
                return ""  # blank so far, or the tag's beginning
            self._started = True
            if lead[0] in "{[`" and not self.calls:
                self._bare = True
                return ""
        if self.calls and not self._held.strip():
            return ""  # maybe the blank between two calls
        keep = _partial_tag_suffix(self._held)
        out, self._held = self._held[: len(self._held) - keep], self._held[len(self._held) - keep :]
        return out

    def finish(self) -> ParsedAnswer:
        """The held-back text as content, or as the calls it holds; a cut block is dropped."""
        held, self._held = self._held, ""
        if self._bare:
            found = _bare_calls(held, self._names)
            if found:
                return ParsedAnswer(None, self._counted(found))
            return ParsedAnswer(held or None)
        if held.startswith(OPEN):  # no closing tag: complete JSON still counts
            found = _calls(held[len(OPEN) :].strip(), self._names)
            return ParsedAnswer(None, self._counted(found or []))
        if self.calls and not held.strip():
            return ParsedAnswer(None)
        return ParsedAnswer(held or None)


def _partial_tag_suffix(text: str) -> int:
    """Length of the longest end of `text` that could begin the tag."""
    for n in range(min(len(OPEN) - 1, len(text)), 0, -1):
        if OPEN.startswith(text[-n:]):
            return n
    return 0


def parse_tool_calls(text: str, names: Collection[str]) -> ParsedAnswer | None:
    """The answer split into content and calls to the tools `names`; None: no tool call."""
    stream = ToolCallStream(names)
    shown, calls = stream.feed(text)
    end = stream.finish()
    if not calls + end.tool_calls:
        return None
    content = (shown + (end.content or "")).strip()
    return ParsedAnswer(content or None, calls + end.tool_calls)


def call_reason(reason: str, called: bool) -> str:
    """OpenAI's finish reason: an answer that made calls ends with `tool_calls`, also when
    max_tokens cut a further call (that one was dropped)."""
    return "tool_calls" if called and reason in ("stop", "length") else reason


def split_answer(
    text: str, reason: str, names: Collection[str]
) -> tuple[str | None, list[dict[str, Any]] | None, str]:
    """A whole answer's (content, tool_calls, finish_reason) as OpenAI reports them."""
    if not names:
        return text, None, reason
    stream = ToolCallStream(names)
    shown, calls = stream.feed(text)
    end = stream.finish()
    calls += end.tool_calls
    content = shown + (end.content or "")
    if not calls:  # the text as it was, less a cut block
        return content if content or not text else None, None, reason
    return content.strip() or None, calls, call_reason(reason, True)


def as_deltas(calls: Iterable[dict[str, Any]], first: int = 0) -> list[ToolCallDelta]:
    """Whole calls as stream deltas, numbered from `first`: the id and name, then the
    arguments."""
    deltas = []
    for i, call in enumerate(calls, first):
        function = call.get("function") or {}
        deltas.append(ToolCallDelta(i, call.get("id") or call_id(), function.get("name") or ""))
        deltas.append(ToolCallDelta(i, arguments=function.get("arguments") or ""))
    return deltas


def merge_deltas(deltas: Iterable[ToolCallDelta]) -> list[dict[str, Any]]:
    """A stream's deltas as whole calls, in index order (fragments joined)."""
    calls: dict[int, dict[str, Any]] = {}
    for d in deltas:
        call = calls.setdefault(d.index, {"id": None, "name": "", "arguments": ""})
        call["id"] = call["id"] or d.id
        call["name"] += d.name or ""
        call["arguments"] += d.arguments
    return [
        {
            "id": c["id"] or call_id(),
            "type": "function",
            "function": {"name": c["name"], "arguments": c["arguments"]},
        }
        for _, c in sorted(calls.items())
    ]
