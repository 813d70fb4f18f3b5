"""OpenAI API request and response models, shared by the engine server and the gateway.

Import-light on purpose (pydantic only): the gateway validates bodies with these models
without pulling in torch. Unknown request fields are kept (clients send vendor extras);
the fields we know are validated, so a bad value is a clear 400 rather than a silent default.
"""

import time
import uuid
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictInt,
    ValidationInfo,
    field_validator,
    model_serializer,
    model_validator,
)

from engine.entrypoints.openai.answer_fields import NamedToolChoice, ResponseFormat, Tool
from engine.entrypoints.openai.logprob_shapes import ChatLogprobs, CompletionLogprobs
from engine.sampling_params import SamplingParams
from engine.structured_output.constraints import constraint_of


class TextPart(BaseModel):
    type: Literal["text"]
    text: str


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")

    role: Literal["system", "user", "assistant", "tool", "developer"]
    content: str | list[TextPart] | None = None
    name: str | None = None
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: str | None = None

    def text(self) -> str:
        """The content as one string: text parts joined, "" when absent."""
        if isinstance(self.content, list):
            return "".join(part.text for part in self.content)
        return self.content or ""

    def template_dict(self) -> dict[str, Any]:
        """The shape chat templates expect: content a plain string, absent fields left out."""
        # "developer" is OpenAI's newer name for "system"; open models' templates predate it.
        role = "system" if self.role == "developer" else self.role
        out: dict[str, Any] = {"role": role, "content": self.text()}
        for key in ("name", "tool_calls", "tool_call_id"):
            if (value := getattr(self, key)) is not None:
                out[key] = value
        return out


class StreamOptions(BaseModel):
    include_usage: bool = False
    continuous_usage_stats: bool = False  # vLLM's: each chunk's usage so far


_INT32_MAX = 2**31 - 1
_INT64 = (-(2**63), 2**63 - 1)  # what torch.Generator.manual_seed takes, as in vLLM
MAX_STOP_SEQUENCES = 4  # OpenAI's bound
MAX_STOP_CHARS = 1000  # per stop string; longer ones only make every step hold more text
MAX_LOGPROBS = 20  # top alternatives per token, OpenAI's bound for chat (vLLM's default)
MAX_LOGIT_BIAS = 300  # entries; each is a scatter per step
MAX_STOP_TOKEN_IDS = 64
MAX_N = 16  # choices per request; on a local engine each is one engine request


class _SamplingRequest(BaseModel):
    """Fields chat and text completions share."""

    model_config = ConfigDict(extra="allow")

    model: str
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, gt=0, le=1)
    top_k: int | None = Field(default=None, ge=-1, le=_INT32_MAX)  # vLLM's; -1 or 0: off
    n: int | None = None
    max_tokens: int | None = Field(default=None, ge=1, le=_INT32_MAX)
    stop: str | list[str] | None = None
    seed: int | None = Field(default=None, ge=_INT64[0], le=_INT64[1])
    stream: bool = False
    stream_options: StreamOptions | None = None
    presence_penalty: float | None = Field(default=None, ge=-2, le=2)
    frequency_penalty: float | None = Field(default=None, ge=-2, le=2)
    logit_bias: dict[str, float] | None = None  # token id (as a string) -> -100..100
    user: str | None = None
    # vLLM extensions
    ignore_eos: bool = False  # used by benchmarks for fixed output lengths
    cache_salt: str | None = None  # different salts never share KV pages
    repetition_penalty: float | None = Field(default=None, gt=0, le=10)
    min_tokens: int | None = Field(default=None, ge=0, le=_INT32_MAX)
    stop_token_ids: list[Annotated[int, Field(ge=0, le=_INT32_MAX)]] | None = Field(
        default=None, max_length=MAX_STOP_TOKEN_IDS
    )

    echo: bool = False  # text completions only

    @field_validator("n")
    @classmethod
    def _choices(cls, n: int | None) -> int | None:
        if n is not None and not 1 <= n <= MAX_N:
            raise ValueError(f"n must be 1..{MAX_N}")
        return n

    @field_validator("echo")
    @classmethod
    def _unsupported(cls, value: Any, info: ValidationInfo) -> Any:
        # The default is accepted so clients that send it work; anything else is refused.
        if value:
            raise ValueError(f"{info.field_name} is not supported")
        return value

    @field_validator("logit_bias")
    @classmethod
    def _token_biases(cls, bias: dict[str, float] | None) -> dict[str, float] | None:
        if bias is None:
            return None
        if len(bias) > MAX_LOGIT_BIAS:
            raise ValueError(f"at most {MAX_LOGIT_BIAS} entries are allowed")
        for key, value in bias.items():
            if not (key.isascii() and key.isdigit()) or int(key) > _INT32_MAX:
                raise ValueError(f"keys must be token ids (got {key!r})")
            if not -100 <= value <= 100:
                raise ValueError(f"biases must be in [-100, 100] (got {value!r} for {key})")
        return bias

    @field_validator("stop")
    @classmethod
    def _bounded_stop(cls, stop: str | list[str] | None) -> str | list[str] | None:
        stops = [stop] if isinstance(stop, str) else stop or []
        if len(stops) > MAX_STOP_SEQUENCES:
            raise ValueError(f"at most {MAX_STOP_SEQUENCES} stop sequences are allowed")
        if any(len(s) > MAX_STOP_CHARS for s in stops):
            raise ValueError(f"a stop sequence may have at most {MAX_STOP_CHARS} characters")
        return stop

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)

    @model_validator(mode="after")
    def _min_below_max(self) -> "_SamplingRequest":
        most = getattr(self, "max_completion_tokens", None) or self.max_tokens
        if self.min_tokens and most is not None and self.min_tokens > most:
            raise ValueError(f"min_tokens ({self.min_tokens}) exceeds max_tokens ({most})")
        return self

    def logprobs_count(self) -> int | None:
        """How many alternatives each token's logprobs list; None when none are asked."""
        raise NotImplementedError

    def candidates(self) -> int:
        """How many answers are generated: `n`, or completions' `best_of` (>= n)."""
        return self.n or 1


