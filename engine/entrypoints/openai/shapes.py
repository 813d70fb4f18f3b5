"""OpenAI response objects for chat and text completions, whole or as SSE chunks, for both
servers (the engine's and the gateway's).

The two endpoints differ only in how an answer is dressed; a shape does the dressing so a
request flow is written once. A shape dresses one choice (`index`); the `n` choices of one
request share an id and time (`shapes(...)`). Logprobs (when the request asked) go in as
the engine's per-token entries. Tool calls are parsed out of the text when `tools` names
what an answer may call (`ChatCompletionRequest.callable_tools()`): one place for every
source, since a local model, a remote without a tool parser and a cache hit of either give
the calls as text; a remote's own `tool_calls` (and refusal, reasoning) pass through.

Two stream styles use the same pieces: the gateway's (`opening`, a `delta` per piece,
`finish`, `usage`: SSE bytes; `whole` for every choice) and the engine server's (a `chunk`
per engine output, the role on the first and the finish reason on the last). The gateway
holds one shape for all of a request's choices: its methods take the choice's `index` and
hand it to that choice's sibling shape (same head; its own tool calls and text offsets).
"""

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, Self

from engine.entrypoints.openai.logprob_shapes import chat_logprobs, completion_logprobs
from engine.entrypoints.openai.protocol import (
    AssistantMessage,
    ChatChoice,
    ChatCompletion,
    ChatCompletionChunk,
    ChunkChoice,
    Completion,
    CompletionChoice,
    DeltaMessage,
    Usage,
    chat_completion_id,
    completion_id,
    created_now,
)
from engine.entrypoints.openai.tool_calls import (
    ToolCallDelta,
    ToolCallStream,
    as_deltas,
    call_reason,
    split_answer,
)
from engine.entrypoints.streaming import sse
from engine.outputs import TokenLogprobs

Logprobs = list[TokenLogprobs] | None


@dataclass(frozen=True)
class Head:
    """What every object of one answer repeats."""

    id: str
    created: int
    model: str

    def fields(self) -> dict[str, Any]:
        return {"id": self.id, "created": self.created, "model": self.model}


@dataclass
class Ended:
    """One choice of a whole answer: the text, and the structure a remote sent beside it."""

    text: str
    reason: str  # the finish reason
    logprobs: Logprobs = None
    tool_calls: list[dict[str, Any]] | None = None  # whole calls (OpenAI's message shape)
    refusal: str | None = None
    reasoning: str | None = None


class Shape(Protocol):
    """The gateway's stream: `index` is the choice (0..n-1) a chunk belongs to; every
    choice streams its own. A delta's structure (tool-call deltas, refusal, reasoning) is
    chat's: text completions have none."""

    def opening(self, n: int = 1) -> bytes | None: ...
    def delta(
        self,
        text: str,
        logprobs: Logprobs = None,
        index: int = 0,
        tool_calls: list[ToolCallDelta] | None = None,
        refusal: str | None = None,
        reasoning: str | None = None,
    ) -> bytes: ...
    def finish(self, reason: str, index: int = 0) -> bytes: ...
    def usage(self, usage: Usage) -> bytes: ...
    def whole(self, choices: Sequence[Ended], usage: Usage) -> bytes: ...


class _ChoiceShape:
    """One choice's shape; the answer's other choices are siblings under the same head."""

    head: Head
    index: int
    _siblings: dict[int, Self]

    def _sibling(self, index: int) -> Self:
        raise NotImplementedError

    def at(self, index: int) -> Self:
        """Choice `index`'s shape, made when first asked."""
        if (shape := self._siblings.get(index)) is None:
            shape = self._sibling(index)
            shape._siblings = self._siblings
            self._siblings[index] = shape
        return shape

    @property
    def id(self) -> str:
        return self.head.id


