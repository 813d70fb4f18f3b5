"""A big POST /v1/embeddings on the real gateway (real all-MiniLM-L6-v2, loopback HTTP, the
openai client): it runs as micro-batches under `embedder.max_batch_tokens`, so its memory
is bounded, and a chat's cache lookup embeds between them instead of after the whole
request (issue 29.1: one 2,048-input request took the gateway down; a 128-input one held a
chat for 13 s)."""

import random
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import openai
import psutil
import pytest

from gateway.app import create_app
from gateway.embedding.embedder import Embedder
from gateway.policy import parse_policy
from tests.paid_api import paid_api_app
from tests.servers import run_uvicorn, wait_for

KEY = "sk-bulk-embed-tenant"
MODEL = "all-MiniLM-L6-v2"
BUDGET = 4096  # not the default: the policy's knob reaches the embedder
INPUTS = 128  # ~256 tokens each: one unbatched pass of these grew resident memory ~2 GB
WORDS = ["cache", "gateway", "engine", "token", "model", "batch", "tenant", "router"]


def long_inputs(n: int, seed: int) -> list[str]:
    """~1.2 KB each, each cut at the model's 256 word pieces."""
    rng = random.Random(seed)
    return [
        " ".join(f"{rng.choice(WORDS)}{rng.randint(0, 999)}" for _ in range(150))[:1200]
        for _ in range(n)
    ]


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Embedder]]:
    path: Path = tmp_path_factory.mktemp("bulk") / "cache.sqlite3"
    with run_uvicorn(paid_api_app()) as paid:
        policy = parse_policy(
            f"""
auth: {{keys: [{{key: {KEY}, tenant: bulk}}]}}
cache: {{enabled: true, store: embedded, path: {path}}}
embedder: {{max_batch_tokens: {BUDGET}}}
tiers:
  paid: {{deployments: [{{model: openai/gpt-4o, api_base: "{paid}/v1"}}]}}
routes:
  auto: {{default: paid}}
""",
            env={},
        )
        app = create_app(policy)
        with run_uvicorn(app) as base:
            client(base).embeddings.create(model=MODEL, input="load the embedder")
            yield base, app.state.gateway.embedder.current


def client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key=KEY, max_retries=0, timeout=600)


class PeakRss:
    """The process's highest resident memory while the block runs (the gateway runs in
    this process), sampled by a thread."""

    def __init__(self) -> None:
        self._proc = psutil.Process()
        self.base = self.peak = self._proc.memory_info().rss
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while not self._done.wait(0.005):
            self.peak = max(self.peak, self._proc.memory_info().rss)

    def __enter__(self) -> "PeakRss":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        self._thread.join()

    @property
    def growth_gb(self) -> float:
        return (self.peak - self.base) / 2**30


def test_bulk_request_runs_in_budgeted_batches_with_bounded_memory(
    gateway: tuple[str, Embedder],
) -> None:
    url, embedder = gateway
    texts = long_inputs(INPUTS, seed=1)
    seen = len(embedder.recent_batches)
    with PeakRss() as rss:
        reply = client(url).embeddings.create(model=MODEL, input=texts)
    assert [d.index for d in reply.data] == list(range(INPUTS))
    batches = list(embedder.recent_batches)[seen:]
    assert sum(b.rows for b in batches) == INPUTS and len(batches) > 1
    assert embedder.max_batch_tokens == BUDGET
    assert all(b.rows * b.width <= BUDGET for b in batches), batches
    assert rss.growth_gb < 1.5, f"resident memory grew {rss.growth_gb:.2f} GB"
    # the same vectors as one pass over all of them, each at its own index
    vectors = np.array([d.embedding for d in reply.data], dtype=np.float32)
    sample = [0, 17, 64, INPUTS - 1]
    assert np.allclose(vectors[sample], embedder.embed_many([texts[i] for i in sample]), atol=1e-5)
    assert reply.usage.prompt_tokens == embedder.count_tokens(texts)


def test_chat_embeds_between_a_bulk_requests_batches(gateway: tuple[str, Embedder]) -> None:
    url, embedder = gateway
    before = embedder.texts_embedded
    bulk: dict[str, object] = {}

    def run_bulk() -> None:
        headers = {"Authorization": f"Bearer {KEY}"}
        body = {"model": MODEL, "input": long_inputs(INPUTS, seed=2)}
        bulk["reply"] = httpx.post(f"{url}/v1/embeddings", json=body, headers=headers, timeout=600)

    thread = threading.Thread(target=run_bulk)
    thread.start()
    wait_for(lambda: embedder.texts_embedded > before, 120)  # the bulk's first batch ran
    answer = client(url).chat.completions.with_raw_response.create(
        model="auto", messages=[{"role": "user", "content": "Is the cache warm?"}], max_tokens=2
    )
    embedded_by_then = embedder.texts_embedded - before
    thread.join()
    assert answer.headers["x-tiergate-cache"] == "miss"  # it was looked up: it embedded
    # The chat's one text was embedded and it was answered while the bulk still had
    # batches to run; before micro-batching it waited for all 128.
    assert embedded_by_then < INPUTS
    assert bulk["reply"].status_code == 200
    shapes = list(embedder.recent_batches)
    last_bulk = max(i for i, b in enumerate(shapes) if not b.urgent)
    assert any(b.urgent for b in shapes[:last_bulk])
