"""The unit of work the scheduler hands the runner: one sequence's tokens for one step."""

from dataclasses import dataclass

import torch

from engine.logits_process import History
from engine.sampler import SampledLogprobs
from engine.sampling_params import SamplingParams
from engine.structured_output.grammar import GrammarState


@dataclass
class SeqChunk:
    seq_id: int
    token_ids: list[int]  # tokens whose K/V are computed this step (a prefill chunk or 1 decode)
    start_pos: int  # tokens of this sequence already in the KV cache (position of token_ids[0])
    page_table: list[int]  # page ids covering positions [0, start_pos + len(token_ids))
    sample: bool  # sample a next token after this chunk (last prefill chunk, or decode)
    params: SamplingParams
    generator: torch.Generator | None = None  # per-request, seeded when params.seed is set
    history: History | None = None  # set when sampling reads past tokens (penalties, min_tokens)
    logprobs: SampledLogprobs | None = None  # written by the runner when params.logprobs is set
    grammar: GrammarState | None = None  # masks the logits when the output is constrained
