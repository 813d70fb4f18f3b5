"""The router's outcome labels (bench/router_labels.py), the resumable answer files
(bench/router_answers.py) and the task set they label (bench/router_tasks.py)."""

import json
import re
from itertools import pairwise
from pathlib import Path

import pytest

from bench.router_answers import prompt_digest, read_answers
from bench.router_labels import TARGETS, gap, quality, rate_label
from bench.router_tasks import Task, build_tasks

ROOT = Path(__file__).resolve().parent.parent


def _row(small: float, large: float, small_greedy: bool, large_greedy: bool) -> dict:
    return {
        "small": {"correct": small_greedy, "rate": small},
        "large": {"correct": large_greedy, "rate": large},
    }


@pytest.mark.parametrize(
    ("small", "large", "greedy", "rate", "graded"),
    [
        (0.0, 1.0, 1.0, 1.0, 1.0),  # only the large tier answers: what routing buys
        (0.2, 0.8, 1.0, 1.0, 0.6),
        (0.2, 0.6, 1.0, 0.0, 0.4),  # greedy says "needs large", the rates say not enough
        (0.0, 0.0, 0.0, 0.0, 0.0),  # neither tier answers: the large one buys nothing
        (1.0, 1.0, 0.0, 0.0, 0.0),  # both answer
        (0.8, 0.2, 0.0, 0.0, 0.0),  # the small tier does better: floored at 0
    ],
)
def test_labels_from_rates(small, large, greedy, rate, graded) -> None:
    row = _row(small, large, small_greedy=greedy == 0.0, large_greedy=True)
    assert TARGETS["greedy"](row) == greedy
    assert rate_label(row) == rate
    assert gap(row) == pytest.approx(graded)


def test_a_greedy_only_row_has_quality_of_its_one_answer() -> None:
    row = {"small": {"correct": False}, "large": {"correct": True}}
    assert (quality(row, "small"), quality(row, "large")) == (0.0, 1.0)
    assert rate_label(row) == gap(row) == 1.0


def test_answer_file_skips_torn_lines_and_answers_to_other_prompts(tmp_path: Path) -> None:
    task = Task("t-1", "arithmetic", "2 + 2 = ?", "4", "number")
    moved = Task("t-2", "arithmetic", "3 + 3 = ?", "6", "number")
    rows = [
        {"id": "t-1", "sample": 0, "prompt_sha": prompt_digest(task), "text": "4"},
        {"id": "t-1", "sample": 1, "text": "5"},  # written before digests were kept
        {"id": "t-2", "sample": 0, "prompt_sha": "0" * 12, "text": "old prompt"},
    ]
    path = tmp_path / "answers.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows) + '{"id": "t-1", "sam')
    kept = read_answers(path, [task, moved])
    assert sorted(kept) == [("t-1", 0), ("t-1", 1)]
    assert read_answers(tmp_path / "missing.jsonl", [task]) == {}


def test_first_tasks_keep_their_prompts_and_later_families_follow() -> None:
    """The first greedy outcomes stay comparable: every task id in them still has its prompt."""
    first = ROOT / "bench" / "data" / "router_outcomes.jsonl"
    old = {r["id"]: r["prompt"] for r in map(json.loads, first.read_text().splitlines())}
    tasks = {t.id: t for t in build_tasks()}
    assert all(tasks[i].prompt == prompt for i, prompt in old.items())
    assert {t.family for t in tasks.values() if t.id not in old} == {"code_trace", "sequence"}


def test_sequences_follow_one_rule() -> None:
    """Each shown sequence continues by one step, a growing step or one ratio."""
    for task in (t for t in build_tasks() if t.family == "sequence"):
        terms = [int(n) for n in re.findall(r"\d+", task.prompt)] + [int(task.expected)]
        steps = [b - a for a, b in pairwise(terms)]
        ratios = {b / a for a, b in pairwise(terms)}
        growing = [b - a for a, b in pairwise(steps)]
        assert len(set(steps)) == 1 or len(set(growing)) == 1 or len(ratios) == 1, task.prompt
