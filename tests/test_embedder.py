"""The real all-MiniLM-L6-v2 embedder: normalised vectors, micro-batching, off the loop;
ONNX Runtime by default, agreeing with torch, torch where ONNX Runtime is missing."""

import asyncio
import json
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

from gateway.embedding.batches import TurnLock
from gateway.embedding.embedder import MAX_CHARS, Embedder, default_model_path
from gateway.embedding.onnx_backend import OnnxUnavailable, exported_path
from tests.servers import wait_for


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


async def test_a_lone_request_runs_at_once_and_a_crowd_waits_for_company() -> None:
    """The window opens only after requests came together: one at a time, none waits."""
    from concurrent.futures import ThreadPoolExecutor

    from gateway.embedding.micro_batch import MicroBatcher

    sizes: list[int] = []

    def run(items: list[int]) -> list[int]:
        sizes.append(len(items))
        return [i * 2 for i in items]

    batcher = MicroBatcher(run, ThreadPoolExecutor(1), batch_size=8, max_wait_s=0.05)
    for i in range(3):
        assert await batcher.submit([i]) == [i * 2]
    assert batcher.waits == 0 and sizes == [1, 1, 1]
    await asyncio.gather(*(batcher.submit([i]) for i in range(4)))  # together: one batch
    late = [asyncio.create_task(batcher.submit([10]))]
    await asyncio.sleep(0.01)  # within the window the crowd opened
    late.append(asyncio.create_task(batcher.submit([11])))
    assert [r for t in late for r in await t] == [20, 22]
    assert batcher.waits == 1 and sizes[3:] == [4, 2]
    assert await batcher.submit([5]) == [10]  # company came: the window still open once
    assert await batcher.submit([6]) == [12]  # a lone one ran alone: at once again
    assert batcher.waits == 2
    await batcher.close()


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


# ---------------------------------------------------------------- backends

PAIRS = Path(__file__).resolve().parents[1] / "training" / "data" / "cache_pairs.jsonl"


@pytest.fixture(scope="module")
def torch_embedder(one_torch_thread: None) -> Embedder:
    return Embedder(backend="torch")


def test_default_backend_is_onnx_runtime(embedder: Embedder) -> None:
    assert embedder.backend == "onnx"  # onnxruntime is a dependency: the fast path is the default


def test_onnx_agrees_with_torch(embedder: Embedder, torch_embedder: Embedder) -> None:
    texts = [
        "How do I reset my password?",
        "héllo Wörld, ÇA VA? 日本語のテキスト",
        "x",
        "",
        " ".join(f"token{i}" for i in range(300)),  # past the 256 word pieces the model reads
    ]
    drift = 1 - (embedder.embed_many(texts) * torch_embedder.embed_many(texts)).sum(axis=1)
    assert np.abs(drift).max() < 1e-4
    for text in texts:  # the same word pieces, cut at the same length
        assert embedder.count_tokens([text]) == torch_embedder.count_tokens([text])


def test_pair_cosines_match_the_labelled_set(embedder: Embedder) -> None:
    """The pair set's cosines were measured on torch; the verifier was calibrated on them."""
    rows = [json.loads(line) for line in PAIRS.read_text().splitlines()]
    rows = [r for r in rows if r["split"] == "test"][:300]
    a = embedder.embed_many([r["a"] for r in rows])
    b = embedder.embed_many([r["b"] for r in rows])
    drift = np.abs((a * b).sum(axis=1) - np.array([r["cosine"] for r in rows]))
    assert drift.max() < 2e-3  # the file keeps 4 decimals


def test_padded_batch_equals_one_at_a_time(embedder: Embedder) -> None:
    texts = ["a", "a much longer question about how paged attention shares KV pages", "b c"]
    one_by_one = np.concatenate([embedder.embed_many([t]) for t in texts])
    assert np.allclose(embedder.embed_many(texts), one_by_one, atol=1e-5)


def test_the_request_paths_states_come_with_its_vectors(embedder: Embedder) -> None:
    """What a verifier takes from the embedder: each text's word-piece states, the same in
    a padded batch as alone, and only for the request path's (urgent) batches."""
    backend = embedder.onnx_backend
    assert backend is not None
    texts = ["a", "a much longer question about how paged attention shares KV pages", "b c"]
    taken: dict[str, np.ndarray] = {}
    embedder.states_sink = lambda text, pieces: taken.setdefault(text, pieces.states)
    try:
        embedder.embed_many(texts)  # bulk: nothing handed over
        assert taken == {}
        vectors = embedder.embed_many(texts, urgent=True)
    finally:
        embedder.states_sink = None
    assert np.allclose(vectors, embedder.embed_many(texts), atol=1e-5)
    for text in texts:
        _, (alone,) = backend.encode_with_states([text])
        assert alone.pieces[0] == "[CLS]" and taken[text].shape == alone.states.shape
        assert np.allclose(taken[text], alone.states, atol=1e-4)


