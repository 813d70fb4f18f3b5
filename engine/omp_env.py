"""OpenMP waiting defaults, set before torch loads libgomp (which reads them once, at load).

libgomp's default lets a thread that reaches a barrier spin for ~300,000 iterations before it
sleeps. On cores shared with other work (the gateway's embedder, another engine, a
neighbour's job) the spinning thread burns the core its descheduled sibling needs, and every
step's barriers stall. PASSIVE makes waiting threads sleep at once (spin count 0). A short
spin (GOMP_SPINCOUNT=10000) was measured beside it and lost on a busy 2-core machine: 2.2x
slower decode at two threads (bench/threads.py, docs/engine.md "Threads"), so none.
Nothing here imports torch: the entry points call it first thing.
"""

import os
from collections.abc import MutableMapping

WAIT_POLICY = "PASSIVE"
SPIN_COUNT = "0"  # PASSIVE's own default, written out so child processes and readers see it
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
