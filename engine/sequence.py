"""One request's state as the scheduler and the engine see it."""

from dataclasses import dataclass, field
from enum import Enum

import torch

from engine.detokenizer import IncrementalDetokenizer
from engine.outputs import TokenLogprobs
from engine.sampling_params import SamplingParams
from engine.structured_output.grammar import GrammarState


class SeqStatus(Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass(eq=False)  # identity semantics: sequences live in lists and are removed by identity
class Sequence:
    seq_id: int
    request_id: str
    token_ids: list[int]  # prompt followed by the generated tokens
    num_prompt_tokens: int
    params: SamplingParams
    max_tokens: int  # params.max_tokens clamped so prompt + output fits the context
    cache_salt: str | None = None
    priority: int = 0  # lower is served first: 0 interactive, 1 batch work (scheduler.py)
    arrival_time: float = 0.0
    generator: torch.Generator | None = None
    detokenizer: IncrementalDetokenizer | None = None
    grammar: GrammarState | None = None  # the output's constraint, advanced per token
    status: SeqStatus = SeqStatus.WAITING
    finish_reason: str | None = None
    # KV bookkeeping (the KV manager holds the page table and sets these)
    num_computed_tokens: int = 0  # leading tokens whose K/V are in the cache
    page_keys: list[bytes] = field(default_factory=list)  # chained keys of full pages
    num_cached_tokens: int = 0  # prompt tokens served from the prefix cache on first admission
    num_preemptions: int = 0
    # latency bookkeeping
    first_token_time: float | None = None
    last_token_time: float | None = None
    num_emitted_tokens: int = 0  # output tokens already reported to the caller
    new_logprobs: list[TokenLogprobs] = field(default_factory=list)  # not yet reported

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens :]
