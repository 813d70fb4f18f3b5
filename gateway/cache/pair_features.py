"""Compare two analysed questions: align their content words, apply the hard vetoes, and
compute the features the learned part of the verifier scores.

A veto is a difference that changes the answer whatever the cosine says: another number,
unit or date, a negation, an opposite, a swapped direction, another name, quoted term or
scope word, another letter case in a question about case. What no veto decides (synonyms
nobody listed, extra words of uncertain weight) is left to the classifier over these
features.
"""

import functools
import math
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass

from gateway.cache import lexicon as lx
from gateway.cache import names
from gateway.cache import question_words as qw
from gateway.cache.pair_text import PairText, WordStats, lemma_candidates

FEATURES = (
    "cosine",
    "unmatched_max",  # content words of one side the other lacks (the larger side)
    "unmatched_min",
    "weight_frac_max",  # share of a side's content weight (idf) left unmatched
    "weight_frac_min",
    "max_unmatched_idf",  # the rarest unmatched word: rare words carry the topic
    "substitution",  # both sides have unmatched words: one thing swapped for another
    "jaccard",
    "char_jaccard",
    "length_ratio",
    "log_content",
    "cosine_x_matched",
)
# Words that mark a direction, grouped where they say the same: "a dict to JSON" and "JSON
# into a dict" are one swap (people's pairs write both).
DIRECTIONAL = (("to", "into"), ("from",), ("than",))


@dataclass(frozen=True)
class Alignment:
    only_a: dict[str, str]  # content key -> word, in a but not b (typos forgiven)
    only_b: dict[str, str]
    shared: int


def within_one_edit(a: str, b: str) -> bool:
    """Damerau distance <= 1: one insertion, deletion, substitution or adjacent swap."""
    if a == b:
        return True
    if abs(len(a) - len(b)) > 1:
        return False
    if len(a) == len(b):
        diff = [i for i in range(len(a)) if a[i] != b[i]]
        if len(diff) == 1:
            return True
        i, j = diff[0], diff[-1]
        return len(diff) == 2 and j == i + 1 and a[i] == b[j] and a[j] == b[i]
    short, long = (a, b) if len(a) < len(b) else (b, a)
    i = next((k for k in range(len(short)) if short[k] != long[k]), len(short))
    return short[i:] == long[i + 1 :]


def _typo_of(word: str, other: PairText, stats: WordStats) -> bool:
    """A misspelling (an unknown word one edit away) or a split/joined form of a word."""
    for w in other.words:
        typo = not stats.known(word) or not stats.known(w)  # two real words: two meanings
        if typo and max(len(w), len(word)) >= 4 and within_one_edit(word, w):
            return True
    tokens = [t.lower for t in other.tokens]
    return any(tokens[i] + tokens[i + 1] == word for i in range(len(tokens) - 1))


def derived_name(word: str, text: PairText) -> bool:
    """`word` and a word of `text` are a name and its people or style (Brazil/Brazilians)."""
    for w in text.words:
        base, longer = (w, word) if len(w) < len(word) else (word, w)
        named = base in text.entities or longer in text.entities or base in names.GAZETTEER
        derived = longer.startswith(base) and longer[len(base) :] in names.DERIVED_NAME_SUFFIXES
        if named and derived and len(base) >= 4:
            return True
    return False


def acronym_in(word: str, text: PairText) -> bool:
    """`word` spells the initials of words in a row of `text` ("GDP", "gross domestic
    product"; "DOJ", "Department of Justice")."""
    if not 3 <= len(word) <= 6 or not word.isalpha():
        return False
    words = [t.lower for t in text.tokens]
    for run in (words, [w for w in words if w not in lx.STOPWORDS]):
        initials = "".join(w[0] for w in run)
        if word in initials:
            return True
    return False


def _forgiven(word: str, own: PairText, other: PairText, stats: WordStats) -> bool:
    """A typo, a name's derived form, or a name that is an acronym of the other's words."""
    if _typo_of(word, other, stats) or derived_name(word, other):
        return True
    return word in own.entities and acronym_in(word, other)


