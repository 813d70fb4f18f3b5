"""Micro-batching for a model on its own thread: whatever callers submit within
`max_wait_s` (up to `batch_size` items) runs as one call of `run`, off the event loop.

The window opens only while requests come together (the last batch had more than one, or
some arrived while it ran): a lone request runs at once, where waiting would only add
`max_wait_s` to its latency (2 ms of a ~17 ms cache lookup).

The worker task is made on the event loop that submits first (again if that loop is gone);
a caller that was cancelled costs the batch nothing, and a batch that fails fails only its
own callers."""

import asyncio
import contextlib
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Generic, TypeVar

Item = TypeVar("Item")
Result = TypeVar("Result")


@dataclass
class _Pending(Generic[Item]):
    item: Item
    future: asyncio.Future


class MicroBatcher(Generic[Item, Result]):
    """`run(items) -> results` (one per item, in order) on `executor`'s thread, in batches."""

    def __init__(
        self,
        run: Callable[[list[Item]], Sequence[Result]],
        executor: ThreadPoolExecutor,
        batch_size: int,
        max_wait_s: float,
    ) -> None:
        self._call, self._executor = run, executor
        self.batch_size, self.max_wait_s = batch_size, max_wait_s
        self._queue: list[_Pending[Item]] = []
        self._worker: asyncio.Task | None = None
        self._wakeup: asyncio.Event | None = None
        self._company = False  # the last batch came with others: the next one waits
        self.waits = 0  # windows opened, so tests can see a lone request run at once

    async def submit(self, items: list[Item]) -> list[Result]:
        """The results of `items`, each batched with whatever others submit meanwhile."""
        loop = asyncio.get_running_loop()
        futures = [loop.create_future() for _ in items]
        self._queue += [_Pending(item, future) for item, future in zip(items, futures, strict=True)]
        if self._worker is None or self._worker.done():
            self._wakeup = asyncio.Event()
            self._worker = loop.create_task(self._run())
        assert self._wakeup is not None
        self._wakeup.set()
        return list(await asyncio.gather(*futures))

    async def _run(self) -> None:
        assert self._wakeup is not None
        loop = asyncio.get_running_loop()
        while True:
            await self._wakeup.wait()
            self._wakeup.clear()
            if not self._queue:
                continue
            if self._company and len(self._queue) < self.batch_size and self.max_wait_s > 0:
                self.waits += 1
                await asyncio.sleep(self.max_wait_s)  # let concurrent callers join
            batch, self._queue = self._queue[: self.batch_size], self._queue[self.batch_size :]
            live = [p for p in batch if not p.future.done()]  # cancelled callers need nothing
            if live:
                await self._run_batch(loop, live)
            self._company = len(batch) > 1 or bool(self._queue)
            if self._queue:
                self._wakeup.set()

    async def _run_batch(self, loop: asyncio.AbstractEventLoop, live: list[_Pending]) -> None:
        try:
            results = await loop.run_in_executor(self._executor, self._call, [p.item for p in live])
        except Exception as exc:  # one bad batch fails its callers, not the worker
            for p in live:
                if not p.future.done():
                    p.future.set_exception(exc)
            return
        for p, result in zip(live, results, strict=True):
            if not p.future.done():
                p.future.set_result(result)

    async def close(self) -> None:
        if self._worker is not None:
            self._worker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._worker
        self._executor.shutdown(wait=False, cancel_futures=True)
