"""The commands users run, as real processes: `tiergate engine` and `tiergate serve`."""

import os
import signal
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from openai import OpenAI

from tests.servers import TIERGATE, free_port, wait_for_port


@contextmanager
def running(args: list[str], port: int) -> Iterator[None]:
    env = {**os.environ, "OMP_WAIT_POLICY": "PASSIVE"}
    proc = subprocess.Popen([*TIERGATE, *args], env=env, stderr=subprocess.PIPE, text=True)
    try:
        wait_for_port(port, timeout=120)
        yield
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def test_engine_command_serves_openai_clients() -> None:
    port = free_port()
    args = [
        "engine",
        "--model",
        "smollm2-135m",
        "--port",
        str(port),
        "--served-name",
        "smol",
        "--kv-cache-mb",
        "32",
        "--threads",
        "1",
    ]
    with running(args, port):
        client = OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused")
        assert [m.id for m in client.models.list().data] == ["smol"]
        reply = client.chat.completions.create(
            model="smol",
            messages=[{"role": "user", "content": "Say hi"}],
            max_tokens=5,
            temperature=0,
        )
        assert reply.usage.completion_tokens <= 5 and reply.choices[0].message.content


def test_serve_command_with_a_policy_file(tmp_path: Path) -> None:
    port = free_port()
    policy = tmp_path / "policy.yaml"
    policy.write_text(
        "auth:\n  keys: [{key: sk-test, tenant: t}]\n"
        "engines:\n  smollm2-135m: {kv_cache_mb: 32, num_threads: 1}\n"
        "tiers:\n  small: {deployments: [{model: smollm2-135m}]}\n"
        "routes:\n  auto: {default: small}\n"
    )
    with running(["serve", "--policy", str(policy), "--port", str(port)], port):
        client = OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="sk-test")
        raw = client.chat.completions.with_raw_response.create(
            model="auto", messages=[{"role": "user", "content": "Say hi"}], max_tokens=5
        )
        assert raw.headers["x-tiergate-tier"] == "small"
        assert raw.headers["x-tiergate-model"] == "smollm2-135m"
        assert raw.parse().choices[0].message.content
