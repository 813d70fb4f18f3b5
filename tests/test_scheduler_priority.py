"""Batch-priority work in the engine's scheduler: it fills idle capacity, is the first
preempted when pages run out, and never keeps an interactive request waiting."""

from engine.config import EngineConfig
from engine.llm_engine import LLMEngine
from engine.sampling_params import SamplingParams
from tests.fake_runner import FakeRunner

BATCH = 1
LONG = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)


def _engine(num_pages: int = 64, **cfg: object) -> LLMEngine:
    config = EngineConfig(model="fake", **cfg)  # type: ignore[arg-type]
    return LLMEngine(config, FakeRunner(num_pages=num_pages, page_size=4))


def _texts(engine: LLMEngine) -> dict[str, str]:
    texts: dict[str, str] = {}
    while engine.has_unfinished():
        for out in engine.step():
            texts[out.request_id] = texts.get(out.request_id, "") + out.text
    assert engine.free_pages() == engine.num_pages
    return texts


def _running(engine: LLMEngine) -> set[str]:
    return {s.request_id for s in engine.scheduler.running}


def test_interactive_admitted_before_older_batch_work() -> None:
    engine = _engine(max_num_seqs=2)
    for i in range(4):
        engine.add_request(f"b{i}", f"{i} batch", LONG, priority=BATCH)
    engine.add_request("chat", "interactive", LONG)
    engine.step()
    assert "chat" in _running(engine)  # arrived last, admitted first
    _texts(engine)


def test_interactive_preempts_batch_when_no_slot_is_free() -> None:
    engine = _engine(max_num_seqs=2)
    engine.add_request("b0", "zero batch", LONG, priority=BATCH)
    engine.add_request("b1", "one batch", LONG, priority=BATCH)
    engine.step()
    assert _running(engine) == {"b0", "b1"}
    engine.add_request("chat", "interactive", LONG)
    engine.step()
    assert "chat" in _running(engine)  # it did not wait for a batch line to end
    assert engine.metrics.snapshot().preemptions == 1
    _texts(engine)


def test_interactive_never_preempts_interactive_for_a_slot() -> None:
    engine = _engine(max_num_seqs=2)
    engine.add_request("a", "first", LONG)
    engine.add_request("b", "second", LONG)
    engine.step()
    engine.add_request("c", "third", LONG)
    engine.step()
    assert _running(engine) == {"a", "b"}  # equal priority: it waits its turn
    assert engine.metrics.snapshot().preemptions == 0
    _texts(engine)


def test_batch_is_preempted_first_when_pages_run_out() -> None:
    # 48 token slots: not enough for all three to finish; no admission reserve, so both batch
    # lines get in and the pool runs out under them
    engine = _engine(num_pages=12, kv_watermark=0, kv_reserve_tokens=0)
    engine.add_request("b0", "zero batch", LONG, priority=BATCH)
    engine.add_request("b1", "one batch", LONG, priority=BATCH)
    for _ in range(4):
        engine.step()
    assert _running(engine) == {"b0", "b1"}  # batch work holds the pages
    engine.add_request("chat", "interactive one", LONG)
    engine.step()
    assert "chat" in _running(engine)
    while engine.has_unfinished():
        engine.step()
        chat = [s for s in engine.scheduler.waiting if s.request_id == "chat"]
        assert not chat  # never the one preempted while batch work holds pages
    assert engine.metrics.snapshot().preemptions > 0
    assert engine.free_pages() == engine.num_pages


def test_priority_keeps_every_output_the_same() -> None:
    prompts = [f"line {i} " * (1 + i % 3) for i in range(6)]
    params = SamplingParams(temperature=0, max_tokens=16)
    plain = _engine(num_pages=128)
    expected = plain.generate(prompts, params)
    mixed = _engine(num_pages=20, max_num_seqs=3)
    for i, prompt in enumerate(prompts):
        mixed.add_request(str(i), prompt, params, priority=BATCH if i % 2 else 0)
    texts = _texts(mixed)
    assert [texts[str(i)] for i in range(6)] == expected


def test_batch_work_pauses_while_an_interactive_request_runs() -> None:
    engine = _engine()
    engine.add_request("b0", "zero batch", LONG, priority=BATCH)
    engine.step()
    engine.add_request("chat", "interactive", SamplingParams(temperature=0, max_tokens=5))
    steps_with_chat = 0
    while any(
        s.request_id == "chat" for s in engine.scheduler.running + list(engine.scheduler.waiting)
    ):
        ids = {o.request_id for o in engine.step()}
        assert "b0" not in ids  # the batch line keeps its pages but runs no step meanwhile
        steps_with_chat += 1
    assert steps_with_chat >= 5
    assert "b0" in _running(engine)
    assert "b0" in {o.request_id for o in engine.step()}  # idle again: the batch goes on
    _texts(engine)
