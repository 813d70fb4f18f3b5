"""`tiergate router learn` on samples whose right answer is known: the reference check that
labels them instead of the judge, the qualities the report reads from it, and the spend cap
holding when samples are labelled concurrently."""

import asyncio
import json
from pathlib import Path

import pytest

from engine.entrypoints.openai.protocol import Usage
from gateway.cli import main
from gateway.policy import load_policy
from tests.router_examples import examples as prior
from training.artifacts import ROOT, sidecar_of
from training.router.learn_reference import reference_kind, reference_verdict
from training.router.learn_tiers import Reply, SpendCapReached, Tiers

POLICY = """
auth: {keys: [{key: sk-learn, tenant: recorded}], admin_key: sk-learn-admin}
tiers:
  small:
    deployments: [{model: openai/none, api_base: 'http://127.0.0.1:9/v1'}]
    price: {input: 1.0, output: 1.0}
  large:
    deployments: [{model: openai/none, api_base: 'http://127.0.0.1:9/v1'}]
    price: {input: 2.0, output: 2.0}
difficulty: {examples: [examples.jsonl], blend: {classifier: 1.0, kernel: 3.0}}
routes:
  auto: {rules: [{tier: large, min_score: 0.5}], default: small}
"""


def write_policy(folder: Path) -> Path:
    (folder / "examples.jsonl").write_text("".join(json.dumps(r) + "\n" for r in prior()))
    (folder / "policy.yaml").write_text(POLICY)
    return folder / "policy.yaml"


@pytest.mark.parametrize(
    ("reference", "kind"),
    [("42", "number"), ("1,234", "number"), ("-3.5", "number"), (" 7 ", "number"),
     ("Paris", "text"), ("10^-4 eV", "text"), ("3 apples", "text")],
)  # fmt: skip
def test_the_reference_kind_is_read_from_the_text(reference: str, kind: str) -> None:
    assert reference_kind(reference) == kind


@pytest.mark.parametrize(
    ("reference", "small", "large", "needs_large"),
    [
        ("1,234", "so the answer is 1234", "It makes 1,234 dollars.", 0),  # both right
        ("18", "She sells 9 eggs for $2: 18 is wrong? No: 20", "9 * 2 = 18", 1),
        ("18", "The answer is 18.", "The answer is 16.", 0),  # the small one right
        ("18", "The answer is 16.", "The answer is 17.", 0),  # both wrong: nothing to buy
        ("Paris", "It is Lyon.", "The capital is paris.", 1),
    ],
)
def test_a_reference_labels_the_pair(reference, small, large, needs_large) -> None:
    verdict = reference_verdict(reference, small, large)
    assert verdict["judge"] == "reference" and verdict["needs_large"] == needs_large
    assert verdict["large_correct"] == (needs_large == 1 or "1,234" in large)


def sample_row(i: int, reference: str | None, small: str, large: str) -> dict:
    question = f"Question {i}: what is {i} + {i}?"
    return {
        "tenant": "recorded", "route": "auto", "tier": "small", "model": "m", "answer": small,
        "messages": [{"role": "user", "content": question}], "id": f"s{i}",
        "answers": {"small": small, "large": large},
        # a judge's old verdict: the reference overrides it
        "verdict": {"judge": "someone", "reply": "YES", "needs_large": 0},
    } | ({"reference": reference} if reference is not None else {})  # fmt: skip


def test_learn_labels_referenced_samples_without_asking(tmp_path: Path) -> None:
    """Every answer is in the file and every sample has a reference: nothing is asked (the
    tiers point at a closed port), the verdicts are the reference's, and the report's
    qualities are the checked answers (all-large is the large tier's right share, not 1)."""
    policy = write_policy(tmp_path)
    rows = [sample_row(i, str(2 * i), "no idea", f"{2 * i}" if i % 2 else "41") for i in range(40)]
    samples = tmp_path / "samples.jsonl"
    samples.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out, record = tmp_path / "learned.jsonl", tmp_path / "record.jsonl"
    code = main(["router", "learn", "--policy", str(policy), "--samples", str(samples),
                 "--out", str(out), "--record", str(record), "--max-usd", "0"])  # fmt: skip
    assert code == 0
    again = [json.loads(line) for line in record.read_text().splitlines()]
    assert {r["verdict"]["judge"] for r in again} == {"reference"}
    assert [r["verdict"]["needs_large"] for r in again] == [i % 2 for i in range(40)]
    assert all(r["reference"] == str(2 * i) for i, r in enumerate(again))
    report = json.loads(sidecar_of(out).read_text())["figures"]
    assert report["skipped"] == {} and report["spent_usd"] == 0
    assert report["all_small_quality"] == 0.0
    assert 0 < report["all_large_quality"] < 1  # half the large answers are right
    assert report["all_large_quality"] == report["needs_large_share"]


