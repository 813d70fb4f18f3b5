"""Where constraints compile: one thread of their own, each request waiting a bounded time.

A schema's compile holds a thread for up to seconds (and the meta-schema check holds the
GIL in bursts). On asyncio's default pool, next to prompt tokenizing and chat templating,
a few distinct schemas at once stalled every other request's start; here they queue behind
each other only. A cached constraint skips the queue. A request that leaves while its
compile still waits in the queue takes the compile with it, and so does one that waited
`timeout_s` for the pool (429); a compile that runs longer than `timeout_s` (400) finishes
anyway and is cached, as llguidance cannot be interrupted.
"""

import asyncio
import time
from concurrent.futures import ThreadPoolExecutor

from engine.errors import EngineDeadError, InvalidParamError, QueueFullError
from engine.structured_output.constraints import Constraint
from engine.structured_output.grammar import GrammarCompiler, GrammarState

# For the pool's thread, then for the compile itself: several times the slowest compile
# the size caps allow (~1.5 s on one laptop core).
COMPILE_TIMEOUT_S = 10.0


class CompilePool:
    def __init__(self, compiler: GrammarCompiler, timeout_s: float = COMPILE_TIMEOUT_S) -> None:
        self.compiler = compiler
        self.timeout_s = timeout_s
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="grammar-compile")

    async def state_for(self, constraint: Constraint) -> GrammarState:
        """A fresh matcher; InvalidParamError for a bad schema or one whose compile runs past
        the timeout, QueueFullError when others' compiles kept it waiting that long."""
        if (state := self.compiler.cached_state(constraint)) is not None:
            return state
        started: list[float] = []  # when the pool's thread took it up

        def compile_one() -> GrammarState:
            started.append(time.monotonic())
            return self.compiler.state_for(constraint)

        try:
            job = asyncio.wrap_future(self._pool.submit(compile_one))
        except RuntimeError:  # shut down with its engine
            raise EngineDeadError("engine shut down") from None
        try:
            # shielded: a timeout decides below; a request that leaves cancels the job
            return await asyncio.wait_for(asyncio.shield(job), self.timeout_s)
        except TimeoutError:
            if not started:
                job.cancel()
                raise QueueFullError("the engine is busy compiling other schemas") from None
            try:  # its own compile gets the whole timeout, however long it queued
                left = started[0] + self.timeout_s - time.monotonic()
                return await asyncio.wait_for(asyncio.shield(job), max(left, 0.0))
            except TimeoutError:
                param = _param(constraint)
                message = f"{param}: the schema did not compile within {self.timeout_s:g} s"
                raise InvalidParamError(param, message) from None
        finally:
            if not job.done():
                job.cancel()  # the request left: a queued compile goes with it

    def shutdown(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


def _param(constraint: Constraint) -> str:
    source = getattr(constraint, "source", None)
    return source.param if source is not None else "tools"
