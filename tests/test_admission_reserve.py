"""The scheduler's admission reserve (kv_watermark, kv_reserve_tokens): under pool pressure it
turns preemptions into waiting, without changing any output or starving a lone request."""

import random

import pytest

from engine.config import EngineConfig
from engine.llm_engine import LLMEngine
from engine.sampling_params import SamplingParams
from tests.fake_runner import FakeRunner

OFF = {"kv_watermark": 0.0, "kv_reserve_tokens": 0}
BATCH = 1


def _engine(num_pages: int = 64, **cfg: object) -> LLMEngine:
    config = EngineConfig(model="fake", max_num_seqs=64, **cfg)  # type: ignore[arg-type]
    return LLMEngine(config, FakeRunner(num_pages=num_pages, page_size=4))


def _pressure(engine: LLMEngine) -> tuple[dict[str, str], int]:
    """32 short prompts with longer outputs, all at once (as ShareGPT's): more than the pool
    holds once they grow. Returns the texts and the peak running count."""
    rng = random.Random(0)
    for i in range(32):
        prompt = f"{i} " + "p" * rng.randint(4, 20)
        params = SamplingParams(temperature=0, max_tokens=rng.randint(8, 48), ignore_eos=True)
        engine.add_request(f"r{i}", prompt, params)
    texts: dict[str, str] = {}
    peak = 0
    while engine.has_unfinished():
        for out in engine.step():
            texts[out.request_id] = texts.get(out.request_id, "") + out.text
        peak = max(peak, len(engine.scheduler.running))
    assert engine.free_pages() == engine.num_pages
    return texts, peak


def test_reserve_turns_preemptions_into_waiting() -> None:
    off = _engine(**OFF)
    on = _engine(kv_reserve_tokens=16, kv_watermark=0.02)
    texts_off, peak_off = _pressure(off)
    texts_on, peak_on = _pressure(on)
    assert off.metrics.snapshot().preemptions > 32  # more than one per request without it
    assert on.metrics.snapshot().preemptions <= 0.1 * 32
    assert texts_on == texts_off and len(texts_on) == 32
    assert peak_on >= peak_off // 2  # still batching: half the overcommitted peak or more


def test_a_request_is_not_admitted_into_the_reserve() -> None:
    engine = _engine(num_pages=16, kv_reserve_tokens=16, kv_watermark=0)
    long = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    engine.add_request("a", "aaaaaaa", long)  # 2 pages now, 4 more reserved for its growth
    engine.step()
    engine.add_request("b", "b" * 41, long)  # 11 pages: fits the 14 free, not beside the 4
    engine.step()
    assert [s.request_id for s in engine.scheduler.running] == ["a"]
    while "a" in {s.request_id for s in engine.scheduler.running}:
        engine.step()
    engine.step()
    assert [s.request_id for s in engine.scheduler.running] == ["b"]  # in once a finished
    assert engine.metrics.snapshot().preemptions == 0


def test_a_lone_request_gets_the_whole_pool() -> None:
    engine = _engine(num_pages=8, kv_reserve_tokens=64, kv_watermark=0.5)
    params = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
    engine.add_request("big", "x" * 27, params)  # 31 tokens of 32 slots: no room to reserve
    engine.step()
    assert [s.request_id for s in engine.scheduler.running] == ["big"]


def test_reserve_stops_at_max_tokens() -> None:
    engine = _engine(num_pages=64, kv_reserve_tokens=64, kv_watermark=0)
    engine.add_request("short", "abcdefg", SamplingParams(temperature=0, max_tokens=2))
    engine.step()  # 7 prompt tokens + 1 sampled: 2 pages held; it ends at 9 tokens, 3 pages
    assert engine.scheduler._reserve_pages() == 1  # not the 16 pages of 64 more tokens


def test_interactive_preempts_batch_work_held_back_by_the_reserve() -> None:
    engine = _engine(num_pages=16, kv_reserve_tokens=16, kv_watermark=0)
    long = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    engine.add_request("b0", "batch line", long, priority=BATCH)
    engine.step()
    engine.add_request("chat", "c" * 41, long)  # 11 of 13 free pages: not beside b0's 4
    engine.step()
    assert [s.request_id for s in engine.scheduler.running] == ["chat"]
    assert engine.metrics.snapshot().preemptions == 1  # the batch line, not the chat


@pytest.mark.parametrize(
    "bad", [{"kv_watermark": 1.0}, {"kv_watermark": -0.1}, {"kv_reserve_tokens": -1}]
)
def test_bad_reserve_settings_are_refused(bad: dict[str, float]) -> None:
    with pytest.raises(ValueError, match=r"kv_watermark|kv_reserve_tokens"):
        _engine(**bad)
