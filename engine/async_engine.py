"""AsyncEngine: asyncio streams over an LLMEngine whose step loop runs in its own thread.

Only the loop thread touches the LLMEngine. Other threads hand it adds and aborts through
a thread-safe queue and wake it with an event (it sleeps on that event when idle); it hands
each output back with loop.call_soon_threadsafe into the request's asyncio queue. If the
loop dies, every pending and future request gets EngineDeadError instead of hanging.
Prompts are tokenized before they reach the loop (long ones in a worker thread), so a long
prompt stalls neither the caller's event loop nor the other requests' steps.
"""

import asyncio
import contextlib
import functools
import logging
import queue
import threading
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from engine.config import EngineConfig
from engine.errors import EngineDeadError, RequestFailedError
from engine.llm_engine import LLMEngine
from engine.outputs import RequestOutput
from engine.sampling_params import SamplingParams
from engine.structured_output.compile_pool import CompilePool
from engine.structured_output.grammar import GrammarState
from engine.thread_choice import apply_in_this_thread

if TYPE_CHECKING:
    from engine.runner import ModelRunner

log = logging.getLogger(__name__)

# Shorter prompts are tokenized or templated on the caller's loop: a thread hop costs more.
_INLINE_CHARS = 2048
_INLINE_MESSAGES = 32  # the template's own work grows with the turns, not only the text

_Item = RequestOutput | BaseException


@dataclass
class _Stream:
    """Where one request's outputs go: an asyncio queue on the caller's event loop."""

    loop: asyncio.AbstractEventLoop
    queue: asyncio.Queue[_Item]

    def put(self, item: _Item) -> None:
        # RuntimeError: the caller's loop is closed, so nobody is listening any more.
        with contextlib.suppress(RuntimeError):
            self.loop.call_soon_threadsafe(self.queue.put_nowait, item)


@dataclass
class _Add:
    request_id: str
    prompt: str | list[int]
    params: SamplingParams
    cache_salt: str | None
    stream: _Stream
    grammar: GrammarState | None
    priority: int = 0


@dataclass
class _Abort:
    request_id: str


