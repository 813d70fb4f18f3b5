"""The router's outcome labels (training/router/labels.py), the resumable answer files
(training/router/answers.py) and the task set they label (training/router/tasks.py)."""

import json
import re
from itertools import pairwise
from pathlib import Path

import pytest

from training.router.answers import prompt_digest, read_answers
from training.router.labels import TARGETS, answers_slice, gap, quality, rate_label
from training.router.tasks import Task, build_tasks, is_correct
from training.router.tasks_round3 import ROUND3_DROPPED, ROUND3_GENERATORS, WEEKDAYS

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


def test_a_slice_of_answers_reads_its_own_rate() -> None:
    """The first five of ten answers give the earlier label; a later slice has no greedy one."""
    ten = [True, False, False, False, False, True, True, True, True, True]
    row = {
        "id": "t-1",
        "small": {"correct": True, "answers": ten, "rate": 0.6},
        "large": {"correct": True, "answers": [True] * 10, "rate": 1.0},
    }
    first, second = answers_slice(row, 0, 5), answers_slice(row, 5, 10)
    assert (quality(first, "small"), rate_label(first), first["small"]["correct"]) == (
        0.2,
        1.0,
        True,
    )
    assert (quality(second, "small"), rate_label(second), second["small"]["correct"]) == (
        1.0,
        0.0,
        None,
    )
    assert row["small"]["rate"] == 0.6  # the row itself is left as it was
    with pytest.raises(ValueError, match="10 answers, not 12"):
        answers_slice(row, 0, 12)


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
    first = ROOT / "training" / "data" / "router_outcomes.jsonl"
    old = {r["id"]: r["prompt"] for r in map(json.loads, first.read_text().splitlines())}
    round_one = {t.id: t for t in build_tasks(rounds=1)}
    assert all(round_one[i].prompt == prompt for i, prompt in old.items())
    assert {t.family for t in round_one.values() if t.id not in old} == {"code_trace", "sequence"}


def test_round_two_appends_new_ids_and_prompts() -> None:
    """Round 2 leaves every round-1 task (id, prompt, order) as it was and asks nothing twice:
    a repeated prompt would put one task in both splits under two ids."""
    first, both = build_tasks(rounds=1), build_tasks(rounds=2)
    assert [(t.id, t.prompt) for t in both[: len(first)]] == [(t.id, t.prompt) for t in first]
    added = both[len(first) :]
    assert len(added) > 500
    assert len({t.id for t in both}) == len(both) == len({t.prompt for t in both})
    assert {t.family for t in added} <= {t.family for t in first} - {"gsm8k", "fact"}


def test_labelled_outcomes_match_the_current_tasks() -> None:
    """Every labelled task in the shipped rates file still has its prompt and round."""
    rates = ROOT / "training" / "data" / "router_rates.jsonl"
    tasks = {t.id: t for t in build_tasks()}
    rounds = {t.id: r for r in (3, 2, 1) for t in build_tasks(rounds=r)}
    for row in map(json.loads, rates.read_text().splitlines()):
        assert tasks[row["id"]].prompt == row["prompt"]
        assert row.get("round", 1) == rounds[row["id"]]


def test_round_three_appends_new_families_after_round_two() -> None:
    """Round 3 keeps rounds 1 and 2 (ids, prompts, order) and adds only its new families,
    in a repeating pattern (so any prefix of it mixes them), asking nothing twice."""
    two, three = build_tasks(rounds=2), build_tasks(rounds=3)
    assert [(t.id, t.prompt) for t in three[: len(two)]] == [(t.id, t.prompt) for t in two]
    added = three[len(two) :]
    families = {t.family for t in added}
    assert families == set(ROUND3_GENERATORS) - ROUND3_DROPPED
    assert not families & {t.family for t in two}
    assert {t.family for t in added[:60]} == families
    assert len({t.id for t in three}) == len(three) == len({t.prompt for t in three})


@pytest.mark.parametrize(
    ("output", "right"),
    [
        ("Friday", True),
        ("If today is Monday, in 4 days it will be Friday.", True),  # restates the start day
        ("Friday. No wait, Saturday", False),  # the last one named counts
        ("friday", True),
        ("Fridays are nice", False),  # a name must stand as a word
        ("I don't know", False),
    ],
)
def test_a_choice_answer_is_the_last_option_named(output: str, right: bool) -> None:
    assert is_correct("choice", "Friday", output, WEEKDAYS) is right


def test_round_three_answers_check_out() -> None:
    """Each round-3 task's own expected answer passes its checker; another option fails."""
    for task in build_tasks()[len(build_tasks(rounds=2)) :]:
        assert is_correct(task.kind, task.expected, task.expected, task.options), task
        wrong = [o for o in task.options if o != task.expected][:1]
        assert not any(is_correct(task.kind, task.expected, w, task.options) for w in wrong)


def test_sequences_follow_one_rule() -> None:
    """Each shown sequence continues by one step, a growing step or one ratio."""
    for task in (t for t in build_tasks() if t.family == "sequence"):
        terms = [int(n) for n in re.findall(r"\d+", task.prompt)] + [int(task.expected)]
        steps = [b - a for a, b in pairwise(terms)]
        ratios = {b / a for a, b in pairwise(terms)}
        growing = [b - a for a, b in pairwise(steps)]
        assert len(set(steps)) == 1 or len(set(growing)) == 1 or len(ratios) == 1, task.prompt
