"""What every backend takes and gives: one validated OpenAI request in, pieces out.

A backend's `generate` is an async generator of `Piece`s, each of one choice (`index`,
0..n-1 for a request's `n`); a choice's last piece carries its finish reason, and the
answer's last piece the usage of all choices. A piece holds the answer's structure beside
its text, as a remote sent it: tool-call deltas (OpenAI's: id and name, then argument
fragments), refusal and reasoning text. A local model's calls come as text: the chat shape
parses them (engine/entrypoints/openai/shapes.py), for every source alike. Closing the generator
early aborts the request upstream (the engine frees its pages, an HTTP stream is closed).
"""

import math
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Protocol

from engine.entrypoints.openai.protocol import ChatCompletionRequest, CompletionRequest, Usage
from engine.entrypoints.openai.tool_calls import ToolCallDelta
from engine.outputs import TokenLogprobs

OpenAIRequest = ChatCompletionRequest | CompletionRequest
# The engines' scheduling priorities (lower first): batch lines fill idle capacity only.
INTERACTIVE, BATCH = 0, 1


@dataclass
class GenerationRequest:
    request_id: str
    body: OpenAIRequest
    tenant: str  # also the engine's cache salt: tenants never share KV pages
    priority: int = INTERACTIVE  # BATCH for a batch line (local engines schedule it last)
    # Prompt token ids by local engine, kept from the chain's checks so a call reuses them.
    prompts: dict[str, list[int]] = field(default_factory=dict, repr=False)

    @property
    def is_chat(self) -> bool:
        return isinstance(self.body, ChatCompletionRequest)


@dataclass
class Piece:
    text: str = ""  # new text since the previous piece
    finish_reason: str | None = None  # set on the last piece
    usage: Usage | None = None  # set on the last piece when the backend reports it
    logprobs: list[TokenLogprobs] | None = None  # the new tokens', when the request asked
    index: int = 0  # the choice this piece belongs to
    tool_calls: list[ToolCallDelta] | None = None  # a remote's structured calls
    refusal: str | None = None  # new refusal text
    reasoning: str | None = None  # new reasoning text (`reasoning_content`)

    @property
    def says(self) -> bool:
        """Whether it carries anything for the caller besides its finish reason and usage."""
        structure = self.tool_calls or self.refusal or self.reasoning
        return bool(self.text or self.logprobs or structure)


class BackendError(Exception):
    """A failed call, sorted by what may help.

    retry: the same deployment may succeed on a later attempt (timeouts, 5xx, 429).
    fallback: another deployment or tier may succeed; False means the request itself is
    at fault (400) and goes straight back to the caller.
    deployment_fault: the failure says the deployment is unwell whoever calls it (refused
    connection, overloaded, misconfigured), so it cools down for every tenant. Otherwise
    (timeouts, 5xx) the request may have caused it, and only its tenant skips the deployment.

    `message` reaches the caller: it names the deployment and what failed, never upstream
    bodies, exception texts, hosts or environment variables (those go to the log).
    """

    def __init__(
        self,
        status: int,
        message: str,
        retry: bool,
        fallback: bool,
        retry_after: float | None = None,
        deployment_fault: bool = False,
        code: str | None = None,  # OpenAI's error code for the caller, e.g. context_length_exceeded
        param: str | None = None,  # the request field at fault (400s), e.g. response_format
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.retry = retry
        self.fallback = fallback
        self.retry_after = sane_wait(retry_after)
        self.deployment_fault = deployment_fault
        self.code = code
        self.param = param


# OpenAI's code for a prompt (or max_tokens) the context cannot hold: the chain tries the
# next deployment, whose context may be larger, rather than answering the 400 at once.
CONTEXT_EXCEEDED = "context_length_exceeded"

MAX_RETRY_AFTER_S = 3600.0  # an upstream asking for more is capped, not obeyed for days


def sane_wait(seconds: float | None) -> float | None:
    """A wait fit for a header and a cooldown: 0..MAX_RETRY_AFTER_S; inf and nan: None."""
    if seconds is None or not math.isfinite(seconds):
        return None
    return min(max(seconds, 0.0), MAX_RETRY_AFTER_S)


def parse_retry_after(value: str | None) -> float | None:
    """Seconds from an upstream `Retry-After` (HTTP dates and garbage: None)."""
    try:
        return sane_wait(float(value)) if value is not None else None
    except ValueError:
        return None


class Backend(Protocol):
    name: str  # the model name reported in x-tiergate-model and the response's `model`

    def generate(self, request: GenerationRequest) -> AsyncIterator[Piece]: ...
