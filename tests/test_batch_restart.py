"""A batch survives its gateway: lines already answered are kept in the store, and at the
next start the batch resumes from the lines without a result. With the embedded SQLite
store a real `tiergate serve` subprocess is killed (SIGKILL) mid-batch and started again;
with Redis a `tiergate serve` on one replica is killed mid-batch and another (a new app on the
same Redis) finishes it.
A gateway stopped gracefully leaves the same. All on the real SmolLM2-135M, over loopback
with the openai client."""

import time
from pathlib import Path

import httpx
import openai
from prometheus_client.parser import text_string_to_metric_families

from gateway.app import create_app
from gateway.policy import parse_policy
from tests.batch_helpers import chat_line, create, records, wait_ended
from tests.processes import Gateway
from tests.servers import run_uvicorn

KEY, ADMIN = "sk-restart-a", "sk-restart-admin"
SMOL = "smollm2-135m"
LINES = 8
# A graceful stop from the test's thread waits on the gateway's event loop; on a starved
# machine all 48 lines once ended in that wait (2026-12-07) and left the next gateway
# nothing to resume. The first Redis gateway is therefore killed: nothing ends after that.
REDIS_LINES = 16


def policy(cache: str) -> str:
    return f"""
auth: {{keys: [{{key: {KEY}, tenant: one}}], admin_key: {ADMIN}}}
cache: {cache}
engines:
  {SMOL}: {{kv_cache_mb: 32, max_num_seqs: 2, max_model_len: 512, num_threads: 1}}
tiers:
  small: {{deployments: [{{model: {SMOL}}}]}}
routes:
  auto: {{default: small}}
batch: {{max_concurrent: 1}}
"""


def client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key=KEY, max_retries=0)


def _lines(count: int = LINES) -> list[dict]:
    return [chat_line(f"r{i}", f"A word for {i}?", max_tokens=8) for i in range(count)]


def _until_some_done(api: openai.OpenAI, batch_id: str, done: int = 2) -> int:
    for _ in range(600):
        counts = api.batches.retrieve(batch_id).request_counts
        if counts.completed >= done:
            return counts.completed
        time.sleep(0.1)
    raise TimeoutError("no line ended")


def _check_all_once(api: openai.OpenAI, batch_id: str, count: int = LINES) -> None:
    done = wait_ended(api, batch_id)
    assert done.status == "completed"
    assert done.request_counts.completed == count and done.request_counts.failed == 0
    assert sorted(records(api, done.output_file_id)) == sorted(f"r{i}" for i in range(count))


def _requests(url: str) -> float:
    """The requests this gateway process served (batch lines included)."""
    text = httpx.get(f"{url}/metrics", headers={"authorization": f"Bearer {ADMIN}"}).text
    families = text_string_to_metric_families(text)
    return sum(s.value for f in families for s in f.samples if s.name == "tiergate_requests_total")


def test_sqlite_batch_resumes_after_the_gateway_is_killed(tmp_path: Path) -> None:
    path = tmp_path / "policy.yaml"
    cache = f"{{enabled: true, store: embedded, path: {tmp_path / 'cache.sqlite3'}}}"
    path.write_text(policy(cache))
    gateway = Gateway(path, "gw", tmp_path / "gateway.log")
    gateway.start()
    try:
        batch = create(client(gateway.url), _lines())
        before = _until_some_done(client(gateway.url), batch.id)
        gateway.kill()  # a crash: no shutdown, lines in flight are lost
        gateway.start()
        _check_all_once(client(gateway.url), batch.id)
        rerun = _requests(gateway.url)  # this process ran only the lines left
        assert 1 <= rerun <= LINES - before
    finally:
        gateway.kill()


def test_redis_batch_finished_by_the_next_gateway(redis_url: str, tmp_path: Path) -> None:
    """The second batch's input file is deleted while it runs: the next gateway cannot
    resume it, and it fails saying so (the first one still completes)."""
    path = tmp_path / "policy.yaml"
    cache = f'{{enabled: true, store: redis, redis_url: "{redis_url}", redis_prefix: batchrs}}'
    path.write_text(policy(cache))
    first = Gateway(path, "gw-a", tmp_path / "first.log")
    first.start()
    try:
        batch = create(client(first.url), _lines(REDIS_LINES))
        orphan = create(client(first.url), _lines())
        client(first.url).files.delete(orphan.input_file_id)
        before = _until_some_done(client(first.url), batch.id)
    finally:
        first.kill()  # nothing runs there after this: the rest is the next gateway's
    with run_uvicorn(create_app(parse_policy(path.read_text(), env={}))) as url:
        _check_all_once(client(url), batch.id, REDIS_LINES)
        failed = wait_ended(client(url), orphan.id)
        assert failed.status == "failed" and failed.failed_at
        assert failed.errors is not None and failed.errors.data[0].code == "invalid_file"
        assert 1 <= _requests(url) <= REDIS_LINES - before  # only the lines left ran here


def test_a_graceful_stop_loses_and_repeats_no_line(one_torch_thread: None, redis_url: str) -> None:
    """A gateway stopped the usual way (lines in flight aborted, BatchRunner.close) mid-batch:
    the next one ends the batch with every line once and runs none the first had ended.
    How many the first ends before it stops depends on the machine, so none may be left."""
    cache = f'{{enabled: true, store: redis, redis_url: "{redis_url}", redis_prefix: batchgs}}'
    text = policy(cache)
    with run_uvicorn(create_app(parse_policy(text, env={}))) as url:
        batch = create(client(url), _lines())
        before = _until_some_done(client(url), batch.id)
    with run_uvicorn(create_app(parse_policy(text, env={}))) as url:
        _check_all_once(client(url), batch.id)
        assert _requests(url) <= LINES - before
