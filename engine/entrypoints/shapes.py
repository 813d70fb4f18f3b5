"""OpenAI response objects for chat and text completions, whole or as SSE chunks, for both
servers (the engine's and the gateway's).

The two endpoints differ only in how an answer is dressed; a shape does the dressing so a
request flow is written once. A shape dresses one choice (`index`); the `n` choices of one
request share an id and time (`shapes(...)`). Logprobs (when the request asked) go in as
the engine's per-token entries. Tool calls are parsed out of the text when `tools` names
what an answer may call (`ChatCompletionRequest.callable_tools()`).

Two stream styles use the same pieces: the gateway's (`opening`, a `delta` per piece,
`finish`, `usage`: SSE bytes; `whole` for every choice) and the engine server's (a `chunk`
per engine output, the role on the first and the finish reason on the last). The gateway
holds one shape for all of a request's choices: its methods take the choice's `index` and
hand it to that choice's sibling shape (same head; its own tool calls and text offsets).
"""

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, Self

from engine.entrypoints.streaming import sse
from engine.logprob_shapes import chat_logprobs, completion_logprobs
from engine.outputs import TokenLogprobs
from engine.protocol import (
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
from engine.tool_calls import ToolCallStream, as_deltas, split_answer

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
    """One choice of a whole answer."""

    text: str
    reason: str  # the finish reason
    logprobs: Logprobs = None


class Shape(Protocol):
    """The gateway's stream: `index` is the choice (0..n-1) a chunk belongs to; every
    choice streams its own."""

    def opening(self, n: int = 1) -> bytes | None: ...
    def delta(self, text: str, logprobs: Logprobs = None, index: int = 0) -> bytes: ...
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

    def usage_chunk(self, usage: Usage) -> ChatCompletionChunk:
        return ChatCompletionChunk(**self.head.fields(), choices=[], usage=usage)

    def feed(self, text: str) -> str:
        """The text to send now: what may be a tool call is held for `end`."""
        return self._calls.feed(text) if self._calls is not None else text

    def end(self, reason: str | None) -> tuple[str | None, list[dict[str, Any]] | None, str | None]:
        """At the answer's end: the text held back, the tool calls, the finish reason."""
        if self._calls is None:
            return None, None, reason
        end = self._calls.finish()
        if not end.tool_calls:
            return end.content, None, reason
        return end.content, as_deltas(end.tool_calls), "tool_calls" if reason == "stop" else reason

    def choice(self, text: str, reason: str | None, logprobs: Logprobs = None) -> ChatChoice:
        shaped = None if logprobs is None else chat_logprobs(logprobs)
        content, calls, reason = split_answer(text, reason or "stop", self._tools)
        message = AssistantMessage(content=content, tool_calls=calls)
        return ChatChoice(index=self.index, message=message, finish_reason=reason, logprobs=shaped)

    def answer(self, choices: list[ChatChoice], usage: Usage) -> ChatCompletion:
        return ChatCompletion(**self.head.fields(), choices=choices, usage=usage)

    # ---- the gateway's stream
    def opening(self, n: int = 1) -> bytes | None:
        # OpenAI's first chunk of each choice names the role; clients that build the
        # message rely on it.
        role = DeltaMessage(role="assistant", content="")
        return b"".join(sse(self.at(i).chunk(role)) for i in range(n))

    def delta(self, text: str, logprobs: Logprobs = None, index: int = 0) -> bytes:
        shape = self.at(index)
        return sse(shape.chunk(DeltaMessage(content=shape.feed(text)), logprobs=logprobs))

    def finish(self, reason: str, index: int = 0) -> bytes:
        shape = self.at(index)
        held, tool_calls, reason = shape.end(reason)
        return sse(shape.chunk(DeltaMessage(content=held, tool_calls=tool_calls), reason))

    def usage(self, usage: Usage) -> bytes:
        return sse(self.usage_chunk(usage))

    def whole(self, choices: Sequence[Ended], usage: Usage) -> bytes:
        shaped = [self.at(i).choice(c.text, c.reason, c.logprobs) for i, c in enumerate(choices)]
        return self.answer(shaped, usage).model_dump_json().encode()


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

    def choice(self, text: str, reason: str | None, logprobs: Logprobs = None) -> CompletionChoice:
        shaped = None if logprobs is None else completion_logprobs(logprobs)
        return CompletionChoice(index=self.index, text=text, finish_reason=reason, logprobs=shaped)

    def answer(self, choices: list[CompletionChoice], usage: Usage) -> Completion:
        return Completion(**self.head.fields(), choices=choices, usage=usage)

    # ---- the gateway's stream
    def opening(self, n: int = 1) -> bytes | None:
        return None

    def delta(self, text: str, logprobs: Logprobs = None, index: int = 0) -> bytes:
        return sse(self.at(index).chunk(text, logprobs=logprobs))

    def finish(self, reason: str, index: int = 0) -> bytes:
        return sse(self.at(index).chunk("", reason))

    def usage(self, usage: Usage) -> bytes:
        return sse(self.usage_chunk(usage))

    def whole(self, choices: Sequence[Ended], usage: Usage) -> bytes:
        shaped = [self.at(i).choice(c.text, c.reason, c.logprobs) for i, c in enumerate(choices)]
        return self.answer(shaped, usage).model_dump_json().encode()


def chat_shapes(model: str, tools: Collection[str], n: int) -> list[ChatShape]:
    """One shape per choice of a request, all under one id."""
    first = ChatShape(model, tools)
    return [first.at(index) for index in range(n)]


def text_shapes(model: str, n: int) -> list[TextShape]:
    first = TextShape(model)
    return [first.at(index) for index in range(n)]
