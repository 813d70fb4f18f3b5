"""FAISS per scope: exact while small, IVF above the policy's size; deletes remove vectors."""

from concurrent.futures import ThreadPoolExecutor

import numpy as np

from gateway.cache.index import CacheIndex, ScopeIndex

DIM = 32


def unit_vectors(n: int, seed: int = 0) -> np.ndarray:
    v = np.random.default_rng(seed).standard_normal((n, DIM)).astype(np.float32)
    return v / np.linalg.norm(v, axis=1, keepdims=True)


def test_flat_index_finds_each_vector_and_forgets_removed_ones() -> None:
    index = ScopeIndex(DIM, approximate_above=1000)
    vectors = unit_vectors(50)
    index.add([f"e{i}" for i in range(50)], vectors)
    assert index.kind == "flat" and len(index) == 50
    best = index.search(vectors[7], 3)
    assert best[0].entry_id == "e7" and abs(best[0].similarity - 1.0) < 1e-5
    assert best[0].similarity >= best[1].similarity >= best[2].similarity
    assert index.remove(["e7", "nope"]) == 1
    assert all(hit.entry_id != "e7" for hit in index.search(vectors[7], 50))
    assert len(index.search(vectors[0], 100)) == 49


def test_readding_an_id_replaces_its_vector() -> None:
    index = ScopeIndex(DIM, approximate_above=1000)
    a, b = unit_vectors(2)
    index.add(["x"], a[None])
    index.add(["x"], b[None])
    assert len(index) == 1
    assert index.search(b, 5)[0].similarity > 0.999


def test_index_turns_approximate_above_the_threshold_and_back() -> None:
    index = ScopeIndex(DIM, approximate_above=400)
    vectors = unit_vectors(1000, seed=1)
    ids = [f"e{i}" for i in range(1000)]
    index.add(ids[:300], vectors[:300])
    assert index.kind == "flat"
    index.add(ids[300:], vectors[300:])
    assert index.kind == "ivf" and len(index) == 1000
    found = sum(index.search(vectors[i], 1)[0].entry_id == ids[i] for i in range(0, 1000, 10))
    assert found >= 95  # the vector itself is its own nearest neighbour, nearly always
    index.remove(ids[:900:2])
    assert all(h.entry_id != "e0" for h in index.search(vectors[0], 20))
    index.remove(ids[1:900:2])
    assert index.kind == "flat" and len(index) == 100  # shrunk below half: exact again
    assert index.search(vectors[950], 1)[0].entry_id == "e950"


def test_a_scope_never_sees_another_scopes_vectors() -> None:
    index = CacheIndex(DIM, approximate_above=1000)
    vectors = unit_vectors(4)
    index.add("tenant-a", ["a0", "a1"], vectors[:2])
    index.add("tenant-b", ["b0", "b1"], vectors[2:])
    assert {h.entry_id for h in index.search("tenant-a", vectors[2], 10)} == {"a0", "a1"}
    assert index.search("tenant-c", vectors[0], 10) == []
    index.remove("tenant-a", ["a0", "a1"])
    assert index.stats()["scopes"] == 1  # an emptied scope's index is dropped
    assert index.stats()["vectors_by_index_kind"] == {"flat": 2, "ivf": 0}


def test_a_serving_index_trains_in_the_background_and_replays_changes() -> None:
    vectors = unit_vectors(700, seed=2)
    ids = [f"e{i}" for i in range(700)]
    with ThreadPoolExecutor(1) as trainer:
        index = ScopeIndex(DIM, approximate_above=400, trainer=trainer)
        index.add(ids[:300], vectors[:300])
        index.add(ids[300:500], vectors[300:500])  # crosses 400: training starts elsewhere
        assert index.kind == "flat"  # the add returned without training
        index.add(ids[500:], vectors[500:])  # changes while it trains are logged...
        index.remove(ids[:100])
        assert index.search(vectors[650], 1)[0].entry_id == "e650"  # ...and served meanwhile
        index.wait_for_training()
        assert index.kind == "ivf" and len(index) == 600
        found = sum(index.search(vectors[i], 1)[0].entry_id == ids[i] for i in range(100, 700, 5))
        assert found >= 114  # of 120: the replayed adds are in the new index
        assert all(h.entry_id not in ids[:100] for h in index.search(vectors[5], 50))


def test_a_bulk_load_into_an_empty_index_trains_at_once() -> None:
    with ThreadPoolExecutor(1) as trainer:
        index = ScopeIndex(DIM, approximate_above=400, trainer=trainer)
        index.add([f"e{i}" for i in range(1000)], unit_vectors(1000))
        assert index.kind == "ivf"  # nothing was serving yet: no reason to wait
