"""The real all-MiniLM-L6-v2 embedder: normalised vectors, micro-batching, off the loop."""

import asyncio

import numpy as np
import pytest

from gateway.cache.embedder import MAX_CHARS, Embedder


@pytest.fixture(scope="module")
def embedder() -> Embedder:
    return Embedder(max_wait_ms=20)


def test_vectors_are_normalised_and_meaningful(embedder: Embedder) -> None:
    v = embedder.embed_many(
        ["How do I reset my password?", "How can I change my password?", "Best pizza in Rome"]
    )
    assert v.shape == (3, embedder.dim) and v.dtype == np.float32
    assert np.allclose(np.linalg.norm(v, axis=1), 1.0, atol=1e-4)
    assert v[0] @ v[1] > v[0] @ v[2] + 0.3  # paraphrases close, unrelated text far


async def test_concurrent_requests_share_one_batch(embedder: Embedder) -> None:
    texts = [f"question number {i} about caching" for i in range(8)]
    before = embedder.batches
    vectors = await asyncio.gather(*(embedder.embed(t) for t in texts))
    assert embedder.batches - before == 1  # all eight arrived within the wait window
    assert np.allclose(np.stack(vectors), embedder.embed_many(texts), atol=1e-5)


async def test_event_loop_keeps_running_while_embedding(embedder: Embedder) -> None:
    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await asyncio.sleep(0.001)

    task = asyncio.create_task(ticker())
    await asyncio.gather(*(embedder.embed("word " * 400 + str(i)) for i in range(64)))
    task.cancel()
    assert ticks > 5  # the loop was never blocked for the whole batch


def test_huge_text_is_clipped_not_tokenised_whole(embedder: Embedder) -> None:
    long = "x" * (MAX_CHARS * 500)
    assert np.allclose(embedder.embed_many([long]), embedder.embed_many([long[:MAX_CHARS]]))
