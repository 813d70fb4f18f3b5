"""A lookup's candidates before its verifier: each candidate's verdict, never an exception.

A verifier that scores a lookup's candidates together (the pair model's `verify_many`)
gets them in one call; one that scores a pair at a time (`verify`) runs on the cache's
verify thread, off the event loop, one candidate at a time, so that a lookup stops
verifying at the candidate it serves. A verifier that fails refuses: a miss, never a wrong
hit.

A lookup's model reads are limited (MODEL_READS_PER_LOOKUP): candidates that the vetoes or
the nli gate decide cost no read; past the limit, a candidate that needs one is refused.
"""

import asyncio
import logging
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from gateway.cache.verifier import ModelReads, Verdict

logger = logging.getLogger("tiergate.cache")
# On the gateway benchmark's reworded traffic (the people's train pairs' stored questions
# in one scope, their rewordings and edits asked; nli, balanced, floor 0.4, 3 candidates)
# the nli model read 1.25 pairs a lookup, 0.86 with one read. Of 1,597 lookups, 41 were
# served only with a read per candidate, mostly by a second or third candidate at a low
# cosine: read by hand, ~28 of them wrong ("What is iteration?" served "Can you explain
# recursion?", "Write an email accepting the job offer" one asking for a pay rise) and ~13
# right. Each pair read is one more chance of a wrong hit, so one read a lookup also keeps
# a lookup's wrong hits near a pair's calibrated rate (bench/cache_populated.py measures it
# on the held-out sets). 2026-12-06, Xeon, 2 cores.
MODEL_READS_PER_LOOKUP = 1


def _failed(exc: Exception) -> Verdict:
    logger.error("cache verifier failed", exc_info=exc)
    return Verdict(False, 0.0, f"verifier_failed: {type(exc).__name__}")


async def verdicts(
    verifier: Any,
    thread: ThreadPoolExecutor,
    query: str,
    candidates: list[tuple],
    strictness: str,
    threshold: float | None,
) -> AsyncIterator[Verdict | None]:
    """Each (hit, held) candidate's verdict, in order, computed as the caller asks for it;
    None where no verifier is asked. After a failure every later candidate is refused."""
    if verifier is None or strictness == "off":
        for _ in candidates:
            yield None
        return
    many = getattr(verifier, "verify_many", None)
    if many is not None and candidates:
        try:
            found = await many(
                query, [held.question for _, held in candidates], strictness, threshold
            )
        except Exception as exc:
            found = [_failed(exc)] * len(candidates)
        for verdict in found:
            yield verdict
        return
    loop = asyncio.get_running_loop()
    failure: Verdict | None = None
    reads = ModelReads(MODEL_READS_PER_LOOKUP)
    for hit, held in candidates:
        if failure is None:
            try:
                yield await loop.run_in_executor(
                    thread,
                    verifier.verify,
                    query,
                    held.question,
                    hit.similarity,
                    strictness,
                    threshold,
                    reads,
                )
                continue
            except Exception as exc:
                failure = _failed(exc)
        yield failure
