"""Batches run in the background, line by line through the pipeline at batch priority.

Each line's result is stored as it ends, so a gateway that stops (or dies) loses only the
lines in flight: at the next start every batch not yet ended resumes from the lines without
a result. Lines in flight are bounded over all batches by `batch.max_concurrent` (read per
line, so a reload applies), which keeps a remote tier's slots for interactive traffic; on a
local engine the lines also run at the batch priority, behind every interactive request.

Statuses: validating -> in_progress -> finalizing -> completed; cancelling -> cancelled
(lines in flight finish, the rest are not run); past `expires_at`: expired; an input file
that is gone: failed. The output file holds the 2xx answers, the error file the rest.
"""

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import AsyncIterator, Callable

from fastapi import FastAPI, Request

from gateway.batch import objects
from gateway.batch.lines import Line, parse_lines
from gateway.batch.objects import ENDED, moved, new_id, not_run, succeeded
from gateway.batch.pipeline import run_line
from gateway.batch.store import BatchStore

logger = logging.getLogger("tiergate.batch")
RETRIED = (429, 500, 502, 503, 504)  # a limit or a failing tier: the line is tried again
MAX_BACKOFF_S = 30.0


class BatchRunner:
    def __init__(self, app: FastAPI) -> None:
        self._app = app
        self._index_lock = asyncio.Lock()
        self._locks: dict[str, asyncio.Lock] = {}  # batch id -> its record's updates
        self._tasks: dict[str, asyncio.Task] = {}
        self._cancelled: set[str] = set()
        self._in_flight = 0
        self._freed = asyncio.Condition()

    @staticmethod
    def of(request: Request) -> "BatchRunner":
        """The app's runner (the lifespan puts it there)."""
        return request.app.state.batches

    def store(self) -> BatchStore:
        """The records, on the cache store open now (a reload may open another)."""
        return BatchStore(self._app.state.gateway.cache, self._index_lock)

    def _settings(self):
        return self._app.state.gateway.runtime.policy.batch

    # -- lifecycle -----------------------------------------------------------------------

    async def resume(self) -> None:
        """Start every batch the store says has not ended (this gateway's restart)."""
        try:
            active = await self.store().active()
        except Exception as exc:  # no store, or it is down: nothing to resume now
            logger.warning("batches: nothing resumed: %s", exc)
            return
        for tenant, batch_id in active:
            self.start(tenant, batch_id)

    def start(self, tenant: str, batch_id: str) -> None:
        if batch_id in self._tasks:
            return
        task = asyncio.create_task(self._run(tenant, batch_id))
        self._tasks[batch_id] = task
        task.add_done_callback(lambda _: self._forget(batch_id))

    def _forget(self, batch_id: str) -> None:
        self._tasks.pop(batch_id, None)
        self._locks.pop(batch_id, None)
        self._cancelled.discard(batch_id)

    async def close(self) -> None:
        """Stop at once: lines in flight are aborted, and run again at the next start."""
        tasks = list(self._tasks.values())
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def cancel(self, tenant: str, batch_id: str) -> dict | None:
        """The batch, now cancelling (or as it was, if it has ended); None if not found."""

        def cancelling(batch: dict) -> dict:
            return batch if batch["status"] in ENDED else moved(batch, "cancelling")

        batch = await self._update(tenant, batch_id, cancelling)
        if batch is not None and batch["status"] == "cancelling":
            self._cancelled.add(batch_id)
            self.start(tenant, batch_id)  # a batch nobody runs here still ends as cancelled
        return batch

    # -- one batch -----------------------------------------------------------------------

    async def _update(self, tenant: str, batch_id: str, change: Callable[[dict], dict]):
        store = self.store()
        async with self._locks.setdefault(batch_id, asyncio.Lock()):
            batch = await store.batch(tenant, batch_id)
            if batch is None:
                return None
            batch = change(batch)
            await store.put_batch(tenant, batch)
            return batch

    async def _run(self, tenant: str, batch_id: str) -> None:
        try:
            await self._execute(tenant, batch_id)
        except asyncio.CancelledError:
            raise
        except Exception:  # left as it is: the next start resumes it
            logger.exception("batch %s stopped on an error", batch_id)

    async def _execute(self, tenant: str, batch_id: str) -> None:
        store = self.store()
        batch = await store.batch(tenant, batch_id)
        if batch is None or batch["status"] in ENDED:
            await store.ended(tenant, batch_id)
            return
        content = await store.file_content(tenant, batch["input_file_id"])
        if content is None:
            await self._fail(tenant, batch_id, "The input file is gone.")
            return
        lines = parse_lines(content)  # checked at upload
        if batch["status"] == "validating":
            batch = await self._update(tenant, batch_id, _started)
        if batch["status"] == "cancelling":
            self._cancelled.add(batch_id)
        results = await store.results(batch_id, len(lines))
        if batch["status"] == "in_progress":
            await self._run_lines(tenant, batch, lines, results)
        await self._finish(tenant, batch_id, lines, results)

    def _stopped(self, batch: dict) -> bool:
        return batch["id"] in self._cancelled or time.time() >= batch["expires_at"]

    async def _run_lines(
        self, tenant: str, batch: dict, lines: list[Line], results: dict[int, dict]
    ) -> None:
        todo = deque(i for i in range(len(lines)) if i not in results)
        store, batch_id = self.store(), batch["id"]

        async def worker() -> None:
            while todo and not self._stopped(batch):
                index = todo.popleft()
                async with self._slot():
                    if self._stopped(batch):  # cancelled while it waited for a place
                        return
                    result = await self._attempts(tenant, batch.get("_key_digest"), lines[index])
                if result is None:  # shutting down: the line runs again at the next start
                    return
                await store.put_result(batch_id, index, result)
                results[index] = result
                await self._update(tenant, batch_id, lambda b: _counted(b, results))

        workers = min(self._settings().max_concurrent, len(todo))
        await asyncio.gather(*(worker() for _ in range(workers)))

    @contextlib.asynccontextmanager
    async def _slot(self) -> AsyncIterator[None]:
        """One of `batch.max_concurrent` places, shared by every batch of this gateway."""
        async with self._freed:
            await self._freed.wait_for(lambda: self._in_flight < self._settings().max_concurrent)
            self._in_flight += 1
        try:
            yield
        finally:
            async with self._freed:
                self._in_flight -= 1
                self._freed.notify()

    async def _attempts(self, tenant: str, key_digest: str | None, line: Line) -> dict | None:
        """The line's result; None when a shutdown aborted it (nothing to store)."""
        attempts = self._settings().line_attempts
        for attempt in range(attempts):
            result = await run_line(self._app, tenant, key_digest, line, new_id("req"))
            if self._app.state.drain.expired:
                return None
            if result["response"]["status_code"] not in RETRIED or attempt == attempts - 1:
                return result
            await asyncio.sleep(min(MAX_BACKOFF_S, 0.5 * 2**attempt))
        raise AssertionError("unreachable")

    async def _fail(self, tenant: str, batch_id: str, message: str) -> None:
        error = {"code": "invalid_file", "message": message, "param": None, "line": None}
        errors = {"object": "list", "data": [error]}
        await self._update(tenant, batch_id, lambda b: moved(b, "failed") | {"errors": errors})
        await self.store().ended(tenant, batch_id)

    async def _finish(
        self, tenant: str, batch_id: str, lines: list[Line], results: dict[int, dict]
    ) -> None:
        """Write the output and error files, then end the batch in its final status."""
        store = self.store()
        batch = await store.batch(tenant, batch_id)
        if batch is None:
            return
        if batch_id in self._cancelled or batch["status"] == "cancelling":
            final, code = "cancelled", "batch_cancelled"
        elif len(results) < len(lines):
            final, code = "expired", "batch_expired"
        else:
            final, code = "completed", ""
            batch = await self._update(tenant, batch_id, lambda b: moved(b, "finalizing"))
        message = f"The batch was {final} before this request ran."
        ordered = [
            results.get(i) or not_run(line.custom_id, code, message) for i, line in enumerate(lines)
        ]
        output = [r for r in ordered if succeeded(r)]
        errors = [r for r in ordered if not succeeded(r)]
        files = {
            "output_file_id": await _write(store, tenant, batch_id, "output", output),
            "error_file_id": await _write(store, tenant, batch_id, "error", errors),
        }
        usage = objects.usage_of(output)

        def ended(b: dict) -> dict:
            return moved(_counted(b, results), final) | files | {"usage": usage}

        await self._update(tenant, batch_id, ended)
        await store.ended(tenant, batch_id)
        await store.drop_results(batch_id, len(lines))


def _started(batch: dict) -> dict:
    # A cancel may have come first: it stays cancelling.
    return moved(batch, "in_progress") if batch["status"] == "validating" else batch


def _counted(batch: dict, results: dict[int, dict]) -> dict:
    done = sum(1 for r in results.values() if succeeded(r))
    counts = batch["request_counts"] | {"completed": done, "failed": len(results) - done}
    return batch | {"request_counts": counts}


async def _write(
    store: BatchStore, tenant: str, batch_id: str, kind: str, results: list[dict]
) -> str | None:
    """A batch's output or error file (None when it would be empty, as OpenAI's)."""
    if not results:
        return None
    content = "".join(objects.jsonl_line(r) for r in results)
    meta = objects.file_object(f"{batch_id}_{kind}.jsonl", len(content.encode()), "batch_output")
    await store.put_file(tenant, meta, content)
    return meta["id"]
