"""The pair model through the live gateway (`verifier_model: pair`, `verifier: lenient`, the
default floor): a rewording people wrote (train split), whose cosine is below the old 0.8
floor, is served from the cache; its negation is not. The tier is the paid-API stand-in;
the embedder, the pair model (ONNX Runtime) and the store are the real ones.
"""

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import openai
import pytest

from gateway.app import create_app
from gateway.embedding.embedder import Embedder
from gateway.policy import CacheSettings, parse_policy
from tests.paid_api import paid_api_app
from tests.servers import eventually, run_uvicorn

KEY = "sk-pair-verifier"
STORED = "recommend me a film for tonight"
REWORDED = "What's a good movie to watch tonight?"  # cosine 0.76
NEGATED = "What's not a good movie to watch tonight?"


def policy_text(paid: str, cache_path: Path) -> str:
    return f"""
auth: {{keys: [{{key: {KEY}, tenant: acme}}]}}
cache: {{enabled: true, store: embedded, path: {cache_path}, verifier_model: pair,
        verifier: lenient}}
tiers:
  cheap: {{deployments: [{{model: openai/gpt-4o-mini, api_base: "{paid}/v1"}}]}}
routes:
  auto: {{default: cheap}}
"""


@pytest.fixture(scope="module")
def url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    cache_path = tmp_path_factory.mktemp("pair") / "cache.sqlite3"
    with run_uvicorn(paid_api_app()) as paid:
        policy = parse_policy(policy_text(paid, cache_path), env={})
        with run_uvicorn(create_app(policy)) as base:
            yield base


@pytest.fixture(scope="module")
def embedder(one_torch_thread: None) -> Embedder:
    return Embedder()


def ask(url: str, text: str):
    client = openai.OpenAI(base_url=f"{url}/v1", api_key=KEY, max_retries=0)
    return client.chat.completions.with_raw_response.create(
        model="auto", messages=[{"role": "user", "content": text}], max_tokens=8, temperature=0
    )


def cosine(embedder: Embedder, a: str, b: str) -> float:
    va, vb = embedder.embed_many([a, b])
    return float(np.dot(va, vb))


def test_a_rewording_below_the_old_floor_hits_and_a_negation_does_not(
    url: str, embedder: Embedder
) -> None:
    floor = CacheSettings().min_similarity
    assert floor < cosine(embedder, REWORDED, STORED) < 0.8  # the old floor missed it
    first = ask(url, STORED)
    assert first.headers["x-tiergate-cache"] == "miss"
    assert eventually(lambda: ask(url, STORED).headers["x-tiergate-cache"] == "hit", 10)
    hit = ask(url, REWORDED)
    assert hit.headers["x-tiergate-cache"] == "hit"
    assert hit.parse().choices[0].message.content == first.parse().choices[0].message.content
    assert cosine(embedder, NEGATED, STORED) >= floor  # a candidate the verifier saw
    refused = ask(url, NEGATED)
    assert refused.headers["x-tiergate-cache"] == "miss"
