"""Traffic of reworded questions for a cached gateway (bench/gateway_overhead.py): the train
pairs' stored questions go in first, then the measured requests ask their rewordings and
must-not edits, so nearly every request has a close neighbour for the verifier to read."""

import asyncio
import json

import aiohttp

from training.artifacts import REAL_PAIRS


def reworded_pairs() -> tuple[list[str], list[str]]:
    """The train pairs' stored questions and, in the same order, the questions asked."""
    rows = [json.loads(line) for line in REAL_PAIRS.read_text().splitlines() if line.strip()]
    rows = [r for r in rows if r["split"] == "train" and r["a"] != r["b"]]
    return [r["b"] for r in rows], [r["a"] for r in rows]


async def store_first(
    session: aiohttp.ClientSession, url: str, model: str, questions: list[str], workers: int
) -> None:
    """Ask each question once (`workers` at a time), so the measured requests find them
    stored; `url` ends in /v1."""
    queue = iter(questions)

    async def worker() -> None:
        for text in queue:
            messages = [{"role": "user", "content": text}]
            req = {"model": model, "messages": messages, "max_tokens": 32}
            async with session.post(f"{url}/chat/completions", json=req) as r:
                if r.status != 200:
                    raise RuntimeError(f"{url}: HTTP {r.status}: {await r.text()}")

    await asyncio.gather(*(worker() for _ in range(workers)))