def test_a_sample_without_a_reference_still_goes_to_the_judge(tmp_path: Path) -> None:
    policy = write_policy(tmp_path)
    rows = [sample_row(i, None, "a", "b") for i in range(6)]
    samples = tmp_path / "samples.jsonl"
    samples.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "learned.jsonl"
    code = main(["router", "learn", "--policy", str(policy), "--samples", str(samples),
                 "--out", str(out), "--max-usd", "0"])  # fmt: skip
    assert code == 1  # the old verdicts are another judge's; a cap of 0 refuses a new one


def test_concurrent_calls_cannot_pass_the_spend_cap(tmp_path: Path) -> None:
    """Each call's estimate is reserved before it starts: 12 calls at once, room for 3."""
    tiers = Tiers(load_policy(write_policy(tmp_path)), max_usd=0.0)
    messages = [{"role": "user", "content": "x" * 400}]  # 101 tokens + 100 out at $1/1M
    one = tiers._estimate("small", messages, 100)
    tiers.max_usd = 3.5 * one

    async def fake_ask(tier: str, messages: list[dict], max_tokens: int) -> Reply:
        await asyncio.sleep(0.05)  # every call is in flight before the first ends
        return Reply("ok", Usage.of(101, 100), one, "m")

    tiers._ask = fake_ask

    async def run() -> list:
        async with tiers.running():
            calls = [tiers.ask("small", messages, 100) for _ in range(12)]
            return await asyncio.gather(*calls, return_exceptions=True)

    results = asyncio.run(run())
    assert sum(isinstance(r, Reply) for r in results) == 3
    assert sum(isinstance(r, SpendCapReached) for r in results) == 9
    assert tiers.spent_usd <= tiers.max_usd and tiers.reserved_usd == 0


RECORD = ROOT / "training" / "data" / "router_learn" / "reference_traffic.jsonl"
DEFAULT_POLICY = ROOT / "router_policies" / "default.yaml"


def test_the_reference_traffic_is_whole_and_labelled_by_its_references() -> None:
    rows = [json.loads(line) for line in RECORD.read_text().splitlines()]
    assert len(rows) >= 300
    for row in rows:
        assert set(row["answers"]) == {"small", "large"} and row["reference"]
        answers = row["answers"]
        again = reference_verdict(row["reference"], answers["small"], answers["large"])
        assert row["verdict"] == again  # the checker that labelled it is today's
    assert {r["verdict"]["needs_large"] for r in rows} == {0, 1}


def test_the_refit_is_ahead_of_the_prior_on_held_out_reference_traffic(tmp_path: Path) -> None:
    """The shipped prior and its refit on the recorded reference traffic (real questions,
    both bundled tiers' answers), replayed with nothing to ask: on the fixed 30% held-out
    slice the refit ranks "needs the large tier" better than the prior it started from."""
    out = tmp_path / "learned.jsonl"
    code = main(["router", "learn", "--policy", str(DEFAULT_POLICY), "--samples", str(RECORD),
                 "--out", str(out), "--max-usd", "0"])  # fmt: skip
    assert code == 0
    report = json.loads(sidecar_of(out).read_text())["figures"]
    assert report["skipped"] == {} and report["spent_usd"] == 0
    assert report["held_out"] >= 90 and 0 < report["needs_large_share"] < 0.5
    assert report["fitted"]["auc"] > report["prior"]["auc"] + 0.15  # 0.609 against 0.341
