"""The gateway's one Embedder, shared by the semantic cache and the difficulty router.

It is created the first time a policy needs it (loading the model takes a second or two, so
it runs in a thread) and kept across reloads. Each request embeds its text at most once:
`embed_once` memoises the call that the cache and the router both await.
"""

import asyncio

import numpy as np

from gateway.embedding.embedder import Embedder
from gateway.policy import EmbedderSettings
from gateway.routing.router import Embed


class SharedEmbedder:
    def __init__(self) -> None:
        self._embedder: Embedder | None = None
        self._lock = asyncio.Lock()

    @property
    def current(self) -> Embedder | None:
        """The embedder if a policy has needed one so far."""
        return self._embedder

    async def get(self, settings: EmbedderSettings) -> Embedder:
        async with self._lock:
            if self._embedder is None:
                self._embedder = await asyncio.to_thread(
                    Embedder,
                    settings.model,
                    settings.batch_size,
                    settings.max_wait_ms,
                    settings.backend,
                    settings.max_batch_tokens,
                )
            return self._embedder

    async def close(self) -> None:
        if self._embedder is not None:
            await self._embedder.close()


def embed_once(embedder: Embedder | None, text: str) -> Embed | None:
    """The request's `embed`: the first call embeds, later calls share its result."""
    if embedder is None:
        return None
    task: asyncio.Task[np.ndarray] | None = None

    async def embed() -> np.ndarray:
        nonlocal task
        if task is None:
            task = asyncio.ensure_future(embedder.embed(text))
        return await asyncio.shield(task)

    return embed
