"""Local deployments: the project's AsyncEngine in this process, each model loaded once.

`LocalEngines` owns the engines (several tiers and deployments may name the same one);
`LocalBackend` turns an OpenAI request into a prompt and sampling settings for one engine.
"""

import asyncio
import contextlib
import gc
import inspect
import itertools
import logging
import time
import weakref
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

from engine.config import EngineConfig
from engine.entrypoints.choices import (
    Child,
    choice_params,
    close_all,
    drain,
    interleave,
    start_children,
    usage_of,
)
from engine.entrypoints.openai.best_of import candidate_params, pick_best, ranks
from engine.entrypoints.openai.chat_template import prompt_ids
from engine.entrypoints.openai.errors import RETRY_AFTER_SECONDS, engine_error_status
from engine.entrypoints.openai.protocol import to_sampling_params
from engine.errors import EngineError, TenantQueueFullError
from gateway.backends.base import INTERACTIVE, BackendError, GenerationRequest, Piece
from gateway.policy import EngineSettings

logger = logging.getLogger("tiergate.local")

EngineFactory = Callable[[EngineConfig], Any]  # returns an AsyncEngine (or a test double)
_RELEASE_POLL_S = 0.1
# A request holds its policy's objects from its first byte to its last; past this with
# nothing generating, whatever still holds a retired engine is a leak, not a request.
_MAX_IDLE_HOLD_S = 300.0


def default_engine_factory(config: EngineConfig) -> Any:
    from engine.engine import AsyncEngine  # torch comes in only when a local model is used

    return AsyncEngine(config)


async def _maybe_await(value: Any) -> None:
    if inspect.isawaitable(value):
        await value


def engine_alive(engine: Any) -> bool:
    # A test double that cannot tell counts as alive.
    return bool(getattr(engine, "is_running", True))


@dataclass(eq=False)
class EngineSlot:
    """One engine of the policy under its name. A restart puts a new engine in the slot;
    backends read `engine` per request, so they follow it."""

    name: str
    config: EngineConfig
    engine: Any
    in_flight: int = 0  # requests generating on it now
    restarts: int = 0
    retired: bool = False  # no policy in force uses it: stopped once nothing holds it
    # The LocalBackends built on it: a request that took a policy holds them until it ends.
    holders: weakref.WeakSet = field(default_factory=weakref.WeakSet)
    retry_at: float = 0.0  # after a failed restart, when to try again (monotonic)
    failed_restarts: int = 0  # in a row; the wait before the next try doubles with each

    @property
    def held(self) -> bool:
        return self.in_flight > 0 or len(self.holders) > 0


