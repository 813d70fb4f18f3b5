"""The sources of the real pair set (real_pairs.py), each read into one row format:
{a, b, should_hit, category, source, domain, detail}. `a` is the new question, `b` the one
whose answer the cache holds.

- handwritten: training/data/cache_pairs_real/handwritten.txt, written by this team.
- groups: training/data/cache_paraphrase_groups.txt, the team's earlier hand-written groups.
- sharegpt: ShareGPT turns that recur across conversations (sharegpt_repeats.py), and the
  embedder's close pairs that a person labelled (cache_pairs_real/sharegpt_reviewed.txt).
- rules: the rule-made edits of training/cache/pair_edits.py (training/data/cache_pairs.jsonl),
  kept apart as category rule_edit: a verifier trained on them learns their rules.
"""

import hashlib
import json
from pathlib import Path

from training.artifacts import CACHE_PAIRS, REAL_PAIRS_DIR
from training.cache.build_pairs import read_groups

HANDWRITTEN = REAL_PAIRS_DIR / "handwritten.txt"
# Written after the first models (later_sets.py): held-out sets, each after the models it
# judges were fixed, and train2, more train pairs in free rewordings.
HANDWRITTEN2 = REAL_PAIRS_DIR / "handwritten_heldout2.txt"
HANDWRITTEN3 = REAL_PAIRS_DIR / "handwritten_heldout3.txt"
HANDWRITTEN4 = REAL_PAIRS_DIR / "handwritten_heldout4.txt"
HANDWRITTEN_TRAIN2 = REAL_PAIRS_DIR / "handwritten_train2.txt"
HANDWRITTEN_TRAIN3 = REAL_PAIRS_DIR / "handwritten_train3.txt"
HANDWRITTEN5 = REAL_PAIRS_DIR / "handwritten_heldout5.txt"
HANDWRITTEN_TRAIN4 = REAL_PAIRS_DIR / "handwritten_train4.txt"
HANDWRITTEN6 = REAL_PAIRS_DIR / "handwritten_heldout6.txt"
SHAREGPT_REVIEWED = REAL_PAIRS_DIR / "sharegpt_reviewed.txt"

SHOULD_HIT = ("paraphrase", "near_repeat", "exact_repeat")
# followup: right in its own conversation only, so never across conversations.
MUST_NOT = ("negation", "number", "entity", "scope", "antonym", "unrelated", "followup")
RULE_EDIT = "rule_edit"  # either label: the edit's own
CATEGORIES = (*SHOULD_HIT, *MUST_NOT, RULE_EDIT)
# The groups file's and the rule generator's kinds, in the categories.
KIND_CATEGORY = {"units": "number", "quoted": "entity", "question": "scope", "direction": "antonym"}
RULE_PAIRS_KEPT = 1200  # of ~3,300: enough to measure, a modest file


def row(a: str, b: str, category: str, source: str, **extra: str | bool | None) -> dict:
    should_hit = extra.pop("should_hit", category in SHOULD_HIT)
    out = {"a": a, "b": b, "should_hit": should_hit, "category": category, "source": source}
    return out | {"domain": extra.get("domain"), "detail": extra.get("detail")}


def read_labelled(path: Path, source: str) -> list[dict]:
    """`category | a | b` lines; `## name` starts a domain; `#` lines are comments."""
    rows, domain = [], None
    if not path.exists():
        return rows
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if line.startswith("## "):
            domain = line[3:].strip()
        elif line.strip() and not line.startswith("#"):
            parts = [p.strip() for p in line.split(" | ")]
            if len(parts) != 3 or parts[0] not in CATEGORIES or parts[0] == RULE_EDIT:
                raise ValueError(f"{path.name}:{n}: expected `category | a | b`: {line!r}")
            rows.append(row(parts[1], parts[2], parts[0], source, domain=domain))
    return rows


def handwritten() -> list[dict]:
    return read_labelled(HANDWRITTEN, "handwritten")


def groups() -> list[dict]:
    rows = []
    for same, others in read_groups():
        for i, x in enumerate(same):
            rows += [row(x, y, "paraphrase", "groups") for y in same[i + 1 :]]
        for kind, text in others:
            rows.append(row(text, same[0], KIND_CATEGORY.get(kind, kind), "groups"))
    return rows


def sharegpt() -> list[dict]:
    from training.cache.sharegpt_repeats import repeats, turns_by_key

    found = [row(r["a"], r["b"], r["category"], "sharegpt") for r in repeats(turns_by_key())]
    return found + read_labelled(SHAREGPT_REVIEWED, "sharegpt")


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def rule_edits() -> list[dict]:
    """The generator's pairs made from ShareGPT and GSM8K questions (not its hand-written
    groups, read above, nor its unrelated pairs, which no rule made), a fixed sample."""
    rows = []
    for line in CACHE_PAIRS.read_text().splitlines():
        p = json.loads(line)
        if p["source"].split(":")[0] in ("sharegpt", "gsm8k") and p["kind"] != "unrelated":
            kind = KIND_CATEGORY.get(p["kind"], p["kind"])
            rows.append(
                row(p["a"], p["b"], RULE_EDIT, "rules", should_hit=bool(p["label"]), detail=kind)
            )
    rows.sort(key=lambda r: _digest(r["a"] + "\0" + r["b"]))
    return rows[:RULE_PAIRS_KEPT]