def align(a: PairText, b: PairText, stats: WordStats) -> Alignment:
    """Content words each side lacks, after synonyms (a function word's too), typos, a
    name's derived forms and acronyms."""
    keys_a, keys_b = set(a.content), set(b.content)
    only_a = {k: a.content[k] for k in keys_a - b.keys if not _forgiven(a.content[k], a, b, stats)}
    only_b = {k: b.content[k] for k in keys_b - a.keys if not _forgiven(b.content[k], b, a, stats)}
    return Alignment(only_a, only_b, len(keys_a & keys_b))


@functools.lru_cache(maxsize=65536)
def _opposite_forms(word: str) -> tuple[frozenset[tuple], frozenset[tuple]]:
    """The forms by which `word` can be one side of an opposite prefix or suffix pair:
    (as the first side, as the second). Two words are opposites by affix when one's first
    forms meet the other's second forms: a lookup per word instead of every word pair
    against every affix pair (the verifier's hottest loop before)."""
    first, second = set(), set()
    for i, (p, q) in enumerate(lx.OPPOSITE_PREFIXES):
        stem = word[len(p) :]
        if word.startswith(p) and len(stem) >= (3 if p else 4):  # not bug/debug
            first.add(("prefix", i, stem))
        if word.startswith(q):
            second.add(("prefix", i, word[len(q) :]))
    for i, (p, q) in enumerate(lx.OPPOSITE_SUFFIXES):
        if word.endswith(p):
            first.add(("suffix", i, word[: -len(p)]))
        if word.endswith(q):
            second.add(("suffix", i, word[: -len(q)]))
    return frozenset(first), frozenset(second)


def _opposite_by_affix(only_a: set[str], only_b: set[str]) -> bool:
    """Whether a word of `only_a` and one of `only_b` differ by an opposite affix pair."""
    forms_a = [_opposite_forms(w) for w in only_a]
    forms_b = [_opposite_forms(w) for w in only_b]
    first_a = frozenset().union(*(f for f, _ in forms_a))
    second_a = frozenset().union(*(s for _, s in forms_a))
    first_b = frozenset().union(*(f for f, _ in forms_b))
    second_b = frozenset().union(*(s for _, s in forms_b))
    return bool(first_a & second_b or first_b & second_a)


def _extra(a: PairText, b: PairText) -> set[str]:
    """Words a has more often than b ("minimum and minimum" vs "maximum and minimum")."""
    return set(Counter(t.lower for t in a.tokens) - Counter(t.lower for t in b.tokens))


def has_antonym(a: PairText, b: PairText) -> bool:
    only_a, only_b = _extra(a, b), _extra(b, a)
    forms_b = {c for y in only_b for c in lemma_candidates(y)}
    for x in only_a:
        for cx in lemma_candidates(x):
            if lx.ANTONYMS.get(cx, frozenset()) & forms_b:
                return True
    return _opposite_by_affix(only_a, only_b)


def _after(text: PairText, preps: tuple[str, ...]) -> set[str]:
    """The first content word after each of `preps` (an infinitive's "to" left out)."""
    words = [t.lower for t in text.tokens]
    found = set()
    for i, w in enumerate(words):
        if w not in preps or (w == "to" and i and words[i - 1] in qw.INFINITIVE_LEADS):
            continue
        nxt = next((v for v in words[i + 1 :] if v not in lx.STOPWORDS), None)
        if nxt:
            found.add(nxt)
    return found


def direction_swapped(a: PairText, b: PairText) -> bool:
    """ "Celsius to Fahrenheit" vs "Fahrenheit into Celsius": same words, other direction."""
    for preps in DIRECTIONAL:
        xa, xb = _after(a, preps), _after(b, preps)
        moved = xa ^ xb  # a swap moves words on both sides, a rewording only on one
        if xa - xb and xb - xa and all(w in a.words and w in b.words for w in moved):
            return True
    return False


