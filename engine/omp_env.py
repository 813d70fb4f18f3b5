"""OpenMP waiting defaults, set before torch loads libgomp (which reads them once, at load).

libgomp's default lets a thread that reaches a barrier spin for ~300,000 iterations before it
sleeps. On cores shared with other work (the gateway's embedder, another engine, a
neighbour's job) the spinning thread burns the core its descheduled sibling needs, and every
step's barriers stall: on a busy 2-core machine two threads ran slower than one
(docs/engine.md, "Threads"). PASSIVE makes waiting threads sleep at once; a short spin
(GOMP_SPINCOUNT) keeps a quiet machine's barriers from paying a futex wake-up every time.
Nothing here imports torch: the entry points call it first thing.
"""

import os
from collections.abc import MutableMapping

WAIT_POLICY = "PASSIVE"
SPIN_COUNT = "10000"  # ~0.1 ms of spinning before a waiting thread sleeps
USER_KNOBS = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")


def set_omp_defaults(env: MutableMapping[str, str] = os.environ) -> dict[str, str]:
    """Set OMP_WAIT_POLICY and GOMP_SPINCOUNT unless the user set either (then both stay
    as they are: a user's spin setting means they chose how threads wait). Returns what
    was set."""
    if any(k in env for k in USER_KNOBS):
        return {}
    chosen = {"OMP_WAIT_POLICY": WAIT_POLICY, "GOMP_SPINCOUNT": SPIN_COUNT}
    env.update(chosen)
    return chosen
