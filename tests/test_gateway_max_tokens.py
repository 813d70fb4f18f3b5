"""An unset max_tokens on a local tier (issue 23 (e)): the answer may run to the end of the
context, on /v1/completions as on chat, as on the engine's own server. Real SmolLM2 with a
short context, real gateway over HTTP, the openai client; `ignore_eos` (vLLM's) keeps the
model from ending first."""

from collections.abc import Iterator

import openai
import pytest

from gateway.app import create_app
from gateway.policy import parse_policy
from tests.servers import run_uvicorn

KEY = "sk-max-tokens"
MODEL = "smollm2-135m"
CONTEXT = 320  # above the 256 tokens the answers stopped at
POLICY = f"""
auth:
  keys: [{{key: {KEY}, tenant: one}}]
cache: {{enabled: false}}
engines:
  {MODEL}: {{kv_cache_mb: 32, max_num_seqs: 2, max_model_len: {CONTEXT}, num_threads: 1}}
tiers:
  small: {{deployments: [{{model: {MODEL}}}]}}
routes:
  auto: {{default: small}}
"""
FIELDS = {"model": "small", "temperature": 0, "extra_body": {"ignore_eos": True}}


@pytest.fixture(scope="module")
def client(one_torch_thread: None) -> Iterator[openai.OpenAI]:
    with run_uvicorn(create_app(parse_policy(POLICY, env={}))) as url:
        yield openai.OpenAI(base_url=f"{url}/v1", api_key=KEY, max_retries=0, timeout=300)


def test_a_completion_without_max_tokens_runs_to_the_context(client: openai.OpenAI) -> None:
    reply = client.completions.create(prompt="Once upon a time", **FIELDS)
    usage = reply.usage
    assert reply.choices[0].finish_reason == "length"
    assert usage.completion_tokens == CONTEXT - usage.prompt_tokens > 256


def test_a_chat_answer_without_max_tokens_runs_to_the_context(client: openai.OpenAI) -> None:
    ask = [{"role": "user", "content": "Tell me a story."}]
    reply = client.chat.completions.create(messages=ask, **FIELDS)  # type: ignore[arg-type]
    usage = reply.usage
    assert reply.choices[0].finish_reason == "length"
    assert usage.completion_tokens == CONTEXT - usage.prompt_tokens > 256