def test_micro_batches_keep_the_budget_and_the_input_order(
    embedder: Embedder, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 29.1: many texts run as length-sorted passes of at most `max_batch_tokens`
    padded tokens; the vectors are one pass's, each at its input's index."""
    texts = [" ".join(f"w{i}" for i in range(n)) for n in (90, 2, 30, 1, 300, 7, 45, 3, 12)]
    monkeypatch.setattr(embedder, "max_batch_tokens", 10**6)
    one_pass = embedder.embed_many(texts)
    seen = len(embedder.recent_batches)
    monkeypatch.setattr(embedder, "max_batch_tokens", 64)
    vectors, tokens = embedder.embed_counted(texts)
    batches = list(embedder.recent_batches)[seen:]
    assert np.allclose(vectors, one_pass, atol=1e-5)
    assert tokens == embedder.count_tokens(texts)
    assert sum(b.rows for b in batches) == len(texts) and len(batches) > 2
    # within the budget, but for a text longer than it, which goes alone
    assert all(b.rows * b.width <= 64 or b.rows == 1 for b in batches), batches
    assert not any(b.urgent for b in batches)  # bulk work, behind the request path


def test_an_urgent_turn_goes_before_bulk_work_that_waited_longer() -> None:
    lock, order = TurnLock(), []

    def take(name: str, urgent: bool) -> None:
        with lock.turn(urgent):
            order.append(name)

    with lock.turn(urgent=False):  # a bulk pass is running
        bulk = threading.Thread(target=take, args=("bulk", False))
        bulk.start()
        wait_for(lambda: lock.waiting == 1)
        chat = threading.Thread(target=take, args=("chat", True))
        chat.start()
        wait_for(lambda: lock.waiting == 2)
    bulk.join()
    chat.join()
    assert order == ["chat", "bulk"]


def test_without_onnxruntime_auto_falls_back_to_torch(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "onnxruntime", None)  # the package is not installed
    with pytest.raises(OnnxUnavailable):
        Embedder(backend="onnx")
    fallback = Embedder(backend="auto")
    assert fallback.backend == "torch"
    assert np.allclose(np.linalg.norm(fallback.embed_many(["still embeds"]), axis=1), 1.0)


def test_unknown_backend_is_refused() -> None:
    with pytest.raises(ValueError, match="backend"):
        Embedder(backend="tensorrt")


def test_graph_is_exported_once_and_a_broken_one_rebuilt(
    embedder: Embedder, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TIERGATE_CACHE_DIR", str(tmp_path))
    graph = exported_path(default_model_path())
    graph.parent.mkdir(parents=True)
    graph.write_bytes(b"not an onnx graph")  # e.g. written by an older, broken build
    rebuilt = Embedder(backend="onnx")
    assert graph.stat().st_size > 1_000_000
    stamp = graph.stat().st_mtime_ns
    again = Embedder(backend="onnx")  # a later start opens the cached graph
    assert graph.stat().st_mtime_ns == stamp
    text = ["the cached graph gives the same vector"]
    assert np.allclose(rebuilt.embed_many(text), embedder.embed_many(text), atol=1e-6)
    assert np.allclose(again.embed_many(text), embedder.embed_many(text), atol=1e-6)


@pytest.mark.parametrize("broken", ["onnx package missing", "cache dir unwritable"])
def test_a_graph_that_cannot_be_exported_falls_back_to_torch(
    broken: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if broken == "onnx package missing":
        monkeypatch.setenv("TIERGATE_CACHE_DIR", str(tmp_path))
        monkeypatch.setitem(sys.modules, "onnx", None)  # the exporter needs it
    else:
        (tmp_path / "file").write_text("")  # a file where the cache dir's folder must go
        monkeypatch.setenv("TIERGATE_CACHE_DIR", str(tmp_path / "file" / "cache"))
    with pytest.raises(OnnxUnavailable, match="export failed"):
        Embedder(backend="onnx")
    fallback = Embedder(backend="auto")
    assert fallback.backend == "torch"
    assert fallback.embed_many([""]).shape == (1, fallback.dim)  # even an empty text
    assert not list(tmp_path.rglob("*.onnx"))  # nothing half-written left behind


def test_a_folder_without_a_fast_tokenizer_runs_on_torch(tmp_path: Path) -> None:
    """A sentence-transformers folder with only vocab.txt: torch builds its tokenizer."""
    for item in default_model_path().iterdir():
        if item.name != "tokenizer.json":
            (tmp_path / item.name).symlink_to(item)
    with pytest.raises(OnnxUnavailable, match=r"tokenizer\.json"):
        Embedder(str(tmp_path), backend="onnx")
    folder = Embedder(str(tmp_path))
    assert folder.backend == "torch"
    assert np.allclose(np.linalg.norm(folder.embed_many(["a question"]), axis=1), 1.0)
