"""What routing reads from a request before any model runs: its size, whether it holds
code, how many messages, and the last user message (the difficulty signals, the rules and
the cache all start from these)."""

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

# A line that starts like a statement of a common language. Matched per line, at its start
# only, with no quantifier that can cross a line: linear in the line.
_STATEMENT = re.compile(
    r"[ \t]*(def|class|import|from[ \t]+\S+[ \t]+import|function|const|let|var|public|"
    r"private|#include|SELECT|fn|func|package)\b"
)
_CALL_OPEN = re.compile(r"\w\(")  # a call or definition: name(
_BLOCK_AFTER_CALL = re.compile(r"\s*[{:]")  # ...) {  or  ...):
# Code shows early or late in a prompt: the middle of a huge one is not scanned.
_CODE_SCAN_HEAD, _CODE_SCAN_TAIL = 64 * 1024, 16 * 1024
_CHARS_PER_TOKEN = 4  # rough English average; routing must decide before any tokenizer runs


@dataclass(frozen=True)
class PromptFeatures:
    chars: int  # all message text (or the prompt) together
    approx_tokens: int
    contains_code: bool
    messages: int  # chat messages; 1 for a plain completion prompt
    last_user_text: str  # what the difficulty scorer and the cache look at


def message_text(content: Any) -> str:
    """Text of an OpenAI message content: a string or a list of parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(p.get("text", "") for p in content if isinstance(p, dict))
    return ""


def looks_like_code(text: str) -> bool:
    """Fenced blocks, statement-like lines, `=>` / `::`, or `name(...) {` / `name(...):`.

    Linear in the text and capped in what it reads: a prompt is a client's input, and this
    runs on the event loop (a backtracking regex here once froze it for minutes).
    """
    if len(text) > _CODE_SCAN_HEAD + _CODE_SCAN_TAIL:
        text = text[:_CODE_SCAN_HEAD] + "\n" + text[-_CODE_SCAN_TAIL:]
    if "```" in text or "=>" in text or "::" in text:
        return True
    for line in text.splitlines():
        if _STATEMENT.match(line) or line.rstrip().endswith((";", "{", "}")):
            return True
    return _call_with_block(text)


def _call_with_block(text: str) -> bool:
    """`\\w+\\([^)]*\\)\\s*[{:]` without its quadratic backtracking: every `name(` up to
    the next `)` closes at that same `)`, so each `)` is looked at once."""
    pos = 0
    while (opening := _CALL_OPEN.search(text, pos)) is not None:
        close = text.find(")", opening.end())
        if close < 0:
            return False  # no `)` after this `(`, nor after any later one
        if _BLOCK_AFTER_CALL.match(text, close + 1):
            return True
        pos = close + 1
    return False


def extract_features(messages: Iterable[dict] | None, prompt: str | None) -> PromptFeatures:
    if messages is None:
        texts, last_user = [prompt or ""], prompt or ""
    else:
        messages = list(messages)
        texts = [message_text(m.get("content")) for m in messages]
        users = [t for m, t in zip(messages, texts, strict=True) if m.get("role") == "user"]
        last_user = users[-1] if users else ""
    text = "\n".join(texts)
    return PromptFeatures(
        chars=len(text),
        approx_tokens=-(-len(text) // _CHARS_PER_TOKEN),
        contains_code=looks_like_code(text),
        messages=len(texts),
        last_user_text=last_user,
    )
