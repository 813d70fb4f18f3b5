"""Where constraints compile: one thread of their own, each request waiting a bounded time.

A schema's compile holds a thread for up to seconds (and the meta-schema check holds the
GIL in bursts). On asyncio's default pool, next to prompt tokenizing and chat templating,
a few distinct schemas at once stalled every other request's start; here they queue behind
each other only. A cached constraint skips the queue. A request that leaves (or runs out
of `timeout_s`) while its compile still waits in the queue takes the compile with it; one
already running finishes and is cached, as llguidance cannot be interrupted.
"""

import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor

from engine.errors import EngineDeadError, InvalidParamError, QueueFullError
from engine.structured_output.constraints import Constraint
from engine.structured_output.grammar import GrammarCompiler, GrammarState

COMPILE_TIMEOUT_S = 10.0  # waiting for the pool, then compiling: several times the worst
# compile the size caps allow


class CompilePool:
    def __init__(self, compiler: GrammarCompiler, timeout_s: float = COMPILE_TIMEOUT_S) -> None:
        self.compiler = compiler
        self.timeout_s = timeout_s
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="grammar-compile")

    async def state_for(self, constraint: Constraint) -> GrammarState:
        """A fresh matcher; InvalidParamError for a bad schema or one that compiles for longer
        than the timeout, QueueFullError when other requests' compiles held it up instead."""
        if (state := self.compiler.cached_state(constraint)) is not None:
            return state
        started = threading.Event()

        def compile_one() -> GrammarState:
            started.set()
            return self.compiler.state_for(constraint)

        try:
            job = self._pool.submit(compile_one)
        except RuntimeError:  # shut down with its engine
            raise EngineDeadError("engine shut down") from None
        try:
            # wait_for cancels the job on timeout, and so does the request's cancellation
            return await asyncio.wait_for(asyncio.wrap_future(job), self.timeout_s)
        except TimeoutError:
            if not started.is_set():
                raise QueueFullError("the engine is busy compiling other schemas") from None
            param = _param(constraint)
            message = f"{param}: the schema did not compile within {self.timeout_s:g} s"
            raise InvalidParamError(param, message) from None

    def shutdown(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


def _param(constraint: Constraint) -> str:
    source = getattr(constraint, "source", None)
    return source.param if source is not None else "tools"
