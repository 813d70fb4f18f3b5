"""Torch threads for the engine, chosen by measurement at start: one thread or all cores.

Which is faster depends on the model, the CPU and what else runs on the cores now: on a
quiet machine all cores win at batch sizes where a step is compute-bound; on a busy one a
step's barriers wait for a descheduled thread and one thread wins (bench/threads.py). So the
engine times a few real decode steps at each, interleaved so a neighbour's burst hits both,
and keeps the faster; all cores must win by more than MARGIN (a measurement's noise), since
one thread also leaves a core to the gateway beside it.
"""

import logging
import os
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

log = logging.getLogger(__name__)
MARGIN = 0.05  # all cores must be this much faster than one thread
ROUNDS = 4  # timed decode steps per candidate (after one untimed warm-up each)


@dataclass(frozen=True)
class ThreadChoice:
    threads: int
    how: str  # "configured" (--threads N), "measured", "one core", "no probe"
    step_ms: dict[int, float] = field(default_factory=dict)  # median decode step per candidate

    def info(self) -> dict[str, str]:
        """For the engine's kernel info (/metrics): the choice and why."""
        out = {"threads": str(self.threads), "threads_how": self.how}
        if self.step_ms:
            out["threads_step_ms"] = " ".join(f"{t}:{ms:.2f}" for t, ms in self.step_ms.items())
        return out


def apply_in_this_thread(choice: ThreadChoice | None) -> None:
    """OpenMP thread counts belong to the calling thread: the thread that steps the engine
    (AsyncEngine's loop) sets the choice made where the runner was built."""
    if choice is not None:
        torch.set_num_threads(choice.threads)


def usable_cores() -> int:
    """Cores this process may run on (taskset / cgroup cpusets count, not the host's)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def choose_threads(
    configured: int | None, probe: Callable[[], None] | None, rounds: int = ROUNDS
) -> ThreadChoice:
    """Set torch's intra-op threads: `configured` when given, else the faster of one thread
    and all cores at `probe` (one decode step), None when the engine cannot run one."""
    if configured:
        torch.set_num_threads(configured)
        return ThreadChoice(configured, "configured")
    cores = usable_cores()
    if cores == 1 or probe is None:
        torch.set_num_threads(1 if cores == 1 else cores)
        return ThreadChoice(torch.get_num_threads(), "one core" if cores == 1 else "no probe")
    step_ms = _time_candidates((1, cores), probe, rounds)
    best = cores if step_ms[cores] < (1 - MARGIN) * step_ms[1] else 1
    torch.set_num_threads(best)
    choice = ThreadChoice(best, "measured", step_ms)
    log.info("threads: %d (decode step ms by threads: %s)", best, choice.info()["threads_step_ms"])
    return choice


def _time_candidates(
    candidates: tuple[int, ...], probe: Callable[[], None], rounds: int
) -> dict[int, float]:
    """Median ms of `probe` per thread count; candidates alternate (and swap order each
    round) so drifting load falls on all of them alike. Round 0 starts each team, untimed."""
    seconds: dict[int, list[float]] = {c: [] for c in candidates}
    for r in range(rounds + 1):
        for c in candidates if r % 2 else candidates[::-1]:
            torch.set_num_threads(c)
            start = time.perf_counter()
            probe()
            if r:
                seconds[c].append(time.perf_counter() - start)
    return {c: round(1000 * statistics.median(s), 3) for c, s in seconds.items()}
