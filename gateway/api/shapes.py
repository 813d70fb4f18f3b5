"""OpenAI response objects for chat and text completions, whole or as SSE chunks.

The two endpoints differ only in how an answer is dressed; a shape does the dressing so the
request flow in openai.py is written once. Logprobs (local engines, when the request asked)
go in as the engine's per-token entries: `delta` takes a piece's, `whole` all of them.
"""

from collections.abc import Collection
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


class Shape(Protocol):
    def opening(self) -> bytes | None: ...
    def delta(self, text: str, logprobs: Logprobs = None) -> bytes: ...
    def finish(self, reason: str) -> bytes: ...
    def usage(self, usage: Usage) -> bytes: ...
    def whole(self, text: str, reason: str, usage: Usage, logprobs: Logprobs = None) -> bytes: ...


class ChatShape:
    """`tools`: the names an answer may call (`ChatCompletionRequest.callable_tools()`, for
    local tiers): their calls are parsed out of the text into `tool_calls`."""

    def __init__(self, model: str, tools: Collection[str] = ()) -> None:
        self.id, self.created, self.model = chat_completion_id(), created_now(), model
        self._tools = tools
        self._calls = ToolCallStream(tools) if tools else None

    def _chunk(self, choices: list[ChunkChoice], usage: Usage | None = None) -> bytes:
        chunk = ChatCompletionChunk(
            id=self.id, created=self.created, model=self.model, choices=choices, usage=usage
        )
        return sse(chunk.model_dump_json())

    def opening(self) -> bytes | None:
        # OpenAI's first chunk names the role; clients that build the message rely on it.
        return self._chunk([ChunkChoice(delta=DeltaMessage(role="assistant", content=""))])

    def delta(self, text: str, logprobs: Logprobs = None) -> bytes:
        shaped = chat_logprobs(logprobs) if logprobs else None
        if self._calls is not None:
            text = self._calls.feed(text)  # what may be a tool call is held for finish()
        return self._chunk([ChunkChoice(delta=DeltaMessage(content=text), logprobs=shaped)])

    def finish(self, reason: str) -> bytes:
        delta = DeltaMessage()
        if self._calls is not None:
            end = self._calls.finish()
            delta = DeltaMessage(content=end.content)
            if end.tool_calls:
                delta.tool_calls = as_deltas(end.tool_calls)
                reason = "tool_calls" if reason == "stop" else reason
        return self._chunk([ChunkChoice(delta=delta, finish_reason=reason)])

    def usage(self, usage: Usage) -> bytes:
        return self._chunk([], usage)

    def whole(self, text: str, reason: str, usage: Usage, logprobs: Logprobs = None) -> bytes:
        shaped = None if logprobs is None else chat_logprobs(logprobs)
        content, calls, reason = split_answer(text, reason, self._tools)
        message = AssistantMessage(content=content, tool_calls=calls)
        choice = ChatChoice(message=message, finish_reason=reason, logprobs=shaped)
        answer = ChatCompletion(
            id=self.id, created=self.created, model=self.model, choices=[choice], usage=usage
        )
        return answer.model_dump_json().encode()


class TextShape:
    def __init__(self, model: str) -> None:
        self.id, self.created, self.model = completion_id(), created_now(), model
        self._sent = 0  # characters of token text streamed: where the next text_offset starts

    def _chunk(self, choices: list[CompletionChoice], usage: Usage | None = None) -> bytes:
        chunk = Completion(
            id=self.id, created=self.created, model=self.model, choices=choices, usage=usage
        )
        return sse(chunk.model_dump_json())

    def opening(self) -> bytes | None:
        return None

    def delta(self, text: str, logprobs: Logprobs = None) -> bytes:
        shaped = None
        if logprobs:
            shaped = completion_logprobs(logprobs, self._sent)
            self._sent += sum(len(e.chosen.token) for e in logprobs)
        return self._chunk([CompletionChoice(text=text, logprobs=shaped)])

    def finish(self, reason: str) -> bytes:
        return self._chunk([CompletionChoice(text="", finish_reason=reason)])

    def usage(self, usage: Usage) -> bytes:
        return self._chunk([], usage)

    def whole(self, text: str, reason: str, usage: Usage, logprobs: Logprobs = None) -> bytes:
        shaped = None if logprobs is None else completion_logprobs(logprobs)
        choice = CompletionChoice(text=text, finish_reason=reason, logprobs=shaped)
        answer = Completion(
            id=self.id, created=self.created, model=self.model, choices=[choice], usage=usage
        )
        return answer.model_dump_json().encode()
