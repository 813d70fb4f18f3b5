"""POST /v1/embeddings on the gateway: the real all-MiniLM-L6-v2, real HTTP, the openai client."""

import asyncio
import base64
from collections.abc import Iterator

import httpx
import numpy as np
import openai
import pytest
from fastapi import FastAPI
from prometheus_client.parser import text_string_to_metric_families

from gateway.app import create_app
from gateway.policy import parse_policy
from tests.servers import run_uvicorn

KEY, ADMIN = "sk-embed-key-1", "sk-embed-admin"
MODEL = "all-MiniLM-L6-v2"
# No local engine: a remote tier nobody calls keeps the gateway light.
POLICY = f"""
auth:
  keys: [{{key: {KEY}, tenant: one}}]
  admin_key: {ADMIN}
tiers:
  small: {{deployments: [{{model: hosted_vllm/none, api_base: "http://127.0.0.1:9/v1"}}]}}
routes:
  auto: {{default: small}}
"""


@pytest.fixture(scope="module")
def app() -> FastAPI:
    return create_app(parse_policy(POLICY, env={}))


@pytest.fixture(scope="module")
def url(app: FastAPI) -> Iterator[str]:
    with run_uvicorn(app) as base:
        yield base


@pytest.fixture
def client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key=KEY, max_retries=0)


def post(url: str, body: dict, key: str = KEY) -> httpx.Response:
    headers = {"Authorization": f"Bearer {key}"}
    return httpx.post(f"{url}/v1/embeddings", json=body, headers=headers, timeout=60)


def test_concurrent_first_requests_load_one_embedder(app: FastAPI, url: str) -> None:
    assert app.state.gateway.embedder.current is None  # nothing loaded at start

    async def run() -> list[httpx.Response]:
        async with httpx.AsyncClient(timeout=120) as http:
            headers = {"Authorization": f"Bearer {KEY}"}
            body = {"model": MODEL, "input": ["one", "two"]}
            call = f"{url}/v1/embeddings"
            calls = [http.post(call, json=body, headers=headers) for _ in range(4)]
            return await asyncio.gather(*calls)

    replies = asyncio.run(run())
    assert [r.status_code for r in replies] == [200] * 4
    # one embedder served them all: it counted every text of the four requests
    assert app.state.gateway.embedder.current.texts_embedded == 8


def test_openai_client_base64_default_and_float(client: openai.OpenAI, app: FastAPI) -> None:
    texts = ["How do I reset my password?", "How can I change my password?", "Pizza in Rome"]
    reply = client.embeddings.create(model=MODEL, input=texts)  # the client asks for base64
    assert reply.model == MODEL and [d.index for d in reply.data] == [0, 1, 2]
    vectors = np.array([d.embedding for d in reply.data], dtype=np.float32)
    assert vectors.shape == (3, 384)
    assert np.allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-4)
    assert vectors[0] @ vectors[1] > vectors[0] @ vectors[2] + 0.3
    embedder = app.state.gateway.embedder.current
    assert np.allclose(vectors, embedder.embed_many(texts), atol=1e-5)
    assert reply.usage.prompt_tokens == reply.usage.total_tokens == embedder.count_tokens(texts)
    floats = client.embeddings.create(model=MODEL, input=texts[0], encoding_format="float")
    assert np.allclose(floats.data[0].embedding, vectors[0], atol=1e-6)
    assert client.embeddings.create(model=MODEL, input="x", dimensions=384).data[0].embedding


def test_wire_formats(url: str) -> None:
    plain = post(url, {"model": MODEL, "input": "hello"}).json()
    packed = post(url, {"model": MODEL, "input": "hello", "encoding_format": "base64"}).json()
    assert plain["object"] == "list" and plain["data"][0]["object"] == "embedding"
    assert isinstance(plain["data"][0]["embedding"], list)
    raw = np.frombuffer(base64.b64decode(packed["data"][0]["embedding"]), dtype="<f4")
    assert np.allclose(raw, plain["data"][0]["embedding"], atol=1e-6)


@pytest.mark.parametrize(
    ("body", "status", "param"),
    [
        ({"model": MODEL, "input": "x", "dimensions": 256}, 400, "dimensions"),
        ({"model": MODEL, "input": ""}, 400, "input"),
        ({"model": MODEL, "input": []}, 400, "input"),
        ({"model": MODEL, "input": ["a", ""]}, 400, "input"),
        ({"model": MODEL, "input": [[1, 2, 3]]}, 400, "input"),
        ({"model": MODEL, "input": ["a"] * 2049}, 400, "input"),
        ({"model": MODEL, "input": "x", "encoding_format": "int8"}, 400, "encoding_format"),
        ({"model": MODEL}, 400, "input"),
        ({"model": "text-embedding-3-small", "input": "x"}, 404, "model"),
    ],
)
def test_bad_requests_name_the_field(url: str, body: dict, status: int, param: str) -> None:
    reply = post(url, body)
    assert reply.status_code == status
    assert reply.json()["error"]["param"] == param


def test_auth_and_per_tenant_stats(url: str) -> None:
    assert post(url, {"model": MODEL, "input": "x"}, key="sk-wrong").status_code == 401
    before = _tenant_counts(url)
    assert post(url, {"model": MODEL, "input": ["a b", "c"]}).status_code == 200
    after = _tenant_counts(url)
    assert after["requests"] == before["requests"] + 1
    assert after["inputs"] == before["inputs"] + 2
    assert after["tokens"] > before["tokens"]


def _tenant_counts(url: str) -> dict[str, float]:
    text = httpx.get(f"{url}/metrics", headers={"Authorization": f"Bearer {ADMIN}"}).text
    counts = {"requests": 0.0, "inputs": 0.0, "tokens": 0.0}
    names = {
        "tiergate_embedding_requests_total": "requests",
        "tiergate_embedding_inputs_total": "inputs",
        "tiergate_embedding_tokens_total": "tokens",
    }
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            ours = sample.labels.get("tenant") == "one"
            if sample.name in names and ours and sample.labels.get("result", "ok") == "ok":
                counts[names[sample.name]] += sample.value
    return counts
