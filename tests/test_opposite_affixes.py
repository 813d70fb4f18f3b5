"""The opposite-affix check ("able"/"unable", "careful"/"careless") read per word
(pair_features._opposite_by_affix) decides as the word-pair-by-affix-pair loop it replaced,
kept here as the reference, on the lexicon's words with every affix put on and taken off
and on the vocabulary of the people's train pairs."""

import itertools
import random

from gateway.cache import lexicon as lx
from gateway.cache.pair_features import _opposite_by_affix
from training.artifacts import REAL_PAIRS
from training.cache.train_pair_model import load_rows


def opposite_reference(x: str, y: str) -> bool:
    for p, q in lx.OPPOSITE_PREFIXES:
        for u, v in ((x, y), (y, x)):
            stem = u[len(p) :]
            long_enough = len(stem) >= (3 if p else 4)
            if long_enough and u.startswith(p) and v.startswith(q) and stem == v[len(q) :]:
                return True
    return any(
        u.endswith(p) and v.endswith(q) and u[: -len(p)] == v[: -len(q)]
        for p, q in lx.OPPOSITE_SUFFIXES
        for u, v in ((x, y), (y, x))
    )


def vocabulary() -> list[str]:
    stems = {"able", "like", "courage", "code", "bug", "care", "fast", "use", "safe", "mount"}
    stems |= {w for r in load_rows(REAL_PAIRS)[:400] for w in r["a"].lower().split()}
    affixes = [a for pair in (*lx.OPPOSITE_PREFIXES, *lx.OPPOSITE_SUFFIXES) for a in pair]
    words = set(stems)
    for stem, affix in itertools.product(sorted(stems), affixes):
        words |= {affix + stem, stem + affix, stem.removeprefix(affix), stem.removesuffix(affix)}
    return sorted(w for w in words if w)


def test_per_word_forms_decide_as_every_pair_against_every_affix() -> None:
    words = vocabulary()
    rng = random.Random(7)
    opposites = 0
    for _ in range(4000):
        only_a = set(rng.sample(words, rng.randint(1, 4)))
        only_b = set(rng.sample(words, rng.randint(1, 4)))
        if rng.random() < 0.5:  # a word and the same word with an affix put on
            word = rng.choice(sorted(only_a))
            p, q = rng.choice((*lx.OPPOSITE_PREFIXES, *lx.OPPOSITE_SUFFIXES))
            only_b.add(rng.choice((p + word, q + word, word + p, word + q)))
        expected = any(opposite_reference(x, y) for x in only_a for y in only_b)
        assert _opposite_by_affix(only_a, only_b) == expected, (only_a, only_b)
        opposites += expected
    for x, y in (("able", "unable"), ("careful", "careless"), ("enable", "disable")):
        assert _opposite_by_affix({x}, {y}) and _opposite_by_affix({y}, {x})
        opposites += 1
    assert not _opposite_by_affix({"bug"}, {"debug"})  # a stem too short to be a word
    assert opposites > 200  # the sample met opposites, not only unrelated words
