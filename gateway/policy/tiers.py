"""The policy's routing sections: deployments, tiers, routes and their rules, difficulty."""

from typing import Literal

from pydantic import (
    Field,
    create_model,
    field_validator,
    model_validator,
)

from gateway.policy.common import StrictModel, between_0_and_1, not_negative, positive
from gateway.policy.signal_names import SIGNAL_NAMES

Strictness = Literal["strict", "balanced", "lenient", "off"]  # "off": the floor alone decides


class RouteCacheSettings(StrictModel):
    """Per-route overrides under `routes.<name>.cache`; an unset key takes `cache.<key>`."""

    enabled: bool | None = None
    min_similarity: float | None = None  # cosine a candidate needs before the verifier sees it
    verifier: Strictness | None = None
    verifier_threshold: float | None = None  # the verifier's probability a candidate needs
    ttl_s: float | None = None

    _check_similarity = field_validator("min_similarity", "verifier_threshold")(between_0_and_1)
    _check_ttl = field_validator("ttl_s")(positive)


class Deployment(StrictModel):
    """A local engine (model names an `engines` entry or a bundled model) or a litellm model."""

    model: str
    api_base: str | None = None  # remote only: e.g. http://vllm:8000/v1
    api_key_env: str | None = None  # remote only: environment variable holding the key
    timeout_s: float | None = None  # overrides the tier's timeout for this deployment
    # remote only. auto: OpenAI-speaking providers (hosted_vllm/, openai/) are called
    # directly, the rest through litellm; litellm: always through litellm.
    client: Literal["auto", "litellm"] = "auto"
    # remote only: false when its model cannot take `tools` (requests offering them skip it;
    # a local engine's chat template tells for itself)
    tools: bool = True

    _check_timeout = field_validator("timeout_s")(positive)


class Price(StrictModel):
    input: float = 0.0  # USD per 1M prompt tokens
    output: float = 0.0  # USD per 1M completion tokens

    _check = field_validator("input", "output")(not_negative)


class Tier(StrictModel):
    deployments: list[Deployment] = Field(min_length=1)
    price: Price = Price()
    timeout_s: float = 60.0  # per attempt: whole answer, or first token of a stream
    retries: int = 1  # extra attempts per deployment on retryable errors
    backoff_s: float = 0.2  # first retry delay; doubles each retry
    cooldown_s: float = 30.0  # a deployment that exhausted its retries is skipped this long
    fallback: str | None = None  # tier tried when every deployment of this one failed
    # Several deployments (replicas): which goes first (docs/deploy.md, "Balancing replicas").
    balance: Literal["ordered", "round_robin", "least_outstanding", "prefix_affinity"] = "ordered"
    # prefix_affinity: requests in flight the replica holding a prefix may have above the
    # least loaded replica before the request goes to that one instead.
    affinity_slack: int = 8
    health_check_s: float = 0.0  # probe remote replicas' /health this often; 0: off

    _check_positive = field_validator("timeout_s")(positive)
    _check_not_negative = field_validator(
        "retries", "backoff_s", "cooldown_s", "affinity_slack", "health_check_s"
    )(not_negative)


class Rule(StrictModel):
    """Matches when every condition it sets holds; unset conditions match anything."""

    tier: str
    name: str | None = None  # how stats and x-tiergate-explain name it; default rules[i]
    min_score: float | None = None  # the difficulty score in [0, 1] (see `difficulty`)
    max_score: float | None = None
    # Prompt signals in [0, 1] by name (gateway/routing/signals.py: tokens, code, math,
    # multi_step, constraints, tools, depth, max_tokens).
    min_signals: dict[str, float] = {}
    max_signals: dict[str, float] = {}
    models: list[str] | None = None  # requested model names (a route's own name or an alias)
    headers: dict[str, str] = {}  # request header -> value ("*": present with any value)
    tools: bool | None = None  # the request offers tools
    min_prompt_tokens: int | None = None  # approximate: characters / 4, before tokenizing
    max_prompt_tokens: int | None = None
    min_chars: int | None = None
    max_chars: int | None = None
    contains_code: bool | None = None
    min_messages: int | None = None
    max_messages: int | None = None

    _check_score = field_validator("min_score", "max_score")(between_0_and_1)
    _check_counts = field_validator(
        "min_prompt_tokens",
        "max_prompt_tokens",
        "min_chars",
        "max_chars",
        "min_messages",
        "max_messages",
    )(not_negative)


