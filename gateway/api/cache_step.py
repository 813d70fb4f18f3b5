"""The semantic cache's place in a request: scope, client controls, lookup, replay, store.

A request is cacheable when its last turn is the user's (or it is a text prompt). Its scope
hashes everything besides that text which changes the answer, so a hit is only ever served
from the same tenant, requested model, system prompt, earlier turns, tools, response format,
sampling settings and tier-choosing headers (the override, those the route's rules read).
The matched text is the last user message (or the prompt).
"""

import asyncio
import hashlib
import json
import logging
import re
from dataclasses import dataclass
from typing import Any

from starlette.datastructures import Headers

from engine.entrypoints.openai.errors import OpenAIError
from engine.entrypoints.openai.protocol import ChatCompletionRequest, ChatMessage, Usage
from engine.entrypoints.openai.tool_calls import as_deltas, call_id
from gateway.api.respond import Answer
from gateway.backends.base import OpenAIRequest, Piece
from gateway.backends.fallback import Served
from gateway.cache.entry import STORABLE_FINISH_REASONS
from gateway.cache.semantic import CachedAnswer, CacheQuery, Embed, Lookup, SemanticCache
from gateway.policy import Policy, Price, RouteCacheSettings

logger = logging.getLogger("tiergate.cache")

# Request fields that change what an answer may be; everything else (stream, user,
# max_tokens, stream_options...) does not. max_tokens is checked per entry (`serves`).
_ANSWER_FIELDS = (
    "temperature",
    "top_p",
    "top_k",
    "seed",
    "stop",
    "presence_penalty",
    "frequency_penalty",
    "tools",
    "tool_choice",
    "parallel_tool_calls",
    "response_format",
    "logit_bias",
    "repetition_penalty",
    "min_tokens",
    "stop_token_ids",
    "ignore_eos",
    "echo",
    "suffix",
)
TTL_HEADER = "x-tiergate-cache-ttl"
_MAX_TTL_S = 365 * 24 * 3600.0


@dataclass(frozen=True)
class CacheControl:
    """What the client asked of the cache: `Cache-Control: no-cache|no-store`, a TTL header."""

    no_cache: bool = False  # do not answer from the cache (the answer may still be stored)
    no_store: bool = False  # do not store this answer
    ttl_s: float | None = None

    @classmethod
    def from_headers(cls, headers: Headers) -> "CacheControl":
        directives = {d.strip().lower() for d in headers.get("cache-control", "").split(",")}
        ttl = headers.get(TTL_HEADER)
        return cls("no-cache" in directives, "no-store" in directives, _ttl(ttl))


def _ttl(value: str | None) -> float | None:
    if value is None:
        return None
    try:
        ttl = float(value)
    except ValueError:
        ttl = -1.0
    if not 0 < ttl <= _MAX_TTL_S:  # also refuses nan and inf
        message = f"{TTL_HEADER} must be a number of seconds in (0, {_MAX_TTL_S:g}]"
        raise OpenAIError(400, message, param=TTL_HEADER)
    return ttl


def matched_text(body: OpenAIRequest) -> str | None:
    """The text a cache entry is keyed by; None when the request is not cacheable."""
    if body.logprobs_count() is not None:  # a stored answer has none (`logprobs: 0` asks too)
        return None
    if not isinstance(body, ChatCompletionRequest):
        return body.prompt if isinstance(body.prompt, str) else None
    last = body.messages[-1]
    return last.text() if last.role == "user" and last.text().strip() else None


def scope_of(tenant: str, body: OpenAIRequest, headers: dict[str, str] | None = None) -> str:
    """A hash of everything but the matched text that decides the answer; `headers`: those
    that change which tier answers (Router.answer_headers)."""
    fields = body.model_dump(include=set(_ANSWER_FIELDS), exclude_none=True, mode="json")
    parts: dict = {"tenant": tenant, "model": body.model, "fields": fields}
    if headers:  # absent when none: scopes stored before headers counted stay the same
        parts["headers"] = headers
    if isinstance(body, ChatCompletionRequest):
        parts["chat"] = _earlier_turns(body.messages[:-1])
    else:
        parts["text"] = True  # a completion never answers a chat request, nor back
    canonical = json.dumps(parts, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode()).hexdigest()


