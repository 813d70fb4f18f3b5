"""What the engine hands back to callers for each request, step by step."""

from dataclasses import dataclass


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
