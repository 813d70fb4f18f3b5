"""What the cache keeps: an answer, and the entry that files it under a scope and a question."""

import re
from dataclasses import dataclass
from typing import Any

import numpy as np

# errors and cut streams are never stored; "tool_calls": a remote's calls, sent whole
STORABLE_FINISH_REASONS = ("stop", "length", "tool_calls")


@dataclass(frozen=True)
class CachedAnswer:
    """The answer as its tier gave it: a local model's calls are in `text` (the shape parses
    them again on a hit), a remote's in `tool_calls` (OpenAI's whole message calls)."""

    text: str
    finish_reason: str  # one of STORABLE_FINISH_REASONS, as the tier said it
    prompt_tokens: int
    completion_tokens: int
    tier: str
    model: str
    max_tokens: int | None  # the limit of the request that produced it (None: none)
    tool_calls: list[dict[str, Any]] | None = None
    refusal: str | None = None

    def serves(self, max_tokens: int | None) -> bool:
        return answer_serves(
            self.finish_reason, self.completion_tokens, self.max_tokens, max_tokens
        )


def answer_serves(
    finish_reason: str, completion_tokens: int, produced_under: int | None, wanted: int | None
) -> bool:
    """Whether an answer may serve a request limited to `wanted` tokens.

    An answer longer than the request allows would have been cut: it does not serve. An
    answer cut by its own limit does not serve a request that allows more, since the model
    would have gone on.
    """
    if wanted is not None and completion_tokens > wanted:
        return False
    if finish_reason == "length":
        cut_at = completion_tokens if produced_under is None else produced_under
        return wanted is not None and wanted <= cut_at
    return True


def facts_only(finish_reason: str, completion_tokens: int, max_tokens: int | None) -> CachedAnswer:
    """An answer without its text: all the in-memory tables need. Loading every entry at
    start reads these facts only; a hit reads the whole answer from the store."""
    return CachedAnswer("", finish_reason, 0, completion_tokens, "", "", max_tokens)


@dataclass(slots=True)
class Entry:
    """One stored question and answer; the vector is the question's embedding. Entries a
    store loads carry `facts_only` answers."""

    id: str
    scope: str
    tenant: str
    route: str
    question: str
    vector: np.ndarray  # float32, L2-normalised
    answer: CachedAnswer
    created_at: float  # unix time
    expires_at: float | None  # unix time; None: never


_SPACES = re.compile(r"\s+")


def normalise(text: str) -> str:
    """The exact-match form of a question: runs of spacing are one space, the ends go.

    Nothing else: an exact hit skips the verifier, and case, Unicode forms and punctuation
    can change the question ("2³" and "23" under NFKC, "Compute 10!" and "Compute 10").
    A text that differs in those is a semantic candidate, judged by the verifier's vetoes.
    """
    return _SPACES.sub(" ", text).strip()
