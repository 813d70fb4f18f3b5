"""Run both local tiers on the checkable tasks; write outcomes and the router's examples.

    python -m training router outcomes --samples 10 --weights w8a8   # the shipped labels
    python -m training router outcomes --samples 5 --weights w8a8 --limit 40   # a quick look
    python -m training router outcomes --samples 1 --weights fp32 --target greedy  # first
    python -m training router outcomes --tiers small   # one tier (two processes at once)
    python -m training router outcomes --samples 5 --weights w8a8 --first 2100  # in chunks

`--first N` labels the first N tasks (round 1's, then a prefix of round 2's: see
training/router/tasks.py), so round 2 can be labelled in chunks, each complete for both tiers.

Answers are kept per tier in `training/data/router_answers_<tier>[_<weights>_t<temp>].jsonl`
(training/router/answers.py: answer 0 greedy, the rest sampled with fixed seeds) and reused:
a run generates only what the file lacks.

Writes the outcomes (one line per task: prompt, expected answer, per tier the greedy
answer's correctness, with --samples > 1 each answer's correctness and the right-answer
`rate`, and mean tokens) and, from the `train` split only, the examples file
({prompt, label} or {prompt, score}; training/router/labels.py says what each target means).
The `heldout` split (every task whose id hashes into the last 25%) is never written to the
examples: bench/router_eval.py measures on it. The examples file is written with its
provenance sidecar (training/artifacts.py).
"""

import argparse
import hashlib
import json
from pathlib import Path

import torch

from training.artifacts import DATA, DIFFICULTY_EXAMPLES, write_artifact
from training.router.answers import TIERS, Sampling, tier_answers
from training.router.labels import SHIPPED_TARGET, TARGETS
from training.router.tasks import Task, build_tasks, is_correct

OUTCOMES = DATA / "router_outcomes.jsonl"  # greedy, fp32: the first labels (kept in git)
RATES = DATA / "router_rates.jsonl"  # 10 answers per tier, w8a8: the shipped labels
HELDOUT_SHARE = 0.25


def split_of(task_id: str) -> str:
    digest = int(hashlib.sha256(task_id.encode()).hexdigest()[:8], 16)
    return "heldout" if digest / 0xFFFFFFFF < HELDOUT_SHARE else "train"


def answers_path(tier: str, sampling: Sampling) -> Path:
    if sampling.samples == 1 and sampling.weights == "fp32":
        return DATA / f"router_answers_{tier}.jsonl"  # the first run's file
    return DATA / f"router_answers_{tier}_{sampling.weights}_t{sampling.temperature:g}.jsonl"


def tier_outcome(task: Task, answers: list[dict]) -> dict:
    """The greedy answer's correctness; with several answers, each one's and their rate."""
    right = [is_correct(task.kind, task.expected, a["text"], task.options) for a in answers]
    if len(answers) == 1:
        return {k: v for k, v in answers[0].items() if k not in ("id", "sample")} | {
            "correct": right[0]
        }
    return {
        "correct": right[0],
        "answers": right,
        "rate": round(sum(right) / len(right), 4),
        "prompt_tokens": answers[0]["prompt_tokens"],
        "completion_tokens": round(sum(a["completion_tokens"] for a in answers) / len(answers), 2),
    }


def outcome_rows(tasks: list[Task], answers: dict[str, dict], samples: int) -> list[dict]:
    """`round`: 1 for the first tasks (bench/router_eval.py reports on their held-out split
    apart, so figures stay comparable across rounds), 2 or 3 for those appended later."""
    rounds = {t.id: r for r in (3, 2, 1) for t in build_tasks(rounds=r)}
    rows = []
    for task in tasks:
        row = {
            "id": task.id,
            "family": task.family,
            "split": split_of(task.id),
            "round": rounds[task.id],
            "prompt": task.prompt,
            "expected": task.expected,
        }
        for tier in TIERS:
            row[tier] = tier_outcome(task, [answers[tier][(task.id, i)] for i in range(samples)])
        rows.append(row)
    return rows


def examples_text(rows: list[dict], target: str) -> str:
    """The train split's {prompt, label} (or {prompt, score}) lines for the router."""
    key = "score" if target == "gap" else "label"
    value = TARGETS[target]
    lines = []
    for r in (r for r in rows if r["split"] == "train"):
        v = value(r)
        lines.append(json.dumps({"prompt": r["prompt"], key: int(v) if key == "label" else v}))
    return "".join(line + "\n" for line in lines)


def accuracies(rows: list[dict]) -> dict[str, dict[str, float]]:
    """Per tier: the greedy answers' accuracy and the mean right-answer rate."""
    out = {}
    for tier in TIERS:
        greedy = sum(r[tier]["correct"] for r in rows) / len(rows)
        rate = sum(r[tier].get("rate", r[tier]["correct"]) for r in rows) / len(rows)
        out[tier] = {"greedy_accuracy": greedy, "mean_rate": rate}
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Label the router's tasks from both tiers.")
    parser.add_argument("--samples", type=int, default=10, help="answers per task and tier")
    parser.add_argument("--temperature", type=float, default=0.7, help="of answers 1..")
    parser.add_argument("--weights", default="w8a8", help="engine weight format")
    parser.add_argument("--limit", type=int, default=0, help="N tasks spread over all (a look)")
    parser.add_argument("--first", type=int, default=0, help="only the first N tasks")
    parser.add_argument("--out", type=Path, help=f"default {RATES.name} ({OUTCOMES.name} at 1)")
    parser.add_argument("--examples", type=Path, default=DIFFICULTY_EXAMPLES)
    parser.add_argument("--target", choices=list(TARGETS), default=SHIPPED_TARGET)
    parser.add_argument("--tiers", nargs="+", default=list(TIERS), choices=list(TIERS))
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    sampling = Sampling(args.samples, args.temperature, args.weights)
    out = args.out or (OUTCOMES if args.samples == 1 else RATES)
    tasks = build_tasks()
    if args.first:
        tasks = tasks[: args.first]
    if args.limit:
        tasks = tasks[:: max(1, len(tasks) // args.limit)][: args.limit]
    paths = {tier: answers_path(tier, sampling) for tier in TIERS}
    answers = {tier: tier_answers(tier, tasks, sampling, paths[tier]) for tier in args.tiers}
    if set(answers) != set(TIERS):
        return  # the other tier's process writes the outcomes once both are there
    rows = outcome_rows(tasks, answers, args.samples)
    out.write_text("".join(json.dumps(r) + "\n" for r in rows))
    figures = accuracies(rows)
    for tier, f in figures.items():
        greedy, rate = f["greedy_accuracy"], f["mean_rate"]
        print(f"{tier}: greedy accuracy {greedy:.3f}, mean right-answer rate {rate:.3f}")
    if args.limit:
        print(f"{len(rows)} outcomes -> {out}; examples left alone (--limit)")
        return
    n = sum(r["split"] == "train" for r in rows)
    figures = {"tasks": len(rows), "examples": n, "target": args.target, "tiers": figures}
    text = examples_text(rows, args.target)
    sidecar = write_artifact(args.examples, text, [out, *paths.values()], figures)
    print(f"{len(rows)} outcomes -> {out}; {n} {args.target} examples -> {args.examples}")
    print(f"provenance -> {sidecar}")
