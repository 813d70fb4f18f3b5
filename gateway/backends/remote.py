"""A remote deployment through litellm: any litellm model string, api_base, key from env.

litellm takes seconds to import: the gateway imports it (in a thread) at start-up or reload
only when a policy has litellm deployments, and a policy without them never pays for it.
"""

import asyncio
import functools
import logging
import os
from collections.abc import AsyncIterator
from types import ModuleType
from typing import Any

from engine.entrypoints.openai.protocol import Usage
from gateway.backends.base import (
    CONTEXT_EXCEEDED,
    BackendError,
    GenerationRequest,
    Piece,
    parse_retry_after,
)
from gateway.backends.forward import (
    OPENAI_FIELDS,
    SALTED_PROVIDERS,
    forwarded_messages,
    sampling_fields,
    tenant_cache_salt,
)
from gateway.backends.openai_compat import missing_key, upstream_message
from gateway.backends.upstream import choice_piece
from gateway.policy import Deployment

logger = logging.getLogger("tiergate.remote")

# Providers that speak OpenAI's /v1/completions natively; litellm would otherwise turn a
# text prompt into a chat message, which applies a chat template the caller did not ask for.
_NATIVE_TEXT_PROVIDERS = {"hosted_vllm", "openai", "text-completion-openai"}


@functools.cache
def load_litellm() -> ModuleType:
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no network at import
    import litellm

    litellm.suppress_debug_info = True  # its "give feedback" banners would flood the log
    return litellm


async def _litellm_loaded() -> ModuleType:
    """litellm, imported in a worker thread the first time so the event loop keeps serving."""
    if load_litellm.cache_info().currsize:
        return load_litellm()
    return await asyncio.to_thread(load_litellm)


def to_backend_error(exc: Exception, model: str) -> BackendError:
    """Sort litellm's exceptions into: the caller's fault, retry here, or try elsewhere.

    litellm's messages name hosts and wrap upstream bodies: they go to the log only.
    """
    llm_errors = load_litellm().exceptions
    logger.warning("%s failed: %s: %s", model, type(exc).__name__, exc)
    if isinstance(exc, llm_errors.Timeout | asyncio.TimeoutError):
        return BackendError(504, f"{model}: timed out", retry=True, fallback=True)
    if isinstance(exc, llm_errors.RateLimitError):
        wait = _retry_after(exc)
        return BackendError(429, f"{model}: rate limited", True, True, wait, deployment_fault=True)
    if isinstance(exc, llm_errors.ContextWindowExceededError | llm_errors.BadRequestError):
        text = getattr(getattr(exc, "response", None), "text", "")
        message = upstream_message(text) or f"{model}: the request was refused as invalid"
        too_long = isinstance(exc, llm_errors.ContextWindowExceededError)
        return BackendError(400, message, False, False, code=CONTEXT_EXCEEDED if too_long else None)
    if isinstance(exc, llm_errors.ServiceUnavailableError):
        wait = _retry_after(exc)
        return BackendError(503, f"{model}: unavailable", True, True, wait, deployment_fault=True)
    status = _status_of(exc)
    if isinstance(exc, llm_errors.APIConnectionError) or (status and status >= 500):
        return BackendError(502, f"{model}: failed", retry=True, fallback=True)
    # Auth, not found, unknown: this deployment is misconfigured; others may work.
    message = f"{model}: failed (misconfigured?)"
    return BackendError(502, message, retry=False, fallback=True, deployment_fault=True)


def _status_of(exc: Exception) -> int | None:
    status = getattr(exc, "status_code", None)
    return status if isinstance(status, int) else None


def _retry_after(exc: Exception) -> float | None:
    # litellm keeps the upstream's headers apart; its `response` is a stand-in without them.
    headers = getattr(exc, "litellm_response_headers", None) or {}
    return parse_retry_after(headers.get("retry-after"))


