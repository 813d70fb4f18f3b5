"""Graceful shutdown for `tiergate serve` and `tiergate engine`.

The first SIGTERM (or Ctrl-C) stops accepting connections and lets in-flight requests,
streams included, run for `grace_s`; then `on_expire` aborts what is left (the caller
ends those requests with an error: an SSE error event in a stream) and uvicorn gets a few
more seconds to send those last bytes before it cancels anything still running. A second
signal exits the process at once.
"""

import asyncio
import inspect
import logging
import os
import signal
import socket
from collections.abc import Awaitable, Callable
from types import FrameType

import uvicorn

logger = logging.getLogger("tiergate.shutdown")

# After on_expire: time for aborted requests to write their error and close.
ABORT_MARGIN_S = 3.0
FORCED_EXIT_CODE = 128 + signal.SIGTERM

OnExpire = Callable[[], Awaitable[None] | None]


class GracefulServer(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, grace_s: float, on_expire: OnExpire) -> None:
        config.timeout_graceful_shutdown = grace_s + ABORT_MARGIN_S
        super().__init__(config)
        self.grace_s = grace_s
        self._on_expire = on_expire
        self._expiry: asyncio.Task | None = None

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if self.should_exit:
            # Already draining: the operator wants out now. No cleanup can be trusted to be
            # quick here (that is what the first signal was for), so leave at once.
            os.write(2, b"tiergate: second signal, exiting now\n")
            os._exit(FORCED_EXIT_CODE)
        logger.info("shutting down: requests in flight get %.0fs to finish", self.grace_s)
        super().handle_exit(sig, frame)

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        self._expiry = asyncio.create_task(self._expire_later())
        try:
            await super().shutdown(sockets)
        finally:
            self._expiry.cancel()

    async def _expire_later(self) -> None:
        await asyncio.sleep(self.grace_s)
        busy = len(self.server_state.tasks)
        if busy:
            logger.warning("grace period over: aborting %d request(s) still running", busy)
        result = self._on_expire()
        if inspect.isawaitable(result):
            await result


def serve_gracefully(
    app: object,
    host: str,
    port: int,
    grace_s: float,
    on_expire: OnExpire,
    **uvicorn_options: object,
) -> None:
    """uvicorn.run with the shutdown above; `uvicorn_options` go to uvicorn.Config."""
    config = uvicorn.Config(app, host=host, port=port, **uvicorn_options)  # type: ignore[arg-type]
    GracefulServer(config, grace_s, on_expire).run()
