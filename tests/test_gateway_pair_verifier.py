"""The verifier models beside the default through the live gateway, at the default floor:
the pair model (`verifier_model: pair`, `verifier: lenient`): a rewording people wrote
(train split), whose cosine is below the old 0.8 floor, is served from the cache; its
negation is not. The aligned model (`verifier_model: aligned`, `strict`): a rewording
(train split) is served, another aspect of the same subject is not; so with the nli model
(`verifier_model: nli`, `balanced`, as docs/cache.md recommends it). The tier is the
paid-API stand-in; the embedder, the verifiers' ONNX graphs and the store are the real ones.
"""

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import openai
import pytest

from gateway.app import create_app
from gateway.embedding.embedder import Embedder
from gateway.policy import CacheSettings, parse_policy
from tests.paid_api import paid_api_app
from tests.pair_verifiers import cosine
from tests.servers import eventually, run_uvicorn

KEY = "sk-pair-verifier"
STORED = "recommend me a film for tonight"
REWORDED = "What's a good movie to watch tonight?"  # cosine 0.76
NEGATED = "What's not a good movie to watch tonight?"


def policy_text(paid: str, cache_path: Path, model: str = "pair", strictness: str = "lenient"):
    return f"""
auth: {{keys: [{{key: {KEY}, tenant: acme}}]}}
cache: {{enabled: true, store: embedded, path: {cache_path}, verifier_model: {model},
        verifier: {strictness}}}
tiers:
  cheap: {{deployments: [{{model: openai/gpt-4o-mini, api_base: "{paid}/v1"}}]}}
routes:
  auto: {{default: cheap}}
"""


@contextmanager
def gateway(tmp: Path, model: str, strictness: str) -> Iterator[str]:
    with run_uvicorn(paid_api_app()) as paid:
        text = policy_text(paid, tmp / "cache.sqlite3", model, strictness)
        with run_uvicorn(create_app(parse_policy(text, env={}))) as base:
            yield base


@pytest.fixture(scope="module")
def url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with gateway(tmp_path_factory.mktemp("pair"), "pair", "lenient") as base:
        yield base


def ask(url: str, text: str):
    client = openai.OpenAI(base_url=f"{url}/v1", api_key=KEY, max_retries=0)
    return client.chat.completions.with_raw_response.create(
        model="auto", messages=[{"role": "user", "content": text}], max_tokens=8, temperature=0
    )


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


STRICTNESS = {"aligned": "balanced", "nli": "balanced"}
ASPECTS = {  # verifier_model: (stored, a rewording, another aspect of the same subject)
    "aligned": (
        "What's Tokyo's population?",
        "How many people live in Tokyo?",
        "What is the area of Tokyo?",
    ),
    "nli": (
        "How do I center a div in CSS?",
        "How can I center a div using CSS?",
        "How do I center text in CSS?",
    ),
}


@pytest.mark.parametrize("model", list(ASPECTS))
def test_a_verifier_model_serves_a_rewording_and_not_another_aspect(
    tmp_path: Path, embedder: Embedder, model: str
) -> None:
    stored, reworded, other = ASPECTS[model]
    assert cosine(embedder, other, stored) >= CacheSettings().min_similarity  # verifier saw it
    with gateway(tmp_path, model, STRICTNESS[model]) as url:
        first = ask(url, stored)
        assert eventually(lambda: ask(url, stored).headers["x-tiergate-cache"] == "hit", 10)
        hit = ask(url, reworded)
        assert hit.headers["x-tiergate-cache"] == "hit"
        assert hit.parse().choices[0].message.content == first.parse().choices[0].message.content
        assert ask(url, other).headers["x-tiergate-cache"] == "miss"
