"""The fallback chain: per-attempt timeouts, retries with backoff, cooldowns, fallback tiers.

A request is served by the first deployment that produces its first piece in time. Until
then anything retryable moves on: the same deployment again (with backoff), the tier's
next deployment, then the fallback tier's. Once a piece has gone out to the client, a
later failure continues the answer on another of them (resume.py) when the route lets it
and the answer can be continued exactly; otherwise it ends the answer with an error.
"""

import asyncio
import functools
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field

from engine.entrypoints.openai.chat_template import offers_tools
from engine.entrypoints.openai.protocol import ChatCompletionRequest
from gateway.backends.balance import Balancer, Prefixes, prefixes_of
from gateway.backends.base import CONTEXT_EXCEEDED, Backend, BackendError, GenerationRequest, Piece
from gateway.backends.cooldowns import Cooldowns
from gateway.backends.resume import OnResume, Reopened, Resuming, resumable
from gateway.policy import Deployment, Price, Tier

logger = logging.getLogger("tiergate.fallback")

OnFailure = Callable[[str, str, BackendError], None]  # (tier, model, error)


@dataclass
class TierBackends:
    name: str
    tier: Tier
    backends: list[tuple[Deployment, Backend]]
    prices: dict[str, Price] = field(default_factory=dict)  # deployment model -> its price


@dataclass
class Served:
    """The deployment that answered, and its pieces (the first already received)."""

    tier: str
    model: str
    price: Price
    pieces: AsyncIterator[Piece]  # aclose() aborts the request upstream, started or not
    failures: list[BackendError] = field(default_factory=list)  # attempts that failed first
    complete: bool = False  # the first piece is the whole answer: nothing left to wait for
    key: str = ""  # the deployment's key (model@api_base)


def deployment_key(deployment: Deployment) -> str:
    return f"{deployment.model}@{deployment.api_base or 'local'}"


async def _first_piece(
    backend: Backend, request: GenerationRequest, timeout_s: float
) -> tuple[AsyncIterator[Piece], Piece]:
    pieces = backend.generate(request)
    try:
        async with asyncio.timeout(timeout_s):  # cheaper than wait_for: no extra task
            first = await anext(pieces)
    except StopAsyncIteration:
        # Every backend ends an answer with a finish reason: nothing at all is a cut answer.
        raise BackendError(502, f"{backend.name}: ended without an answer", True, True) from None
    except TimeoutError:
        await pieces.aclose()
        raise BackendError(
            504, f"{backend.name}: no answer within {timeout_s:g}s", True, True
        ) from None
    except BackendError:
        await pieces.aclose()
        raise
    except Exception as exc:  # a backend bug must not take the whole chain down
        await pieces.aclose()
        logger.exception("%s failed", backend.name)
        raise BackendError(502, f"{backend.name}: failed", False, True) from exc
    return pieces, first


class _Answer:
    """The first piece, then the others, each within the timeout.

    A class rather than a generator: `aclose` must abort upstream even when iteration
    never started (a client that left before the first byte went out). Whatever goes
    wrong after the first piece leaves as a BackendError, which the API turns into an SSE
    error event; so does an upstream that ends without a finish reason (a cut stream is
    not an answer that stopped).
    """

    def __init__(
        self,
        pieces: AsyncIterator[Piece],
        first: Piece,
        name: str,
        timeout_s: float,
        on_close: Callable[[], None] = lambda: None,
    ) -> None:
        self._pieces, self._first, self._name, self._timeout_s = pieces, first, name, timeout_s
        self.complete = first.finish_reason is not None and first.usage is not None
        self._finished = first.finish_reason is not None
        self._on_close: Callable[[], None] | None = on_close  # once: the request left

    def __aiter__(self) -> "_Answer":
        return self

    async def __anext__(self) -> Piece:
        if self._first is not None:
            piece, self._first = self._first, None
            return piece
        if self.complete:
            raise StopAsyncIteration
        try:
            async with asyncio.timeout(self._timeout_s):
                piece = await anext(self._pieces)
        except StopAsyncIteration:
            if not self._finished:
                logger.warning("%s: the answer ended without a finish reason", self._name)
                raise BackendError(502, f"{self._name}: the answer was cut", False, False) from None
            raise
        except TimeoutError:
            message = f"{self._name}: stalled for {self._timeout_s:g}s"
            raise BackendError(504, message, False, False) from None
        except BackendError:
            raise
        except Exception as exc:  # a backend bug mid-answer: an error event, not a cut
            logger.exception("%s failed mid-answer", self._name)
            raise BackendError(502, f"{self._name}: failed mid-answer", False, False) from exc
        self._finished = self._finished or piece.finish_reason is not None
        return piece

    async def aclose(self) -> None:
        if self._on_close is not None:
            on_close, self._on_close = self._on_close, None
            on_close()
        await self._pieces.aclose()