def _earlier_turns(messages: list[ChatMessage]) -> list[dict[str, Any]]:
    """The turns as the template sees them, tool-call ids renamed by order of appearance: an
    id only pairs a call with its result, and every answer (a replay too) gives its calls
    fresh ones, so a conversation that went on after a call would never be asked twice."""
    ids: dict[str, str] = {}

    def renamed(given: Any) -> str:
        return ids.setdefault(str(given), f"call_{len(ids)}")

    turns = []
    for message in messages:
        turn = message.template_dict()
        if isinstance(calls := turn.get("tool_calls"), list):
            turn["tool_calls"] = [
                {**call, "id": renamed(call.get("id"))} if isinstance(call, dict) else call
                for call in calls
            ]
        if "tool_call_id" in turn:
            turn["tool_call_id"] = renamed(turn["tool_call_id"])
        turns.append(turn)
    return turns


class _Replay:
    """A stored answer as pieces: words, then the last with the refusal, the tool calls
    (fresh ids: an id names one answer's call), the finish reason and usage."""

    def __init__(self, answer: CachedAnswer, prompt_tokens: int) -> None:
        usage = Usage.of(prompt_tokens, answer.completion_tokens, prompt_tokens)
        words = re.findall(r"\s*\S+\s*|\s+", answer.text) or [""]
        self._pieces = [Piece(w) for w in words[:-1]]
        calls = [{**call, "id": call_id()} for call in answer.tool_calls or []]
        last = Piece(words[-1], answer.finish_reason, usage, refusal=answer.refusal)
        last.tool_calls = as_deltas(calls) or None
        self._pieces.append(last)

    def __aiter__(self) -> "_Replay":
        return self

    async def __anext__(self) -> Piece:
        if not self._pieces:
            raise StopAsyncIteration
        return self._pieces.pop(0)

    async def aclose(self) -> None:
        self._pieces.clear()


@dataclass
class CacheStep:
    """One request's use of the cache; built only for requests the cache may serve."""

    cache: SemanticCache
    policy: Policy
    settings: RouteCacheSettings  # the route's effective cache settings, resolved once
    query: CacheQuery
    control: CacheControl
    embed: Embed
    lookup_result: Lookup | None = None

    async def lookup(self) -> Lookup:
        if self.control.no_cache:
            self.lookup_result = Lookup("bypass", reason="no-cache")
        else:
            self.lookup_result = await self.cache.lookup(self.query, self.embed, self.settings)
        return self.lookup_result

    def served(self, approx_prompt_tokens: int) -> Served:
        """A hit as a deployment's answer: the tier and model that first gave it, with this
        request's prompt tokens (an exact hit's prompt is the stored one's, up to spacing: its
        count stands; a semantic hit's is another text, so the gateway's estimate of it)."""
        assert self.lookup_result is not None and self.lookup_result.answer is not None
        answer = self.lookup_result.answer
        exact = self.lookup_result.outcome == "exact"
        prompt_tokens = answer.prompt_tokens if exact else approx_prompt_tokens
        tier = self.policy.tiers.get(answer.tier)
        price = tier.price if tier is not None else Price()  # a tier since removed
        replay = _Replay(answer, prompt_tokens)
        return Served(answer.tier, answer.model, price, replay, complete=True)

    def store_hook(self, tier: str, model: str, tasks: set[asyncio.Task]):
        """The after-response hook that stores a complete answer (in the background)."""

        def store(answer: Answer) -> None:
            if answer.finish_reason not in STORABLE_FINISH_REASONS:
                return
            cached = CachedAnswer(
                answer.text,
                answer.finish_reason,
                answer.usage.prompt_tokens,
                answer.usage.completion_tokens,
                tier,
                model,
                self.query.max_tokens,
                answer.tool_calls,
                answer.refusal,
            )
            task = asyncio.ensure_future(self._store(cached))
            tasks.add(task)
            task.add_done_callback(tasks.discard)

        return store

    async def _store(self, answer: CachedAnswer) -> None:
        try:
            await self.cache.store(
                self.query, self.embed, answer, self.control.ttl_s, self.settings
            )
        except Exception:  # a failed store loses a future hit, never the answer already sent
            logger.exception("cache store failed")