class ChatCompletionRequest(_SamplingRequest):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1, le=_INT32_MAX)
    tools: list[Tool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = None
    response_format: ResponseFormat | None = None
    logprobs: StrictBool | None = None
    top_logprobs: int | None = Field(default=None, ge=0, le=MAX_LOGPROBS)
    # vLLM's: go on with the final (assistant) message instead of starting a new turn
    continue_final_message: bool = False
    add_generation_prompt: bool = True

    @field_validator("tool_choice")
    @classmethod
    def _declared_tool(cls, choice: Any, info: ValidationInfo) -> Any:
        tools = info.data.get("tools") or []
        if choice == "required" and not tools:
            raise ValueError("`required` needs at least one tool in `tools`")
        if isinstance(choice, NamedToolChoice):
            name = choice.function.name
            if name not in {tool.function.name for tool in tools}:
                raise ValueError(f"the function {name!r} is not one of `tools`")
        return choice

    @field_validator("top_logprobs")
    @classmethod
    def _needs_logprobs(cls, top: int | None, info: ValidationInfo) -> int | None:
        if top is not None and not info.data.get("logprobs"):
            raise ValueError("logprobs must be true when top_logprobs is set")
        return top

    def logprobs_count(self) -> int | None:
        return (self.top_logprobs or 0) if self.logprobs else None

    def callable_tools(self) -> set[str]:
        """Names of the tools the answer may call (none with `tool_choice: none`)."""
        if not self.tools or self.tool_choice == "none":
            return set()
        if isinstance(self.tool_choice, NamedToolChoice):
            return {self.tool_choice.function.name}
        return {tool.function.name for tool in self.tools}


class CompletionRequest(_SamplingRequest):
    prompt: str | list[int] | list[str]
    logprobs: StrictInt | None = Field(default=None, ge=0, le=MAX_LOGPROBS)
    best_of: int | None = None  # candidates generated; the n most likely are returned
    # An OpenAI field nothing here serves: its default passes, anything else is a 400
    suffix: str | None = None

    @field_validator("best_of")
    @classmethod
    def _enough_candidates(cls, best_of: int | None, info: ValidationInfo) -> int | None:
        if best_of is None:
            return None
        n = info.data.get("n") or 1
        if not n <= best_of <= MAX_N:
            raise ValueError(f"best_of must be n ({n})..{MAX_N}")
        if best_of > n and info.data.get("stream"):
            raise ValueError("best_of above n cannot be streamed")
        return best_of

    @field_validator("suffix")
    @classmethod
    def _only_defaults(cls, value: Any, info: ValidationInfo) -> Any:
        if value not in (None, ""):
            raise ValueError(f"{info.field_name} is not supported")
        return value

    def logprobs_count(self) -> int | None:
        return self.logprobs

    def candidates(self) -> int:
        return self.best_of or self.n or 1

    @field_validator("prompt")
    @classmethod
    def _one_prompt(cls, prompt: str | list[int] | list[str]) -> str | list[int]:
        if isinstance(prompt, str):
            return prompt
        if not prompt:
            raise ValueError("the prompt must not be empty")
        if isinstance(prompt[0], str):
            if len(prompt) != 1:
                raise ValueError("only one prompt per request is supported")
            return prompt[0]
        return prompt


def to_sampling_params(
    req: _SamplingRequest, default_max_tokens: int | None = None
) -> SamplingParams:
    """Engine sampling settings for a request; OpenAI's defaults where a field is absent."""
    max_tokens = getattr(req, "max_completion_tokens", None) or req.max_tokens
    if max_tokens is None:
        max_tokens = default_max_tokens or SamplingParams.max_tokens
    stop = [req.stop] if isinstance(req.stop, str) else list(req.stop or [])
    return SamplingParams(
        temperature=1.0 if req.temperature is None else req.temperature,
        top_p=1.0 if req.top_p is None else req.top_p,
        top_k=max(req.top_k or 0, 0),
        seed=req.seed,
        max_tokens=max_tokens,
        stop=stop,
        stop_token_ids=list(req.stop_token_ids or []),
        ignore_eos=req.ignore_eos,
        presence_penalty=req.presence_penalty or 0.0,
        frequency_penalty=req.frequency_penalty or 0.0,
        repetition_penalty=req.repetition_penalty or 1.0,
        logit_bias={int(k): v for k, v in (req.logit_bias or {}).items()},
        min_tokens=req.min_tokens or 0,
        logprobs=req.logprobs_count(),
        constraint=constraint_of(req) if isinstance(req, ChatCompletionRequest) else None,
    )


class PromptTokensDetails(BaseModel):
    cached_tokens: int = 0


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails | None = None

    @classmethod
    def of(cls, prompt_tokens: int, completion_tokens: int, cached_tokens: int = 0) -> "Usage":
        return cls(
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
            total_tokens=prompt_tokens + completion_tokens,
            prompt_tokens_details=PromptTokensDetails(cached_tokens=cached_tokens),
        )


FinishReason = Literal["stop", "length", "tool_calls", "content_filter", "abort"]


class _Choice(BaseModel):
    index: int = 0
    finish_reason: FinishReason | None = None
    logprobs: None = None


class _Response(BaseModel):
    id: str
    object: str  # each response type pins its own literal
    created: int = Field(default_factory=lambda: created_now())
    model: str
    usage: Usage | None = None  # in streams: only on the final chunk, if include_usage
    system_fingerprint: str | None = None


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str | None = None
    refusal: str | None = None  # OpenAI sends it, null unless the model refused
    tool_calls: list[dict[str, Any]] | None = None
    reasoning_content: str | None = None  # a reasoning model's (vLLM's name); absent if none

    @model_serializer(mode="wrap")
    def _drop_no_reasoning(self, handler: Any) -> dict[str, Any]:
        return {k: v for k, v in handler(self).items() if v is not None or k != "reasoning_content"}


class ChatChoice(_Choice):
    message: AssistantMessage
    logprobs: ChatLogprobs | None = None


class ChatCompletion(_Response):
    object: Literal["chat.completion"] = "chat.completion"
    choices: list[ChatChoice]


class DeltaMessage(BaseModel):
    role: Literal["assistant"] | None = None
    content: str | None = None
    refusal: str | None = None
    tool_calls: list[dict[str, Any]] | None = None
    reasoning_content: str | None = None

    @model_serializer(mode="wrap")
    def _drop_none(self, handler: Any) -> dict[str, Any]:
        # OpenAI sends only the keys that change, e.g. `"delta": {}` on the last chunk.
        return {k: v for k, v in handler(self).items() if v is not None}


class ChunkChoice(_Choice):
    delta: DeltaMessage
    logprobs: ChatLogprobs | None = None


class ChatCompletionChunk(_Response):
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    choices: list[ChunkChoice]


class CompletionChoice(_Choice):
    text: str
    logprobs: CompletionLogprobs | None = None


class Completion(_Response):
    """A text completion, and also each chunk of a streamed one (same object name)."""

    object: Literal["text_completion"] = "text_completion"
    choices: list[CompletionChoice]


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int = Field(default_factory=lambda: created_now())
    owned_by: str = "tiergate"
    max_model_len: int | None = None


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


def chat_completion_id() -> str:
    return f"chatcmpl-{uuid.uuid4().hex}"


def completion_id() -> str:
    return f"cmpl-{uuid.uuid4().hex}"


def created_now() -> int:
    return int(time.time())
