"""logprobs, penalties, logit_bias, min_tokens and stop_token_ids on the engine's server:
real SmolLM2, real uvicorn, the official openai client, sync and streamed, at temperature 0."""

import asyncio
from collections.abc import Iterator
from typing import Any

import openai
import pytest

from engine.config import EngineConfig
from engine.engine import AsyncEngine
from engine.entrypoints.openai.protocol import ChatCompletionRequest
from engine.entrypoints.server import create_engine_app
from gateway.backends.base import GenerationRequest, Piece
from gateway.backends.local import EngineSlot, LocalBackend
from tests.servers import run_uvicorn, running_engine

NAME = "smollm2-135m"
USER = [{"role": "user", "content": "Name three colours."}]
CONFIG = EngineConfig(model=NAME, kv_cache_bytes=32 * 1024 * 1024, max_num_seqs=4, num_threads=1)
GREEDY: dict[str, Any] = {"model": NAME, "temperature": 0, "max_tokens": 12}
VLLM_FIELDS = {"repetition_penalty", "min_tokens", "stop_token_ids"}  # not in the openai client


def kwargs(**fields: Any) -> dict[str, Any]:
    """The openai client's keyword arguments: vLLM's fields travel in extra_body."""
    out = {k: v for k, v in fields.items() if k not in VLLM_FIELDS}
    extra = {k: v for k, v in fields.items() if k in VLLM_FIELDS}
    return {**out, "extra_body": extra} if extra else out


@pytest.fixture(scope="module")
def engine(one_torch_thread: None) -> Iterator[AsyncEngine]:
    with running_engine(CONFIG) as engine:
        yield engine


@pytest.fixture(scope="module")
def base_url(engine: AsyncEngine) -> Iterator[str]:
    with run_uvicorn(create_engine_app(engine, NAME)) as url:
        yield url