class AsyncEngine:
    def __init__(self, config: EngineConfig, runner: "ModelRunner | None" = None) -> None:
        self.engine = LLMEngine(config, runner)  # owned by the loop thread once started
        self._owns_runner = runner is None  # a runner passed in is the caller's to free
        self.tokenizer = self.engine.tokenizer
        self.max_model_len = self.engine.max_model_len
        self.model_name = self.engine.model_name
        self.metrics = self.engine.metrics
        self.compiles = CompilePool(self.engine.grammars)
        self._commands: queue.SimpleQueue[_Add | _Abort] = queue.SimpleQueue()
        self._wake = threading.Event()
        self._lock = threading.Lock()  # orders "submit a command" against "the loop died"
        self._streams: dict[str, _Stream] = {}  # loop thread only
        self._thread: threading.Thread | None = None
        self._stopping = False
        self._dead: str | None = None  # why the loop is gone
        self._dead_cause: BaseException | None = None

    # -- lifecycle --------------------------------------------------------------------------

    def start(self) -> None:
        with self._lock:
            if self._thread is not None or self._dead is not None:
                return
            self._thread = threading.Thread(target=self._run, name="engine-step-loop", daemon=True)
            self._thread.start()

    def shutdown(self, timeout: float = 10.0) -> None:
        """Stop the loop after its current step; pending requests get EngineDeadError."""
        self._stopping = True
        self._wake.set()
        self.compiles.shutdown()
        if self._thread is not None:
            self._thread.join(timeout)
        else:
            self._die("engine shut down", None)

    @property
    def is_running(self) -> bool:
        return self._thread is not None and self._dead is None

    # -- requests ---------------------------------------------------------------------------

    async def generate(
        self,
        prompt: str | list[int],
        params: SamplingParams,
        request_id: str,
        cache_salt: str | None = None,
        priority: int = 0,
    ) -> AsyncIterator[RequestOutput]:
        """Stream the request's output deltas; closing the stream early aborts the request.

        PromptTooLongError, QueueFullError, ValueError and EngineDeadError are raised before
        the first output. EngineDeadError is also raised mid-stream if the loop crashes, and
        RequestFailedError if this request failed inside a step (the others go on).
        """
        self.start()
        if isinstance(prompt, str):
            prompt = await self.encode(prompt)
        grammar = None
        if params.constraint is not None:  # compiled here, on its own pool: it takes a while
            grammar = await self.compiles.state_for(params.constraint)
        stream = _Stream(asyncio.get_running_loop(), asyncio.Queue())
        self._submit(_Add(request_id, prompt, params, cache_salt, stream, grammar, priority))
        finished = False
        try:
            while not finished:
                item = await stream.queue.get()
                if isinstance(item, BaseException):
                    finished = True  # rejected or the engine died: nothing to abort
                    raise item
                finished = item.finished
                yield item
        finally:
            if not finished:  # aclose(), break, cancellation: free the pages now
                self.abort(request_id)

    async def encode(self, text: str) -> list[int]:
        """Token ids of a prompt; PromptTooLongError without tokenizing when far too long."""
        self.engine.check_prompt_chars(len(text))
        if len(text) <= _INLINE_CHARS:
            return self.tokenizer.encode(text)
        return await asyncio.to_thread(self.tokenizer.encode, text)

    def check_room(self, num_prompt_tokens: int, max_tokens: int | None = None) -> None:
        """PromptTooLongError (CompletionTooLongError for max_tokens) when the context cannot
        hold the prompt and the requested completion; reads only the fixed context length."""
        self.engine.check_room(num_prompt_tokens, max_tokens)

    @property
    def carries_tools(self) -> bool:
        """Whether the model's chat template shows it the request's `tools`."""
        return getattr(self.tokenizer, "carries_tools", True)  # test tokenizers cannot tell

    async def apply_chat_template(
        self, messages: list[dict], tools: list[dict] | None, add_generation_prompt: bool = True
    ) -> str:
        """The prompt for chat messages (a long one rendered in a worker thread).

        PromptTooLongError, without rendering, when the messages are far beyond the context.
        """
        chars = sum(len(str(m.get("content") or "")) for m in messages)
        self.engine.check_prompt_chars(chars)
        render = functools.partial(
            self.tokenizer.apply_chat_template,
            messages,
            add_generation_prompt=add_generation_prompt,
            tools=tools,
        )
        if chars <= _INLINE_CHARS and len(messages) <= _INLINE_MESSAGES and not tools:
            return render()
        return await asyncio.to_thread(render)

    def abort(self, request_id: str) -> None:
        """Abort a request from any thread; a no-op if it already finished."""
        with contextlib.suppress(EngineDeadError):  # a dead engine holds no pages
            self._submit(_Abort(request_id))

    def _submit(self, command: _Add | _Abort) -> None:
        with self._lock:
            if self._dead is not None:
                raise self._dead_error()
            self._commands.put(command)
        self._wake.set()

    def _dead_error(self) -> EngineDeadError:
        err = EngineDeadError(self._dead or "engine is not running")
        err.__cause__ = self._dead_cause
        return err

    # -- the loop thread --------------------------------------------------------------------

    def _run(self) -> None:
        apply_in_this_thread(getattr(self.engine.runner, "threads", None))  # test runners: none
        try:
            while not self._stopping:
                if not self.engine.has_unfinished() and self._commands.empty():
                    self._wake.wait()  # idle: sleep until a command arrives
                self._wake.clear()  # commands are queued before set(), so none is missed
                self._drain_commands()
                if self.engine.has_unfinished() and not self._stopping:
                    for out in self.engine.step():
                        self._deliver(out)
        except BaseException as exc:
            log.exception("engine step loop crashed")
            self._die(f"engine step loop crashed: {exc!r}", exc)
        else:
            self._die("engine shut down", None)
        if self._owns_runner:
            self.engine.runner.release()

    def _queued_commands(self) -> Iterator[_Add | _Abort]:
        while True:
            try:
                yield self._commands.get_nowait()
            except queue.Empty:
                return

    def _drain_commands(self) -> None:
        for cmd in self._queued_commands():
            if isinstance(cmd, _Abort):
                self.engine.abort_request(cmd.request_id)  # its stream gets "abort" next step
                continue
            try:
                self.engine.add_request(
                    cmd.request_id,
                    cmd.prompt,
                    cmd.params,
                    cmd.cache_salt,
                    cmd.grammar,
                    cmd.priority,
                )
            except Exception as exc:  # a rejected request, not an engine failure
                cmd.stream.put(exc)
                continue
            self._streams[cmd.request_id] = cmd.stream

    def _deliver(self, out: RequestOutput) -> None:
        stream = self._streams.get(out.request_id)
        if stream is None:
            return
        if out.finished:
            del self._streams[out.request_id]
        stream.put(out if out.error is None else RequestFailedError(out.error))

    def _die(self, reason: str, cause: BaseException | None) -> None:
        with self._lock:  # after this, _submit refuses; commands already queued are failed here
            self._dead, self._dead_cause = reason, cause
        streams = list(self._streams.values())
        self._streams.clear()
        streams += [cmd.stream for cmd in self._queued_commands() if isinstance(cmd, _Add)]
        for stream in streams:
            stream.put(self._dead_error())
