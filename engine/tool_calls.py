"""Tool calls out of a model's answer, as OpenAI `tool_calls`, whole or while streaming.

Qwen2.5 (and Hermes-style templates) write each call as a JSON object between
`<tool_call>` and `</tool_call>`; small models often write the bare object (or a list of
them, or one in a ```json fence) instead, which counts only when the name is a declared
tool. An answer whose markup does not parse stays plain content: nothing is lost.
"""

import json
import re
import uuid
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any

OPEN, CLOSE = "<tool_call>", "</tool_call>"
_BLOCK = re.compile(re.escape(OPEN) + r"(.*?)(?:" + re.escape(CLOSE) + r"|\Z)", re.DOTALL)
_FENCE = re.compile(r"\A```(?:json)?\s*(.*?)\s*```\Z", re.DOTALL)


@dataclass
class ParsedAnswer:
    content: str | None  # the text around the calls; None when there is none
    tool_calls: list[dict[str, Any]] = field(default_factory=list)  # OpenAI's shape


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
        "id": f"call_{uuid.uuid4().hex[:24]}",
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


def parse_tool_calls(text: str, names: Collection[str]) -> ParsedAnswer | None:
    """The answer split into content and calls to the tools `names`; None: no tool call."""
    if OPEN in text:
        calls: list[dict[str, Any]] = []
        for block in _BLOCK.finditer(text):
            found = _calls(block.group(1).strip(), names)
            if found is None:
                return None
            calls += found
        content = _BLOCK.sub("", text).strip()
        return ParsedAnswer(content or None, calls)
    bare = text.strip()
    fenced = _FENCE.match(bare)
    found = _calls(fenced.group(1) if fenced else bare, names)
    return ParsedAnswer(None, found) if found else None


class ToolCallStream:
    """Splits a streamed answer: text that cannot be part of a call goes out at once; from
    the first sign of a call (the tag, or an answer that opens like JSON) it is held back
    and parsed at the end."""

    def __init__(self, names: Collection[str]) -> None:
        self._names = names
        self._held = ""
        self._holding_call = False
        self._started = False  # some non-blank text has gone out or been judged

    def feed(self, text: str) -> str:
        """New text in; the part that can be shown now out."""
        self._held += text
        if self._holding_call:
            return ""
        tag = self._held.find(OPEN)
        if tag >= 0:
            out, self._held, self._holding_call = self._held[:tag], self._held[tag:], True
            return out
        if not self._started:
            lead = self._held.lstrip()
            if not lead or OPEN.startswith(lead):
                return ""  # blank so far, or the tag's beginning
            self._started = True
            if lead[0] in "{[`":
                self._holding_call = True
                return ""
        keep = _partial_tag_suffix(self._held)
        out, self._held = self._held[: len(self._held) - keep], self._held[len(self._held) - keep :]
        return out

    def finish(self) -> ParsedAnswer:
        """The held-back text as content, or as the calls it holds."""
        held, self._held = self._held, ""
        parsed = parse_tool_calls(held, self._names) if held.strip() else None
        return parsed or ParsedAnswer(held or None)


def _partial_tag_suffix(text: str) -> int:
    """Length of the longest end of `text` that could begin the tag."""
    for n in range(min(len(OPEN) - 1, len(text)), 0, -1):
        if OPEN.startswith(text[-n:]):
            return n
    return 0


def split_answer(
    text: str, reason: str, names: Collection[str]
) -> tuple[str | None, list[dict[str, Any]] | None, str]:
    """A whole answer's (content, tool_calls, finish_reason) as OpenAI reports them."""
    parsed = parse_tool_calls(text, names) if names else None
    if parsed is None:
        return text, None, reason
    return parsed.content, parsed.tool_calls, "tool_calls" if reason == "stop" else reason


def as_deltas(calls: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Whole calls as stream deltas: each with its `index`, arguments in one piece."""
    return [{"index": i, **call} for i, call in enumerate(calls)]