class ChatShape(_ChoiceShape):
    def __init__(
        self, model: str, tools: Collection[str] = (), index: int = 0, head: Head | None = None
    ) -> None:
        self.head = head or Head(chat_completion_id(), created_now(), model)
        self.index = index
        self._tools = tools
        self._calls = ToolCallStream(tools) if tools else None
        self._sent_calls = False  # a remote's tool-call deltas went out
        self._siblings: dict[int, ChatShape] = {index: self}  # the choices, shared

    def _sibling(self, index: int) -> "ChatShape":
        return ChatShape(self.head.model, self._tools, index, self.head)

    # ---- pieces
    def chunk(
        self, delta: DeltaMessage, reason: str | None = None, logprobs: Logprobs = None
    ) -> ChatCompletionChunk:
        shaped = chat_logprobs(logprobs) if logprobs else None
        choice = ChunkChoice(index=self.index, delta=delta, finish_reason=reason, logprobs=shaped)
        return ChatCompletionChunk(**self.head.fields(), choices=[choice])

    def chunks(
        self,
        delta: DeltaMessage,
        reason: str | None = None,
        logprobs: Logprobs = None,
    ) -> list[ChatCompletionChunk]:
        """The delta as one chunk, or as one per round of its tool-call deltas: the openai
        SDK merges a call's deltas across chunks only, so no chunk holds two of one call
        (OpenAI sends the id and name in one chunk, the arguments in the next)."""
        rounds = _rounds(delta.tool_calls or [])
        if len(rounds) <= 1:
            return [self.chunk(delta, reason, logprobs)]
        first = delta.model_copy(update={"tool_calls": rounds[0]})
        out = [self.chunk(first, None, logprobs)]
        out += [self.chunk(DeltaMessage(tool_calls=r)) for r in rounds[1:-1]]
        return [*out, self.chunk(DeltaMessage(tool_calls=rounds[-1]), reason)]

    def usage_chunk(self, usage: Usage) -> ChatCompletionChunk:
        return ChatCompletionChunk(**self.head.fields(), choices=[], usage=usage)

    def feed(self, text: str) -> tuple[str, list[dict[str, Any]] | None]:
        """The text to send now and the tool-call deltas parsed out of it: what may be a
        tool call is held until it closes (or the answer ends)."""
        if self._calls is None:
            return text, None
        first = self._calls.calls
        shown, calls = self._calls.feed(text)
        return shown, _openai(as_deltas(calls, first)) if calls else None

    def end(self, reason: str | None) -> tuple[str | None, list[dict[str, Any]] | None, str | None]:
        """At the answer's end: the text held back, the tool calls, the finish reason."""
        if self._calls is None:
            return None, None, reason
        first = self._calls.calls
        end = self._calls.finish()
        deltas = _openai(as_deltas(end.tool_calls, first)) if end.tool_calls else None
        called = self._calls.calls > 0 or self._sent_calls
        return end.content, deltas, call_reason(reason, called) if reason else reason

    def choice(self, ended: Ended) -> ChatChoice:
        shaped = None if ended.logprobs is None else chat_logprobs(ended.logprobs)
        content, calls, reason = split_answer(ended.text, ended.reason or "stop", self._tools)
        calls = (ended.tool_calls or []) + (calls or []) or None
        if not ended.text and content == "" and (calls or ended.refusal):
            content = None  # OpenAI's null beside calls or a refusal
        message = AssistantMessage(
            content=content,
            refusal=ended.refusal,
            tool_calls=calls,
            reasoning_content=ended.reasoning,
        )
        return ChatChoice(index=self.index, message=message, finish_reason=reason, logprobs=shaped)

    def answer(self, choices: list[ChatChoice], usage: Usage) -> ChatCompletion:
        return ChatCompletion(**self.head.fields(), choices=choices, usage=usage)

    # ---- the gateway's stream
    def opening(self, n: int = 1) -> bytes | None:
        # OpenAI's first chunk of each choice names the role; clients that build the
        # message rely on it.
        role = DeltaMessage(role="assistant", content="")
        return b"".join(sse(self.at(i).chunk(role)) for i in range(n))

    def delta(
        self,
        text: str,
        logprobs: Logprobs = None,
        index: int = 0,
        tool_calls: list[ToolCallDelta] | None = None,
        refusal: str | None = None,
        reasoning: str | None = None,
    ) -> bytes:
        shape = self.at(index)
        shown, parsed = shape.feed(text)
        calls = (parsed or []) + _openai(tool_calls or []) or None
        shape._sent_calls = shape._sent_calls or bool(tool_calls)
        structured = calls is not None or refusal is not None or reasoning is not None
        delta = DeltaMessage(
            content=shown or (None if structured else ""),
            refusal=refusal,
            tool_calls=calls,
            reasoning_content=reasoning,
        )
        return b"".join(sse(c) for c in shape.chunks(delta, logprobs=logprobs))

    def finish(self, reason: str, index: int = 0) -> bytes:
        shape = self.at(index)
        held, tool_calls, reason = shape.end(reason)
        delta = DeltaMessage(content=held, tool_calls=tool_calls)
        return b"".join(sse(c) for c in shape.chunks(delta, reason))

    def usage(self, usage: Usage) -> bytes:
        return sse(self.usage_chunk(usage))

    def whole(self, choices: Sequence[Ended], usage: Usage) -> bytes:
        shaped = [self.at(i).choice(c) for i, c in enumerate(choices)]
        return self.answer(shaped, usage).model_dump_json().encode()


