"""Per-request sampling settings, shared by the scheduler, the runner and the servers."""

from dataclasses import dataclass, field

from engine.structured_output.constraints import Constraint


@dataclass
class SamplingParams:
    temperature: float = 1.0  # 0 means greedy
    top_p: float = 1.0
    top_k: int = 0  # 0 means off
    seed: int | None = None
    max_tokens: int = 256
    stop: list[str] = field(default_factory=list)  # never emitted; matched across tokens
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    # OpenAI's penalties on output tokens; vLLM's (HF's) repetition penalty on prompt + output
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logit_bias: dict[int, float] = field(default_factory=dict)  # token id -> added to its logit
    min_tokens: int = 0  # EOS and stop_token_ids are banned until this many tokens are out
    logprobs: int | None = None  # None: none; k: the chosen token's and the top k's
    constraint: Constraint | None = None  # what the output must match (structured_output/)

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise ValueError("temperature must be >= 0")
        if not 0 < self.top_p <= 1:
            raise ValueError("top_p must be in (0, 1]")
        if self.top_k < 0:
            raise ValueError("top_k must be >= 0")
        if self.max_tokens < 1:
            raise ValueError("max_tokens must be >= 1")
        if self.repetition_penalty <= 0:
            raise ValueError("repetition_penalty must be > 0")
        if self.min_tokens < 0:
            raise ValueError("min_tokens must be >= 0")
        if self.logprobs is not None and self.logprobs < 0:
            raise ValueError("logprobs must be >= 0")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0 or self.top_k == 1

    @property
    def needs_history(self) -> bool:
        """Whether sampling reads the tokens so far (penalties, min_tokens)."""
        return (
            self.presence_penalty != 0
            or self.frequency_penalty != 0
            or self.repetition_penalty != 1
            or self.min_tokens > 0
        )

    @property
    def adjusts_logits(self) -> bool:
        return self.needs_history or bool(self.logit_bias)
