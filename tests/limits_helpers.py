"""A gateway with per-test limits over a real engine on the fake runner (no model needed)."""

import contextlib
import textwrap
from collections.abc import Iterator

import httpx
import openai

from engine.config import EngineConfig
from engine.engine import AsyncEngine
from gateway.app import create_app
from gateway.policy import key_digest, parse_policy
from tests.fake_runner import FakeRunner
from tests.servers import run_uvicorn

KEY_A, KEY_A2, KEY_B = "sk-limits-a-0001", "sk-limits-a-0002", "sk-limits-b-0001"
METRICS_KEY = "sk-limits-metrics-key"
POLICY = f"""
auth:
  metrics_key: {METRICS_KEY}
  keys:
    - {{key: {KEY_A}, tenant: one}}
    - {{key: {KEY_A2}, tenant: one}}
    - {{key: {KEY_B}, tenant: two}}
engines:
  fake: {{max_num_seqs: 8}}
tiers:
  small: {{deployments: [{{model: fake}}], retries: 0}}
"""
HASH_A = key_digest(KEY_A.encode())


def metrics_text(url: str) -> str:
    headers = {"Authorization": f"Bearer {METRICS_KEY}"}
    return httpx.get(f"{url}/metrics", headers=headers).text


def fake_engine(step_delay_s: float = 0.0):
    def factory(config: EngineConfig) -> AsyncEngine:
        return AsyncEngine(config, FakeRunner(num_pages=256, delay=step_delay_s))

    return factory


@contextlib.contextmanager
def gateway(limits: str, step_delay_s: float = 0.0) -> Iterator[str]:
    """The gateway with `limits` (YAML of the `limits:` section) on a free port."""
    text = POLICY + "limits:\n" + textwrap.indent(textwrap.dedent(limits), "  ")
    app = create_app(parse_policy(text, env={}), engine_factory=fake_engine(step_delay_s))
    with run_uvicorn(app) as url:
        yield url


def client(url: str, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0, timeout=60)


def complete(url: str, key: str, prompt: str = "hello", max_tokens: int = 4) -> str:
    reply = client(url, key).completions.create(model="small", prompt=prompt, max_tokens=max_tokens)
    return reply.choices[0].text


def refused(url: str, key: str, prompt: str = "hello") -> openai.RateLimitError:
    try:
        complete(url, key, prompt)
    except openai.RateLimitError as exc:
        return exc
    raise AssertionError("the request was not refused")


def assert_429(exc: openai.RateLimitError, code: str) -> int:
    """Checks the OpenAI error body and returns Retry-After in seconds."""
    assert exc.status_code == 429
    body = exc.response.json()["error"]
    assert body["type"] == "rate_limit_error"
    assert body["code"] == code
    assert body["message"]
    assert set(body) == {"message", "type", "param", "code"}
    retry_after = int(exc.response.headers["retry-after"])
    assert 1 <= retry_after <= 120
    return retry_after
