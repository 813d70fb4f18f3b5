"""Gateways with prices, budgets and managed keys over a real engine on the fake runner.

The fake runner's tokenizer is byte-level, so a completion's prompt costs one token per
byte of its prompt and the answer at most `max_tokens`: every cost follows from the request.
"""

import contextlib
import textwrap
from collections.abc import Iterator

import httpx
import openai
from prometheus_client.parser import text_string_to_metric_families

from gateway.app import create_app
from gateway.policy import key_digest, parse_policy
from tests.limits_helpers import fake_engine
from tests.servers import run_uvicorn

ALICE, BOB, CAROL = "sk-spend-alice-0001", "sk-spend-bob-00001", "sk-spend-carol-0001"
ADMIN = "sk-spend-admin-key"
USD_PER_TOKEN = 1.0  # the tier's price, $1 per token each way: costs are token counts
POLICY = f"""
auth:
  admin_key: {ADMIN}
  keys:
    - {{key: {ALICE}, tenant: one, name: alice}}
    - {{key: {BOB}, tenant: one}}
    - {{key: {CAROL}, tenant: two}}
engines:
  fake: {{max_num_seqs: 8}}
tiers:
  small:
    deployments: [{{model: fake}}]
    retries: 0
    price: {{input: {USD_PER_TOKEN * 1e6}, output: {USD_PER_TOKEN * 1e6}}}
routes:
  chat: {{default: small}}
"""
BOB_DIGEST = key_digest(BOB.encode())


def policy_text(extra: str = "") -> str:
    return POLICY + textwrap.dedent(extra)


@contextlib.contextmanager
def gateway(
    extra: str = "", step_delay_s: float = 0.0, managed_keys_path: str | None = None
) -> Iterator[str]:
    """The gateway with `extra` (YAML sections) added to POLICY, on a free port."""
    policy = parse_policy(policy_text(extra), env={})
    if managed_keys_path is not None:
        auth = policy.auth.model_copy(update={"managed_keys_path": managed_keys_path})
        policy = policy.model_copy(update={"auth": auth})
    with run_uvicorn(create_app(policy, engine_factory=fake_engine(step_delay_s))) as url:
        yield url


def client(url: str, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0, timeout=60)


def complete(url: str, key: str, model: str = "small", prompt: str = "hello") -> float:
    """One completion; returns what it cost (its usage at USD_PER_TOKEN)."""
    reply = client(url, key).completions.create(model=model, prompt=prompt, max_tokens=4)
    assert reply.usage is not None
    return reply.usage.total_tokens * USD_PER_TOKEN


def admin(url: str) -> httpx.Client:
    return httpx.Client(base_url=url, headers={"Authorization": f"Bearer {ADMIN}"}, timeout=30)


def spend_samples(url: str) -> dict[tuple[str, str, str], float]:
    """tiergate_spend_usd_total from /metrics, by (tenant, key, route)."""
    text = admin(url).get("/metrics").text
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == "tiergate_spend_usd_total":
                out[(s.labels["tenant"], s.labels["key"], s.labels["route"])] = s.value
    return out