class LocalEngines:
    """Every engine this process runs. A reload reuses an engine whose name and config are
    unchanged, starts the others, and retires those the new policy no longer uses.

    A retired engine is stopped once nothing holds it (after `retire_grace_s`): requests
    that took the previous policy just before the swap still finish on it. An engine whose
    step loop died is restarted in its slot; its tier's fallback serves meanwhile.
    """

    def __init__(
        self,
        factory: EngineFactory = default_engine_factory,
        retire_grace_s: float = 5.0,
        on_restart: Callable[[str], None] | None = None,
        check_interval_s: float = 0.5,
    ) -> None:
        self._factory = factory
        self._grace_s = retire_grace_s
        self._on_restart = on_restart
        self._check_s = check_interval_s
        self._slots: list[EngineSlot] = []  # running and not retired
        self._active: dict[str, EngineSlot] = {}
        self._tasks: set[asyncio.Task] = set()  # retirements and the supervisor
        self._supervisor: asyncio.Task | None = None
        self._lock = asyncio.Lock()

    async def start(self, engines: dict[str, EngineSettings]) -> dict[str, EngineSlot]:
        """Name -> slot for a policy, starting those not running yet with the same config."""
        async with self._lock:
            out = {}
            for name, settings in engines.items():
                config = settings.to_config(name)
                found = [s for s in self._slots if s.name == name and s.config == config]
                if found:
                    out[name] = found[0]
                    continue
                logger.info("starting local engine %s (%s)", name, config.model)
                slot = EngineSlot(name, config, await self._launch(config))
                self._slots.append(slot)
                out[name] = slot
        if self._supervisor is None:
            self._supervisor = self._spawn(self._supervise())
        return out

    async def _launch(self, config: EngineConfig) -> Any:
        # Loading weights blocks for seconds: keep the event loop serving meanwhile.
        engine = await asyncio.to_thread(self._factory, config)
        await _maybe_await(engine.start())
        return engine

    def activate(self, active: dict[str, EngineSlot]) -> None:
        """Call once the policy using `active` serves: every other engine is retired."""
        self._active = dict(active)
        keep = {id(s) for s in active.values()}
        for slot in [s for s in self._slots if id(s) not in keep]:
            self._slots.remove(slot)
            slot.retired = True
            self._spawn(self._stop_when_released(slot))

    def _spawn(self, coro: Any) -> asyncio.Task:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def _stop_when_released(self, slot: EngineSlot) -> None:
        await asyncio.sleep(self._grace_s)
        idle_polls = 0  # polls in a row with no request on it, yet something holding it
        while slot.held:
            await asyncio.sleep(_RELEASE_POLL_S)
            idle_polls = idle_polls + 1 if slot.in_flight == 0 else 0
            if idle_polls * _RELEASE_POLL_S >= _MAX_IDLE_HOLD_S:
                logger.warning("retired engine %s is still referenced; stopping it", slot.name)
                break
            if idle_polls % 50 == 49:  # maybe a reference cycle: collect it now rather than
                gc.collect()  # whenever the collector would
        logger.info("stopping retired local engine %s", slot.name)
        await _stop(slot.engine)

    async def _supervise(self) -> None:
        while True:
            await asyncio.sleep(self._check_s)
            for slot in list(self._slots):
                if not engine_alive(slot.engine) and time.monotonic() >= slot.retry_at:
                    try:
                        await self._restart(slot)
                    except Exception:  # the supervisor itself must outlive any one failure
                        logger.exception("supervising local engine %s failed", slot.name)

    async def _restart(self, slot: EngineSlot) -> None:
        logger.error("local engine %s died; restarting it", slot.name)
        async with self._lock:
            if slot.retired:
                return
            try:
                await _stop(slot.engine)  # joins the dead loop's thread
                engine = await self._launch(slot.config)
            except Exception:
                slot.failed_restarts += 1
                slot.retry_at = time.monotonic() + min(30.0, 2.0**slot.failed_restarts)
                logger.exception("restarting local engine %s failed", slot.name)
                return
            if slot.retired:  # a reload retired it while the new one loaded
                await _stop(engine)
                return
            slot.engine, slot.failed_restarts = engine, 0
            slot.restarts += 1
        if self._on_restart is not None:
            self._on_restart(slot.name)

    def get(self, name: str) -> Any:
        return self._active[name].engine

    def all(self) -> dict[str, Any]:
        """The engines of the policy in force (what /ready and /metrics report)."""
        return {name: slot.engine for name, slot in self._active.items()}

    def restarts(self) -> dict[str, int]:
        return {name: slot.restarts for name, slot in self._active.items()}

    async def shutdown(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        slots = self._slots
        self._slots, self._active = [], {}
        for slot in slots:
            slot.retired = True
            await _stop(slot.engine)


async def _stop(engine: Any) -> None:
    # shutdown() joins the step thread: keep the event loop free meanwhile.
    await _maybe_await(await asyncio.to_thread(engine.shutdown))


def _engine_error(exc: Exception, name: str) -> BackendError:
    """The engine server's status and code for the error, with what the chain may do next."""
    known = engine_error_status(exc) if isinstance(exc, EngineError) else None
    if known is None:
        if isinstance(exc, ValueError):  # the request's fault: InvalidParamError names the field
            param = getattr(exc, "param", None)
            return BackendError(400, str(exc), retry=False, fallback=False, param=param)
        logger.error("%s failed: %s: %s", name, type(exc).__name__, exc)  # the caller sees less
        return BackendError(502, f"{name}: the engine failed", retry=False, fallback=True)
    status, code = known
    if status == 400:  # the prompt or max_tokens does not fit: the request's fault
        param = getattr(exc, "param", None)
        return BackendError(status, str(exc), retry=False, fallback=False, code=code, param=param)
    if isinstance(exc, TenantQueueFullError):  # this tenant's doing: no cooldown for others
        message, wait = f"{name}: {exc}", RETRY_AFTER_SECONDS
        return BackendError(status, message, False, False, wait, code=code)
    if status == 429:
        message, wait = f"{name}: queue full", RETRY_AFTER_SECONDS
        return BackendError(status, message, True, True, wait, deployment_fault=True, code=code)
    if status == 503:
        message = f"{name}: engine stopped"
        return BackendError(status, message, False, True, deployment_fault=True, code=code)
    # the engine lives on: nothing to fall back from
    return BackendError(status, f"{name}: the engine failed this request", False, False, code=code)


class LocalBackend:
    def __init__(self, name: str, slot: EngineSlot) -> None:
        self.name = name
        self._slot = slot
        slot.holders.add(self)  # a request holding this policy keeps the engine from retiring
        self._attempts = itertools.count()

    async def _prompt(self, engine: Any, request: GenerationRequest) -> list[int]:
        """The prompt's ids, checked against the engine's context and template; rendered once
        per engine for a request (the chain's `refusal` check, then the call)."""
        ids = request.prompts.get(self._slot.name)
        if ids is None:
            ids = await prompt_ids(engine, request.body)
            request.prompts[self._slot.name] = ids
        return ids

    async def refusal(self, request: GenerationRequest) -> BackendError | None:
        """Why this engine cannot take the request at all (its context cannot hold it, its
        template cannot show the tools), before it is tried; None when it can."""
        try:
            await self._prompt(self._slot.engine, request)
        except (EngineError, ValueError) as exc:
            error = _engine_error(exc, self.name)
            return error if error.status == 400 else None  # a dead engine: the call says so
        return None

    async def generate(self, request: GenerationRequest) -> AsyncIterator[Piece]:
        """The request's `n` choices as sibling engine requests (same prompt and salt, so
        they share the prompt's KV pages), their outputs interleaved as they come; with
        `best_of`, that many candidates and the best `n` once all have ended."""
        slot = self._slot
        slot.in_flight += 1  # before any await: a retiring engine must see this request
        children: list[Child] = []
        try:
            engine = slot.engine
            prompt = await self._prompt(engine, request)
            # Without max_tokens an answer may run to the end of the context, chat and text
            # alike, as on the engine's own server (the engine caps it at the room left).
            context = getattr(engine, "max_model_len", None)
            sampling = to_sampling_params(request.body, default_max_tokens=context)
            params = candidate_params(sampling, request.body)
            # One engine id per attempt: a retry must not collide with the last one's abort.
            engine_id = f"{request.request_id}-{next(self._attempts)}"

            # Batch work asks for its priority; interactive calls stay as test doubles know them.
            extra = {"priority": request.priority} if request.priority != INTERACTIVE else {}

            async def start(index: int) -> Child:
                outputs = engine.generate(
                    prompt,
                    choice_params(params, index),
                    f"{engine_id}-{index}" if index else engine_id,
                    cache_salt=request.tenant,
                    **extra,
                )
                return await anext(outputs), outputs

            children = await start_children(start, request.body.candidates())
            if ranks(request.body):
                async for piece in _best_of(children, request):
                    yield piece
                return
            lasts = [first for first, _ in children]
            running = len(children)
            # aclosing: its tasks that read the engine's streams end before those close
            async with contextlib.aclosing(interleave(children)) as outputs:
                async for index, out in outputs:
                    lasts[index] = out
                    if not out.finished:
                        yield Piece(out.text, logprobs=out.logprobs, index=index)
                        continue
                    running -= 1
                    usage = None if running else usage_of(lasts)  # on the answer's last piece
                    yield Piece(out.text, out.finish_reason, usage, out.logprobs, index)
        except (EngineError, ValueError) as exc:
            raise _engine_error(exc, self.name) from exc
        finally:
            await close_all(children)  # closing the engine's generators aborts the requests
            slot.in_flight -= 1


async def _best_of(children: list[Child], request: GenerationRequest) -> AsyncIterator[Piece]:
    """The `n` best candidates, each whole as one piece, once all have ended (never
    streamed: validation refuses `stream` with more candidates than choices)."""
    finals = list(await asyncio.gather(*(drain(first, outputs) for first, outputs in children)))
    best = pick_best(finals, request.body)
    for index, out in enumerate(best):
        usage = usage_of(finals) if index == len(best) - 1 else None  # every candidate's
        yield Piece(out.text, out.finish_reason, usage, out.logprobs, index)
