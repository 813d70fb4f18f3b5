"""Another API's answer made from the chat pipeline's: its whole JSON, or its SSE stream
rewritten event by event as it is sent; and the chat request's validation errors named in
the other API's fields.

The chat response keeps its own ending and closing logic (a disconnect still aborts the
tier): the stream wrapper only rewrites the bytes it sends. `[DONE]` is the chat stream's
end marker; the translator's `end()` replaces it.
"""

import json
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from fastapi.responses import Response
from pydantic import ValidationError
from starlette.types import Message, Receive, Scope, Send

from engine.entrypoints.openai.error_bodies import validation_error_message
from engine.entrypoints.openai.errors import OpenAIError


class Events(Protocol):
    """A stream translator: bytes to send for the start, each chat chunk, and the end."""

    def start(self) -> bytes: ...
    def chunk(self, data: dict[str, Any]) -> bytes: ...
    def end(self) -> bytes: ...


class TranslatedStream(Response):
    """`chat`'s SSE stream sent as `events` make it."""

    def __init__(
        self, chat: Response, events: Events, after: Callable[[], Awaitable[None]] | None = None
    ) -> None:
        self.chat, self.events, self.after = chat, events, after  # after: once sent whole
        self.status_code = chat.status_code
        self.background = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        started, ended, pending = False, False, b""

        async def rewrite(message: Message) -> None:
            nonlocal started, ended, pending
            if message["type"] != "http.response.body":
                return await send(message)
            out = b"" if started else self.events.start()
            started = True
            *events, pending = (pending + message.get("body", b"")).split(b"\n\n")
            for event in events:
                data = event.removeprefix(b"data: ").strip()
                if data == b"[DONE]":
                    ended = True
                    out += self.events.end()
                elif data and not ended:
                    out += self.events.chunk(json.loads(data))
            await send({**message, "body": out})

        await self.chat(scope, receive, rewrite)
        if ended and self.after is not None:
            await self.after()


def chat_json(response: Response) -> dict[str, Any] | None:
    """A whole chat answer's JSON; None for a body that is not one (a 499 has none)."""
    if response.status_code != 200 or not response.body:
        return None
    return json.loads(response.body)


def renamed_error(exc: ValidationError, names: dict[str, str]) -> OpenAIError:
    """The chat request's 400 for a translated body, its field named as the caller sent it
    (`names`: chat field -> the other API's)."""
    message, param = validation_error_message(exc)
    head = (param or "").split(".", 1)[0].split("[", 1)[0]
    if head in names:
        message = message.replace(f"'{head}", f"'{names[head]}", 1)
        param = names[head]
    return OpenAIError(400, message, param=param)
