"""Bearer keys: read from the Authorization header and compared as bytes in constant time.

Shared by the engine server (`tiergate engine --api-key`) and the gateway. Comparing bytes
matters: `hmac.compare_digest` refuses non-ASCII str, which turned a non-ASCII token into
a 500 instead of a 401.
"""

import hmac
import json

from starlette.datastructures import Headers
from starlette.types import ASGIApp, Receive, Scope, Send

from engine.entrypoints.openai.error_bodies import error_response_body


def bearer_token(authorization: str) -> bytes | None:
    """The token of `Bearer <token>` as the bytes sent; None when there is none."""
    scheme, _, token = authorization.partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token:
        return None
    # Starlette decodes header bytes as latin-1, so this gives back exactly what was sent.
    return token.encode("latin-1")


def same_key(token: bytes, key: str) -> bool:
    return hmac.compare_digest(token, key.encode())


class RequireApiKey:
    """ASGI middleware: every HTTP request but `open_paths` needs `Bearer <key>`, else 401."""

    def __init__(self, app: ASGIApp, key: str, open_paths: frozenset[str]) -> None:
        self.app, self._key, self._open = app, key, open_paths

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in self._open:
            return await self.app(scope, receive, send)
        token = bearer_token(Headers(scope=scope).get("authorization", ""))
        if token is not None and same_key(token, self._key):
            return await self.app(scope, receive, send)
        message = "This server needs its API key: send 'Authorization: Bearer YOUR_KEY'."
        body = json.dumps(error_response_body(401, message, code="invalid_api_key")).encode()
        headers = [(b"content-type", b"application/json"), (b"www-authenticate", b"Bearer")]
        await send({"type": "http.response.start", "status": 401, "headers": headers})
        await send({"type": "http.response.body", "body": body})
