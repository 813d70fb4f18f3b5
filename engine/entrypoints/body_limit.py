"""A request-body size limit, checked while the body streams in (chunked bodies included).

Pure ASGI so it sees the body piece by piece before any framework buffers it whole. A
declared Content-Length over the limit is refused before one byte is read; otherwise the
bytes are counted as the app receives them, and the first piece past the limit ends the
request with a 413 OpenAI error body (the app's own response, if it tries one, is dropped).
"""

import json

from starlette.types import ASGIApp, Message, Receive, Scope, Send

DEFAULT_MAX_BODY_BYTES = 8 * 1024 * 1024


class BodyTooLarge(Exception):
    """Raised into the app from receive(): the body went past the limit."""


class BodyLimit:
    def __init__(self, app: ASGIApp, max_body_bytes: int = DEFAULT_MAX_BODY_BYTES) -> None:
        self.app = app
        self.max_body_bytes = max_body_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if _declared_length(scope) > self.max_body_bytes:
            await self._refuse(send)
            return
        received, started, refused = 0, False, False

        async def counting_receive() -> Message:
            nonlocal received, refused
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_body_bytes:
                    if not started:
                        refused = True
                        await self._refuse(send)
                    raise BodyTooLarge(f"the request body is over {self.max_body_bytes} bytes")
            return message

        async def guarded_send(message: Message) -> None:
            nonlocal started
            if refused:
                return  # the 413 has been sent: whatever the app answers after is dropped
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, counting_receive, guarded_send)
        except BodyTooLarge:
            if not refused:
                raise

    async def _refuse(self, send: Send) -> None:
        # Imported here: the policy module reads DEFAULT_MAX_BODY_BYTES, and
        # `tiergate check-policy` must not pay for building the API models.
        from engine.entrypoints.openai.error_bodies import error_response_body

        message = f"The request body is too large: the limit is {self.max_body_bytes} bytes."
        body = json.dumps(error_response_body(413, message, code="request_too_large")).encode()
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
            (b"connection", b"close"),  # the rest of the body is not read
        ]
        await send({"type": "http.response.start", "status": 413, "headers": headers})
        await send({"type": "http.response.body", "body": body})


def _declared_length(scope: Scope) -> int:
    for name, value in scope.get("headers", []):
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return 0  # the server refuses a malformed length itself
    return 0
