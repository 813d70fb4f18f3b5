"""A remote that speaks OpenAI's API itself (vLLM, SGLang, our engine server, OpenAI).

litellm translates between providers; for a server that already speaks OpenAI there is
nothing to translate, and litellm's per-call work (~2 ms CPU here) would be most of the
gateway's overhead. This client sends the validated body's allowed fields (forward.py)
over one shared httpx pool and reads the answer or the SSE stream directly.
"""

import json
import logging
import os
from collections.abc import AsyncIterator
from typing import Any

import httpx

from engine.entrypoints.openai.protocol import Usage
from gateway.backends.base import (
    CONTEXT_EXCEEDED,
    BackendError,
    GenerationRequest,
    Piece,
    parse_retry_after,
)
from gateway.backends.forward import (
    SALTED_PROVIDERS,
    forwarded_messages,
    sampling_fields,
    tenant_cache_salt,
)
from gateway.backends.upstream import choice_piece
from gateway.policy import Deployment

logger = logging.getLogger("tiergate.remote")

NATIVE_PROVIDERS = {"hosted_vllm", "openai"}  # litellm prefixes of OpenAI-speaking servers
_OPENAI_BASE = "https://api.openai.com/v1"


def status_error(status: int, text: str, model: str, retry_after: str | None) -> BackendError:
    """Sort an upstream HTTP error: the caller's fault, retry here, or try elsewhere."""
    logger.warning("%s answered HTTP %d: %s", model, status, text[:1000])
    message = f"{model}: upstream answered HTTP {status}"
    wait = parse_retry_after(retry_after)
    if status in (400, 413, 422):
        code = CONTEXT_EXCEEDED if upstream_code(text) == CONTEXT_EXCEEDED else None
        return BackendError(400, upstream_message(text) or message, False, False, code=code)
    if status in (429, 503):  # overloaded whoever asks: everyone waits
        return BackendError(status, message, True, True, wait, deployment_fault=True)
    if status >= 500 or status == 408:
        return BackendError(502, message, retry=True, fallback=True)
    # 401/403/404: misconfigured (key, model name, api_base)
    return BackendError(502, message, retry=False, fallback=True, deployment_fault=True)


def upstream_message(text: str) -> str | None:
    """The `error.message` of an upstream's OpenAI error body (the caller's own mistake)."""
    try:
        message = json.loads(text)["error"]["message"]
    except (ValueError, KeyError, TypeError):
        return None
    return message[:500] if isinstance(message, str) else None


def upstream_code(text: str) -> str | None:
    try:
        code = json.loads(text)["error"]["code"]
    except (ValueError, KeyError, TypeError):
        return None
    return code if isinstance(code, str) else None


def usage_of(raw: dict[str, Any] | None, salted: bool) -> Usage | None:
    if not raw or raw.get("prompt_tokens") is None:
        return None
    # Unsalted, an upstream's cached-token count would tell a tenant what others sent.
    cached = (raw.get("prompt_tokens_details") or {}).get("cached_tokens") or 0 if salted else 0
    return Usage.of(raw["prompt_tokens"], raw.get("completion_tokens") or 0, cached)


def missing_key(model: str, env: str) -> BackendError:
    logger.error("%s: environment variable %s is not set", model, env)
    return BackendError(502, f"{model}: not configured (no API key)", False, True, None, True)


