"""The nli gate's threshold (training/cache/nli_gate.py): the highest that refuses at most
GATE_LOSS of the should-hit pairs the model serves at lenient, never above GATE_MAX or the
lenient threshold."""

from training.cache import nli_gate
from training.cache.nli_gate import pick_gate


def rows(n: int, should_hit: bool = True) -> list[dict]:
    return [{"should_hit": should_hit, "source": "handwritten"} for _ in range(n)]


def test_the_threshold_refuses_at_most_the_allowed_share(monkeypatch) -> None:
    monkeypatch.setattr(nli_gate, "GATE_LOSS", 0.02)  # 2 of 100 served pairs
    gate = [i / 1000 for i in range(100)] + [0.0] * 50  # the 50 must-not: lowest of all
    probs = [0.9] * 100 + [0.9] * 50
    fit = pick_gate(rows(100) + rows(50, False), gate, probs, lenient=0.5)
    assert fit.lost == 2 and fit.served == 100
    assert 0.001 < fit.threshold <= 0.002
    assert fit.refused_share == round(52 / 150, 4)


def test_pairs_the_model_does_not_serve_do_not_count() -> None:
    gate = [0.01, 0.2, 0.25]
    probs = [0.1, 0.9, 0.9]  # the first is refused by the model anyway
    fit = pick_gate(rows(3), gate, probs, lenient=0.5)
    assert fit.lost == 0 and fit.served == 2 and fit.threshold < 0.2


def test_the_threshold_stays_under_the_caps() -> None:
    gate, probs = [0.9] * 10, [0.99] * 10
    assert pick_gate(rows(10), gate, probs, lenient=0.5).threshold < nli_gate.GATE_MAX
    assert pick_gate(rows(10), gate, probs, lenient=0.2).threshold < 0.2
