"""Server processes for the benchmarks, started with tests/servers.py's `session_process`:
wait until one answers, and read its CPU time and resident memory from /proc."""

import asyncio
import contextlib
import os
import time
from pathlib import Path

import aiohttp


async def wait_ready(url: str, deadline_s: float, headers: dict[str, str] | None = None) -> float:
    """Poll url until it answers 200; returns seconds waited. Raises after the deadline."""
    start = time.perf_counter()
    async with aiohttp.ClientSession() as session:
        while time.perf_counter() - start < deadline_s:
            with contextlib.suppress(aiohttp.ClientError, OSError, asyncio.TimeoutError):
                timeout = aiohttp.ClientTimeout(total=5)
                async with session.get(url, headers=headers, timeout=timeout) as resp:
                    if resp.status == 200:
                        return time.perf_counter() - start
            await asyncio.sleep(0.25)
    raise TimeoutError(f"{url} not ready after {deadline_s} s")


def tree_cpu_seconds(pid: int) -> float:
    """user+system CPU of pid and its descendants, from /proc (clock ticks)."""
    tick = os.sysconf("SC_CLK_TCK")
    children: dict[int, list[int]] = {}
    stats: dict[int, list[str]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            raw = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        fields = raw[raw.rindex(")") + 2 :].split()  # after "(comm)": state is field 3
        stats[int(entry)] = fields
        children.setdefault(int(fields[1]), []).append(int(entry))
    total, todo = 0.0, [pid]
    while todo:
        p = todo.pop()
        if p in stats:
            total += (int(stats[p][11]) + int(stats[p][12])) / tick  # utime, stime
        todo.extend(children.get(p, []))
    return total


class RssSampler:
    """Samples a process's resident set size (from /proc) every `interval_s` in a task."""

    def __init__(self, pid: int, interval_s: float = 0.5) -> None:
        self.pid, self.interval_s = pid, interval_s
        self.samples: list[tuple[float, int]] = []  # (monotonic time, bytes)
        self._task: asyncio.Task | None = None

    def rss(self) -> int:
        with open(f"/proc/{self.pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
        return 0

    async def _run(self) -> None:
        while True:
            with contextlib.suppress(OSError):
                self.samples.append((time.monotonic(), self.rss()))
            await asyncio.sleep(self.interval_s)

    def start(self) -> None:
        self._task = asyncio.create_task(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
