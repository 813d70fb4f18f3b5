"""Real tiergate processes for tests: `tiergate engine` and `tiergate serve` subprocesses on
loopback ports they keep across restarts; each can be killed (SIGKILL: a crash)."""

import contextlib
import os
import signal
import subprocess
import time
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

from tests.servers import TIERGATE, free_port, wait_for_port

ENGINE_MODEL = "smollm2-135m"


class Process:
    """One `python -m gateway.cli ARGS` child; its stderr goes to `log` when given."""

    def __init__(
        self, args: list[str], port: int, log: Path | None = None, env: dict | None = None
    ) -> None:
        self.args, self.port, self.log, self.env = args, port, log, env or {}
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def launch(self) -> None:
        """Start without waiting (several can then load their models at once)."""
        env = {**os.environ, "OMP_WAIT_POLICY": "PASSIVE", **self.env}
        cmd = [*TIERGATE, *self.args]
        err = open(self.log, "ab") if self.log else subprocess.DEVNULL  # noqa: SIM115
        self.proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=err)

    def wait_ready(self, timeout: float = 180) -> None:
        """Until the port opens: uvicorn opens it once the lifespan is done (models and
        embedder loaded). A process that exits first fails at once, with its log's end."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                tail = self.log.read_text()[-2000:] if self.log else ""
                raise RuntimeError(f"{self.args[0]} exited with {self.proc.returncode}\n{tail}")
            with contextlib.suppress(TimeoutError):
                return wait_for_port(self.port, timeout=1)
        raise TimeoutError(f"{self.args[0]} not listening on {self.port} after {timeout}s")

    def start(self) -> None:
        """Launch and wait; a child that never got ready is killed, not left holding its
        model's memory for the rest of the test session."""
        self.launch()
        try:
            self.wait_ready()
        except BaseException:
            self.kill()
            raise

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()

    def metric(self, name: str, headers: dict[str, str] | None = None) -> float:
        text = httpx.get(f"{self.url}/metrics", headers=headers, timeout=10).text
        return sum(
            sample.value
            for family in text_string_to_metric_families(text)
            for sample in family.samples
            if sample.name == name
        )


class Engine(Process):
    """`tiergate engine` with the small model (or `model`), one thread, a small KV budget."""

    def __init__(
        self, log: Path | None = None, model: str = ENGINE_MODEL, served: str = "smol"
    ) -> None:
        port = free_port()
        args = ["engine", "--model", model, "--port", str(port), "--served-name", served]
        args += ["--kv-cache-mb", "32", "--threads", "1", "--max-model-len", "2048"]
        super().__init__(args, port, log)

    def api_base(self) -> str:
        return f"{self.url}/v1"

    def requests_served(self) -> float:
        return self.metric("tiergate_engine_time_to_first_token_seconds_count")

    def prefix_hit_rate(self) -> float:
        hits = self.metric("tiergate_engine_prefix_cache_hits_total")
        return hits / self.metric("tiergate_engine_prefix_cache_queries_total")


class Gateway(Process):
    """`tiergate serve --policy FILE`; TIERGATE_REPLICA_ID names it among its replicas,
    which share one TIERGATE_POLICY_SECRET (their policy reloads are signed with it)."""

    def __init__(self, policy: Path, replica: str, log: Path | None = None) -> None:
        port = free_port()
        args = ["serve", "--policy", str(policy), "--port", str(port), "--log-level", "warning"]
        env = {"TIERGATE_REPLICA_ID": replica, "TIERGATE_POLICY_SECRET": "test-fleet-secret"}
        super().__init__(args, port, log, env)
        self.replica = replica
