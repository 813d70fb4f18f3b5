"""What the engine hands back to callers for each request, step by step."""

from dataclasses import dataclass


@dataclass
class Logprob:
    token_id: int
    token: str  # the token's text (a piece of a character shows as "\ufffd")
    token_bytes: bytes  # its exact bytes, so pieces of one character can be joined
    logprob: float


@dataclass
class TokenLogprobs:
    """One output token's log-probability and the top alternatives' (most likely first)."""

    chosen: Logprob
    top: list[Logprob]


@dataclass
class RequestOutput:
    request_id: str
    text: str  # new text since the previous output of this request (a delta)
    token_ids: list[int]  # new token ids since the previous output
    finished: bool
    finish_reason: str | None  # "stop" | "length" | "abort" | "error" once finished
    prompt_tokens: int
    completion_tokens: int  # total so far
    cached_tokens: int  # prompt tokens served from the prefix cache
    error: str | None = None  # why the engine failed this request (finish_reason "error")
    # one entry per new token but a final stop token, when the request asked for logprobs
    logprobs: list[TokenLogprobs] | None = None
