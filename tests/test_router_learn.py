"""`tiergate router learn` end to end on the bundled tiers (SmolLM2-135M small,
Qwen2.5-Coder-0.5B large and judge), replaying the recorded traffic in
tests/data/router_traffic.jsonl (real prompts through a real gateway, both tiers' answers
and the judge's verdicts: `python -m training router record-traffic`). One answer and one
verdict are removed so the run makes one live answer call and one live judge call; the
rest is the refit, calibration, provenance and report. Then its failure modes, the judge's
reading of replies, and a changed examples file reloading a running gateway by itself.

The figures such a run reports on 40 recorded samples are a unit test of the pipeline,
not a result.
"""

import json
from pathlib import Path

import httpx
import pytest

from gateway.app import create_app
from gateway.cache.samples import Sample
from gateway.cli import main
from gateway.policy import ExamplePrompt, load_policy
from gateway.routing.nearest import KERNEL_MAX_EXAMPLES
from tests.router_examples import examples as prior
from tests.servers import eventually, run_uvicorn
from training.artifacts import sha256_of, sidecar_of
from training.router.learn_fit import Labelled, fitted_examples, is_held_out, with_examples
from training.router.learn_judge import parse_verdict

TRAFFIC = Path(__file__).parent / "data" / "router_traffic.jsonl"
JUDGE = "qwen2.5-coder-0.5b"
ENGINE = "{kv_cache_mb: 32, max_num_seqs: 2, max_model_len: 2048, num_threads: 1, weights: blocks}"
POLICY = f"""
auth: {{keys: [{{key: sk-learn, tenant: recorded}}], admin_key: sk-learn-admin}}
server: {{reload_interval_s: 0.2}}
engines: {{smollm2-135m: {ENGINE}, {JUDGE}: {ENGINE}}}
tiers:
  small: {{deployments: [{{model: smollm2-135m}}], price: {{input: 0.02, output: 0.04}}}}
  large: {{deployments: [{{model: {JUDGE}}}], price: {{input: 0.07, output: 0.15}}}}
difficulty:
  examples: [examples.jsonl]
  blend: {{classifier: 1.0, kernel: 3.0}}
routes:
  auto:
    rules: [{{name: hard, tier: large, min_score: 0.5}}]  # learn --write-policy keeps this
    default: small
"""


def write_policy(folder: Path) -> Path:
    (folder / "examples.jsonl").write_text("".join(json.dumps(r) + "\n" for r in prior()))
    (folder / "policy.yaml").write_text(POLICY)
    return folder / "policy.yaml"


def recorded() -> list[dict]:
    return [json.loads(line) for line in TRAFFIC.read_text().splitlines()]


def learn(*args: str) -> int:
    return main(["router", "learn", *args])


def test_the_recorded_traffic_is_whole() -> None:
    rows = recorded()
    assert len(rows) >= 30
    for row in rows:
        assert set(row["answers"]) == {"small", "large"} and row["tier"] in row["answers"]
        assert row["verdict"]["judge"] == JUDGE and row["verdict"]["needs_large"] in (0, 1)
    labels = {row["verdict"]["needs_large"] for row in rows}
    assert labels == {0, 1}, "the recorded verdicts must hold both labels"


def test_learn_end_to_end(tmp_path: Path, one_torch_thread: None) -> None:
    policy = write_policy(tmp_path)
    rows = recorded()
    small_served = next(i for i, r in enumerate(rows) if r["tier"] == "small")
    del rows[small_served]["answers"]["large"]  # one live answer from the large tier,
    rows[small_served]["max_tokens"] = 12  # kept short
    rows[-1]["verdict"] = None  # and one live verdict from the judge
    samples = tmp_path / "samples.jsonl"
    samples.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out, record = tmp_path / "learned.jsonl", tmp_path / "record.jsonl"
    code = learn("--policy", str(policy), "--samples", str(samples), "--out", str(out),
                 "--record", str(record), "--write-policy")  # fmt: skip
    assert code == 0
    again = [json.loads(line) for line in record.read_text().splitlines()]
    assert len(again) == len(rows)
    assert again[small_served]["answers"]["large"].strip()  # fetched from Qwen
    assert again[-1]["verdict"]["judge"] == JUDGE  # judged live
    side = json.loads(sidecar_of(out).read_text())
    assert side["sha256"] == sha256_of(out) and str(record.name) in " ".join(side["data"])
    report = side["figures"]
    examples = [ExamplePrompt.model_validate_json(line) for line in out.read_text().splitlines()]
    labelled = [r for r in again if r["verdict"]["needs_large"] is not None]
    held = [r for r in labelled if is_held_out(r["id"], 0.3)]
    assert report["held_out"] == len(held) and report["train"] == len(labelled) - len(held)
    prior_prompts = {p["prompt"] for p in prior()}
    traffic = [e for e in examples if e.prompt not in prior_prompts]
    assert len(traffic) == 3 * report["train"]  # --weight 3
    held_prompts = {r["messages"][-1]["content"] for r in held}
    assert not held_prompts & {e.prompt for e in traffic}, "the held-out slice is never trained on"
    assert report["prior_examples"] == len(prior())
    for score in ("prior", "fitted"):
        assert set(report[score]) == {"auc", "cpt50", "large_share", "quality"}
    assert report["all_large_quality"] == 1.0
    written = load_policy(policy)
    assert written.routes["auto"].rules[0].min_score == report["calibration"]["min_score"]
    assert "learn --write-policy keeps this" in policy.read_text()


