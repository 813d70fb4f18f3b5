"""How the embedder cuts work into forward passes, and who runs the next one.

A forward pass costs memory in proportion to its padded tokens (rows x longest row): about
16 MB per 256-token row on all-MiniLM-L6-v2 under ONNX Runtime, so one pass over 2,048
such inputs wants ~32 GB. `plan_batches` sorts the texts by length and cuts them into
micro-batches of at most `max_batch_tokens` padded tokens, as text-embeddings-inference
does with its `max_batch_tokens`; sorting keeps the padding small.

`TurnLock` serialises the passes (one model, one thread of compute at a time) and lets the
request path (the cache lookup and the router, which a chat is waiting on) take the next
turn ahead of bulk work (/v1/embeddings, training the router's examples): a bulk request
then waits between its micro-batches, never the chat for the whole bulk request.
"""

import contextlib
import threading
from collections.abc import Iterator


def plan_batches(lengths: list[int], max_batch_tokens: int) -> list[list[int]]:
    """Indices of `lengths` in micro-batches, shortest texts first, each within
    `max_batch_tokens` padded tokens (a text longer than the budget goes alone)."""
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    batches: list[list[int]] = []
    current: list[int] = []
    for i in order:
        # Sorted ascending, so the newest text is the longest: it sets the padded width.
        if current and (len(current) + 1) * max(lengths[i], 1) > max_batch_tokens:
            batches.append(current)
            current = []
        current.append(i)
    if current:
        batches.append(current)
    return batches


class TurnLock:
    """A lock whose urgent waiters go before the others. No order is promised within
    either kind. Bulk work waits while any urgent work is queued: under chat traffic that
    keeps the embedder busy, bulk embeddings slow down rather than the chats."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._busy = False
        self._urgent_waiting = 0
        self.waiting = 0  # threads waiting for a turn, of either kind

    @contextlib.contextmanager
    def turn(self, urgent: bool) -> Iterator[None]:
        with self._cond:
            self._urgent_waiting += urgent
            self.waiting += 1
            try:
                while self._busy or (not urgent and self._urgent_waiting):
                    self._cond.wait()
            finally:
                self._urgent_waiting -= urgent
                self.waiting -= 1
            self._busy = True
        try:
            yield
        finally:
            with self._cond:
                self._busy = False
                self._cond.notify_all()
