"""The traffic sample's place in a request: a route with `learn.sample_rate` keeps that share
of its answered requests (the messages, the tier served, its answer) for `tiergate router
learn`, in the background after the answer went out.

Kept: answers from a tier (a cache hit says nothing new about the tiers), one choice, no
tools (a learn run re-asks the prompt of another tier, which needs the whole request).
A store that fails loses the sample, never the answer.
"""

import asyncio
import logging
import random

from engine.entrypoints.openai.protocol import ChatCompletionRequest
from gateway.api.respond import AfterHook, Answer
from gateway.backends.base import OpenAIRequest
from gateway.backends.fallback import Served
from gateway.cache.sample_stores import open_sample_store, store_key
from gateway.cache.samples import Sample, SampleStore
from gateway.policy import Policy
from gateway.state import GatewayState

logger = logging.getLogger("tiergate")
KEPT_FINISH_REASONS = ("stop", "length")


def sample_store(state: GatewayState) -> SampleStore:
    """The store the running policy's cache section names, opened on first use (and again
    when a reload names another one)."""
    cache = state.runtime.policy.cache
    key = store_key(cache)
    if state.samples is None or state.samples_key != key:
        old = state.samples
        state.samples, state.samples_key = open_sample_store(cache), key
        if old is not None:
            task = asyncio.ensure_future(old.close())
            state.background.add(task)
            task.add_done_callback(state.background.discard)
    return state.samples


def request_messages(body: OpenAIRequest) -> list[dict[str, str]] | None:
    if isinstance(body, ChatCompletionRequest):
        return [{"role": m.role, "content": m.text()} for m in body.messages]
    if isinstance(body.prompt, str):
        return [{"role": "user", "content": body.prompt}]
    return None  # token ids or a batch of prompts: nothing a judge can read


def sample_hook(
    state: GatewayState,
    policy: Policy,
    route: str,
    tenant: str,
    body: OpenAIRequest,
    served: Served,
) -> AfterHook | None:
    """The after-response hook keeping this request, when its route draws it."""
    learn = policy.routes[route].learn if route in policy.routes else None
    if learn is None or learn.sample_rate <= 0 or random.random() >= learn.sample_rate:
        return None
    messages = request_messages(body)
    if messages is None or body.candidates() > 1 or getattr(body, "tools", None):
        return None
    max_tokens = getattr(body, "max_completion_tokens", None) or body.max_tokens

    def keep(answer: Answer) -> None:
        if answer.finish_reason not in KEPT_FINISH_REASONS or answer.tool_calls:
            return
        sample = Sample(
            tenant,
            route,
            messages,
            served.tier,
            served.model,
            answer.text,
            max_tokens,
            answer.usage.prompt_tokens,
            answer.usage.completion_tokens,
        )
        sample.expires_at = sample.created_at + learn.retention_s
        task = asyncio.ensure_future(_add(sample_store(state), sample, learn.max_samples))
        state.background.add(task)
        task.add_done_callback(state.background.discard)

    return keep


async def _add(store: SampleStore, sample: Sample, max_samples: int) -> None:
    try:
        await store.add(sample, max_samples)
    except Exception:  # a lost sample costs a learn run one row, never the answer sent
        logger.exception("router sample not kept")