@pytest.fixture
def client(base_url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{base_url}/v1", api_key="unused", max_retries=0)


def chat(client: openai.OpenAI, **extra: Any) -> Any:
    return client.chat.completions.create(**kwargs(messages=USER, **{**GREEDY, **extra}))


def streamed_chat(client: openai.OpenAI, **extra: Any) -> tuple[str, list[Any], str | None]:
    text, entries, reason = "", [], None
    for chunk in client.chat.completions.create(messages=USER, stream=True, **{**GREEDY, **extra}):
        choice = chunk.choices[0]
        text += choice.delta.content or ""
        entries += choice.logprobs.content if choice.logprobs else []
        reason = choice.finish_reason or reason
    return text, entries, reason


def test_chat_logprobs_whole_and_streamed(client: openai.OpenAI) -> None:
    reply = chat(client, logprobs=True, top_logprobs=3)
    choice = reply.choices[0]
    entries = choice.logprobs.content
    assert choice.finish_reason == "length"  # every token has text: one entry each
    assert len(entries) == reply.usage.completion_tokens == 12
    assert b"".join(bytes(e.bytes) for e in entries).decode() == choice.message.content
    for e in entries:
        assert len(e.top_logprobs) == 3
        values = [t.logprob for t in e.top_logprobs]
        assert values == sorted(values, reverse=True) and values[0] <= 0
        # greedy: the chosen token is the most likely one
        assert (e.top_logprobs[0].token, e.top_logprobs[0].logprob) == (e.token, e.logprob)
    text, streamed, reason = streamed_chat(client, logprobs=True, top_logprobs=3)
    assert (text, reason) == (choice.message.content, "length")
    assert [e.token for e in streamed] == [e.token for e in entries]
    # the same numbers up to float rounding (another batch shape sums in another order)
    assert [e.logprob for e in streamed] == pytest.approx([e.logprob for e in entries], abs=1e-3)
    plain = chat(client)
    assert plain.choices[0].logprobs is None
    assert plain.choices[0].message.content == choice.message.content
    only_chosen = chat(client, logprobs=True).choices[0].logprobs.content
    assert all(e.top_logprobs == [] for e in only_chosen) and len(only_chosen) == 12


def test_completion_logprobs_whole_and_streamed(client: openai.OpenAI) -> None:
    body: dict[str, Any] = {**GREEDY, "prompt": "The capital of France is", "logprobs": 2}
    reply = client.completions.create(**body)
    lp = reply.choices[0].logprobs
    assert "".join(lp.tokens) == reply.choices[0].text
    assert len(lp.token_logprobs) == len(lp.tokens) == len(lp.top_logprobs) == 12
    pairs = zip(lp.tokens, lp.top_logprobs, strict=True)
    assert all(len(top) <= 2 and token in top for token, top in pairs)
    offsets = [sum(len(t) for t in lp.tokens[:i]) for i in range(len(lp.tokens))]
    assert lp.text_offset == offsets
    tokens, offs = [], []
    for chunk in client.completions.create(stream=True, **body):
        if chunk.choices and chunk.choices[0].logprobs:
            tokens += chunk.choices[0].logprobs.tokens
            offs += chunk.choices[0].logprobs.text_offset
    assert (tokens, offs) == (lp.tokens, lp.text_offset)


def test_logit_bias_bans_the_greedy_token(client: openai.OpenAI, engine: AsyncEngine) -> None:
    first = chat(client, max_tokens=1, logprobs=True).choices[0].logprobs.content[0]
    token_id = engine.engine.tokenizer.encode(first.token)[-1]
    assert engine.engine.tokenizer.decode([token_id]) == first.token
    biased = chat(client, max_tokens=1, logprobs=True, logit_bias={str(token_id): -100})
    assert biased.choices[0].logprobs.content[0].token != first.token
    forced = chat(client, max_tokens=3, logit_bias={str(token_id): 100})
    assert forced.choices[0].message.content == first.token * 3


def _repeats(client: openai.OpenAI, stream: bool = False, **extra: Any) -> Any:
    body = kwargs(**{**GREEDY, "prompt": "1 1 1 1 1 1 1 1 1 1 1 1", "max_tokens": 16, **extra})
    if not stream:
        return client.completions.create(**body).choices[0]
    return "".join(c.choices[0].text for c in client.completions.create(stream=True, **body))


def test_penalties_change_a_repetitive_answer(client: openai.OpenAI) -> None:
    plain = _repeats(client, logprobs=0)
    assert plain.text.split() == ["1"] * len(plain.text.split())  # the model alone repeats
    penalised = _repeats(client, frequency_penalty=2.0).text
    assert penalised.split().count("1") < len(plain.text.split())
    assert _repeats(client, stream=True, frequency_penalty=2.0) == penalised
    # presence: a flat 2.0 off each token already in the output (not enough to change this
    # answer, so the logprobs, taken after penalties, show it): the first token is untouched
    present = _repeats(client, logprobs=0, presence_penalty=2.0)
    assert present.logprobs.tokens == plain.logprobs.tokens
    before, after = plain.logprobs.token_logprobs, present.logprobs.token_logprobs
    assert after[0] == pytest.approx(before[0], abs=1e-3)
    assert all(a < b - 0.01 for a, b in zip(after[2:], before[2:], strict=True))
    assert _repeats(client, stream=True, presence_penalty=2.0) == present.text
    # the prompt is all "1": a strong repetition penalty acts before any output exists
    assert not _repeats(client, max_tokens=1, repetition_penalty=3.0).text.strip().startswith("1")


def test_min_tokens_and_stop_token_ids(client: openai.OpenAI, engine: AsyncEngine) -> None:
    short = {**GREEDY, "max_tokens": 200, "messages": [{"role": "user", "content": "Say OK."}]}
    plain = client.chat.completions.create(**short)
    assert plain.choices[0].finish_reason == "stop"
    n = plain.usage.completion_tokens  # the EOS included
    longer = client.chat.completions.create(**kwargs(**short, min_tokens=n + 5))
    assert longer.usage.completion_tokens > n + 5
    assert longer.choices[0].message.content.startswith(plain.choices[0].message.content)

    ids = engine.engine.tokenizer.encode(plain.choices[0].message.content)
    stop_at = next(i for i in range(1, len(ids)) if ids[i] not in ids[:i])
    cut = client.chat.completions.create(**kwargs(**short, stop_token_ids=[ids[stop_at]]))
    assert cut.choices[0].finish_reason == "stop"
    assert cut.choices[0].message.content == engine.engine.tokenizer.decode(ids[:stop_at])
    held = client.chat.completions.create(
        **kwargs(**short, stop_token_ids=[ids[stop_at]], min_tokens=n + 5)
    )
    assert held.usage.completion_tokens > n + 5


def test_adjusted_and_plain_requests_batched_together(base_url: str) -> None:
    client = openai.AsyncOpenAI(base_url=f"{base_url}/v1", api_key="unused", max_retries=0)
    adjusted = {"frequency_penalty": 1.0, "logit_bias": {"28": 5}, "logprobs": True}

    async def one(**extra: Any) -> str:
        reply = await client.chat.completions.create(messages=USER, **{**GREEDY, **extra})
        return reply.choices[0].message.content

    async def run() -> tuple[list[str], list[str]]:
        together = await asyncio.gather(one(), one(**adjusted), one(), one(**adjusted))
        alone = [await one(), await one(**adjusted)]
        return list(together), alone

    together, (plain, adj) = asyncio.run(run())
    assert together == [plain, adj, plain, adj]
    assert plain != adj


def test_local_backend_pieces_carry_the_logprobs(
    client: openai.OpenAI, engine: AsyncEngine
) -> None:
    """What the gateway's request path hands to `shape.delta(piece.text, piece.logprobs)`."""
    body = ChatCompletionRequest.model_validate(
        {**GREEDY, "messages": USER, "logprobs": True, "top_logprobs": 2}
    )
    backend = LocalBackend(NAME, EngineSlot(NAME, CONFIG, engine))

    async def pieces() -> list[Piece]:
        return [p async for p in backend.generate(GenerationRequest("r1", body, "t"))]

    got = asyncio.run(pieces())
    entries = [e for p in got for e in p.logprobs or []]
    served = chat(client, logprobs=True, top_logprobs=2).choices[0].logprobs.content
    assert [e.chosen.token for e in entries] == [e.token for e in served]
    assert all(len(e.top) == 2 for e in entries)
    assert "".join(p.text for p in got) == "".join(e.chosen.token for e in entries)


def test_n_choices_share_the_prompt_pages(client: openai.OpenAI, engine: AsyncEngine) -> None:
    # a fresh prompt (the salt keeps earlier tests' pages out) of several full pages
    prompt = "Write a short poem about the sea. " * 8
    salt = {"extra_body": {"cache_salt": "n-choices"}}
    before = engine.metrics.snapshot()
    body = {**GREEDY, "prompt": prompt, "temperature": 1.2, "seed": 5, "max_tokens": 12, **salt}
    reply = client.completions.create(n=3, **body)
    after = engine.metrics.snapshot()
    assert [c.index for c in reply.choices] == [0, 1, 2]
    assert len({c.text for c in reply.choices}) > 1  # seed, seed + 1, seed + 2
    one = client.completions.create(**{**body, "max_tokens": 1})
    prompt_tokens = one.usage.prompt_tokens
    assert reply.usage.prompt_tokens == prompt_tokens  # the prompt counts once
    assert reply.usage.completion_tokens == 3 * 12
    # two siblings reused every full page of the prompt the first one computed
    full_pages = (prompt_tokens // CONFIG.page_size) * CONFIG.page_size
    assert after.prefix_cache_hits - before.prefix_cache_hits >= 2 * full_pages
    assert after.prompt_tokens - before.prompt_tokens == 3 * prompt_tokens


def test_n_choices_streamed_chat(client: openai.OpenAI) -> None:
    whole = chat(client, n=2)
    assert [c.message.content for c in whole.choices] == [whole.choices[0].message.content] * 2
    texts, reasons = ["", ""], [None, None]
    stream = client.chat.completions.create(
        messages=USER, stream=True, n=2, stream_options={"include_usage": True}, **GREEDY
    )
    usage = None
    for chunk in stream:
        usage = chunk.usage or usage
        for choice in chunk.choices:
            texts[choice.index] += choice.delta.content or ""
            reasons[choice.index] = choice.finish_reason or reasons[choice.index]
    assert texts == [c.message.content for c in whole.choices]
    assert reasons == ["length", "length"]
    assert usage is not None and usage.completion_tokens == 24


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"logprobs": 3}, "logprobs"),
        ({"top_logprobs": 2}, "top_logprobs"),
        ({"logprobs": True, "top_logprobs": 50}, "top_logprobs"),
        ({"presence_penalty": 3}, "presence_penalty"),
        ({"repetition_penalty": -1}, "repetition_penalty"),
        ({"logit_bias": {"999999": 1}}, "logit_bias"),
        ({"logit_bias": {"x": 1}}, "logit_bias"),
        ({"stop_token_ids": [10**9]}, "stop_token_ids"),
        ({"min_tokens": 50, "max_tokens": 10}, None),
        ({"n": 17}, "n"),
    ],
)
def test_bad_values_are_400s_naming_the_field(
    client: openai.OpenAI, extra: dict[str, Any], param: str | None
) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(**kwargs(**{**GREEDY, "messages": USER, **extra}))
    assert info.value.status_code == 400
    assert info.value.body["param"] == param
