"""`best_of` on completions, as OpenAI and vLLM define it: `best_of` candidates are
generated (sibling requests sharing the prompt's KV pages, like `n` choices) and the `n`
with the highest cumulative log-probability of their sampled tokens are returned.

Ranking needs every candidate's sampled-token logprobs, so they are requested even when
the client did not ask, then dropped from the answer. Usage counts every candidate's
tokens (`usage_of` over all of them), as OpenAI bills. Used by the engine's server and the
gateway's local tiers alike.
"""

import dataclasses

from engine.entrypoints.openai.protocol import ChatCompletionRequest, CompletionRequest
from engine.outputs import RequestOutput
from engine.sampling_params import SamplingParams


def ranks(body: ChatCompletionRequest | CompletionRequest) -> bool:
    """Whether the answer is a pick among more candidates than it returns."""
    return body.candidates() > (body.n or 1)


def candidate_params(
    params: SamplingParams, body: ChatCompletionRequest | CompletionRequest
) -> SamplingParams:
    """A candidate's settings: with its sampled tokens' logprobs when it must be ranked."""
    if ranks(body) and params.logprobs is None:
        return dataclasses.replace(params, logprobs=0)
    return params


def cumulative_logprob(out: RequestOutput) -> float:
    """The sum over the sampled tokens (a final stop token has no entry: see outputs)."""
    return sum(entry.chosen.logprob for entry in out.logprobs or [])


def pick_best(
    finals: list[RequestOutput], body: ChatCompletionRequest | CompletionRequest
) -> list[RequestOutput]:
    """The answer's choices from the finished candidates (whole, see `drain`): the `n`
    most likely, most likely first (ties keep candidate order); all of them unranked."""
    if not ranks(body):
        return finals
    best = sorted(finals, key=cumulative_logprob, reverse=True)[: body.n or 1]
    if body.logprobs_count() is None:  # asked for ranking only
        best = [dataclasses.replace(out, logprobs=None) for out in best]
    return best
