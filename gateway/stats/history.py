"""A ring of periodic snapshots of the stats counters, so views can show windows.

A window (last minute, last hour) is the live counters minus the newest snapshot taken
before the window began; since-start is the live counters minus nothing. Counters only
grow, so a difference is exact to within one snapshot interval at the window's start.
"""

import asyncio
import time
from array import array
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from gateway.stats.counters import Labels, Samples

DEFAULT_INTERVAL_S = 5.0
KEEP_S = 3600.0  # the longest window that is not since-start


class Snapshot(Protocol):
    @property
    def at(self) -> float: ...  # unix time

    @property
    def samples(self) -> Samples: ...


@dataclass(frozen=True)
class Live:
    """Counters read now (or the zeros at start)."""

    at: float
    samples: Samples


class _Keys:
    """Every (sample name, labels) seen, numbered in order of first sight (append-only):
    a stored snapshot is then just an array of floats, 8 bytes a sample, instead of a
    dict of label tuples (an hour of snapshots would hold ~100 MB that way)."""

    def __init__(self) -> None:
        self.index: dict[tuple[str, Labels], int] = {}
        self.keys: list[tuple[str, Labels]] = []

    def pack(self, samples: Samples) -> array:
        for name, values in samples.items():
            for labels in values:
                if (name, labels) not in self.index:
                    self.index[name, labels] = len(self.keys)
                    self.keys.append((name, labels))
        packed = array("d", bytes(8 * len(self.keys)))
        for name, values in samples.items():
            for labels, value in values.items():
                packed[self.index[name, labels]] = value
        return packed

    def unpack(self, packed: array) -> Samples:
        out: Samples = {}
        for (name, labels), value in zip(self.keys, packed, strict=False):
            out.setdefault(name, {})[labels] = value
        return out


class _Stored:
    """A snapshot in the ring, unpacked on demand."""

    def __init__(self, at: float, packed: array, keys: _Keys) -> None:
        self.at, self._packed, self._keys = at, packed, keys

    @property
    def samples(self) -> Samples:
        return self._keys.unpack(self._packed)


def difference(new: Samples, old: Samples) -> Samples:
    """new - old per sample; a sample that went down was reset (an engine restarted, a
    reload replaced it) and counts from zero."""
    out: Samples = {}
    for name, values in new.items():
        before = old.get(name, {})
        out[name] = {
            labels: value - before.get(labels, 0.0) if value >= before.get(labels, 0.0) else value
            for labels, value in values.items()
        }
    return out


class StatsHistory:
    def __init__(
        self,
        read: Callable[[], Samples],
        interval_s: float = DEFAULT_INTERVAL_S,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._read, self.interval_s, self._clock = read, interval_s, clock
        self.started_at = clock()
        self._start = Live(self.started_at, {})  # every counter is zero at start
        self._keys = _Keys()
        # One more than an hour's worth: the window's baseline must predate the hour.
        ring: deque[Snapshot] = deque(maxlen=int(KEEP_S / interval_s) + 2)
        ring.append(self._start)
        self._ring = ring
        # What views derived from two stored snapshots never changes: computed once, kept
        # here (keyed by the older snapshot's time first) while that snapshot is kept.
        self.derived: dict[tuple, Any] = {}

    def take(self) -> None:
        self._ring.append(_Stored(self._clock(), self._keys.pack(self._read()), self._keys))
        oldest = self._ring[0].at
        for key in [k for k in self.derived if k[0] < oldest]:
            del self.derived[key]

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            self.take()

    def now(self) -> Live:
        return Live(self._clock(), self._read())

    def baseline(self, seconds: float | None, now: float) -> Snapshot:
        """The newest snapshot at or before `now - seconds`; the start for None, or when the
        gateway is younger than the window (then the window is since start)."""
        if seconds is None:
            return self._start
        since = now - seconds
        best = self._ring[0]
        for snapshot in self._ring:
            if snapshot.at > since:
                break
            best = snapshot
        return best

    def points(self, seconds: float, now: Snapshot) -> list[Snapshot]:
        """The snapshots of the last `seconds` (with one before them) and the live one."""
        since = now.at - seconds
        kept = [s for s in self._ring if s.at >= since]
        older = [s for s in self._ring if s.at < since]
        return [*older[-1:], *kept, now]