class RemoteBackend:
    """Calls litellm's acompletion / atext_completion; streams pass through piece by piece."""

    def __init__(
        self, deployment: Deployment, timeout_s: float, salt_secret: str | None = None
    ) -> None:
        self.name = deployment.model
        self._deployment = deployment
        self._timeout_s = timeout_s
        self._provider = deployment.model.split("/", 1)[0]
        self._salted = self._provider in SALTED_PROVIDERS
        self._salt_secret = salt_secret

    def _api_key(self) -> str | None:
        env = self._deployment.api_key_env
        if env is None:
            return None
        key = os.environ.get(env)
        if not key:
            raise missing_key(self.name, env)
        return key

    def _call_kwargs(self, request: GenerationRequest) -> dict[str, Any]:
        fields = sampling_fields(request, vllm=self._salted)
        known = {k: v for k, v in fields.items() if k in OPENAI_FIELDS}
        # vLLM's own fields travel in the body litellm sends as is; other providers get none.
        extra = {k: v for k, v in fields.items() if k not in OPENAI_FIELDS}
        if self._salted:
            extra["cache_salt"] = tenant_cache_salt(request.tenant, self._salt_secret)
        kwargs: dict[str, Any] = {
            "model": self.name,
            "api_base": self._deployment.api_base,
            "api_key": self._api_key(),
            "timeout": self._timeout_s,
            "num_retries": 0,  # retries, backoff and cooldown are the fallback chain's job
            "stream": request.body.stream,
            **known,
        }
        if extra:
            kwargs["extra_body"] = extra
        if request.body.stream:
            kwargs["stream_options"] = {"include_usage": True}  # tokens and cost are counted
        return {k: v for k, v in kwargs.items() if v is not None}

    async def _call(self, request: GenerationRequest) -> Any:
        litellm = await _litellm_loaded()
        kwargs = self._call_kwargs(request)
        if request.is_chat:
            return await litellm.acompletion(messages=forwarded_messages(request), **kwargs)
        if self._provider in _NATIVE_TEXT_PROVIDERS and self._deployment.api_base:
            kwargs["model"] = "text-completion-openai/" + self.name.split("/", 1)[1]
            # Self-hosted servers take any key, but litellm's OpenAI client insists on one.
            kwargs.setdefault("api_key", "none")
        return await litellm.atext_completion(prompt=request.body.prompt, **kwargs)

    async def generate(self, request: GenerationRequest) -> AsyncIterator[Piece]:
        try:
            response = await self._call(request)
        except BackendError:
            raise
        except Exception as exc:
            raise to_backend_error(exc, self.name) from exc
        if not request.body.stream:
            try:
                pieces = _whole_answer(response, request.is_chat, self._salted)
            except (AttributeError, IndexError, TypeError) as exc:
                logger.warning("%s sent a malformed answer: %r", self.name, exc)
                raise BackendError(502, f"{self.name}: malformed answer", False, True) from exc
            for piece in pieces:
                yield piece
            return
        started, finished = set(), set()
        try:
            async for chunk in response:
                for piece in _stream_pieces(chunk, request.is_chat, self._salted):
                    started.add(piece.index)
                    if piece.finish_reason is not None:
                        finished.add(piece.index)
                    yield piece
            # litellm's stream passes on only the first finish reason of an n > 1 answer;
            # the stream itself ended well (litellm checks that), so the others stopped too.
            if finished:
                for index in sorted(started - finished):
                    yield Piece("", "stop", index=index)
        except Exception as exc:  # litellm's own check of a cut stream lands here too
            raise to_backend_error(exc, self.name) from exc
        finally:
            await _close_stream(response)  # the client went away or we are done: free upstream


async def _close_stream(stream: Any) -> None:
    # litellm's text-completion wrapper has no aclose; the chat stream it wraps does.
    while stream is not None and not hasattr(stream, "aclose"):
        stream = getattr(stream, "completion_stream", None)
    if stream is not None:
        await stream.aclose()


def _usage(raw: Any, salted: bool) -> Usage | None:
    if raw is None or getattr(raw, "prompt_tokens", None) is None:
        return None
    details = getattr(raw, "prompt_tokens_details", None)
    # Unsalted, an upstream's cached-token count would tell a tenant what others sent.
    cached = (getattr(details, "cached_tokens", 0) or 0) if salted else 0
    return Usage.of(raw.prompt_tokens, raw.completion_tokens or 0, cached)


def _as_dict(choice: Any) -> dict[str, Any]:
    # litellm's choices are pydantic models: dumped, they read like the JSON they came from
    return choice if isinstance(choice, dict) else choice.model_dump()


def _whole_answer(response: Any, is_chat: bool, salted: bool) -> list[Piece]:
    """One piece per choice; the last carries the usage."""
    pieces = [choice_piece(_as_dict(c), is_chat, whole=True) for c in response.choices]
    pieces[-1].usage = _usage(response.usage, salted)  # no choices: IndexError, malformed
    return pieces


def _stream_pieces(chunk: Any, is_chat: bool, salted: bool) -> list[Piece]:
    """A chunk's pieces, one per choice in it (the usage on the last)."""
    usage = _usage(getattr(chunk, "usage", None), salted)
    pieces = [choice_piece(_as_dict(c), is_chat, whole=False) for c in chunk.choices or []]
    pieces = [p for p in pieces if p.says or p.finish_reason]
    if usage is not None:
        pieces = pieces or [Piece()]
        pieces[-1].usage = usage
    return pieces
