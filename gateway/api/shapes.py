"""OpenAI response objects for chat and text completions, whole or as SSE chunks.

The two endpoints differ only in how an answer is dressed; a shape does the dressing so the
request flow in openai.py is written once. Logprobs (local engines, when the request asked)
go in as the engine's per-token entries: `delta` takes a piece's, `whole` all of them.
"""

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Protocol

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


def sse(data: str) -> bytes:
    return f"data: {data}\n\n".encode()


Logprobs = list[TokenLogprobs] | None


@dataclass
class Ended:
    """One choice of a whole answer."""

    text: str
    reason: str  # the finish reason
    logprobs: Logprobs = None


class Shape(Protocol):
    """`index` is the choice (0..n-1) a chunk belongs to; every choice streams its own."""

    def opening(self, n: int = 1) -> bytes | None: ...
    def delta(self, text: str, logprobs: Logprobs = None, index: int = 0) -> bytes: ...
    def finish(self, reason: str, index: int = 0) -> bytes: ...
    def usage(self, usage: Usage) -> bytes: ...
    def whole(self, choices: Sequence[Ended], usage: Usage) -> bytes: ...


class ChatShape:
    """`tools`: the names an answer may call (`ChatCompletionRequest.callable_tools()`, for
    local tiers): their calls are parsed out of the text into `tool_calls`."""

    def __init__(self, model: str, tools: Collection[str] = ()) -> None:
        self.id, self.created, self.model = chat_completion_id(), created_now(), model
        self._tools = tools
        self._calls: dict[int, ToolCallStream] = {}  # per choice, when tools may be called

    def _chunk(self, choices: list[ChunkChoice], usage: Usage | None = None) -> bytes:
        chunk = ChatCompletionChunk(
            id=self.id, created=self.created, model=self.model, choices=choices, usage=usage
        )
        return sse(chunk.model_dump_json())

    def _tool_calls(self, index: int) -> ToolCallStream | None:
        if not self._tools:
            return None
        return self._calls.setdefault(index, ToolCallStream(self._tools))

    def opening(self, n: int = 1) -> bytes | None:
        # OpenAI's first chunk of each choice names the role; clients that build the
        # message rely on it.
        role = DeltaMessage(role="assistant", content="")
        return b"".join(self._chunk([ChunkChoice(index=i, delta=role)]) for i in range(n))

    def delta(self, text: str, logprobs: Logprobs = None, index: int = 0) -> bytes:
        shaped = chat_logprobs(logprobs) if logprobs else None
        if (calls := self._tool_calls(index)) is not None:
            text = calls.feed(text)  # what may be a tool call is held for finish()
        delta = DeltaMessage(content=text)
        return self._chunk([ChunkChoice(index=index, delta=delta, logprobs=shaped)])

    def finish(self, reason: str, index: int = 0) -> bytes:
        delta = DeltaMessage()
        if (calls := self._tool_calls(index)) is not None:
            end = calls.finish()
            delta = DeltaMessage(content=end.content)
            if end.tool_calls:
                delta.tool_calls = as_deltas(end.tool_calls)
                reason = "tool_calls" if reason == "stop" else reason
        return self._chunk([ChunkChoice(index=index, delta=delta, finish_reason=reason)])

    def usage(self, usage: Usage) -> bytes:
        return self._chunk([], usage)

    def _choice(self, index: int, ended: Ended) -> ChatChoice:
        shaped = None if ended.logprobs is None else chat_logprobs(ended.logprobs)
        content, calls, reason = split_answer(ended.text, ended.reason, self._tools)
        message = AssistantMessage(content=content, tool_calls=calls)
        return ChatChoice(index=index, message=message, finish_reason=reason, logprobs=shaped)

    def whole(self, choices: Sequence[Ended], usage: Usage) -> bytes:
        answer = ChatCompletion(
            id=self.id,
            created=self.created,
            model=self.model,
            choices=[self._choice(i, c) for i, c in enumerate(choices)],
            usage=usage,
        )
        return answer.model_dump_json().encode()


class TextShape:
    def __init__(self, model: str) -> None:
        self.id, self.created, self.model = completion_id(), created_now(), model
        # per choice: characters of token text streamed, where its next text_offset starts
        self._sent: dict[int, int] = {}

    def _chunk(self, choices: list[CompletionChoice], usage: Usage | None = None) -> bytes:
        chunk = Completion(
            id=self.id, created=self.created, model=self.model, choices=choices, usage=usage
        )
        return sse(chunk.model_dump_json())

    def opening(self, n: int = 1) -> bytes | None:
        return None

    def delta(self, text: str, logprobs: Logprobs = None, index: int = 0) -> bytes:
        shaped = None
        if logprobs:
            sent = self._sent.get(index, 0)
            shaped = completion_logprobs(logprobs, sent)
            self._sent[index] = sent + sum(len(e.chosen.token) for e in logprobs)
        return self._chunk([CompletionChoice(index=index, text=text, logprobs=shaped)])

    def finish(self, reason: str, index: int = 0) -> bytes:
        return self._chunk([CompletionChoice(index=index, text="", finish_reason=reason)])

    def usage(self, usage: Usage) -> bytes:
        return self._chunk([], usage)

    def whole(self, choices: Sequence[Ended], usage: Usage) -> bytes:
        shaped = [
            CompletionChoice(
                index=i,
                text=c.text,
                finish_reason=c.reason,
                logprobs=None if c.logprobs is None else completion_logprobs(c.logprobs),
            )
            for i, c in enumerate(choices)
        ]
        answer = Completion(
            id=self.id, created=self.created, model=self.model, choices=shaped, usage=usage
        )
        return answer.model_dump_json().encode()
