"""A lookup's candidates before its verifier: each candidate's verdict, never an exception.

A verifier that scores a lookup's candidates together (the pair model's `verify_many`)
gets them in one call; one that scores a pair at a time (`verify`) runs on the cache's
verify thread, off the event loop, one candidate at a time, so that a lookup stops
verifying at the candidate it serves. A verifier that fails refuses: a miss, never a wrong
hit.

A lookup that meets one candidate at or above the floor is one pair: it is held to the
verifier's pair-by-pair threshold where the verifier has one (one_candidate_threshold).

A policy may limit a lookup's model reads (`cache.model_reads`): candidates that the vetoes
or the nli gate decide cost no read; past the limit, a candidate that needs one is refused.
"""

import asyncio
import logging
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Protocol

from gateway.cache.verifier import ModelReads, Verdict

logger = logging.getLogger("tiergate.cache")


class Verifier(Protocol):
    """What a cache asks of its verifier, one pair at a time."""

    def verify(
        self,
        query: str,
        candidate: str,
        cosine: float,
        strictness: str,
        threshold: float | None = None,
        reads: ModelReads | None = None,
    ) -> Verdict: ...


def one_candidate_threshold(verifier: Any, strictness: str) -> float | None:
    """The threshold a lookup that meets one candidate holds it to (cache
    `one_candidate_thresholds`); None where the verifier has none: its own then decides."""
    if verifier is None or strictness == "off":
        return None
    read = getattr(verifier, "one_candidate_threshold", None)
    return read(strictness) if read is not None else None


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
    model_reads: int | None = None,
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
    reads = ModelReads(model_reads) if model_reads is not None else None
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
