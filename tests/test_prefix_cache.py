"""The KV manager's contract: prefix lookup (in tokens), allocate-or-refuse, publish after
compute, free; chained page keys and salts."""

from engine.kv.kv_manager import KVManager, PrefixHit, hash_page
from engine.sampling_params import SamplingParams
from engine.sequence import Sequence


def _seq(tokens: list[int], salt: str | None = None, seq_id: int = 0) -> Sequence:
    return Sequence(seq_id, f"r{seq_id}", list(tokens), len(tokens), SamplingParams(), 8, salt)


def _run_prefill(kv: KVManager, seq: Sequence) -> PrefixHit:
    hit = kv.lookup(seq)
    assert kv.allocate(seq, seq.num_tokens - hit.num_tokens, hit)
    assert seq.num_computed_tokens == hit.num_tokens
    seq.num_computed_tokens = seq.num_tokens  # as if the runner computed the chunk
    kv.on_computed(seq)
    return hit


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
    assert _run_prefill(kv, first).pages == []
    second = _seq([*range(10), 42], seq_id=1)
    hit = _run_prefill(kv, second)
    assert hit.pages == kv.page_table(first)[:2]
    assert hit.num_tokens == 8  # hits count in tokens, not pages
    assert kv.page_table(second)[:2] == hit.pages
    assert kv.page_table(second)[2] != kv.page_table(first)[2]  # partial pages never shared
    assert kv.pool.num_in_use() == 3 + 1  # first's 3 pages + second's own third page


def test_keeps_one_token_to_compute() -> None:
    kv = KVManager(num_pages=16, page_size=4, enable_prefix_caching=True)
    _run_prefill(kv, _seq(list(range(8))))
    again = _seq(list(range(8)), seq_id=1)  # exactly two full pages, all cached
    hit = kv.lookup(again)
    assert len(hit.pages) == 1 and hit.num_tokens == 4  # a logit is left to sample from


def test_different_salt_never_shares() -> None:
    kv = KVManager(num_pages=16, page_size=4, enable_prefix_caching=True)
    _run_prefill(kv, _seq(list(range(12)), salt="a"))
    assert kv.lookup(_seq(list(range(12)), salt="b", seq_id=1)).pages == []
    assert kv.lookup(_seq(list(range(12)), seq_id=2)).pages == []
    assert len(kv.lookup(_seq(list(range(12)), salt="a", seq_id=3)).pages) == 2


def test_pages_published_only_after_compute() -> None:
    kv = KVManager(num_pages=16, page_size=4, enable_prefix_caching=True)
    seq = _seq(list(range(9)))
    assert kv.allocate(seq, 9, kv.lookup(seq))  # the lookup keys seq's pages
    probe = _seq(list(range(9)), seq_id=1)
    hit = kv.lookup(probe)
    assert hit.pages == [] and hit.next_in_flight  # allocated, not computed: being computed
    seq.num_computed_tokens = 9
    kv.on_computed(seq)
    hit = kv.lookup(probe)
    assert len(hit.pages) == 2 and not hit.next_in_flight


def test_refusal_leaves_no_half_allocation() -> None:
    kv = KVManager(num_pages=4, page_size=4, enable_prefix_caching=True)
    cached = _seq(list(range(9)))
    _run_prefill(kv, cached)  # 3 pages; 2 full ones cached
    kv.free(cached)  # all parked or free: 4 free
    seq = _seq([*range(9), *range(100, 108)], seq_id=1)  # 17 tokens: 5 pages
    hit = kv.lookup(seq)
    assert hit.num_tokens == 8
    # the 2 hit pages are parked: reusing them leaves 2 for 3 more pages -> refused whole
    assert not kv.allocate(seq, seq.num_tokens - hit.num_tokens, hit)
    assert seq.num_computed_tokens == 0 and kv.num_free() == 4 and kv.pool.num_in_use() == 0
    assert kv.lookup(seq).pages == hit.pages  # nothing evicted by the refusal
    assert kv.allocate(seq, 8, hit)  # what fits: 16 tokens in 4 pages
    assert kv.num_free() == 0 and len(kv.page_table(seq)) == 4
    grown = seq.num_computed_tokens + 8
    assert not kv.allocate(seq, grown)  # a running sequence's growth is refused whole too
    assert len(kv.page_table(seq)) == 4 and kv.num_free() == 0


def test_free_returns_pages_and_keeps_them_cached_until_needed() -> None:
    kv = KVManager(num_pages=4, page_size=4, enable_prefix_caching=True)
    seq = _seq(list(range(9)))
    _run_prefill(kv, seq)
    assert kv.num_free() == 1
    kv.free(seq)
    assert kv.num_free() == 4 and kv.usage() == 0.0  # parked pages count as free
    assert seq.num_computed_tokens == 0
    assert len(kv.lookup(_seq(list(range(9)), seq_id=1)).pages) == 2
    other = _seq([100 + i for i in range(13)], seq_id=2)  # needs all 4 pages: evicts both
    _run_prefill(kv, other)
    assert kv.lookup(_seq(list(range(9)), seq_id=3)).pages == []
    kv.free(other)
    assert kv.num_free() == 4
    kv.free(other)  # freeing twice is harmless


def test_reset_prefix_cache_forgets_parked_pages() -> None:
    kv = KVManager(num_pages=4, page_size=4, enable_prefix_caching=True)
    seq = _seq(list(range(9)))
    _run_prefill(kv, seq)
    kv.free(seq)
    kv.reset_prefix_cache()
    assert kv.lookup(_seq(list(range(9)), seq_id=1)).pages == [] and kv.num_free() == 4


def test_disabled_cache_never_hits() -> None:
    kv = KVManager(num_pages=8, page_size=4, enable_prefix_caching=False)
    seq = _seq(list(range(9)))
    _run_prefill(kv, seq)
    assert kv.lookup(_seq(list(range(9)), seq_id=1)) == PrefixHit([], 0, False)
    kv.free(seq)
    assert kv.num_free() == 8
