"""The cache's verifier: the lexical vetoes, then the cross-encoder pair model.

The rules (verifier.PairVerifier.decide: numbers, negation, opposites, names, scope words,
the same words) settle what they can; every other candidate goes to the pair model, whose
probability must reach the strictness' threshold (gateway/cache/pair_model.json, picked
on a dev part of the train split by `python -m training cache pair-model`). A lookup's
candidates are scored in one call, and concurrent lookups share forward passes
(pair_model.PairBatcher).

`score_pairs(queries, candidates)` is the public score: P(serve), vetoes included (0 for a
vetoed pair, 1 for the same words), what calibration and reports read.
"""

import asyncio
import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from gateway.cache.pair_model import PAIR_CONFIG, PairBatcher, PairModel
from gateway.cache.verifier import STRICTNESS, ModelReads, PairVerifier, Verdict

# Vetoes the pair model overrules: on the train split of the people's pairs the scope-word
# veto refused 36 should-hit pairs for 26 must-not ones, the question-word veto 11 for 9
# ("What causes earthquakes?" / "What is the cause of an earthquake?"); the others refuse
# several times more must-not pairs than should-hit ones and stay.
SOFT_VETOES = ("scope", "question word")


def decide(rules: PairVerifier, query: str, candidate: str) -> tuple[float, str] | None:
    """What the rules settle before the pair model: (0, veto), (1, "") or None."""
    decided = rules.decide(query, candidate)
    return None if decided is not None and decided[1] in SOFT_VETOES else decided


class CrossVerifier:
    def __init__(self, rules: PairVerifier, model: PairModel, thresholds: dict[str, float]):
        missing = set(STRICTNESS) - set(thresholds)
        if missing:
            raise ValueError(f"pair model thresholds missing {sorted(missing)}")
        self.rules = rules
        self.model = model
        self.thresholds = thresholds
        self._batcher: PairBatcher | None = None  # made on the event loop that uses it
        self._rules_thread = ThreadPoolExecutor(1, thread_name_prefix="cache-rules")

    @classmethod
    def load(cls, config: str | Path | None = None, model: str | Path | None = None):
        settings = json.loads(Path(config or PAIR_CONFIG).read_text())
        return cls(PairVerifier.load(), PairModel(model), settings["thresholds"])

    def score_pairs(self, queries: list[str], candidates: list[str]) -> list[float]:
        """P(the answer stored for candidates[i] answers queries[i]); blocking."""
        decided = [decide(self.rules, q, c) for q, c in zip(queries, candidates, strict=True)]
        open_rows = [i for i, d in enumerate(decided) if d is None]
        probs = self.model.score_pairs(
            [queries[i] for i in open_rows], [candidates[i] for i in open_rows]
        )
        out = [d[0] if d else 0.0 for d in decided]
        for i, p in zip(open_rows, probs, strict=True):
            out[i] = p
        return out

    def verify(
        self,
        query: str,
        candidate: str,
        cosine: float,
        strictness: str = "balanced",
        threshold: float | None = None,
        reads: ModelReads | None = None,
    ) -> Verdict:
        """One pair, blocking (the cosine is not read: the pair model reads the texts).
        `threshold`, when given, replaces the strictness's; `reads` is not limited here
        (the request path scores a lookup's candidates together: verify_many)."""
        t = self._threshold(strictness, threshold)
        decided = decide(self.rules, query, candidate)
        if decided is not None:
            return _verdict(decided, 0.0)
        (p,) = self.model.score_pairs([query], [candidate])
        return _verdict((p, ""), t)

    async def verify_many(
        self, query: str, candidates: list[str], strictness: str, threshold: float | None = None
    ) -> list[Verdict]:
        """A lookup's candidates at once: rules on their thread, the rest in one pass shared
        with concurrent lookups."""
        t = self._threshold(strictness, threshold)
        loop = asyncio.get_running_loop()
        decided = await loop.run_in_executor(
            self._rules_thread, lambda: [decide(self.rules, query, c) for c in candidates]
        )
        open_rows = [i for i, d in enumerate(decided) if d is None]
        if open_rows:
            if self._batcher is None:
                self._batcher = PairBatcher(self.model)
            probs = await self._batcher.score(
                [query] * len(open_rows), [candidates[i] for i in open_rows]
            )
            for i, p in zip(open_rows, probs, strict=True):
                decided[i] = (p, "")
        return [_verdict(d, t) for d in decided]

    def _threshold(self, strictness: str, threshold: float | None) -> float:
        if strictness not in self.thresholds:
            raise ValueError(f"strictness must be one of {', '.join(STRICTNESS)}")
        return self.thresholds[strictness] if threshold is None else threshold

    async def close(self) -> None:
        if self._batcher is not None:
            await self._batcher.close()
        self._rules_thread.shutdown(wait=False)


def _verdict(decided: tuple[float, str], threshold: float) -> Verdict:
    p, reason = decided
    if reason:
        return Verdict(False, p, reason)
    accept = p >= threshold
    return Verdict(accept, p, "ok" if accept else "low probability")