class RouteLearnSettings(StrictModel):
    """`routes.<name>.learn`: an opt-in sample of the route's answered requests, kept in the
    cache's store for `tiergate router learn` (docs/routing.md, "Fitting to your tiers")."""

    sample_rate: float = 0.0  # share of answered requests kept (0..1); 0: none, the default
    max_samples: int = 1000  # most kept per tenant on this route; the oldest go first
    retention_days: float = 30.0  # a sample is dropped this long after its request

    _check_rate = field_validator("sample_rate")(between_0_and_1)
    _check_positive = field_validator("max_samples", "retention_days")(positive)

    @property
    def retention_s(self) -> float:
        return self.retention_days * 86400.0


class Route(StrictModel):
    rules: list[Rule] = []  # first match wins
    default: str  # tier when no rule matches
    cache: RouteCacheSettings = RouteCacheSettings()
    aliases: list[str] = []  # more model names that pick this route (e.g. "gpt-4o")
    # An answer whose deployment fails midway goes on on another one (docs/operations.md)
    resume_streams: bool = True
    learn: RouteLearnSettings = RouteLearnSettings()


class RouterLearningSettings(StrictModel):
    """`router_learning`: how `tiergate router learn` labels the sampled traffic."""

    # The judge comparing the small and the large answer. None: the first deployment of the
    # policy's most expensive tier (locally the largest model; a remote through litellm).
    judge: Deployment | None = None
    judge_price: Price = Price()  # USD per 1M tokens, counted against max_usd
    max_usd: float = 1.0  # spend cap of one run: answers fetched plus judge calls
    max_tokens: int = 256  # the answer fetched from the other tier, at most

    _check_usd = field_validator("max_usd")(not_negative)
    _check_tokens = field_validator("max_tokens")(positive)


class ExamplePrompt(StrictModel):
    prompt: str
    label: int | None = None  # 1: needs the larger tier, 0: the smaller one does well
    score: float | None = None  # or a graded target in [0, 1]

    _check_score = field_validator("score")(between_0_and_1)

    @model_validator(mode="after")
    def _one_target(self) -> "ExamplePrompt":
        if (self.label is None) == (self.score is None):
            raise ValueError("give exactly one of label (0 or 1) and score")
        if self.label not in (None, 0, 1):
            raise ValueError("label must be 0 or 1")
        return self

    @property
    def target(self) -> float:
        return float(self.label if self.label is not None else self.score)


class _LearnedWeights(StrictModel):
    classifier: float = 1.0
    neighbours: float = 0.0
    kernel: float = 0.0

    _check = field_validator("*")(not_negative)  # the signals' weights too (Blend below)


# Weights of the difficulty score: the trained classifier's probability, the mean target of
# the nearest examples, the kernel ridge prediction from the examples and each prompt signal
# (one field per SIGNAL_NAMES entry, 0 by default); the score is their weighted mean
# (weights are normalised).
Blend = create_model(
    "Blend",
    __base__=_LearnedWeights,
    __module__=__name__,
    **{name: (float, 0.0) for name in SIGNAL_NAMES},
)


class DifficultySettings(StrictModel):
    # JSONL files of {prompt, label} or {prompt, score} (paths relative to the policy file),
    # or examples written inline. The classifier is trained on them when the policy loads.
    examples: list[str | ExamplePrompt] = []
    blend: Blend = Blend()
    regularization: float = 1.0  # inverse L2 strength of the logistic regression (C)
    k_nearest: int = 5  # how many of the most similar examples `blend.neighbours` averages
    kernel_width: float = 0.5  # `blend.kernel`: exp((similarity - 1) / width) between prompts
    kernel_ridge: float = 0.3  # and its ridge (L2) strength
    # the similarity: (1 - this) x embedding cosine + this x word cosine (routing/lexical.py)
    kernel_lexical: float = 0.7
    # score against this many examples (the centres, by a hash of the prompt), fitted to all
    # of them: scoring and training memory grow with it, not with the examples; unset: all
    kernel_centres: int | None = None

    _check = field_validator(
        "regularization", "k_nearest", "kernel_width", "kernel_ridge", "kernel_centres"
    )(positive)
    _share = field_validator("kernel_lexical")(between_0_and_1)