def _quoted_missing(a: PairText, b: PairText, stats: WordStats) -> bool:
    """A quoted term of a that b lacks, word for word (a misspelling inside is forgiven)."""
    for term in a.quoted:
        if term in b.quoted or term in b.normalised:
            continue
        if not all(w in b.words or _typo_of(w, b, stats) for w in term.split()):
            return True
    return False


def _is_scope(word: str) -> bool:
    return any(c in lx.SCOPE_WORDS for c in lemma_candidates(word))


def _case_differs(a: PairText, b: PairText) -> bool:
    """A word both have, written in another case (where no sentence starts: a capital
    there says nothing)."""
    forms: dict[str, set[str]] = {}
    for t in a.tokens:
        if not t.initial:
            forms.setdefault(t.lower, set()).add(t.raw)
    return any(not t.initial and t.raw not in forms.get(t.lower, {t.raw}) for t in b.tokens)


def _asks_another_fact(qa: frozenset[str], qb: frozenset[str]) -> bool:
    """Each side asks a distinct question word the other does not (when vs who wrote it):
    a harder rule than "question word", which a model may overrule (nli, cross)."""
    distinct = qw.DISTINCT_QUESTION_WORDS
    return bool((qa - qb) & distinct and (qb - qa) & distinct)


def veto(a: PairText, b: PairText, al: Alignment, stats: WordStats) -> str | None:
    """Why the two cannot share an answer, or None when no hard rule says so."""
    return next(vetoes(a, b, al, stats), None)


def vetoes(a: PairText, b: PairText, al: Alignment, stats: WordStats) -> Iterator[str]:
    """Every rule that says the two cannot share an answer, in the order veto() checks."""
    if a.numbers != b.numbers:
        yield "numbers differ"
    if a.units and b.units and a.units != b.units:
        yield "units differ"  # one side alone ("a day" vs "daily") is left to the model
    if a.dates != b.dates:
        yield "dates differ"
    if _quoted_missing(a, b, stats) or _quoted_missing(b, a, stats):
        yield "quoted term"
    if (a.asks_case or b.asks_case) and (_case_differs(a, b) or _case_differs(b, a)):
        yield "letter case"
    if a.negations != b.negations:
        yield "negation"
    if has_antonym(a, b):
        yield "antonym"
    if direction_swapped(a, b):
        yield "direction"
    unmatched = set(al.only_a.values()) | set(al.only_b.values())
    if (a.entities | b.entities) & unmatched:
        yield "entity"
    if any(_is_scope(w) for w in unmatched):
        yield "scope"
    qa, qb = a.asks, b.asks
    if qa - qb and qb - qa and (qa ^ qb) & qw.DISTINCT_QUESTION_WORDS:
        yield "question word"
    if _asks_another_fact(qa, qb):
        yield "another fact"


def features(
    a: PairText, b: PairText, al: Alignment, cosine: float, stats: WordStats
) -> list[float]:
    def frac(text: PairText, unmatched: dict[str, str]) -> float:
        total = sum(stats.weight(w) for w in text.content.values())
        return sum(stats.weight(w) for w in unmatched.values()) / total if total else 0.0

    na, nb = len(al.only_a), len(al.only_b)
    fa, fb = frac(a, al.only_a), frac(b, al.only_b)
    unmatched = list(al.only_a.values()) + list(al.only_b.values())
    union = al.shared + na + nb
    tri_union = len(a.trigrams | b.trigrams)
    la, lb = len(a.content), len(b.content)
    return [
        cosine,
        float(min(max(na, nb), 5)),
        float(min(min(na, nb), 5)),
        max(fa, fb),
        min(fa, fb),
        max((stats.weight(w) for w in unmatched), default=0.0) / stats.max_idf,
        float(na > 0 and nb > 0),
        al.shared / union if union else 1.0,
        len(a.trigrams & b.trigrams) / tri_union if tri_union else 1.0,
        min(la, lb) / max(la, lb) if max(la, lb) else 1.0,
        math.log1p(la + lb),
        cosine * (1.0 - max(fa, fb)),
    ]
