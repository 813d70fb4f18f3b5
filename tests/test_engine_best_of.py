"""`best_of` on `tiergate engine`'s /v1/completions: real SmolLM2 engine, real uvicorn, the
openai client. The candidates are checked by asking for them as `n` choices with logprobs
and the same seed (candidate i uses seed + i, as choice i does)."""

from collections.abc import Iterator
from typing import Any

import openai
import pytest

from engine.config import EngineConfig
from engine.engine import AsyncEngine
from engine.entrypoints.server import create_engine_app
from tests.servers import run_uvicorn, running_engine, wait_idle

NAME = "smollm2-135m"
CONFIG = EngineConfig(
    model=NAME, kv_cache_bytes=32 * 1024 * 1024, max_num_seqs=4, max_waiting=8, num_threads=1
)
PROMPT = "The best thing about summer is"
GREEDY: dict[str, Any] = {"model": NAME, "prompt": PROMPT, "temperature": 0, "max_tokens": 8}
SAMPLED: dict[str, Any] = {**GREEDY, "temperature": 1.0, "max_tokens": 10, "seed": 11}


@pytest.fixture(scope="module")
def engine(one_torch_thread: None) -> Iterator[AsyncEngine]:
    with running_engine(CONFIG) as engine:
        yield engine


@pytest.fixture(scope="module")
def client(engine: AsyncEngine) -> Iterator[openai.OpenAI]:
    with run_uvicorn(create_engine_app(engine, NAME)) as url:
        yield openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)


def summed_logprob(choice: Any) -> float:
    return sum(choice.logprobs.token_logprobs)


def ranked_candidates(client: openai.OpenAI, best_of: int, **body: Any) -> list[Any]:
    """The candidates a `best_of` request generates, most likely first."""
    choices = client.completions.create(n=best_of, logprobs=0, **body).choices
    assert len({c.text for c in choices}) == best_of  # distinct, so the pick is observable
    return sorted(choices, key=summed_logprob, reverse=True)


def test_greedy_best_of_is_the_plain_answer(client: openai.OpenAI) -> None:
    plain = client.completions.create(**GREEDY)
    best = client.completions.create(best_of=3, n=1, **GREEDY)
    assert [c.text for c in best.choices] == [plain.choices[0].text]
    assert best.choices[0].logprobs is None  # ranked with logprobs the client did not ask
    assert best.usage.prompt_tokens == plain.usage.prompt_tokens  # the prompt once
    assert best.usage.completion_tokens == 3 * plain.usage.completion_tokens  # all candidates


def test_seeded_best_of_returns_the_most_likely_candidates(client: openai.OpenAI) -> None:
    candidates = ranked_candidates(client, 3, **SAMPLED)
    assert candidates[0].index != 0  # this seed's best is not the first: the pick shows
    one = client.completions.create(best_of=3, n=1, **SAMPLED)
    assert [c.text for c in one.choices] == [candidates[0].text]
    two = client.completions.create(best_of=3, n=2, logprobs=0, **SAMPLED)
    assert [c.index for c in two.choices] == [0, 1]
    assert [c.text for c in two.choices] == [c.text for c in candidates[:2]]
    # logprobs asked: the chosen candidates' own
    assert [summed_logprob(c) for c in two.choices] == [summed_logprob(c) for c in candidates[:2]]


def test_best_of_usage_counts_every_candidate(client: openai.OpenAI) -> None:
    as_choices = client.completions.create(n=4, **SAMPLED)
    best = client.completions.create(best_of=4, n=1, **SAMPLED)
    assert best.usage.prompt_tokens == as_choices.usage.prompt_tokens
    assert best.usage.completion_tokens == as_choices.usage.completion_tokens


def test_best_of_candidates_share_the_prompt_pages(
    client: openai.OpenAI, engine: AsyncEngine
) -> None:
    prompt = "A long and careful introduction to the subject at hand. " * 12
    before = wait_idle(engine)
    reply = client.completions.create(**{**GREEDY, "prompt": prompt}, best_of=3)
    after = wait_idle(engine)
    full_pages = reply.usage.prompt_tokens // CONFIG.page_size * CONFIG.page_size
    # the two other candidates reused every full page of the prompt the first computed
    assert after.prefix_cache_hits - before.prefix_cache_hits >= 2 * full_pages > 0
    assert after.prompt_tokens - before.prompt_tokens == 3 * reply.usage.prompt_tokens


def test_best_of_equal_to_n_streams(client: openai.OpenAI) -> None:
    whole = client.completions.create(n=2, **GREEDY)
    stream = client.completions.create(best_of=2, n=2, stream=True, **GREEDY)
    texts = {0: "", 1: ""}
    for chunk in stream:
        for choice in chunk.choices:
            texts[choice.index] += choice.text
    assert texts == {c.index: c.text for c in whole.choices}


@pytest.mark.parametrize(
    ("fields", "words"),
    [
        ({"best_of": 2, "n": 3}, "best_of must be n (3)..16"),
        ({"best_of": 17}, "best_of must be n (1)..16"),
        ({"best_of": 3, "n": 1, "stream": True}, "cannot be streamed"),
    ],
)
def test_bad_best_of_is_a_400_naming_it(
    client: openai.OpenAI, engine: AsyncEngine, fields: dict[str, Any], words: str
) -> None:
    before = engine.metrics.snapshot().prompt_tokens
    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(**{**GREEDY, **fields})
    assert info.value.body["param"] == "best_of" and words in info.value.body["message"]
    assert engine.metrics.snapshot().prompt_tokens == before  # nothing reached the engine
