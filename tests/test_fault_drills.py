"""Fault drills on a real `tiergate serve` process over loopback, observed through /metrics.

A client that disconnects midway: the engine aborts the sequence (running back to 0, KV
usage back to its idle value, far fewer tokens generated than asked for) and the gateway
counts the request as 499 in `tiergate_requests_total`. Once for a stream closed after a
few pieces, once for a whole answer whose socket closes while the engine generates it.
"""

import asyncio
import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from tests.load_driver import Target
from tests.pool_state import PoolState, pool_state, wait_at_rest
from tests.servers import free_port, stop_session

ROOT = Path(__file__).resolve().parent.parent
KEY = "sk-drill-0123456789"
ADMIN_KEY = "sk-drill-admin-0123456789"
MAX_TOKENS = 600  # the KV budget caps one sequence near this; an abort stops far earlier
POLICY = f"""
server: {{reload_interval_s: 0}}
auth:
  keys: [{{key: {KEY}, tenant: drill}}]
  admin_key: {ADMIN_KEY}
engines:
  smollm2-135m: {{kv_cache_mb: 48, max_num_seqs: 4, num_threads: 1}}
tiers:
  small: {{deployments: [{{model: smollm2-135m}}], retries: 0, timeout_s: 300}}
routes:
  auto: {{default: small}}
"""
BODY = {
    "model": "auto",
    "messages": [{"role": "user", "content": "Tell me a very long story."}],
    "max_tokens": MAX_TOKENS,
    "ignore_eos": True,
}


@contextlib.contextmanager
def gateway_process(policy: Path) -> Iterator[str]:
    """`tiergate serve` in its own session; yields its base URL once /health answers."""
    port = free_port()
    cmd = [sys.executable, "-m", "gateway.cli", "serve", "--policy", str(policy)]
    cmd += ["--port", str(port), "--log-level", "warning"]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(cmd, env=env, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 300
        while not _healthy(url):
            assert proc.poll() is None, f"gateway exited with {proc.returncode}"
            assert time.monotonic() < deadline, "gateway not healthy after 300 s"
            time.sleep(0.2)
        yield url
    finally:
        stop_session(proc, grace_s=30)


def _healthy(url: str) -> bool:
    with contextlib.suppress(httpx.HTTPError):
        return httpx.get(f"{url}/health", timeout=2).status_code == 200
    return False


@pytest.fixture(scope="module")
def target(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Target]:
    policy = tmp_path_factory.mktemp("drill") / "policy.yaml"
    policy.write_text(POLICY)
    with gateway_process(policy) as url:
        # One short answer first: the engine's gauges appear on /metrics after its first step.
        client = openai.OpenAI(base_url=f"{url}/v1", api_key=KEY, max_retries=0)
        client.chat.completions.create(model="auto", messages=BODY["messages"], max_tokens=2)
        yield Target(url, "auto", KEY, ADMIN_KEY)


async def _idle(target: Target) -> PoolState:
    state = await wait_at_rest(target, deadline_s=120)
    assert state.at_rest, state
    return state


async def _until_generating(target: Target, before: PoolState) -> PoolState:
    """Poll /metrics until the engine runs one sequence that has produced tokens."""
    deadline = time.monotonic() + 120
    state = await pool_state(target)
    while not (state.running == 1 and state.generated_tokens > before.generated_tokens):
        assert time.monotonic() < deadline, f"the request never started generating: {state}"
        await asyncio.sleep(0.05)
        state = await pool_state(target)
    return state


def _assert_aborted_and_counted(before: PoolState, after: PoolState) -> None:
    assert after.at_rest, after  # running 0, waiting 0, KV usage back to idle (0)
    generated = after.generated_tokens - before.generated_tokens
    assert 0 < generated < MAX_TOKENS / 2, generated  # stopped, not run to the end
    closed = after.requests_by_status.get("499", 0) - before.requests_by_status.get("499", 0)
    assert closed == 1, after.requests_by_status


async def _stream_then_hang_up(target: Target) -> None:
    headers = {"Authorization": f"Bearer {KEY}"}
    before = await _idle(target)
    async with (
        httpx.AsyncClient(base_url=target.base_url, timeout=120) as client,
        client.stream(
            "POST", "/v1/chat/completions", json={**BODY, "stream": True}, headers=headers
        ) as r,
    ):
        assert r.status_code == 200
        pieces = 0
        async for line in r.aiter_lines():
            pieces += line.startswith("data:")
            if pieces == 5:
                break
        assert (await pool_state(target)).running == 1  # still generating as we leave
    _assert_aborted_and_counted(before, await wait_at_rest(target, deadline_s=120))


async def _whole_then_hang_up(target: Target) -> None:
    headers = {"Authorization": f"Bearer {KEY}"}
    before = await _idle(target)
    async with httpx.AsyncClient(base_url=target.base_url, timeout=120) as client:
        post = asyncio.create_task(client.post("/v1/chat/completions", json=BODY, headers=headers))
        await _until_generating(target, before)
        assert not post.done()
        post.cancel()  # httpx closes the socket of a cancelled request
        with contextlib.suppress(asyncio.CancelledError):
            await post
    _assert_aborted_and_counted(before, await wait_at_rest(target, deadline_s=120))


def test_stream_closed_midway_frees_the_pages_and_counts_499(target: Target) -> None:
    asyncio.run(_stream_then_hang_up(target))


def test_whole_answer_socket_closed_midway_frees_the_pages_and_counts_499(
    target: Target,
) -> None:
    asyncio.run(_whole_then_hang_up(target))
