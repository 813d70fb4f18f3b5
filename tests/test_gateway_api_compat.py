"""The new OpenAI fields through the gateway on a local tier: real SmolLM2, real HTTP, the
openai client: pieces' logprobs and the request's tools reach the shapes, and the
embedding model is listed."""

from collections.abc import Iterator
from typing import Any

import openai
import pytest

from gateway.app import create_app
from gateway.policy import parse_policy
from tests.servers import run_uvicorn

KEY = "sk-compat-key"
MODEL = "smollm2-135m"
POLICY = f"""
auth:
  keys: [{{key: {KEY}, tenant: one}}]
engines:
  {MODEL}: {{kv_cache_mb: 32, max_num_seqs: 4, max_model_len: 1024, num_threads: 1}}
tiers:
  small: {{deployments: [{{model: {MODEL}}}]}}
routes:
  auto: {{default: small}}
"""
USER = [{"role": "user", "content": "Name three colours."}]
GREEDY: dict[str, Any] = {"model": "small", "temperature": 0, "max_tokens": 8}


@pytest.fixture(scope="module")
def client(one_torch_thread: None) -> Iterator[openai.OpenAI]:
    with run_uvicorn(create_app(parse_policy(POLICY, env={}))) as url:
        yield openai.OpenAI(base_url=f"{url}/v1", api_key=KEY, max_retries=0)


def test_chat_logprobs_through_the_gateway(client: openai.OpenAI) -> None:
    reply = client.chat.completions.create(messages=USER, logprobs=True, top_logprobs=2, **GREEDY)
    entries = reply.choices[0].logprobs.content
    assert "".join(e.token for e in entries) == reply.choices[0].message.content
    streamed = []
    for chunk in client.chat.completions.create(
        messages=USER, logprobs=True, top_logprobs=2, stream=True, **GREEDY
    ):
        if chunk.choices and chunk.choices[0].logprobs:
            streamed += chunk.choices[0].logprobs.content
    assert [e.token for e in streamed] == [e.token for e in entries]


def test_completion_logprobs_through_the_gateway(client: openai.OpenAI) -> None:
    reply = client.completions.create(prompt="The sky is", logprobs=1, **GREEDY)
    assert "".join(reply.choices[0].logprobs.tokens) == reply.choices[0].text


def test_embedding_model_is_listed(client: openai.OpenAI) -> None:
    assert "all-MiniLM-L6-v2" in [m.id for m in client.models.list().data]


def test_penalties_and_bias_reach_the_local_engine(client: openai.OpenAI) -> None:
    plain = client.completions.create(prompt="1 1 1 1 1 1 1 1", **GREEDY).choices[0].text
    penalised = (
        client.completions.create(prompt="1 1 1 1 1 1 1 1", frequency_penalty=2.0, **GREEDY)
        .choices[0]
        .text
    )
    assert plain != penalised
    assert len(client.chat.completions.create(messages=USER, n=2, **GREEDY).choices) == 2
