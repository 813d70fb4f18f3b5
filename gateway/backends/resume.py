"""Answers that survive a dying deployment: the same answer continued elsewhere.

When a deployment fails in the middle of an answer (its connection drops, its engine is
killed as a spot reclaim does, it stalls past the timeout), the chain opens a
continuation on another deployment of the tier or of its fallbacks: the prompt plus the
text already received, which that deployment goes on with. A chat continues the final
assistant message (vLLM's `continue_final_message`, which `tiergate engine` and the local
engines take too); a text completion's prompt simply gets the text appended. The caller
sees one answer: no text repeated, none missing, the usage of every attempt summed,
`max_tokens` counted across them, the finish reason the continuation's.

Only what can be continued exactly is: one choice, text (and logprobs) only so far, no
tools the model may call, no `response_format` (a grammar would start again from its
first state), no reasoning. Anything else ends as before, with an error (an SSE error
event in a stream). Greedy answers continue exactly as they would have gone on.
"""

import dataclasses
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass

from engine.entrypoints.openai.protocol import ChatCompletionRequest, Usage
from gateway.backends.base import BackendError, GenerationRequest, Piece

logger = logging.getLogger("tiergate.resume")


@dataclass
class Reopened:
    """A continuation that started: its pieces (the first already received), where."""

    pieces: AsyncIterator[Piece]
    tier: str
    key: str  # the deployment key, excluded from later continuations


Reopen = Callable[[GenerationRequest, frozenset[str]], Awaitable[Reopened]]
# (the tier first routed to, the tier that continued or "-", outcome: resumed / failed)
OnResume = Callable[[str, str, str], None]


def resumable(request: GenerationRequest) -> bool:
    """Whether an answer to this request could be continued exactly elsewhere."""
    body = request.body
    if body.candidates() > 1:
        return False
    if isinstance(body, ChatCompletionRequest):
        return not body.callable_tools() and body.response_format is None
    return isinstance(body.prompt, str)  # token ids cannot take the text on


def continuation(request: GenerationRequest, text: str, generated: int) -> GenerationRequest:
    """The request that goes on from `text` (`generated` tokens of it so far)."""
    body = request.body
    fields = body.model_dump(exclude_unset=True)
    for name in ("max_tokens", "max_completion_tokens"):
        if fields.get(name) is not None:
            fields[name] = fields[name] - generated
    if fields.get("min_tokens"):
        fields["min_tokens"] = max(0, fields["min_tokens"] - generated)
    if text and isinstance(body, ChatCompletionRequest):
        messages = fields["messages"]
        if body.continue_final_message:  # the caller's own prefix, and ours after it
            last = body.messages[-1]
            messages[-1] = {**messages[-1], "content": last.text() + text}
        else:
            messages.append({"role": "assistant", "content": text})
        fields |= {"continue_final_message": True, "add_generation_prompt": False}
    elif text:
        fields["prompt"] = body.prompt + text  # type: ignore[operator]
    again = type(body).model_validate(fields)
    # replace(): whatever else the request carries (its tenant, a priority) goes on with it
    again_id = f"{request.request_id}-r"
    return dataclasses.replace(request, request_id=again_id, body=again, prompts={})


def _plus(a: Usage, b: Usage) -> Usage:
    cached = (a.prompt_tokens_details.cached_tokens if a.prompt_tokens_details else 0) + (
        b.prompt_tokens_details.cached_tokens if b.prompt_tokens_details else 0
    )
    return Usage.of(
        a.prompt_tokens + b.prompt_tokens, a.completion_tokens + b.completion_tokens, cached
    )


class Resuming:
    """An answer's pieces; a mid-answer failure continues it on another deployment.

    Tokens per attempt come from the usage so far its pieces carry (a local engine, a
    vLLM-style server asked for `continuous_usage_stats`); a source that reports none is
    counted one token per piece of text, and its prompt as the continuation's less that.
    """

    def __init__(
        self,
        pieces: AsyncIterator[Piece],
        request: GenerationRequest,
        tier: str,
        key: str,
        reopen: Reopen,
        on_resume: OnResume,
    ) -> None:
        self._pieces, self._request, self._tier = pieces, request, tier
        self._reopen, self._on_resume = reopen, on_resume
        self._tried = frozenset({key})
        self._text: list[str] = []  # everything passed on so far
        self._spent = Usage.of(0, 0)  # by the attempts that failed
        self._guessed_prompts = 0  # failed attempts whose prompt tokens are unknown
        self._so_far: Usage | None = None  # the current attempt's, as it reported
        self._pieces_seen = 0  # the current attempt's pieces with text
        self._safe = True  # only text so far: a continuation can take it on
        self._finished = False
        self._resumes = 0

    def __aiter__(self) -> "Resuming":
        return self

    async def __anext__(self) -> Piece:
        while True:
            try:
                piece = await anext(self._pieces)
            except BackendError as exc:
                await self._resume(exc)
                continue
            return self._passed_on(piece)

    async def aclose(self) -> None:
        await self._pieces.aclose()

    def _passed_on(self, piece: Piece) -> Piece:
        if piece.tool_calls or piece.refusal or piece.reasoning or piece.index:
            self._safe = False
        if piece.text:
            self._text.append(piece.text)
            self._pieces_seen += 1
        self._so_far = piece.so_far or self._so_far
        self._finished = self._finished or piece.finish_reason is not None
        if piece.usage is not None and self._resumes:
            piece.usage = self._summed(piece.usage)
        return piece

    def _summed(self, usage: Usage) -> Usage:
        spent = self._spent
        if self._guessed_prompts:  # each failed attempt read about the original prompt
            original = max(0, usage.prompt_tokens - spent.completion_tokens)
            spent = _plus(spent, Usage.of(original * self._guessed_prompts, 0))
        return _plus(spent, usage)

    def _generated(self) -> int:
        """Completion tokens of every attempt so far, the current one included."""
        current = self._so_far.completion_tokens if self._so_far else self._pieces_seen
        return self._spent.completion_tokens + current

    async def _resume(self, failure: BackendError) -> None:
        """Continue on another deployment, or raise `failure` when that cannot be."""
        if failure.status < 500 or self._finished or not self._safe:
            raise failure
        generated = self._generated()
        text = "".join(self._text)
        try:
            again = continuation(self._request, text, generated)
        except ValueError:  # e.g. max_tokens all spent: nothing left to continue
            raise failure from None
        logger.warning("%s; continuing the answer elsewhere", failure.message)
        await self._pieces.aclose()  # the failed attempt's connection and bookkeeping
        try:
            reopened = await self._reopen(again, self._tried)
        except BackendError as exc:
            self._on_resume(self._tier, "-", "failed")
            message = f"{failure.message}; continuing elsewhere failed: {exc.message}"
            raise BackendError(failure.status, message, False, False) from None
        self._spent = _plus(self._spent, self._so_far or Usage.of(0, self._pieces_seen))
        self._guessed_prompts += self._so_far is None
        self._pieces, self._so_far, self._pieces_seen = reopened.pieces, None, 0
        self._tried |= {reopened.key}
        self._resumes += 1
        self._on_resume(self._tier, reopened.tier, "resumed")
