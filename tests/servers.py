"""Real servers for tests and benchmarks: uvicorn on a free loopback port, redis-server in a
temp folder, a command in its own session (`session_process`, `tiergate serve`); and
waiting on what runs (`eventually`, `wait_idle`). The benchmarks import these too."""

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import uvicorn

# `tiergate` as the running interpreter runs it: this checkout's code, whatever is installed.
TIERGATE = [sys.executable, "-m", "gateway.cli"]


def tiergate_serve(policy: Path, port: int) -> list[str]:
    return [*TIERGATE, "serve", "--policy", str(policy), "--port", str(port)]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def stop_session(proc: subprocess.Popen, grace_s: float) -> None:
    """SIGTERM the session a process leads (started with start_new_session=True), then
    SIGKILL it if the leader has not exited after `grace_s`."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)


@contextlib.contextmanager
def session_process(cmd: list[str], log: Path, env: dict[str, str] | None = None) -> Iterator[int]:
    """`cmd` in its own session, its output in `log`; yields its pid, and stops that session
    (only it: a server's own children too) on exit."""
    with log.open("w") as out:
        proc = subprocess.Popen(
            cmd,
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, **(env or {})},
            start_new_session=True,
        )
    try:
        yield proc.pid
    finally:
        stop_session(proc, grace_s=20)


def wait_for_port(port: int, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.2):
            return
        time.sleep(0.05)
    raise TimeoutError(f"nothing listening on 127.0.0.1:{port} after {timeout}s")


def eventually(check: Callable[[], bool], seconds: float) -> bool:
    """Whether `check()` comes true within `seconds` (polled every 50 ms)."""
    deadline = time.monotonic() + seconds
    while not check():
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)
    return True


def wait_for(check: Callable[[], bool], seconds: float = 30.0) -> None:
    """`eventually`, as an assertion."""
    if not eventually(check, seconds):
        raise AssertionError(f"condition not reached within {seconds} s")


def wait_idle(engine: Any, seconds: float = 30.0) -> Any:
    """Until an AsyncEngine runs nothing, queues nothing and every KV page is free (or holds
    only reusable cached content); returns its metrics snapshot then."""

    def idle() -> bool:
        llm, snap = engine.engine, engine.metrics.snapshot()
        at_rest = not llm.has_unfinished() and llm.free_pages() == llm.num_pages
        return at_rest and snap.running == 0 and snap.waiting == 0

    if not eventually(idle, seconds):
        raise AssertionError(f"engine not idle: {engine.metrics.snapshot()}")
    return engine.metrics.snapshot()


@contextlib.contextmanager
def running_engine(config: Any, runner: Any = None) -> Iterator[Any]:
    """An AsyncEngine (engine.config.EngineConfig; a test runner such as FakeRunner if
    given) started, and shut down when the block ends however it ends."""
    from engine.engine import AsyncEngine

    engine = AsyncEngine(config, runner)
    engine.start()
    try:
        yield engine
    finally:
        engine.shutdown()


@contextlib.contextmanager
def run_uvicorn(app: object, port: int | None = None) -> Iterator[str]:
    """Serve an ASGI app in a background thread; yields its base URL (http://127.0.0.1:PORT)."""
    port = port or free_port()
    config = uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="on")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        # The lifespan loads the app's models: minutes on a slow, shared CI machine.
        deadline = time.monotonic() + 300
        while not server.started:
            if not thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("uvicorn failed to start")
            time.sleep(0.02)
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=60)


class RedisServer:
    """A real redis-server on a loopback port that a test can stop and start again."""

    def __init__(self, workdir: str, port: int | None = None) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            raise RuntimeError(
                "redis-server is not installed; run `make test` (apt-get install redis-server)"
            )
        self.binary, self.workdir, self.port = binary, workdir, port or free_port()
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        args = ["--port", str(self.port), "--bind", "127.0.0.1", "--dir", self.workdir]
        args += ["--save", "", "--appendonly", "no", "--protected-mode", "yes"]
        self.proc = subprocess.Popen(
            [self.binary, *args], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        wait_for_port(self.port)

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.kill()  # a crash, not a polite shutdown
            self.proc.wait(timeout=10)
            self.proc = None


@contextlib.contextmanager
def redis_server() -> Iterator[RedisServer]:
    with tempfile.TemporaryDirectory(prefix="tiergate-redis-") as workdir:
        server = RedisServer(workdir)
        server.start()
        try:
            yield server
        finally:
            server.stop()


def start_redis_server(port: int, workdir: str) -> subprocess.Popen:
    """A redis-server on 127.0.0.1:`port` with no persistence; tests may kill and restart it."""
    server = RedisServer(workdir, port)
    server.start()
    assert server.proc is not None
    return server.proc


@contextlib.contextmanager
def run_redis() -> Iterator[str]:
    """A real redis-server on a free loopback port; yields redis://127.0.0.1:PORT/0."""
    with redis_server() as server:
        yield server.url
