"""Limits shared by two gateway instances through one real Redis, and what happens when
that Redis dies mid-run and comes back."""

import contextlib
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Iterator

import openai
import pytest
import redis

from tests.limits_helpers import (
    KEY_A,
    KEY_A2,
    KEY_B,
    assert_429,
    client,
    complete,
    gateway,
    metrics_text,
    refused,
)
from tests.servers import free_port, wait_for, wait_for_port


class RedisProcess:
    """A redis-server that a test can kill and start again on the same port."""

    def __init__(self, persistent: bool = False) -> None:
        self.persistent = persistent  # keeps its data across a kill (append-only file)
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self._dir = tempfile.TemporaryDirectory(prefix="tiergate-limits-redis-")
        self._proc: subprocess.Popen | None = None

    def start(self) -> None:
        binary = shutil.which("redis-server")
        assert binary, "redis-server is not installed (make test installs it)"
        args = [binary, "--port", str(self.port), "--bind", "127.0.0.1", "--dir", self._dir.name]
        args += ["--save", ""]
        args += ["--appendonly", "yes", "--appendfsync", "always"] if self.persistent else []
        self._proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_for_port(self.port)

    def kill(self) -> None:
        assert self._proc is not None
        self._proc.kill()
        self._proc.wait(timeout=10)

    def pause(self) -> None:
        assert self._proc is not None
        self._proc.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        assert self._proc is not None
        self._proc.send_signal(signal.SIGCONT)

    def close(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self.kill()
        self._dir.cleanup()


@pytest.fixture
def own_redis() -> Iterator[RedisProcess]:
    server = RedisProcess()
    server.start()
    yield server
    server.close()


def limits_on(url: str, extra: str = "") -> str:
    return f"redis_url: {url}\n" + extra


def test_two_gateways_share_requests_and_slots(redis_url: str) -> None:
    limits = limits_on(redis_url, "default: {requests_per_minute: 3}\n")
    limits += "tenants: {two: {requests_per_minute: null, max_concurrent: 1}}\n"
    with gateway(limits) as one, gateway(limits, step_delay_s=0.02) as two:
        complete(one, KEY_A)
        complete(two, KEY_A)
        complete(one, KEY_A2)
        assert_429(refused(two, KEY_A), "requests_per_minute")  # 3 counted across both
        assert_429(refused(one, KEY_A2), "requests_per_minute")
        stream = client(two, KEY_B).completions.create(
            model="small", prompt="go", max_tokens=200, stream=True
        )
        next(iter(stream))
        assert_429(refused(one, KEY_B), "max_concurrent")  # the slot is held on the other
        for _ in stream:  # read to the end: the slot is released when the answer ends
            pass
        complete(one, KEY_B)


def test_redis_dies_and_comes_back(own_redis: RedisProcess) -> None:
    limits = limits_on(own_redis.url, "default: {requests_per_minute: 2}\n")
    with gateway(limits) as one, gateway(limits) as two:
        complete(one, KEY_A)
        complete(two, KEY_A)
        assert_429(refused(one, KEY_A), "requests_per_minute")  # shared: Redis counts

        own_redis.kill()
        # Every request is still answered, each gateway now limiting on its own.
        complete(one, KEY_B)
        complete(one, KEY_B)
        complete(two, KEY_B)
        assert_429(refused(one, KEY_B), "requests_per_minute")
        assert fallbacks(one) >= 3

        own_redis.start()  # empty: what was counted while it was away stays local
        # After a short pause each gateway goes back to Redis by itself.
        wait_for(lambda: _counted_in_redis(one) and _counted_in_redis(two))
        redis.Redis.from_url(own_redis.url).flushall()
        before = fallbacks(one), fallbacks(two)
        complete(one, KEY_A2)
        complete(two, KEY_A2)
        assert_429(refused(one, KEY_A2), "requests_per_minute")  # shared again
        assert (fallbacks(one), fallbacks(two)) == before


def _counted_in_redis(url: str) -> bool:
    """Did this gateway's next admission (answered or refused) go to Redis?"""
    before = fallbacks(url)
    with contextlib.suppress(openai.RateLimitError):
        complete(url, KEY_A2)
    return fallbacks(url) == before


def fallbacks(url: str) -> float:
    for line in metrics_text(url).splitlines():
        if line.startswith("tiergate_limits_redis_fallbacks_total "):
            return float(line.split()[1])
    raise AssertionError("no fallback counter in /metrics")


def test_no_redis_at_start_limits_in_process() -> None:
    nobody = f"redis://127.0.0.1:{free_port()}/0"  # nothing listens there
    with gateway(limits_on(nobody, "default: {requests_per_minute: 2}\n")) as url:
        complete(url, KEY_A)
        complete(url, KEY_A2)
        assert_429(refused(url, KEY_A), "requests_per_minute")
        assert fallbacks(url) == 3


def test_a_hung_redis_is_not_waited_for(own_redis: RedisProcess) -> None:
    with gateway(limits_on(own_redis.url, "default: {max_concurrent: 4}\n")) as url:
        complete(url, KEY_A)
        own_redis.pause()  # accepts connections, never answers
        try:
            complete(url, KEY_A)  # answered: the limiter gave up on Redis
            assert fallbacks(url) == 1
        finally:
            own_redis.resume()


def test_a_release_redis_missed_is_sent_when_it_answers() -> None:
    """Redis restarts (with its data) while a request ends: the slot is freed once it is back."""
    own_redis = RedisProcess(persistent=True)
    own_redis.start()
    with (
        contextlib.closing(own_redis),
        gateway(limits_on(own_redis.url, "default: {max_concurrent: 1}\n"), 0.02) as url,
    ):
        stream = client(url, KEY_A).completions.create(
            model="small", prompt="go", max_tokens=100, stream=True
        )
        next(iter(stream))  # its slot is in Redis
        own_redis.kill()
        for _ in stream:  # ends while Redis is away
            pass
        own_redis.start()
        r = redis.Redis.from_url(own_redis.url)
        assert r.zcard("tiergate:limits:tenant:one:c") == 1  # still held there
        wait_for(lambda: _answered_in_redis(url))
        assert r.zcard("tiergate:limits:tenant:one:c") == 0


def _answered_in_redis(url: str) -> bool:
    before = fallbacks(url)
    complete(url, KEY_A)  # with the slot leaked in Redis, this would be a 429
    return fallbacks(url) == before
