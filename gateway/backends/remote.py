"""A remote deployment through litellm: any litellm model string, api_base, key from env.

litellm takes seconds to import: the gateway imports it (in a thread) at start-up or reload
only when a policy has litellm deployments, and a policy without them never pays for it.
"""

import asyncio
import functools
import os
from collections.abc import AsyncIterator
from types import ModuleType
from typing import Any

from engine.protocol import Usage
from gateway.backends.base import BackendError, GenerationRequest, Piece
from gateway.policy import Deployment

# Request fields litellm maps for every provider; anything else goes in extra_body.
_OPENAI_PARAMS = {
    "temperature",
    "top_p",
    "max_tokens",
    "max_completion_tokens",
    "stop",
    "seed",
    "presence_penalty",
    "frequency_penalty",
    "user",
    "tools",
    "tool_choice",
    "response_format",
}
_NOT_FORWARDED = {
    "model",
    "messages",
    "prompt",
    "stream",
    "stream_options",
    "n",
    "logprobs",
    "echo",
}
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


def _split_params(body: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    fields = body.model_dump(exclude_unset=True, exclude_none=True, exclude=_NOT_FORWARDED)
    known = {k: v for k, v in fields.items() if k in _OPENAI_PARAMS}
    extra = {k: v for k, v in fields.items() if k not in _OPENAI_PARAMS}
    return known, extra


def _status_of(exc: Exception) -> int | None:
    status = getattr(exc, "status_code", None)
    return status if isinstance(status, int) else None


def to_backend_error(exc: Exception, model: str) -> BackendError:
    """Sort litellm's exceptions into: the caller's fault, retry here, or try elsewhere."""
    llm_errors = load_litellm().exceptions
    where = f"{model}: {type(exc).__name__}: {exc}"
    if isinstance(exc, llm_errors.Timeout | asyncio.TimeoutError):
        return BackendError(504, f"{model}: timed out", retry=True, fallback=True)
    if isinstance(exc, llm_errors.RateLimitError):
        return BackendError(429, where, retry=True, fallback=True, retry_after=_retry_after(exc))
    if isinstance(exc, llm_errors.ContextWindowExceededError | llm_errors.BadRequestError):
        return BackendError(400, str(exc), retry=False, fallback=False)
    if isinstance(exc, llm_errors.ServiceUnavailableError):
        return BackendError(503, where, retry=True, fallback=True)
    status = _status_of(exc)
    if isinstance(exc, llm_errors.APIConnectionError) or (status and status >= 500):
        return BackendError(502, where, retry=True, fallback=True)
    # Auth, not found, unknown: this deployment is misconfigured; others may work.
    return BackendError(502, where, retry=False, fallback=True)


def _retry_after(exc: Exception) -> float | None:
    response = getattr(exc, "response", None)
    value = getattr(response, "headers", {}).get("retry-after") if response is not None else None
    try:
        return float(value) if value is not None else None
    except ValueError:
        return None


class RemoteBackend:
    """Calls litellm's acompletion / atext_completion; streams pass through piece by piece."""

    def __init__(self, deployment: Deployment, timeout_s: float) -> None:
        self.name = deployment.model
        self._deployment = deployment
        self._timeout_s = timeout_s
        self._provider = deployment.model.split("/", 1)[0]

    def _api_key(self) -> str | None:
        env = self._deployment.api_key_env
        if env is None:
            return None
        key = os.environ.get(env)
        if not key:
            raise BackendError(
                502, f"{self.name}: environment variable {env} is not set", False, True
            )
        return key

    def _call_kwargs(self, request: GenerationRequest) -> dict[str, Any]:
        known, extra = _split_params(request.body)
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
            messages = [m.model_dump(exclude_none=True) for m in request.body.messages]
            return await litellm.acompletion(messages=messages, **kwargs)
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
            yield _whole_answer(response, request.is_chat)
            return
        try:
            async for chunk in response:
                piece = _stream_piece(chunk, request.is_chat)
                if piece is not None:
                    yield piece
        except Exception as exc:
            raise to_backend_error(exc, self.name) from exc
        finally:
            await _close_stream(response)  # the client went away or we are done: free upstream


async def _close_stream(stream: Any) -> None:
    # litellm's text-completion wrapper has no aclose; the chat stream it wraps does.
    while stream is not None and not hasattr(stream, "aclose"):
        stream = getattr(stream, "completion_stream", None)
    if stream is not None:
        await stream.aclose()


def _usage(raw: Any) -> Usage | None:
    if raw is None or getattr(raw, "prompt_tokens", None) is None:
        return None
    details = getattr(raw, "prompt_tokens_details", None)
    cached = getattr(details, "cached_tokens", 0) or 0
    return Usage.of(raw.prompt_tokens, raw.completion_tokens or 0, cached)


def _whole_answer(response: Any, is_chat: bool) -> Piece:
    choice = response.choices[0]
    text = choice.message.content if is_chat else choice.text
    return Piece(text or "", choice.finish_reason or "stop", _usage(response.usage))


def _stream_piece(chunk: Any, is_chat: bool) -> Piece | None:
    usage = _usage(getattr(chunk, "usage", None))
    if not chunk.choices:
        return Piece(usage=usage) if usage else None
    choice = chunk.choices[0]
    text = (choice.delta.content if is_chat else choice.text) or ""
    if not text and choice.finish_reason is None and usage is None:
        return None
    return Piece(text, choice.finish_reason, usage)
