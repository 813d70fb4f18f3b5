"""A short load run through the gateway and the real small engine (bench/load.py: the long one).

~150 requests at concurrency 16, mixed whole, streamed, abandoned midway and invalid:
every valid request is answered whole and well-formed, nothing is 5xx, and once the
traffic stops the engine holds no request and no KV page.
"""

import asyncio

import pytest

from gateway.app import create_app
from gateway.policy import parse_policy
from tests.load_driver import Target, make_jobs, run_load
from tests.pool_state import wait_at_rest
from tests.servers import run_uvicorn

KEY = "sk-load-0123456789"
ADMIN_KEY = "sk-load-admin-0123456789"
POLICY = f"""
auth:
  keys: [{{key: {KEY}, tenant: load}}]
  admin_key: {ADMIN_KEY}
engines:
  smollm2-135m: {{kv_cache_mb: 64, max_num_seqs: 16, max_waiting: 64}}
tiers:
  small: {{deployments: [{{model: smollm2-135m}}], retries: 0, timeout_s: 300}}
routes:
  auto: {{default: small}}
"""
QUESTIONS = [
    "What is a KV cache?",
    "Write a haiku about the sea.",
    "Explain continuous batching in two sentences.",
    "How do I reverse a list in Python?",
    "Name three prime numbers larger than 100.",
    "Why is the sky blue?",
    "Give me a recipe for pancakes.",
    "What does HTTP status 499 mean?",
]


@pytest.mark.usefixtures("one_torch_thread")
def test_mixed_load_answers_every_valid_request_and_frees_every_page() -> None:
    app = create_app(parse_policy(POLICY, env={}))
    jobs = make_jobs(QUESTIONS, 150, seed=8, max_tokens=(8, 24))
    with run_uvicorn(app) as url:
        target = Target(url, "auto", KEY, ADMIN_KEY)
        run = asyncio.run(run_load(target, jobs, concurrency=16))
        rest = asyncio.run(wait_at_rest(target, deadline_s=120))
        engine = app.state.gateway.engines.get("smollm2-135m").engine
        free_pages = engine.free_pages()  # read at rest: the step thread is idle

    assert run.problems == [], "\n".join(run.problems[:20])
    summary = run.summary()
    kinds = summary["kinds"]
    assert summary["valid_answered"] == kinds["whole"] + kinds["stream"]
    assert all(kinds.get(k, 0) > 0 for k in ("cancel_stream", "bad_body", "bad_key"))
    assert summary["cancelled_midway"] > 0
    assert not any(s.startswith("5") for s in rest.requests_by_status), rest.requests_by_status
    assert rest.requests_by_status.get("499", 0) >= 1  # the gateway counted the abandoned ones
    assert rest.at_rest, rest
    assert free_pages == engine.num_pages
