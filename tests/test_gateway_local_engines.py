"""Local engines under the gateway: a crashed engine restarts while its tier's fallback
serves, a retired engine outlives the requests that hold it, long prompts stay off the loop.

Engines are real AsyncEngines over tests/fake_runner.py (no model weights needed); the
gateway runs under real uvicorn and is called over loopback.
"""

import asyncio
import sys
import threading
import time
import weakref
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import openai
import pytest

from engine.config import EngineConfig
from engine.engine import AsyncEngine
from gateway.app import create_app
from gateway.policy import load_policy, parse_policy
from tests.fake_runner import FakeRunner, FakeTokenizer
from tests.servers import run_uvicorn, wait_for

ADMIN = "sk-local-engines-admin"
POLICY = f"""
server: {{reload_interval_s: 0}}
auth: {{mode: none, admin_key: {ADMIN}}}
engines:
  flaky: {{kv_cache_mb: 1}}
  steady: {{kv_cache_mb: 1}}
tiers:
  small: {{deployments: [{{model: flaky}}], fallback: large}}
  large: {{deployments: [{{model: steady}}]}}
routes:
  auto: {{default: small}}
"""
PROMPT = {"model": "small", "prompt": "abc", "max_tokens": 4}


class Crash(BaseException):
    """What a hard fault looks like to the step loop: not an Exception it could isolate."""


class CrashingRunner(FakeRunner):
    crash = False

    def execute(self, chunks):  # type: ignore[no-untyped-def]
        if self.crash:
            raise Crash("the model process state is gone")
        return super().execute(chunks)


class LoopWatchingTokenizer(FakeTokenizer):
    """Records, for each long chat template or encode, whether it ran on an event loop."""

    def __init__(self) -> None:
        self.on_loop: list[bool] = []
        self.step_thread: list[bool] = []

    def _record(self, text_len: int) -> None:
        if text_len > 10_000:
            try:
                asyncio.get_running_loop()
                self.on_loop.append(True)
            except RuntimeError:
                self.on_loop.append(False)
            self.step_thread.append(threading.current_thread().name == "engine-step-loop")

    def encode(self, text: str) -> list[int]:
        self._record(len(text))
        return super().encode(text)

    def apply_chat_template(self, messages, add_generation_prompt=True, tools=None) -> str:  # type: ignore[no-untyped-def]
        self._record(sum(len(m["content"]) for m in messages))
        return super().apply_chat_template(messages, add_generation_prompt, tools)


class Factory:
    """Builds each engine on a fake runner; `hold` makes the next build of `flaky` wait."""

    def __init__(self) -> None:
        self.runners: dict[str, list[CrashingRunner]] = {}
        self.hold = threading.Event()
        self.hold.set()

    def __call__(self, config: EngineConfig) -> AsyncEngine:
        if config.model == "flaky" and self.runners.get("flaky"):
            assert self.hold.wait(60)
        runner = CrashingRunner(max_model_len=16384, num_pages=4200, delay=0.002)
        runner.tokenizer = LoopWatchingTokenizer()
        self.runners.setdefault(config.model, []).append(runner)
        return AsyncEngine(config, runner)


@pytest.fixture(scope="module")
def factory() -> Factory:
    return Factory()


@pytest.fixture(scope="module")
def url(factory: Factory) -> Iterator[str]:
    app = create_app(parse_policy(POLICY, env={}), engine_factory=factory)
    with run_uvicorn(app) as base:
        yield base


def complete(url: str, body: dict) -> httpx.Response:
    return httpx.post(f"{url}/v1/completions", json=body, timeout=60)


def test_crashed_engine_restarts_and_the_fallback_serves_meanwhile(
    url: str, factory: Factory
) -> None:
    # Regression: a dead step loop stayed dead until the gateway restarted.
    assert complete(url, PROMPT).headers["x-tiergate-tier"] == "small"
    factory.hold.clear()  # the restart waits until the checks below are done
    factory.runners["flaky"][-1].crash = True
    complete(url, PROMPT)  # crashes the loop (this request falls back or fails)
    ready = httpx.get(f"{url}/ready")
    assert ready.status_code == 503 and ready.json()["dead_engines"] == ["flaky"]
    served = complete(url, PROMPT)
    assert served.status_code == 200 and served.headers["x-tiergate-tier"] == "large"
    factory.hold.set()
    wait_for(lambda: httpx.get(f"{url}/ready").status_code == 200)
    assert httpx.get(f"{url}/ready").json()["engines"]["flaky"] == {"running": True, "restarts": 1}
    assert complete(url, PROMPT).headers["x-tiergate-tier"] == "small"
    assert (
        'tiergate_engine_restarts_total{engine="flaky"} 1.0'
        in httpx.get(f"{url}/metrics", headers={"Authorization": f"Bearer {ADMIN}"}).text
    )