class OpenAICompatBackend:
    def __init__(
        self,
        deployment: Deployment,
        timeout_s: float,
        client: httpx.AsyncClient,
        salt_secret: str | None = None,
    ) -> None:
        self.name = deployment.model
        self._served_name = deployment.model.split("/", 1)[1]
        self._base = (deployment.api_base or _OPENAI_BASE).rstrip("/")
        self._key_env = deployment.api_key_env
        self._timeout = httpx.Timeout(timeout_s, connect=min(timeout_s, 10.0))
        self._client = client
        self._salted = deployment.model.split("/", 1)[0] in SALTED_PROVIDERS
        self._salt_secret = salt_secret
        # vLLM-style servers continue a final assistant message and report usage mid-stream
        self.continues_chat = self._salted

    def _headers(self) -> dict[str, str]:
        if self._key_env is None:
            return {}
        key = os.environ.get(self._key_env)
        if not key:
            raise missing_key(self.name, self._key_env)
        return {"Authorization": f"Bearer {key}"}

    def _payload(self, request: GenerationRequest) -> dict[str, Any]:
        body = request.body
        payload: dict[str, Any] = {"model": self._served_name, "stream": body.stream}
        if request.is_chat:
            payload["messages"] = forwarded_messages(request)
        else:
            payload["prompt"] = body.prompt  # type: ignore[union-attr]
        payload |= sampling_fields(request, vllm=self._salted)
        if self._salted:
            payload["cache_salt"] = tenant_cache_salt(request.tenant, self._salt_secret)
        if body.stream:  # tokens and cost are counted; mid-stream too where the server can
            payload["stream_options"] = {"include_usage": True}
            if self._salted:
                payload["stream_options"]["continuous_usage_stats"] = True
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
        except httpx.ConnectError as exc:  # nothing listening: down for everyone
            logger.warning("%s: cannot connect to %s: %s", self.name, self._base, exc)
            message = f"{self.name}: could not be reached"
            raise BackendError(502, message, True, True, deployment_fault=True) from None
        except httpx.HTTPError as exc:
            logger.warning("%s: %s: %s", self.name, type(exc).__name__, exc)
            message = f"{self.name}: the connection failed"
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
                for piece in self._whole(await response.aread(), request.is_chat):
                    yield piece
        except httpx.HTTPError as exc:
            logger.warning("%s: %s: %s", self.name, type(exc).__name__, exc)
            message = f"{self.name}: the connection failed"
            raise BackendError(502, message, retry=False, fallback=True) from None
        finally:
            await response.aclose()  # done or abandoned: closing the connection aborts upstream

    def _whole(self, raw: bytes, is_chat: bool) -> list[Piece]:
        """One piece per choice; the last carries the usage."""
        try:
            answer = json.loads(raw)
            pieces = [choice_piece(choice, is_chat, whole=True) for choice in answer["choices"]]
            pieces[-1].usage = usage_of(answer.get("usage"), self._salted)
            return pieces
        except (ValueError, KeyError, IndexError, TypeError, AttributeError) as exc:
            raise self._malformed(exc, raw) from None

    def _malformed(self, exc: Exception, raw: bytes | str) -> BackendError:
        logger.warning("%s sent a malformed answer (%s): %r", self.name, exc, raw[:300])
        return BackendError(502, f"{self.name}: malformed answer", retry=False, fallback=True)

    async def _stream(self, response: httpx.Response, is_chat: bool) -> AsyncIterator[Piece]:
        async for line in response.aiter_lines():
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                continue  # read on to the body's end, so the connection returns to the pool
            try:
                pieces = self._stream_pieces(json.loads(data), is_chat)
            except (ValueError, KeyError, IndexError, TypeError, AttributeError) as exc:
                # Before the first piece the chain may still try elsewhere; after it, the
                # error ends the caller's stream with an SSE error event.
                raise self._malformed(exc, data) from None
            for piece in pieces:
                yield piece

    def _stream_pieces(self, chunk: dict[str, Any], is_chat: bool) -> list[Piece]:
        """A chunk's pieces, one per choice in it (the usage on the last)."""
        if "error" in chunk:
            logger.warning("%s: error in stream: %s", self.name, chunk["error"])
            raise BackendError(502, f"{self.name}: failed mid-stream", False, False)
        usage = usage_of(chunk.get("usage"), self._salted)
        pieces = [choice_piece(c, is_chat, whole=False) for c in chunk.get("choices") or []]
        if pieces and usage is not None and self._salted:  # continuous_usage_stats: so far
            for piece in pieces:
                piece.so_far = usage
            usage = None
        pieces = [p for p in pieces if p.says or p.finish_reason]
        if usage is not None:
            pieces = pieces or [Piece()]
            pieces[-1].usage = usage
        return pieces
