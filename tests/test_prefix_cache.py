"""Prefix sharing: chained page keys, salts, longest-prefix reuse, publish-after-compute."""

from engine.kv import KVManager, hash_page
from engine.sampling_params import SamplingParams
from engine.sequence import Sequence


def _seq(tokens: list[int], salt: str | None = None, seq_id: int = 0) -> Sequence:
    return Sequence(seq_id, f"r{seq_id}", list(tokens), len(tokens), SamplingParams(), 8, salt)


def _run_prefill(kv: KVManager, seq: Sequence) -> list[int]:
    hits = kv.match_prefix(seq)
    kv.admit(seq, hits, seq.num_tokens - len(hits) * kv.page_size)
    seq.num_computed_tokens = seq.num_tokens  # as if the runner computed the chunk
    kv.register_full_pages(seq)
    return hits


def test_keys_chain_over_parent_tokens_and_salt() -> None:
    root = hash_page(None, [1, 2, 3, 4])
    assert root == hash_page(None, [1, 2, 3, 4])
    assert root != hash_page(None, [1, 2, 3, 5])
    assert root != hash_page(None, [1, 2, 3, 4], salt="tenant-a")
    assert hash_page(None, [1, 2, 3, 4], "a") != hash_page(None, [1, 2, 3, 4], "b")
    assert hash_page(root, [5, 6, 7, 8]) != hash_page(None, [5, 6, 7, 8])


def test_second_request_reuses_every_full_page() -> None:
    kv = KVManager(num_pages=16, page_size=4, enable_prefix_caching=True)
    first = _seq(list(range(10)))  # pages: [0..3] [4..7] full, [8, 9] partial
    assert _run_prefill(kv, first) == []
    second = _seq([*range(10), 42], seq_id=1)
    hits = _run_prefill(kv, second)
    assert hits == first.page_table[:2]
    assert [kv.pool.ref_counts[p] for p in hits] == [2, 2]
    assert second.page_table[2] != first.page_table[2]  # the partial page is never shared


def test_keeps_one_token_to_compute() -> None:
    kv = KVManager(num_pages=16, page_size=4, enable_prefix_caching=True)
    _run_prefill(kv, _seq(list(range(8))))
    again = _seq(list(range(8)), seq_id=1)  # exactly two full pages, all cached
    hits = kv.match_prefix(again)
    assert len(hits) == 1  # the last page is recomputed so there is a logit to sample from


def test_different_salt_never_shares() -> None:
    kv = KVManager(num_pages=16, page_size=4, enable_prefix_caching=True)
    _run_prefill(kv, _seq(list(range(12)), salt="a"))
    assert kv.match_prefix(_seq(list(range(12)), salt="b", seq_id=1)) == []
    assert kv.match_prefix(_seq(list(range(12)), seq_id=2)) == []
    assert len(kv.match_prefix(_seq(list(range(12)), salt="a", seq_id=3))) == 2


def test_pages_published_only_after_compute() -> None:
    kv = KVManager(num_pages=16, page_size=4, enable_prefix_caching=True)
    seq = _seq(list(range(9)))
    kv.admit(seq, [], 9)
    assert kv.match_prefix(_seq(list(range(9)), seq_id=1)) == []  # allocated, not computed
    seq.num_computed_tokens = 9
    kv.register_full_pages(seq)
    assert len(kv.match_prefix(_seq(list(range(9)), seq_id=1))) == 2


def test_finished_pages_stay_cached_until_needed() -> None:
    kv = KVManager(num_pages=4, page_size=4, enable_prefix_caching=True)
    seq = _seq(list(range(9)))
    _run_prefill(kv, seq)
    kv.free(seq)
    assert kv.num_free() == 4  # parked pages count as free
    assert len(kv.match_prefix(_seq(list(range(9)), seq_id=1))) == 2
    other = _seq([100 + i for i in range(13)], seq_id=2)  # needs all 4 pages: evicts both
    _run_prefill(kv, other)
    assert kv.match_prefix(_seq(list(range(9)), seq_id=3)) == []
    kv.free(other)
    assert kv.num_free() == 4


def test_disabled_cache_never_hits() -> None:
    kv = KVManager(num_pages=8, page_size=4, enable_prefix_caching=False)
    seq = _seq(list(range(9)))
    _run_prefill(kv, seq)
    assert kv.match_prefix(_seq(list(range(9)), seq_id=1)) == []
    kv.free(seq)
    assert kv.num_free() == 8
