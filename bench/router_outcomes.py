"""Run both local tiers on the checkable tasks; write raw outcomes and the router's labels.

    python bench/router_outcomes.py            # both tiers, one torch thread (~25 min CPU)
    python bench/router_outcomes.py --tiers small   # one tier (run two processes at once)
    python bench/router_outcomes.py --limit 40 # a quick look

Each tier's answers are kept in `bench/data/router_answers_<tier>.jsonl` and reused by
later runs (delete the file to run that tier again).

Writes `bench/data/router_outcomes.jsonl` (one line per task: prompt, expected answer,
each tier's answer, correctness, tokens) and, from its `train` split,
`router_policies/difficulty_examples.jsonl` ({prompt, label}). The label is the outcome,
RouteLLM's way: 1 ("needs the large tier") when the small tier (smollm2-135m) answers
wrong and the large tier (qwen2.5-coder-0.5b) answers right; 0 otherwise (the small tier
is right, or neither is, so the large tier would buy nothing). The
`heldout` split (every task whose id hashes into the last 25%) is never written to the
examples file: bench/router_eval.py measures on it.
"""

import argparse
import hashlib
import json
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.router_tasks import Task, build_tasks, is_correct  # noqa: E402
from engine.config import EngineConfig  # noqa: E402
from engine.llm_engine import LLMEngine  # noqa: E402
from engine.sampling_params import SamplingParams  # noqa: E402

TIERS = {"small": "smollm2-135m", "large": "qwen2.5-coder-0.5b"}
OUTCOMES = ROOT / "bench" / "data" / "router_outcomes.jsonl"  # kept in git: the eval reuses it
EXAMPLES = ROOT / "router_policies" / "difficulty_examples.jsonl"
HELDOUT_SHARE = 0.25


def split_of(task_id: str) -> str:
    digest = int(hashlib.sha256(task_id.encode()).hexdigest()[:8], 16)
    return "heldout" if digest / 0xFFFFFFFF < HELDOUT_SHARE else "train"


def needs_large(row: dict) -> int:
    return int(row["large"]["correct"] and not row["small"]["correct"])


def run_tier(model: str, tasks: list[Task]) -> dict[str, dict]:
    """Greedy answers for every task, batched through one engine on one thread."""
    engine = LLMEngine(
        EngineConfig(model=model, num_threads=1, max_num_seqs=64, max_waiting=len(tasks) + 1)
    )
    tok = engine.tokenizer
    for task in tasks:
        messages = [
            {"role": "system", "content": task.system},
            {"role": "user", "content": task.prompt},
        ]
        prompt = tok.apply_chat_template(messages)
        engine.add_request(
            task.id, prompt, SamplingParams(temperature=0.0, max_tokens=task.max_tokens)
        )
    texts: dict[str, list[str]] = {t.id: [] for t in tasks}
    done: dict[str, dict] = {}
    while engine.has_unfinished():
        for out in engine.step():
            texts[out.request_id].append(out.text)
            if out.finished:
                if len(done) % 200 == 0:
                    print(f"{model}: {len(done)}/{len(tasks)} done", flush=True)
                done[out.request_id] = {
                    "text": "".join(texts[out.request_id]),
                    "prompt_tokens": out.prompt_tokens,
                    "completion_tokens": out.completion_tokens,
                }
    return done


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--limit", type=int, default=0, help="first N tasks only (a quick look)")
    parser.add_argument("--out", type=Path, default=OUTCOMES)
    parser.add_argument("--examples", type=Path, default=EXAMPLES)
    parser.add_argument("--tiers", nargs="+", default=list(TIERS), choices=list(TIERS))
    args = parser.parse_args()
    torch.set_num_threads(1)
    tasks = build_tasks()
    if args.limit:
        tasks = tasks[:: max(1, len(tasks) // args.limit)][: args.limit]
    answers = {}
    for tier in args.tiers:
        answers[tier] = _answers(tier, tasks, args.out.parent / f"router_answers_{tier}.jsonl")
    if set(answers) != set(TIERS):
        return  # the other tier's process writes the outcomes once both are there
    _write(tasks, answers, args)


def _answers(tier: str, tasks: list[Task], cache: Path) -> dict[str, dict]:
    if cache.exists():
        kept = {r["id"]: r for r in map(json.loads, cache.read_text().splitlines())}
        if all(t.id in kept for t in tasks):
            return kept
    start = time.process_time()
    got = run_tier(TIERS[tier], tasks)
    seconds = time.process_time() - start
    print(f"{tier} ({TIERS[tier]}): {seconds:.0f} s CPU for {len(tasks)} tasks", flush=True)
    cache.parent.mkdir(parents=True, exist_ok=True)
    cache.write_text("".join(json.dumps({"id": k, **v}) + "\n" for k, v in got.items()))
    return got


def _write(
    tasks: list[Task], answers: dict[str, dict[str, dict]], args: argparse.Namespace
) -> None:
    rows = []
    for task in tasks:
        row = {
            "id": task.id,
            "family": task.family,
            "split": split_of(task.id),
            "prompt": task.prompt,
            "expected": task.expected,
        }
        for tier in TIERS:
            got = {k: v for k, v in answers[tier][task.id].items() if k != "id"}
            row[tier] = {**got, "correct": is_correct(task.kind, task.expected, got["text"])}
        rows.append(row)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("".join(json.dumps(r) + "\n" for r in rows))
    train = [r for r in rows if r["split"] == "train"]
    args.examples.write_text(
        "".join(json.dumps({"prompt": r["prompt"], "label": needs_large(r)}) + "\n" for r in train)
    )
    for tier in TIERS:
        acc = sum(r[tier]["correct"] for r in rows) / len(rows)
        print(f"{tier}: accuracy {acc:.3f}")
    print(f"{len(rows)} outcomes -> {args.out}; {len(train)} examples -> {args.examples}")


if __name__ == "__main__":
    main()
