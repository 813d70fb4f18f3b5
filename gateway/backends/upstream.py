"""An upstream OpenAI answer's choice as a `Piece`: text, tool calls, refusal, reasoning
and logprobs, whole (`message`) or streamed (`delta`), chat or text completion.

Both remote clients read through here: the direct one gets the JSON as dicts, litellm's
objects are dumped to the same dicts first. Upstream call ids are kept, so a client's tool
loop answers the ids it saw.
"""

from typing import Any

from engine.entrypoints.openai.tool_calls import ToolCallDelta
from engine.outputs import Logprob, TokenLogprobs
from gateway.backends.base import Piece

# vLLM names a reasoning model's thoughts `reasoning_content` (newer versions `reasoning`)
_REASONING_KEYS = ("reasoning_content", "reasoning")


def choice_piece(choice: dict[str, Any], is_chat: bool, whole: bool) -> Piece:
    """One upstream choice as a piece; `whole`: a complete answer (its reason defaults)."""
    reason = choice.get("finish_reason") or ("stop" if whole else None)
    index = int(choice.get("index") or 0)
    logprobs = logprobs_of(choice.get("logprobs"), is_chat)
    if not is_chat:
        return Piece(choice.get("text") or "", reason, logprobs=logprobs, index=index)
    message = choice.get("message") if whole else choice.get("delta")
    message = message or {}
    reasoning = next((message[k] for k in _REASONING_KEYS if message.get(k)), None)
    return Piece(
        message.get("content") or "",
        reason,
        logprobs=logprobs,
        index=index,
        tool_calls=_deltas(message.get("tool_calls"), whole),
        refusal=message.get("refusal") or None,
        reasoning=reasoning,
    )


def _deltas(calls: list[dict[str, Any]] | None, whole: bool) -> list[ToolCallDelta] | None:
    """A message's whole calls (numbered in order) or a chunk's deltas (with their index)."""
    if not calls:
        return None
    out = []
    for position, call in enumerate(calls):
        function = call.get("function") or {}
        index = position if whole else int(call.get("index") or 0)
        out.append(
            ToolCallDelta(
                index, call.get("id"), function.get("name"), function.get("arguments") or ""
            )
        )
    return out


def logprobs_of(raw: dict[str, Any] | None, is_chat: bool) -> list[TokenLogprobs] | None:
    """The engine's per-token entries from OpenAI's chat or legacy logprobs object (token
    ids are unknown upstream: -1); the shapes dress them again."""
    if not raw:
        return None
    if is_chat:
        return [
            TokenLogprobs(_logprob(e), [_logprob(t) for t in e.get("top_logprobs") or []])
            for e in raw.get("content") or []
        ]
    tops = raw.get("top_logprobs") or []
    entries = []
    for i, (token, logprob) in enumerate(zip(raw["tokens"], raw["token_logprobs"], strict=False)):
        top = tops[i] if i < len(tops) and tops[i] else {}
        alternatives = sorted(top.items(), key=lambda kv: -kv[1])
        entries.append(
            TokenLogprobs(
                Logprob(-1, token, token.encode(), logprob if logprob is not None else 0.0),
                [Logprob(-1, t, t.encode(), v) for t, v in alternatives],
            )
        )
    return entries


def _logprob(entry: dict[str, Any]) -> Logprob:
    token = entry["token"]
    raw = entry.get("bytes")
    return Logprob(-1, token, bytes(raw) if raw else token.encode(), float(entry["logprob"]))
