"""Pure ASGI middleware: a request id for every request, and the tiergate headers on every answer.

The id is the caller's x-request-id when it sends a sane one, else a new one.

Handlers record the tier and model they used in `request.state`; the headers are written
when the response starts, so streamed answers carry them too.
"""

import uuid

from starlette.datastructures import MutableHeaders
from starlette.types import ASGIApp, Message, Receive, Scope, Send

UNKNOWN = "none"  # tier/model of answers that never reached a tier (401, 400, 404...)


def _client_request_id(scope: Scope) -> str | None:
    """A caller's own x-request-id is kept (it ties their logs to ours) if it looks sane."""
    for name, value in scope["headers"]:
        if name == b"x-request-id":
            text = value.decode("latin-1")
            ok = 0 < len(text) <= 128 and text.isprintable() and " " not in text
            return text if ok else None
    return None


class TiergateHeaders:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        state = scope.setdefault("state", {})
        state["request_id"] = request_id = _client_request_id(scope) or f"req-{uuid.uuid4().hex}"

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = MutableHeaders(scope=message)
                headers["x-request-id"] = request_id
                headers["x-tiergate-tier"] = state.get("tier", UNKNOWN)
                headers["x-tiergate-model"] = state.get("model", UNKNOWN)
                headers["x-tiergate-cache"] = state.get("cache", "off")
                if "similarity" in state:
                    headers["x-tiergate-similarity"] = state["similarity"]
                if "cache_entry" in state:
                    headers["x-tiergate-cache-entry"] = state["cache_entry"]
                if "explain" in state:  # asked for with x-tiergate-explain: 1
                    headers["x-tiergate-explain"] = state["explain"]
            await send(message)

        await self.app(scope, receive, send_with_headers)