async def refusal(
    dep: Deployment, backend: Backend, request: GenerationRequest
) -> BackendError | None:
    """Why the deployment cannot take this request at all (skipped, as LiteLLM's pre-call
    checks do): tools its template drops, a context too small. None: try it."""
    if not dep.tools and offers_tools(request.body):
        message = f"{backend.name}: this deployment does not take `tools` (policy tools: false)"
        return BackendError(400, message, False, False, param="tools")
    body = request.body
    continues = isinstance(body, ChatCompletionRequest) and body.continue_final_message
    if continues and not getattr(backend, "continues_chat", False):
        message = f"{backend.name}: this deployment cannot continue a final assistant message"
        return BackendError(400, message, False, False, param="continue_final_message")
    check = getattr(backend, "refusal", None)  # local engines know their context and template
    if check is None:
        return None
    try:
        return await check(request)
    except Exception:  # a check that fails must not take the chain down: the call will tell
        logger.exception("%s: checking the request failed", backend.name)
        return None


def _serves(tier: TierBackends, model: str) -> bool:
    return any(d.model == model for d, _ in tier.backends)


def all_failed(failures: list[BackendError]) -> BackendError:
    """One error for the caller: 504 if all timed out, 429/503 if all said so, else 502."""
    statuses = {f.status for f in failures}
    status = statuses.pop() if len(statuses) == 1 and statuses <= {429, 503, 504} else 502
    if not failures:
        return BackendError(503, "no deployment is available", False, False)
    waits = [f.retry_after for f in failures if f.retry_after is not None]
    detail = "; ".join(f.message for f in failures)
    return BackendError(
        status, f"all deployments failed: {detail}", False, False, min(waits, default=None)
    )