def _openai(deltas: list[ToolCallDelta]) -> list[dict[str, Any]]:
    return [d.openai() for d in deltas]


def _rounds(calls: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """Tool-call deltas in order, a new round wherever a call's index comes again."""
    rounds: list[list[dict[str, Any]]] = []
    for call in calls:
        if not rounds or any(c["index"] == call["index"] for c in rounds[-1]):
            rounds.append([])
        rounds[-1].append(call)
    return rounds


class TextShape(_ChoiceShape):
    def __init__(self, model: str, index: int = 0, head: Head | None = None) -> None:
        self.head = head or Head(completion_id(), created_now(), model)
        self.index = index
        self._sent = 0  # characters of token text streamed: where the next text_offset starts
        self._siblings: dict[int, TextShape] = {index: self}  # the choices, shared

    def _sibling(self, index: int) -> "TextShape":
        return TextShape(self.head.model, index, self.head)

    # ---- pieces
    def chunk(self, text: str, reason: str | None = None, logprobs: Logprobs = None) -> Completion:
        shaped = None
        if logprobs:
            shaped = completion_logprobs(logprobs, self._sent)
            self._sent += sum(len(e.chosen.token) for e in logprobs)
        choice = CompletionChoice(
            index=self.index, text=text, finish_reason=reason, logprobs=shaped
        )
        return Completion(**self.head.fields(), choices=[choice])

    def usage_chunk(self, usage: Usage) -> Completion:
        return Completion(**self.head.fields(), choices=[], usage=usage)

    def choice(self, ended: Ended) -> CompletionChoice:
        logprobs = ended.logprobs
        shaped = None if logprobs is None else completion_logprobs(logprobs)
        return CompletionChoice(
            index=self.index, text=ended.text, finish_reason=ended.reason, logprobs=shaped
        )

    def answer(self, choices: list[CompletionChoice], usage: Usage) -> Completion:
        return Completion(**self.head.fields(), choices=choices, usage=usage)

    # ---- the gateway's stream
    def opening(self, n: int = 1) -> bytes | None:
        return None

    def delta(self, text: str, logprobs: Logprobs = None, index: int = 0, **_: Any) -> bytes:
        return sse(self.at(index).chunk(text, logprobs=logprobs))

    def finish(self, reason: str, index: int = 0) -> bytes:
        return sse(self.at(index).chunk("", reason))

    def usage(self, usage: Usage) -> bytes:
        return sse(self.usage_chunk(usage))

    def whole(self, choices: Sequence[Ended], usage: Usage) -> bytes:
        shaped = [self.at(i).choice(c) for i, c in enumerate(choices)]
        return self.answer(shaped, usage).model_dump_json().encode()


def chat_shapes(model: str, tools: Collection[str], n: int) -> list[ChatShape]:
    """One shape per choice of a request, all under one id."""
    first = ChatShape(model, tools)
    return [first.at(index) for index in range(n)]


def text_shapes(model: str, n: int) -> list[TextShape]:
    first = TextShape(model)
    return [first.at(index) for index in range(n)]
