"""Local deployments: the project's AsyncEngine in this process, each model loaded once.

`LocalEngines` owns the engines (several tiers and deployments may name the same one);
`LocalBackend` turns an OpenAI request into a prompt and sampling settings for one engine.
"""

import asyncio
import inspect
import itertools
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any

from engine.config import EngineConfig
from engine.errors import (
    EngineDeadError,
    EngineError,
    PromptTooLongError,
    QueueFullError,
    TenantQueueFullError,
)
from engine.protocol import Usage, to_sampling_params
from gateway.backends.base import BackendError, GenerationRequest, Piece
from gateway.policy import EngineSettings

logger = logging.getLogger("tiergate.local")

EngineFactory = Callable[[EngineConfig], Any]  # returns an AsyncEngine (or a test double)
_MB = 1024 * 1024


def engine_config(name: str, settings: EngineSettings) -> EngineConfig:
    return EngineConfig(
        model=settings.model or name,
        kv_cache_bytes=settings.kv_cache_mb * _MB,
        page_size=settings.page_size,
        max_num_seqs=settings.max_num_seqs,
        max_num_batched_tokens=settings.max_num_batched_tokens,
        max_waiting=settings.max_waiting,
        max_waiting_per_tenant=settings.max_waiting_per_tenant,
        max_model_len=settings.max_model_len,
        enable_prefix_caching=settings.enable_prefix_caching,
        num_threads=settings.num_threads,
    )


def default_engine_factory(config: EngineConfig) -> Any:
    from engine.engine import AsyncEngine  # torch comes in only when a local model is used

    return AsyncEngine(config)


async def _maybe_await(value: Any) -> None:
    if inspect.isawaitable(value):
        await value


class LocalEngines:
    """Every engine this process runs. A reload reuses an engine whose name and config are
    unchanged, starts the others, and retires those the new policy no longer uses.

    A retired engine is stopped once it has been idle after a grace period: requests that
    took the previous policy just before the swap still finish on it.
    """

    def __init__(
        self, factory: EngineFactory = default_engine_factory, retire_grace_s: float = 5.0
    ) -> None:
        self._factory = factory
        self._grace_s = retire_grace_s
        self._running: list[tuple[str, EngineConfig, Any]] = []
        self._active: dict[str, Any] = {}
        self._retiring: set[asyncio.Task] = set()
        self._lock = asyncio.Lock()

    async def start(self, engines: dict[str, EngineSettings]) -> dict[str, Any]:
        """Name -> engine for a policy, starting those not running yet with the same config."""
        async with self._lock:
            out = {}
            for name, settings in engines.items():
                config = engine_config(name, settings)
                found = [e for n, c, e in self._running if n == name and c == config]
                if found:
                    out[name] = found[0]
                    continue
                logger.info("starting local engine %s (%s)", name, config.model)
                # Loading weights blocks for seconds: keep the event loop serving meanwhile.
                engine = await asyncio.to_thread(self._factory, config)
                await _maybe_await(engine.start())
                self._running.append((name, config, engine))
                out[name] = engine
            return out

    def activate(self, active: dict[str, Any]) -> None:
        """Call once the policy using `active` serves: every other engine is retired."""
        self._active = dict(active)
        keep = {id(e) for e in active.values()}
        for entry in [r for r in self._running if id(r[2]) not in keep]:
            self._running.remove(entry)
            task = asyncio.create_task(self._stop_when_idle(entry[0], entry[2]))
            self._retiring.add(task)
            task.add_done_callback(self._retiring.discard)

    async def _stop_when_idle(self, name: str, engine: Any) -> None:
        await asyncio.sleep(self._grace_s)
        while _busy(engine):
            await asyncio.sleep(1.0)
        logger.info("stopping retired local engine %s", name)
        await _stop(engine)

    def get(self, name: str) -> Any:
        return self._active[name]

    def all(self) -> dict[str, Any]:
        """The engines of the policy in force (what /ready and /metrics report)."""
        return dict(self._active)

    async def shutdown(self) -> None:
        for task in list(self._retiring):
            task.cancel()
        engines = [e for _, _, e in self._running]
        self._running, self._active = [], {}
        for engine in engines:
            await _stop(engine)


def _busy(engine: Any) -> bool:
    snapshot = engine.metrics.snapshot()
    return bool(snapshot.running or snapshot.waiting)


async def _stop(engine: Any) -> None:
    # shutdown() joins the step thread: keep the event loop free meanwhile.
    await _maybe_await(await asyncio.to_thread(engine.shutdown))


def _engine_error(exc: Exception, name: str) -> BackendError:
    if isinstance(exc, PromptTooLongError | ValueError):  # the request's fault: no fallback
        return BackendError(400, str(exc), retry=False, fallback=False)
    if isinstance(exc, TenantQueueFullError):  # this tenant's doing: no cooldown for others
        return BackendError(429, f"{name}: {exc}", retry=False, fallback=False, retry_after=1)
    if isinstance(exc, QueueFullError):
        return BackendError(429, f"{name}: queue full", True, True, 1, deployment_fault=True)
    if isinstance(exc, EngineDeadError):
        return BackendError(503, f"{name}: engine stopped", False, True, deployment_fault=True)
    logger.error("%s failed: %s: %s", name, type(exc).__name__, exc)  # the caller sees less
    return BackendError(502, f"{name}: the engine failed", retry=False, fallback=True)


class LocalBackend:
    def __init__(self, name: str, engine: Any) -> None:
        self.name = name
        self._engine = engine
        self._attempts = itertools.count()

    def _prompt(self, request: GenerationRequest) -> str | list[int]:
        body = request.body
        if not request.is_chat:
            return body.prompt
        messages = [m.template_dict() for m in body.messages]
        tools = [t.model_dump(exclude_none=True) for t in body.tools] if body.tools else None
        try:
            return self._engine.tokenizer.apply_chat_template(
                messages, add_generation_prompt=True, tools=tools
            )
        except Exception as exc:  # the template itself refuses, e.g. roles out of order
            raise BackendError(400, f"chat template: {exc}", retry=False, fallback=False) from exc

    async def generate(self, request: GenerationRequest) -> AsyncIterator[Piece]:
        prompt = self._prompt(request)
        try:
            params = to_sampling_params(request.body)
        except ValueError as exc:
            raise BackendError(400, str(exc), retry=False, fallback=False) from exc
        # One engine id per attempt: a retry must not collide with the abort of the last one.
        engine_id = f"{request.request_id}-{next(self._attempts)}"
        outputs = self._engine.generate(prompt, params, engine_id, cache_salt=request.tenant)
        try:
            async for out in outputs:
                if not out.finished:
                    yield Piece(out.text)
                    continue
                usage = Usage.of(out.prompt_tokens, out.completion_tokens, out.cached_tokens)
                yield Piece(out.text, out.finish_reason, usage)
        except (EngineError, ValueError) as exc:
            raise _engine_error(exc, self.name) from exc
        finally:
            await outputs.aclose()  # closing the engine's generator aborts the request