class FallbackChain:
    def __init__(
        self,
        tiers: dict[str, TierBackends],
        cooldowns: Cooldowns,
        on_failure: OnFailure | None = None,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        balancer: Balancer | None = None,
        on_resume: OnResume | None = None,
    ) -> None:
        self.tiers = tiers
        self._cooldowns = cooldowns
        self.balancer = balancer or Balancer()
        self._on_failure = on_failure or (lambda tier, model, error: None)
        self._on_resume = on_resume or (lambda tier, served_tier, outcome: None)
        self._sleep = sleep

    def chain(self, tier_name: str) -> list[TierBackends]:
        """The tier, its fallback, that one's fallback... (the policy forbids cycles)."""
        out = []
        name: str | None = tier_name
        while name is not None:
            out.append(self.tiers[name])
            name = self.tiers[name].tier.fallback
        return out

    def _candidates(
        self,
        tier_name: str,
        deployment: str | None,
        prefixes: Prefixes | None,
        exclude: frozenset[str] = frozenset(),
    ) -> list[tuple[TierBackends, Deployment, Backend]]:
        """Each tier's replicas in its balance order, then the next tier's."""
        if deployment is not None:  # a named deployment is pinned: no other model answers
            tiers = [t for t in self.tiers.values() if _serves(t, deployment)]
        else:
            tiers = self.chain(tier_name)
        out = []
        for tier in tiers:
            pairs = [
                (d, b)
                for d, b in tier.backends
                if deployment in (None, d.model) and deployment_key(d) not in exclude
            ]
            keys = [deployment_key(d) for d, _ in pairs]
            order = self.balancer.order(
                tier.name, tier.tier.balance, keys, prefixes, tier.tier.affinity_slack
            )
            out += [(tier, *pairs[i]) for i in order]
        return out

    async def open(
        self,
        request: GenerationRequest,
        tier_name: str,
        deployment: str | None = None,
        resume: bool = False,
        exclude: frozenset[str] = frozenset(),
    ) -> Served:
        """Find a deployment that starts answering; raises BackendError when none does.

        resume: a failure mid-answer continues it on another deployment (not in `exclude`).
        """
        served = await self._open(request, tier_name, deployment, exclude)
        if resume and resumable(request):

            async def reopen(again: GenerationRequest, tried: frozenset[str]) -> Reopened:
                more = await self._open(again, tier_name, deployment, tried)
                return Reopened(more.pieces, more.tier, more.key)

            served.pieces = Resuming(
                served.pieces, request, served.tier, served.key, reopen, self._on_resume
            )
        return served

    async def _open(
        self,
        request: GenerationRequest,
        tier_name: str,
        deployment: str | None,
        exclude: frozenset[str],
    ) -> Served:
        tiers = self.chain(tier_name) if deployment is None else self.tiers.values()
        affinity = any(t.tier.balance == "prefix_affinity" for t in tiers)
        prefixes = prefixes_of(request) if affinity else None
        candidates = self._candidates(tier_name, deployment, prefixes, exclude)
        tenant = request.tenant

        def ready(dep: Deployment) -> bool:
            key = deployment_key(dep)
            return not self._cooldowns.cooling(key, tenant) and not self.balancer.is_down(key)

        # When everything that can hold the request is cooling down or down, trying anyway
        # beats a certain error.
        flags = [ready(dep) for _, dep, _ in candidates]
        ready_ones = [c for c, up in zip(candidates, flags, strict=True) if up]
        cooling = [c for c, up in zip(candidates, flags, strict=True) if not up]
        failures: list[BackendError] = []
        refusals: list[BackendError] = []  # from deployments that could never answer it
        for group in (ready_ones, cooling):
            served, tried = await self._try_group(request, group, failures, refusals, prefixes)
            if served is not None:
                return served
            # The cooling ones are for when no ready one could take it, or every one tried
            # proved unwell (a refused connection): a busy replica that missed a health probe
            # may still answer, where stopping here is a certain 502.
            if tried and not all(f.deployment_fault for f in failures):
                break
        # A timeout is the caller's answer, not a 400 from a tier that could never answer.
        raise all_failed(failures) if failures or not refusals else refusals[0]

    async def _try_group(
        self,
        request: GenerationRequest,
        group: list[tuple[TierBackends, Deployment, Backend]],
        failures: list[BackendError],
        refusals: list[BackendError],
        prefixes: Prefixes | None,
    ) -> tuple[Served | None, bool]:
        """The group's deployments in order, skipping those that cannot take the request:
        the one that answers (or None), and whether any was tried."""
        tried = False
        for tier, dep, backend in group:
            if (refused := await refusal(dep, backend, request)) is not None:
                refusals.append(refused)
                continue
            try:
                served = await self._try(request, tier, dep, backend, failures, prefixes)
            except BackendError as exc:
                if exc.code != CONTEXT_EXCEEDED:
                    raise
                refusals.append(exc)  # a remote's context that was too small after all
                continue
            tried = True
            if served is not None:
                return served, True
        return None, tried

    async def _try(
        self,
        request: GenerationRequest,
        tier: TierBackends,
        dep: Deployment,
        backend: Backend,
        failures: list[BackendError],
        prefixes: Prefixes | None = None,
    ) -> Served | None:
        timeout_s = dep.timeout_s or tier.tier.timeout_s
        key = deployment_key(dep)
        cooldown_s = tier.tier.cooldown_s
        blamed: str | None = request.tenant  # None once a failure is the deployment's own
        for attempt in range(tier.tier.retries + 1):
            if attempt:
                await self._sleep(tier.tier.backoff_s * 2 ** (attempt - 1))
            # Owned from now, not from the first piece: requests for the same prefix that
            # arrive while this one is being prefilled should queue behind it, not elsewhere.
            self.balancer.started(key)
            self.balancer.served(tier.name, prefixes, key)
            try:
                pieces, first = await _first_piece(backend, request, timeout_s)
            except BackendError as exc:
                self.balancer.finished(key)
                self._on_failure(tier.name, backend.name, exc)
                if not exc.fallback:
                    raise
                failures.append(exc)
                if exc.deployment_fault:
                    blamed = None
                # An overloaded deployment says when to come back (a local engine's queue
                # drains in about a second); waiting the full cooldown would idle it.
                if exc.retry_after is not None:
                    cooldown_s = min(tier.tier.cooldown_s, exc.retry_after)
                if not exc.retry:
                    break
                continue
            except BaseException:  # cancelled while waiting: the request is gone
                self.balancer.finished(key)
                raise
            done = functools.partial(self.balancer.finished, key)
            answer = _Answer(pieces, first, backend.name, timeout_s, done)
            price = tier.prices.get(dep.model, tier.tier.price)
            complete = answer.complete
            return Served(tier.name, backend.name, price, answer, failures, complete, key)
        self._cooldowns.trip(key, cooldown_s, blamed)
        return None
