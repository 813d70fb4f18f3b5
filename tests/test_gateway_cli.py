"""The `tiergate` command's failure paths: one clear line, exit status 1, no traceback."""

from pathlib import Path

import pytest

from gateway.cli import main


def test_engine_with_unknown_model(capsys: pytest.CaptureFixture) -> None:
    assert main(["engine", "--model", "no-such-model", "--port", "1"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("tiergate: unknown model 'no-such-model'") and err.count("\n") == 1


def test_serve_refuses_an_invalid_policy(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        "tiers:\n  a: {deployments: [{model: smollm2-135m}], fallback: b}\nauth: {mode: none}\n"
    )
    assert main(["serve", "--policy", str(bad)]) == 1
    assert capsys.readouterr().err == f"{bad}:2: tiers.a.fallback: unknown tier 'b'\n"


def test_serve_with_a_missing_model(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text(
        "engines:\n  mine: {model: /nowhere/model.gguf}\n"
        "tiers:\n  a: {deployments: [{model: mine}]}\nauth: {mode: none}\n"
    )
    assert main(["serve", "--policy", str(policy)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("tiergate: unknown model '/nowhere/model.gguf'") and err.count("\n") == 1


def test_check_policy_on_a_missing_file(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    missing = tmp_path / "nope.yaml"
    assert main(["check-policy", str(missing)]) == 1
    assert (
        capsys.readouterr().err.splitlines()[0]
        == f"{missing}: cannot read: No such file or directory"
    )
