"""The policy's tiers (and its judge) as `tiergate router learn` calls them: through the
gateway's own backends (local engines in this process, remotes over HTTP or litellm), with
retries and cooldowns as the gateway has them, but no fallback to another tier (an answer
must be the asked tier's), every call counted against a spend cap.
"""

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass

import httpx

from engine.entrypoints.openai.protocol import ChatCompletionRequest, Usage
from gateway.backends.base import BackendError, GenerationRequest
from gateway.backends.fallback import Cooldowns
from gateway.backends.local import LocalEngines
from gateway.policy import Policy, Tier
from gateway.pricing import most_expensive, policy_prices
from gateway.state import build_runtime, prepare
from gateway.stats.counters import Stats, cost_usd

JUDGE_TIER = "__judge__"  # the judge's deployment, as one more tier of the learn policy
CHARS_PER_TOKEN = 4  # the gateway's prompt estimate, for a call's cost before it is made


class SpendCapReached(Exception):
    """The next call would pass `--max-usd`: the run labels what it has."""


@dataclass
class Reply:
    text: str
    usage: Usage
    cost_usd: float
    model: str


def learn_policy(policy: Policy) -> Policy:
    """The policy's tiers without fallbacks, plus the judge as tier JUDGE_TIER: the configured
    one, else the first deployment of the most expensive tier at that tier's price."""
    learning = policy.router_learning
    tiers = {n: t.model_copy(update={"fallback": None}) for n, t in policy.tiers.items()}
    if learning.judge is not None:
        judge = Tier(deployments=[learning.judge], price=learning.judge_price, retries=1)
    else:
        top, _ = most_expensive(policy_prices(policy))
        source = policy.tiers[top] if top in policy.tiers else next(iter(policy.tiers.values()))
        judge = source.model_copy(update={"deployments": source.deployments[:1], "fallback": None})
    return policy.model_copy(update={"tiers": {**tiers, JUDGE_TIER: judge}})


class Tiers:
    """Ask a tier (or the judge) one chat; the cap is checked before each call from its
    estimate (prompt characters / 4 plus `max_tokens` at the tier's price), which stays
    reserved until the call's real cost replaces it, so concurrent calls cannot pass it."""

    def __init__(self, policy: Policy, max_usd: float) -> None:
        self.policy = learn_policy(policy)
        self.max_usd = max_usd
        self.spent_usd = 0.0
        self.reserved_usd = 0.0
        self.calls = 0
        self._starting = asyncio.Lock()
        self._runtime = None
        self._engines: LocalEngines | None = None
        self._http: httpx.AsyncClient | None = None

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator["Tiers"]:
        """Calls may be made inside; the engines start on the first one (a run that only
        replays a record, or whose cap refuses every call, starts none)."""
        async with httpx.AsyncClient() as http:
            self._http = http
            try:
                yield self
            finally:
                if self._engines is not None:
                    await self._engines.shutdown()
                self._runtime = self._engines = self._http = None

    async def _start(self) -> None:
        self._engines = LocalEngines(retire_grace_s=0.0)
        prepared = await prepare(self.policy, self._engines, None)
        self._engines.activate(prepared.engines)
        self._runtime = build_runtime(self.policy, prepared, Cooldowns(), Stats(), self._http)

    def judge_model(self) -> str:
        return self.policy.tiers[JUDGE_TIER].deployments[0].model

    def _estimate(self, tier: str, messages: list[dict], max_tokens: int) -> float:
        chars = sum(len(str(m.get("content") or "")) for m in messages)
        usage = Usage.of(chars // CHARS_PER_TOKEN + 1, max_tokens)
        return cost_usd(usage, self.policy.tiers[tier].price)

    async def ask(self, tier: str, messages: list[dict], max_tokens: int) -> Reply:
        """The tier's greedy answer; BackendError when it fails, SpendCapReached first when
        the call could pass the cap."""
        assert self._http is not None, "use `async with tiers.running()`"
        estimate = self._estimate(tier, messages, max_tokens)
        if self.spent_usd + self.reserved_usd + estimate > self.max_usd:
            raise SpendCapReached(f"{self.spent_usd:.4f} USD spent of {self.max_usd}")
        self.reserved_usd += estimate
        try:
            reply = await self._ask(tier, messages, max_tokens)
        finally:
            self.reserved_usd -= estimate
        self.spent_usd += reply.cost_usd
        self.calls += 1
        return reply

    async def _ask(self, tier: str, messages: list[dict], max_tokens: int) -> Reply:
        async with self._starting:
            if self._runtime is None:
                await self._start()
        body = ChatCompletionRequest.model_validate(
            {"model": tier, "messages": messages, "max_tokens": max_tokens, "temperature": 0}
        )
        request = GenerationRequest(f"learn-{uuid.uuid4().hex[:12]}", body, "router-learn")
        served = await self._runtime.chain.open(request, tier)
        if served.tier != tier:  # no fallbacks are configured; a changed policy would show
            await served.pieces.aclose()
            raise BackendError(502, f"tier {tier} answered from {served.tier}", False, False)
        parts, usage = [], None
        async for piece in served.pieces:
            parts.append(piece.text)
            usage = piece.usage or usage
        text = "".join(parts)
        usage = usage or Usage.of(self._estimate_tokens(messages), len(text) // CHARS_PER_TOKEN)
        return Reply(text, usage, cost_usd(usage, served.price), served.model)

    @staticmethod
    def _estimate_tokens(messages: list[dict]) -> int:
        return sum(len(str(m.get("content") or "")) for m in messages) // CHARS_PER_TOKEN
