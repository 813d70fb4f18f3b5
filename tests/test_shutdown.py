"""Graceful shutdown drills on real processes: `tiergate serve` and `tiergate engine` with
the small model, the openai client streaming while SIGTERM arrives."""

import contextlib
import os
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from tests.servers import TIERGATE, free_port, wait_for_port

MODEL = "smollm2-135m"
FOREVER = {"ignore_eos": True}  # with a large max_tokens: minutes of output on this CPU


@contextlib.contextmanager
def started(args: list[str], port: int) -> Iterator[subprocess.Popen]:
    """The command as a real process, listening on `port`; its log is shown on failure."""
    env = {**os.environ, "OMP_WAIT_POLICY": "PASSIVE"}
    with tempfile.TemporaryFile("w+") as log:
        proc = subprocess.Popen([*TIERGATE, *args], env=env, stdout=log, stderr=log)
        try:
            _wait_listening(proc, port, timeout=180)
            yield proc
        finally:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
            log.seek(0)
            print(log.read()[-4000:])  # pytest shows it when the test failed


def _wait_listening(proc: subprocess.Popen, port: int, timeout: float) -> None:
    """Like wait_for_port, but a process that exits (a bad policy) fails at once."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited with status {proc.returncode}")
        with contextlib.suppress(TimeoutError):
            wait_for_port(port, timeout=1)
            return
    raise TimeoutError(f"nothing listening on 127.0.0.1:{port} after {timeout}s")


def gateway(tmp: Path, grace_s: float) -> tuple[list[str], int]:
    port = free_port()
    policy = tmp / "policy.yaml"
    policy.write_text(
        f"server: {{port: {port}, shutdown_grace_s: {grace_s}, reload_interval_s: 0}}\n"
        "auth: {mode: none}\n"
        f"engines:\n  {MODEL}: {{kv_cache_mb: 32, max_model_len: 4096, num_threads: 1}}\n"
        f"tiers:\n  small: {{deployments: [{{model: {MODEL}}}], timeout_s: 600}}\n"
    )
    return ["serve", "--policy", str(policy), "--log-level", "info"], port


def engine(grace_s: float) -> tuple[list[str], int]:
    port = free_port()
    args = ["engine", "--model", MODEL, "--port", str(port), "--served-name", "small"]
    args += ["--kv-cache-mb", "32", "--threads", "1", "--shutdown-grace-s", str(grace_s)]
    return args, port


def stream(port: int, max_tokens: int) -> openai.Stream:
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="x", max_retries=0)
    return client.completions.create(
        model="small",
        prompt="Once upon a time",
        max_tokens=max_tokens,
        stream=True,
        stream_options={"include_usage": True},
        extra_body=FOREVER,
    )


def refuses_connections(port: int, deadline_s: float = 30.0) -> bool:
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        try:
            socket.create_connection(("127.0.0.1", port), 0.5).close()
        except ConnectionRefusedError:
            return True
        time.sleep(0.05)
    return False


def exits(proc: subprocess.Popen, deadline_s: float) -> int:
    try:
        return proc.wait(timeout=deadline_s)
    except subprocess.TimeoutExpired:
        raise AssertionError(f"still running {deadline_s}s later") from None


@pytest.fixture(params=["serve", "engine"])
def command(request: pytest.FixtureRequest, tmp_path: Path):
    return lambda grace_s: (
        gateway(tmp_path, grace_s) if request.param == "serve" else engine(grace_s)
    )


def test_in_flight_stream_finishes_after_sigterm(command) -> None:
    args, port = command(300)
    with started(args, port) as proc:
        chunks = iter(stream(port, max_tokens=40))
        next(chunks)
        proc.send_signal(signal.SIGTERM)
        assert refuses_connections(port)  # stops accepting at once...
        rest = list(chunks)  # ...but the answer in flight runs to its end
        assert rest[-2].choices[0].finish_reason == "length"
        assert rest[-1].usage.completion_tokens == 40
        exits(proc, 60)  # then the process is gone, long before the 300 s grace


def test_grace_period_over_aborts_the_stream_with_an_error_event(command) -> None:
    args, port = command(1)
    with started(args, port) as proc:
        chunks = iter(stream(port, max_tokens=640))  # most of the 704-token context: long
        next(chunks)
        proc.send_signal(signal.SIGTERM)
        with pytest.raises(openai.APIError) as caught:
            for _ in chunks:
                pass
        assert "shut" in caught.value.message  # an SSE error event, not a silent cut
        exits(proc, 60)


def test_second_sigterm_exits_at_once(tmp_path: Path) -> None:
    args, port = gateway(tmp_path, 300)
    with started(args, port) as proc:
        chunks = iter(stream(port, max_tokens=640))
        next(chunks)
        proc.send_signal(signal.SIGTERM)
        assert refuses_connections(port)  # draining, and would for 300 s
        proc.send_signal(signal.SIGTERM)
        assert exits(proc, 30) == 128 + signal.SIGTERM
