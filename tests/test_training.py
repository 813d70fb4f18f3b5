"""training/: the shipped artefacts carry provenance that matches them and their data, and
the one entry point (`python -m training`, `tiergate train`) writes an artefact with it."""

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from gateway.cli import main as tiergate
from training import artifacts

SHIPPED = [
    artifacts.VERIFIER_MODEL,
    artifacts.DIFFICULTY_EXAMPLES,
    artifacts.PAIR_MODEL_CONFIG,
    artifacts.ALIGNED_MODEL,
]


@pytest.mark.parametrize("artifact", SHIPPED, ids=lambda p: p.name)
def test_each_shipped_artifact_names_its_data_code_and_figures(artifact: Path) -> None:
    """Regenerate an artefact or edit its data, and this fails until the writer runs again."""
    sidecar = artifacts.sidecar_of(artifact)
    record = json.loads(sidecar.read_text())
    assert record["artifact"] == str(artifact.relative_to(artifacts.ROOT))
    assert record["sha256"] == artifacts.sha256_of(artifact), "artefact changed since written"
    assert record["data"], "no source data recorded"
    for name, digest in record["data"].items():
        assert name.startswith("training/data/"), name
        assert artifacts.sha256_of(artifacts.ROOT / name) == digest, f"{name} changed"
    assert re.fullmatch(r"[0-9a-f]{40}", record["code"]["commit"])
    assert record["code"]["dirty"] is False  # the commit alone reproduces it
    assert record["figures"] and record["command"].startswith("python -m training ")


def test_the_entry_point_trains_the_verifier_with_its_sidecar(tmp_path: Path) -> None:
    """`python -m training cache verifier` (the people's train pairs, thresholds out of
    fold, ~30 s) writes what ships, with a sidecar naming its data."""
    out = tmp_path / "verifier.json"
    cmd = [sys.executable, "-m", "training", "cache", "verifier", "--out", str(out)]
    done = subprocess.run(cmd, cwd=artifacts.ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    model = json.loads(out.read_text())
    record = json.loads((tmp_path / "verifier.provenance.json").read_text())
    assert record["sha256"] == artifacts.sha256_of(out)
    assert record["command"] == f"python -m training cache verifier --out {out}"
    for data in (artifacts.REAL_PAIRS, artifacts.CACHE_WORDS):
        name = str(data.relative_to(artifacts.ROOT))
        assert record["data"][name] == artifacts.sha256_of(data)
    assert record["figures"]["thresholds"] == model["thresholds"]
    shipped = json.loads(artifacts.VERIFIER_MODEL.read_text())
    for key in ("weights", "mean", "scale"):
        assert model["model"][key] == pytest.approx(shipped["model"][key], abs=2e-6)
    assert model["thresholds"] == pytest.approx(shipped["thresholds"], abs=2e-6)
    assert model["word_stats"] == shipped["word_stats"]


def test_tiergate_train_runs_the_same_steps(capsys: pytest.CaptureFixture) -> None:
    assert tiergate(["train", "router", "nonsense"]) == 2
    usage = capsys.readouterr().err
    for step in ("router outcomes", "router label-cv", "cache pairs", "cache verifier"):
        assert step in usage


def test_a_report_carries_its_provenance(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(artifacts, "REPORTS", tmp_path)
    rates = artifacts.DATA / "router_rates.jsonl"
    path = artifacts.write_report("curve", {"auc": 0.7}, [rates])
    body = json.loads(path.read_text())
    assert path == tmp_path / "curve.json" and body["auc"] == 0.7
    assert body["provenance"]["data"] == {
        "training/data/router_rates.jsonl": artifacts.sha256_of(rates)
    }


def test_tiergate_train_without_the_training_package_says_where_to_run_it(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    """An installed gateway (the Docker image) has no training/: one line, no traceback."""
    monkeypatch.setitem(sys.modules, "training", None)  # import training now fails
    monkeypatch.delitem(sys.modules, "training.__main__", raising=False)
    assert tiergate(["train", "cache", "verifier"]) == 1
    assert "run it from a source checkout" in capsys.readouterr().err
