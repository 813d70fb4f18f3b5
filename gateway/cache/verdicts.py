"""A lookup's candidates before its verifier: every candidate's verdict, never an exception.

A verifier that scores a lookup's candidates together (the pair model's `verify_many`)
gets them in one call; one that scores a pair at a time (`verify`) runs on the cache's
verify thread, off the event loop. A verifier that fails refuses: a miss, never a wrong hit.
"""

import asyncio
import logging
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from gateway.cache.verifier import Verdict

logger = logging.getLogger("tiergate.cache")


async def verdicts(
    verifier: Any,
    thread: ThreadPoolExecutor,
    query: str,
    candidates: list[tuple],
    strictness: str,
    threshold: float | None,
) -> list[Verdict | None]:
    """Each (hit, held) candidate's verdict, in order; None where no verifier is asked."""
    if verifier is None or strictness == "off" or not candidates:
        return [None] * len(candidates)
    many = getattr(verifier, "verify_many", None)
    try:
        if many is not None:
            return await many(
                query, [held.question for _, held in candidates], strictness, threshold
            )
        loop = asyncio.get_running_loop()
        return [
            await loop.run_in_executor(
                thread, verifier.verify, query, held.question, hit.similarity, strictness, threshold
            )
            for hit, held in candidates
        ]
    except Exception as exc:
        logger.exception("cache verifier failed")
        return [Verdict(False, 0.0, f"verifier_failed: {type(exc).__name__}")] * len(candidates)