def test_long_prompts_are_templated_and_tokenized_off_the_loops(url: str, factory: Factory) -> None:
    # Regression: the gateway rendered chat templates on its event loop, and the engine
    # tokenized in its step thread, so one long prompt stalled everyone else.
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
    text = "word " * 2400  # 12,000 characters (and tokens), inside the 16,384-token context
    client.chat.completions.create(
        model="large", messages=[{"role": "user", "content": text}], max_tokens=2
    )
    client.completions.create(model="large", prompt=text, max_tokens=2)
    tokenizer = factory.runners["steady"][-1].tokenizer
    assert len(tokenizer.on_loop) == 3  # the template, then encoding the two prompts
    assert tokenizer.on_loop == [False] * 3 and tokenizer.step_thread == [False] * 3


def test_prompt_far_beyond_the_context_is_refused_untouched(url: str, factory: Factory) -> None:
    # Regression: half a megabyte of "x" froze the gateway's event loop for minutes (code
    # detection backtracked) before it was tokenized whole and refused.
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=60)
    tokenizer = factory.runners["steady"][-1].tokenizer
    before = len(tokenizer.on_loop)
    huge = "x" * (16384 * 32 + 1)
    for call in (
        lambda: client.completions.create(model="large", prompt=huge, max_tokens=1),
        lambda: client.chat.completions.create(
            model="large", messages=[{"role": "user", "content": huge}], max_tokens=1
        ),
    ):
        with pytest.raises(openai.BadRequestError) as caught:
            call()
        assert caught.value.body["code"] == "context_length_exceeded"
    assert len(tokenizer.on_loop) == before  # neither templated nor tokenized


RELOAD = f"""
server: {{reload_interval_s: 0}}
auth: {{mode: none, admin_key: {ADMIN}}}
engines:
  one: {{kv_cache_mb: KV}}
tiers:
  small: {{deployments: [{{model: one}}]}}
"""


def test_request_that_took_the_old_policy_runs_on_the_retired_engine(
    tmp_path: Path, factory: Factory
) -> None:
    # Regression: a request that arrived just before a reload could find its engine
    # stopped (a grace period, then a check of the engine's own queue, which does not see
    # a request the gateway has not handed over yet). Here the request's body is still
    # coming in while the policy is swapped and the grace runs out.
    path = tmp_path / "policy.yaml"
    path.write_text(RELOAD.replace("KV", "1"))
    app = create_app(load_policy(path), policy_path=path, engine_factory=factory, retire_grace_s=0)
    release = threading.Event()

    def body() -> Iterator[bytes]:
        yield b'{"model": "small", "prompt": "abc", '
        assert release.wait(30)
        yield b'"max_tokens": 40, "ignore_eos": true}'

    with run_uvicorn(app) as url, ThreadPoolExecutor(1) as pool:
        old = app.state.gateway.engines.get("one")
        runtime = weakref.ref(app.state.gateway.runtime)  # a strong one would hold the engine
        refs = sys.getrefcount(runtime())
        pending = pool.submit(httpx.post, f"{url}/v1/completions", content=body(), timeout=60)
        # The handler takes the running policy, then waits for the rest of the body.
        wait_for(lambda: sys.getrefcount(runtime()) > refs)
        path.write_text(RELOAD.replace("KV", "2"))
        admin = {"Authorization": f"Bearer {ADMIN}"}
        assert httpx.post(f"{url}/admin/policy/reload", headers=admin).status_code == 200
        assert app.state.gateway.engines.get("one") is not old
        time.sleep(1.0)  # the grace (0 s) is long over
        assert old.is_running
        release.set()
        reply = pending.result(timeout=60)
        assert reply.status_code == 200, reply.text
        assert reply.json()["usage"]["completion_tokens"] == 40
        wait_for(lambda: not old.is_running)  # stopped once nothing holds it
        fresh = complete(url, {**PROMPT, "max_tokens": 3})
        assert fresh.status_code == 200 and fresh.json()["usage"]["completion_tokens"] == 3
