"""The train scope's extra stored questions and their judged neighbours: train-side data
that must never carry held-out text, and rows a trainer can read."""

from collections import Counter

from training import artifacts
from training.cache.neighbours import read_rows, scope_questions, train_files
from training.cache.sharegpt_repeats import normal_key

SCOPE = artifacts.SCOPE_QUESTIONS_TRAIN
JUDGED = artifacts.REAL_PAIRS_DIR / "neighbours_judged_scope.jsonl"
DOMAINS = {"coding", "maths", "facts", "howto", "writing", "chitchat", "support"}


def _rows(name_part: str) -> list[dict]:
    return read_rows([p for p in artifacts.REAL_PAIRS_DIR.glob("*.jsonl") if name_part in p.name])


def _written_lines() -> list[str]:
    lines = [line.strip() for line in SCOPE.read_text().splitlines()]
    return [line for line in lines if line and not line.startswith("#")]


def test_no_scope_question_is_a_held_out_question() -> None:
    held_out = {normal_key(q) for r in _rows("heldout") for q in (r["a"], r["b"])}
    held_out |= {normal_key(r["a"]) for r in _rows("populated_judged.jsonl")}
    assert held_out, "the held-out files were not found"
    assert not {normal_key(q) for q in scope_questions(SCOPE)} & held_out


def test_every_line_names_a_domain_and_a_question_once() -> None:
    lines = _written_lines()
    domains = Counter(line.split("|", 1)[0].strip() for line in lines)
    assert set(domains) == DOMAINS
    assert min(domains.values()) >= 150
    keys = [normal_key(q) for q in scope_questions(SCOPE)]
    assert len(keys) == len(lines) == len(set(keys)) >= 1_800
    assert all(keys)


def test_the_reader_takes_the_question_after_the_domain(tmp_path) -> None:
    path = tmp_path / "scope.txt"
    path.write_text("# a comment\ncoding | how do I sort a list | in place?\n\nmaths | 2+2?\n")
    assert scope_questions(path) == ["how do I sort a list | in place?", "2+2?"]


def test_the_judged_scope_rows_are_train_rows_a_trainer_reads() -> None:
    rows = read_rows([JUDGED])
    train = {normal_key(q) for r in _rows("pairs_train") for q in (r["a"], r["b"])}
    train |= {
        normal_key(q)
        for r in _rows("pairs.jsonl")
        if r["split"] == "train"
        for q in (r["a"], r["b"])
    }
    stored = train | {normal_key(q) for q in scope_questions(SCOPE)}
    assert rows and all(r["split"] == "judged_train" and r["source"] == "judged" for r in rows)
    assert all(isinstance(r["should_hit"], bool) for r in rows)
    assert all(normal_key(r["a"]) in train and normal_key(r["b"]) in stored for r in rows)
    assert {r["should_hit"] for r in rows} == {True, False}
    assert JUDGED in artifacts.TRAIN_JUDGED and JUDGED in train_files()