def test_learn_refuses_bad_input(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    policy = write_policy(tmp_path)
    out = str(tmp_path / "out.jsonl")
    base = ["--policy", str(policy), "--out", out]
    assert learn(*base, "--samples", str(tmp_path / "none.jsonl")) == 1
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"tenant": "t"}\n')
    assert learn(*base, "--samples", str(bad)) == 1
    assert "bad.jsonl:1: not a sample" in capsys.readouterr().err
    assert learn(*base, "--samples", str(TRAFFIC), "--route", "nope") == 1
    assert "no route 'nope'" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        learn(*base, "--samples", str(TRAFFIC), "--held-out", "2")
    assert not Path(out).exists()


def test_learn_stops_at_the_spend_cap(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """A cap of 0 refuses every call before any engine starts: the recorded rows still
    label, the rows that needed a call are counted as skipped."""
    policy = write_policy(tmp_path)
    rows = recorded()
    for row in rows[:3]:
        row["verdict"] = None
    samples = tmp_path / "samples.jsonl"
    samples.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "out.jsonl"
    code = learn("--policy", str(policy), "--samples", str(samples), "--out", str(out),
                 "--max-usd", "0")  # fmt: skip
    assert code == 0
    report = json.loads(sidecar_of(out).read_text())["figures"]
    assert report["skipped"] == {"spend_cap": 3} and report["spent_usd"] == 0


@pytest.mark.parametrize(
    ("reply", "needs_large"),
    [
        ("YES", 0), ("Yes.", 0), (" yes, A is as good", 0), ("A is as good as B.", 0),
        ("NO", 1), ("No, B is better.", 1), ("A is not as good as B", 1), ("**No**", 1),
        ("A is worse", 1), ("I cannot tell", None), ("", None), ("Answer B", None),
    ],
)  # fmt: skip
def test_judge_replies_are_read_robustly(reply: str, needs_large: int | None) -> None:
    assert parse_verdict(reply) == needs_large


def test_refit_keeps_under_the_kernel_limit_and_traffic_wins(tmp_path: Path) -> None:
    policy = load_policy(write_policy(tmp_path))
    many = [ExamplePrompt(prompt=f"prior {i}", label=i % 2) for i in range(KERNEL_MAX_EXAMPLES)]
    policy = with_examples(policy, many)
    train = [Labelled(Sample("t", "auto", [{"role": "user", "content": "prior 7"}], "small",
                             "m", "a"), 0)]  # fmt: skip
    examples, kept = fitted_examples(policy, train, 3)
    assert len(examples) == KERNEL_MAX_EXAMPLES and kept == KERNEL_MAX_EXAMPLES - 3
    assert [e.label for e in examples if e.prompt == "prior 7"] == [0, 0, 0]


RELOAD_POLICY = """
auth: {keys: [{key: sk-learn, tenant: recorded}], admin_key: sk-learn-admin}
server: {reload_interval_s: 0.2}
tiers:
  small: {deployments: [{model: openai/none, api_base: 'http://127.0.0.1:9/v1'}]}
  large: {deployments: [{model: openai/none, api_base: 'http://127.0.0.1:9/v1'}]}
difficulty: {examples: [examples.jsonl], blend: {classifier: 1.0, kernel: 3.0}}
routes:
  auto: {rules: [{tier: large, min_score: 0.5}], default: small}
"""


def test_a_new_examples_file_reloads_the_gateway(tmp_path: Path, one_torch_thread: None) -> None:
    """What `router learn --out <the policy's examples file>` relies on: no POST needed."""
    policy_path = write_policy(tmp_path)
    policy_path.write_text(RELOAD_POLICY)
    app = create_app(load_policy(policy_path), policy_path=policy_path)
    with run_uvicorn(app) as base:
        state = app.state.gateway
        before = state.runtime.loaded_at
        rows = [*prior(), {"prompt": "What is the capital of France?", "label": 1}]
        (tmp_path / "examples.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        assert eventually(lambda: state.runtime.loaded_at > before, 30)
        admin = {"authorization": "Bearer sk-learn-admin"}
        assert httpx.get(f"{base}/admin/policy", headers=admin).json()["last_error"] is None


def test_learn_reads_one_tenants_samples_from_the_store(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """`--from-store --tenant` reads the policy's own store, that tenant's samples only
    (with a cap of 0 each one needs a call it may not make: counted, nothing written)."""
    import asyncio

    from gateway.cache.samples_sqlite import SqliteSamples

    policy = write_policy(tmp_path)
    store_path = tmp_path / "store.sqlite3"
    policy.write_text(POLICY + f"cache: {{path: '{store_path}'}}\n")
    rows = recorded()[:5]

    async def fill() -> None:
        store = SqliteSamples(store_path)
        for i, row in enumerate(rows):
            keep = {k: v for k, v in row.items() if k not in ("answers", "verdict")}
            sample = Sample(**keep | {"tenant": "a" if i < 3 else "b", "expires_at": 4e9})
            await store.add(sample, 100)
        await store.close()

    asyncio.run(fill())
    out = tmp_path / "out.jsonl"
    code = learn("--policy", str(policy), "--from-store", "--tenant", "a", "--out", str(out),
                 "--max-usd", "0")  # fmt: skip
    assert code == 1 and "{'spend_cap': 3}" in capsys.readouterr().err
    assert not out.exists()
