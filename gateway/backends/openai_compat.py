"""A remote that speaks OpenAI's API itself (vLLM, SGLang, our engine server, OpenAI).

litellm translates between providers; for a server that already speaks OpenAI there is
nothing to translate, and litellm's per-call work (~2 ms CPU here) would be most of the
gateway's overhead. This client forwards the validated body as is over one shared
httpx pool and reads the answer or the SSE stream directly.
"""

import json
import os
from collections.abc import AsyncIterator
from typing import Any

import httpx

from engine.protocol import Usage
from gateway.backends.base import BackendError, GenerationRequest, Piece
from gateway.policy import Deployment

NATIVE_PROVIDERS = {"hosted_vllm", "openai"}  # litellm prefixes of OpenAI-speaking servers
_OPENAI_BASE = "https://api.openai.com/v1"


def status_error(status: int, text: str, model: str, retry_after: str | None) -> BackendError:
    """Sort an upstream HTTP error: the caller's fault, retry here, or try elsewhere."""
    message = f"{model}: HTTP {status}: {text[:300]}"
    wait = float(retry_after) if retry_after and retry_after.isdigit() else None
    if status in (400, 413, 422):
        return BackendError(400, _upstream_message(text) or message, retry=False, fallback=False)
    if status == 429:
        return BackendError(429, message, retry=True, fallback=True, retry_after=wait)
    if status == 503:
        return BackendError(503, message, retry=True, fallback=True, retry_after=wait)
    if status >= 500 or status == 408:
        return BackendError(502, message, retry=True, fallback=True)
    return BackendError(502, message, retry=False, fallback=True)  # 401/403/404: misconfigured


def _upstream_message(text: str) -> str | None:
    try:
        return json.loads(text)["error"]["message"]
    except (ValueError, KeyError, TypeError):
        return None


def _usage(raw: dict[str, Any] | None) -> Usage | None:
    if not raw or raw.get("prompt_tokens") is None:
        return None
    cached = (raw.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
    return Usage.of(raw["prompt_tokens"], raw.get("completion_tokens") or 0, cached)


def _choice_text(choice: dict[str, Any], is_chat: bool) -> str:
    if not is_chat:
        return choice.get("text") or ""
    return (choice.get("delta") or choice.get("message") or {}).get("content") or ""


class OpenAICompatBackend:
    def __init__(self, deployment: Deployment, timeout_s: float, client: httpx.AsyncClient) -> None:
        self.name = deployment.model
        self._served_name = deployment.model.split("/", 1)[1]
        self._base = (deployment.api_base or _OPENAI_BASE).rstrip("/")
        self._key_env = deployment.api_key_env
        self._timeout = httpx.Timeout(timeout_s, connect=min(timeout_s, 10.0))
        self._client = client

    def _headers(self) -> dict[str, str]:
        if self._key_env is None:
            return {}
        key = os.environ.get(self._key_env)
        if not key:
            message = f"{self.name}: environment variable {self._key_env} is not set"
            raise BackendError(502, message, retry=False, fallback=True)
        return {"Authorization": f"Bearer {key}"}

    def _payload(self, request: GenerationRequest) -> dict[str, Any]:
        payload = request.body.model_dump(exclude_unset=True, exclude_none=True)
        payload["model"] = self._served_name
        if request.body.stream:
            payload["stream_options"] = {"include_usage": True}  # tokens and cost are counted
        return payload

    async def generate(self, request: GenerationRequest) -> AsyncIterator[Piece]:
        path = "/chat/completions" if request.is_chat else "/completions"
        http_request = self._client.build_request(
            "POST",
            self._base + path,
            json=self._payload(request),
            headers=self._headers(),
            timeout=self._timeout,
        )
        try:
            response = await self._client.send(http_request, stream=True)
        except httpx.TimeoutException:
            raise BackendError(504, f"{self.name}: timed out", retry=True, fallback=True) from None
        except httpx.HTTPError as exc:
            message = f"{self.name}: {type(exc).__name__}: {exc}"
            raise BackendError(502, message, retry=True, fallback=True) from None
        try:
            if response.status_code >= 400:
                text = (await response.aread()).decode(errors="replace")
                retry_after = response.headers.get("retry-after")
                raise status_error(response.status_code, text, self.name, retry_after)
            if request.body.stream:
                async for piece in self._stream(response, request.is_chat):
                    yield piece
            else:
                answer = json.loads(await response.aread())
                choice = answer["choices"][0]
                text = _choice_text(choice, request.is_chat)
                finish = choice.get("finish_reason") or "stop"
                yield Piece(text, finish, _usage(answer.get("usage")))
        except httpx.HTTPError as exc:
            message = f"{self.name}: {type(exc).__name__}: {exc}"
            raise BackendError(502, message, retry=False, fallback=True) from None
        finally:
            await response.aclose()  # done or abandoned: closing the connection aborts upstream

    async def _stream(self, response: httpx.Response, is_chat: bool) -> AsyncIterator[Piece]:
        async for line in response.aiter_lines():
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                continue  # read on to the body's end, so the connection returns to the pool
            chunk = json.loads(data)
            if "error" in chunk:
                message = f"{self.name}: {chunk['error'].get('message', 'stream error')}"
                raise BackendError(502, message, retry=False, fallback=False)
            usage = _usage(chunk.get("usage"))
            choices = chunk.get("choices") or []
            if not choices:
                if usage is not None:
                    yield Piece(usage=usage)
                continue
            text = _choice_text(choices[0], is_chat)
            finish = choices[0].get("finish_reason")
            if text or finish or usage:
                yield Piece(text, finish, usage)
