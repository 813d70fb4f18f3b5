"""Prompt signals for the difficulty score, each in [0, 1], computed in one pass over words.

No regular expressions here: a split on whitespace and set look-ups keep the cost linear in
the prompt, whatever its shape (the code test reuses `PromptFeatures.contains_code`).
"""

import math
from dataclasses import make_dataclass

import numpy as np

from gateway.policy.signal_names import SIGNAL_NAMES
from gateway.routing.features import PromptFeatures

# Each signal saturates at a cap: beyond it "more" says nothing new about difficulty.
_TOKENS_CAP = 2048
_MAX_TOKENS_CAP = 4096
_DEPTH_CAP = 16
_MATH_CAP = 8
_STEPS_CAP = 6
_CONSTRAINTS_CAP = 4


def _words(text: str) -> frozenset[str]:
    return frozenset(text.split())


_MATH_WORDS = _words(
    "solve equation integral derivative prove proof compute calculate probability sum "
    "product matrix theorem factor remainder divisible percent average ratio sqrt log"
)
_MATH_SYMBOLS = frozenset("+-*/^=<>%")
_STEP_WORDS = _words(
    "then after afterwards next finally first second third also additionally step "
    "steps explain compare why"
)
_CONSTRAINT_WORDS = _words(
    "must exactly only without never always least most format json yaml words "
    "sentences limit strictly ensure"
)

NAMES = SIGNAL_NAMES


class _SignalViews:
    def vector(self) -> np.ndarray:
        return np.array([getattr(self, n) for n in NAMES], dtype=np.float32)

    def as_dict(self) -> dict[str, float]:
        return {n: getattr(self, n) for n in NAMES}


# One float field per signal name, in NAMES' order (the classifier's feature order).
Signals = make_dataclass("Signals", [(n, float) for n in NAMES], bases=(_SignalViews,), frozen=True)


def _saturating(count: float, cap: float) -> float:
    """log-scaled to [0, 1]: the first few occurrences count most."""
    return min(1.0, math.log1p(max(count, 0)) / math.log1p(cap))


def _word_counts(text: str) -> tuple[int, int, int, int]:
    """Math, multi-step and constraint markers, and questions, in one pass."""
    math_hits = steps = constraints = questions = 0
    for raw in text.split():
        word = raw.strip(".,;:!?()[]{}\"'").lower()
        if word in _MATH_WORDS or (len(raw) == 1 and raw in _MATH_SYMBOLS):
            math_hits += 1
        elif word[:1].isdigit() and any(c in _MATH_SYMBOLS for c in raw):
            math_hits += 1  # 3*4, 2^10, x=5: an expression written without spaces
        if word in _STEP_WORDS or (
            word[:-1].isdigit() and raw.endswith((".", ")")) and len(raw) <= 3
        ):
            steps += 1  # "1." / "2)" list items count as asks
        if word in _CONSTRAINT_WORDS:
            constraints += 1
        questions += raw.count("?")
    return math_hits, steps, constraints, questions


def compute_signals(
    features: PromptFeatures, tools: bool = False, max_tokens: int | None = None
) -> Signals:
    """The last user message carries the ask; the token count covers the whole prompt."""
    math_hits, steps, constraints, questions = _word_counts(features.last_user_text)
    return Signals(
        tokens=_saturating(features.approx_tokens, _TOKENS_CAP),
        code=1.0 if features.contains_code else 0.0,
        math=_saturating(math_hits, _MATH_CAP),
        multi_step=_saturating(steps + max(questions - 1, 0), _STEPS_CAP),
        constraints=_saturating(constraints, _CONSTRAINTS_CAP),
        tools=1.0 if tools else 0.0,
        depth=_saturating(max(features.messages - 1, 0), _DEPTH_CAP),
        max_tokens=0.0 if max_tokens is None else _saturating(max_tokens, _MAX_TOKENS_CAP),
    )
