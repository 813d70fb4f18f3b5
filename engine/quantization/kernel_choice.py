"""Kernel choice by measurement: where two paths compete for one matmul shape, time each
briefly once per machine and keep the winner.

Which path is faster moves between CPUs (our panel GEMM beat oneDNN by ~20% at decode
batches on one AMD EPYC and lost 241 vs 288 GFLOP/s on an Intel Xeon), so no rule of
thumb holds everywhere. A decision is keyed by what was compared and the shape class, and
kept in one JSON file per CPU (model name, flags, torch version) in the cache folder: a
restart reads it back and measures nothing. Callers keep the decisions they used (the
ops object of a runner), for the start-up log and the kernel-info gauge on /metrics.
"""

import functools
import hashlib
import json
import logging
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import torch

from engine.cache_files import atomic_path, cache_dir
from engine.native import cpu_signature

log = logging.getLogger(__name__)

_VERSION = "3"  # bump when the kernels compared change enough to void old decisions
_BUDGET_S = 0.02  # per candidate: calls are repeated until this much time has passed
_MAX_CALLS = 20
_lock = threading.Lock()


def choice_file() -> Path:
    """This CPU's decisions (same CPU, same torch: same file)."""
    key = f"{cpu_signature()}|{torch.__version__}|{_VERSION}"
    return cache_dir() / "kernel_choice" / f"{hashlib.sha256(key.encode()).hexdigest()[:16]}.json"


@functools.cache
def _read(path: Path) -> dict[str, dict]:
    try:
        found = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}  # none yet, or unreadable: measure again
    return found if isinstance(found, dict) else {}


def choice_key(kind: str, shape: tuple[int, ...]) -> str:
    return f"{kind}:{'x'.join(map(str, shape))}"


def _stored() -> dict[str, dict]:
    """This CPU's decisions, read once per file (TIERGATE_CACHE_DIR may move it)."""
    return _read(choice_file())


def seconds_per_call(fn: Callable[[], object]) -> float:
    """The fastest of a few calls after one warm-up: the least disturbed by neighbours."""
    fn()
    best, spent, calls = float("inf"), 0.0, 0
    while calls < 3 or (spent < _BUDGET_S and calls < _MAX_CALLS):
        t0 = time.perf_counter()
        fn()
        took = time.perf_counter() - t0
        best, spent, calls = min(best, took), spent + took, calls + 1
    return best


def known(kind: str, shape: tuple[int, ...], names: Iterable[str]) -> str | None:
    """The stored winner among these candidate names, or None when it must be measured
    (never measured, or measured against other candidates: a path came or went)."""
    names = set(names)
    with _lock:
        stored = _stored().get(choice_key(kind, shape))
    stored = stored if isinstance(stored, dict) else {}
    same_field = set(stored.get("us", names)) == names
    return stored["winner"] if stored.get("winner") in names and same_field else None


def choose(
    kind: str,
    shape: tuple[int, ...],
    candidates: dict[str, Any],
    cost: Callable[[Any], float] = seconds_per_call,
) -> str:
    """The fastest candidate for `kind` at `shape` on this CPU: read from this CPU's
    decision file, or measured now (and stored). One candidate: it, unmeasured. cost:
    seconds a candidate takes (default: a call's, the candidate being a callable)."""
    key = choice_key(kind, shape)
    winner = known(kind, shape, candidates)
    if winner is not None:
        return winner
    with _lock:
        if len(candidates) == 1:
            return next(iter(candidates))
        timings = {name: cost(candidate) for name, candidate in candidates.items()}
        winner = min(timings, key=timings.__getitem__)
        micros = {n: round(t * 1e6, 1) for n, t in timings.items()}
        _stored()[key] = {"winner": winner, "us": micros}
        _save()
    log.info(
        "kernel choice %s: %s (%s)",
        key,
        winner,
        ", ".join(f"{n} {t * 1e6:.0f} us" for n, t in timings.items()),
    )
    return winner


def machine_figure(name: str, measure: Callable[[], float]) -> float:
    """A figure of this machine (a bandwidth, say) from this CPU's decision file, or
    measured now and stored there: measured once per machine like the decisions."""
    key = f"figure:{name}"
    with _lock:
        stored = _stored().get(key)
        if isinstance(stored, dict) and isinstance(stored.get("value"), (int, float)):
            return float(stored["value"])
        value = measure()
        _stored()[key] = {"value": value}
        _save()
    log.info("machine figure %s: %.4g", name, value)
    return value


def _save() -> None:
    """Write the decisions; a concurrent writer's may be lost (they are measured again)."""
    try:
        with atomic_path(choice_file()) as tmp:
            Path(tmp).write_text(json.dumps(_stored(), indent=1, sort_keys=True))
    except OSError as exc:
        log.warning("kernel choices not cached (%s): measured again next start", exc)
