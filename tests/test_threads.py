"""Threads chosen by measurement at engine start, and the OpenMP waiting defaults the entry
points set before torch loads."""

import os
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest
import torch

from engine.config import EngineConfig
from engine.omp_env import set_omp_defaults
from engine.runner import ModelRunner
from engine.thread_choice import choose_threads, usable_cores
from gateway.cli import main
from gateway.policy import EngineSettings

MODEL = "smollm2-135m"
multicore = pytest.mark.skipif(usable_cores() < 2, reason="needs two cores to choose from")


@pytest.fixture(autouse=True)
def keep_torch_threads() -> Iterator[None]:
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def _probe(slow_at: int) -> tuple[list[int], object]:
    """A probe that sleeps 20 ms at `slow_at` threads and 2 ms otherwise; records each call."""
    calls: list[int] = []

    def probe() -> None:
        calls.append(torch.get_num_threads())
        time.sleep(0.02 if torch.get_num_threads() == slow_at else 0.002)

    return calls, probe


def test_configured_threads_are_used_without_measuring() -> None:
    calls, probe = _probe(slow_at=1)
    choice = choose_threads(1, probe)  # type: ignore[arg-type]
    assert (choice.threads, choice.how, calls) == (1, "configured", [])
    assert torch.get_num_threads() == 1


@multicore
@pytest.mark.parametrize("slow_at", [1, usable_cores()])
def test_auto_keeps_the_faster_candidate_and_says_why(slow_at: int) -> None:
    calls, probe = _probe(slow_at)
    choice = choose_threads(None, probe)  # type: ignore[arg-type]
    cores = usable_cores()
    assert set(calls) == {1, cores}  # both were timed, interleaved
    assert choice.how == "measured" and set(choice.step_ms) == {1, cores}
    assert choice.threads == (cores if slow_at == 1 else 1)
    assert torch.get_num_threads() == choice.threads
    assert choice.info()["threads_step_ms"].startswith("1:")


@multicore
def test_all_cores_must_win_by_more_than_noise() -> None:
    def probe() -> None:  # the same time either way: one thread, which leaves a core free
        time.sleep(0.005)

    assert choose_threads(None, probe).threads == 1


def test_a_real_engine_measures_its_own_decode_steps() -> None:
    runner = ModelRunner(EngineConfig(model=MODEL, kv_cache_bytes=16 << 20))
    info = runner.kernel_info()
    assert runner.threads.threads in {1, usable_cores()}
    assert info["threads"] == str(runner.threads.threads)
    if usable_cores() > 1:
        assert info["threads_how"] == "measured"
        assert sorted(runner.threads.step_ms) == [1, usable_cores()]
        assert all(ms > 0 for ms in runner.threads.step_ms.values())
    explicit = ModelRunner(EngineConfig(model=MODEL, kv_cache_bytes=16 << 20, num_threads=1))
    assert explicit.kernel_info()["threads_how"] == "configured"
    assert torch.get_num_threads() == 1


def test_omp_defaults_never_override_the_user() -> None:
    env: dict[str, str] = {}
    assert set_omp_defaults(env) == env == {"OMP_WAIT_POLICY": "PASSIVE", "GOMP_SPINCOUNT": "0"}
    for mine in ({"OMP_WAIT_POLICY": "ACTIVE"}, {"GOMP_SPINCOUNT": "300000"}):
        env = dict(mine)
        assert set_omp_defaults(env) == {} and env == mine


@pytest.mark.parametrize("user", [None, "ACTIVE"])
def test_the_cli_sets_them_before_torch_loads(user: str | None) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    if user:
        env["OMP_WAIT_POLICY"] = user
    code = (
        "import os, sys\nfrom gateway.cli import main\nloaded = 'torch' in sys.modules\n"
        "main(['hash-key', 'k'])\nprint(os.environ.get('OMP_WAIT_POLICY'), loaded)"
    )
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.stdout.splitlines()[-1] == f"{user or 'PASSIVE'} False"


@pytest.mark.parametrize("flags", [["--threads", "0"], ["--kv-watermark", "1.5"]])
def test_bad_engine_values_exit_2(flags: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["engine", "--model", MODEL, *flags]) == 2
    assert flags[0] in capsys.readouterr().err


def test_threads_is_auto_or_a_number(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["engine", "--model", MODEL, "--threads", "many"])
    assert "expected auto or a number" in capsys.readouterr().err


def test_auto_is_a_policy_value_too() -> None:
    assert EngineSettings(num_threads="auto").num_threads is None  # type: ignore[arg-type]
    assert EngineSettings(num_threads=3).to_config("m").num_threads == 3
