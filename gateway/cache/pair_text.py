"""One question taken apart for the pair verifier: tokens, content words, numbers, units,
dates, negations, quoted terms and names. Computed once per text (cached: a stored
question is compared with many queries) and compared in pair_features.
"""

import re
from collections import Counter
from dataclasses import dataclass, field
from functools import lru_cache

from gateway.cache import lexicon as lx
from gateway.cache import names
from gateway.cache import question_words as qw

WORD = re.compile(r"[A-Za-z][A-Za-z0-9+#]*|[0-9]+")
NUMBER = re.compile(r"\d+(?:[.,]\d+)*")
ORDINAL = re.compile(r"\b(\d+)(?:st|nd|rd|th)\b")
# "2³" is 2^3 (NFKC would make it 23); "10!" is a factorial ("10!=" a comparison).
SUPERSCRIPT = re.compile("[⁰¹²³⁴⁵⁶⁷⁸⁹]+")
SUPERSCRIPT_DIGITS = str.maketrans("⁰¹²³⁴⁵⁶⁷⁸⁹", "0123456789")
FACTORIAL = re.compile(r"(?<=\d)!(?!=)")
# An ask about letter case ("lowercase this: Hello World"): there, case is the question.
CASE_ASK = re.compile(
    r"\b(?:lower|upper|title|camel|snake|sentence)[ -]?case|\bcapitali[sz]|\ball caps\b"
    r"|\bcase[- ]?(?:sensitiv|insensitiv)",
    re.IGNORECASE,
)
# Maths between numbers or variables ("2+2" vs "2*2", "5x + 6" vs "5x - 6"): the operator
# is part of the question. A letter counts as a variable alone ("a + b") or after a
# coefficient ("5x"), so hyphenated words ("top-5", "covid-19") are not maths.
_CARDINAL = "(?:" + "|".join(lx.CARDINALS) + ")"
OPERATOR = re.compile(
    r"(?:(?<=\d)|(?<=\d[a-z])|(?<=\W[a-z])|(?<=^[a-z]))\s*([-−+*/x×÷^%=<>])\s*"
    rf"(?=\d|[a-z]\b|{_CARDINAL}\b)"
)
# Operators in words between numbers ("7 times 8", "x squared minus 5x"): the operator, so
# that "7 times 8" and "7 x 8" ask one thing.
_OPERAND = rf"(?:\d+[a-z]?|(?![ai]\b)[a-z]|{_CARDINAL})"  # not the article "a", nor "I"
OPERATOR_WORDS = tuple(
    (re.compile(rf"\b({_OPERAND})\s+{words}\s+(?={_OPERAND}\b)", re.IGNORECASE), op)
    for words, op in (
        ("plus", r"\1 + "),
        ("minus", r"\1 - "),
        ("(?:times|multiplied by)", r"\1 * "),
        ("(?:divided by|over)", r"\1 / "),
        ("equals", r"\1 = "),
    )
)
HYPHENATED_NUMBER = re.compile(rf"\b({_CARDINAL})-({_CARDINAL})\b", re.IGNORECASE)
# An operator after a number word ("two + two" once the words above are rewritten).
OPERATOR_AFTER_WORD = re.compile(rf"\b{_CARDINAL}\s*([-+*/=^])\s*(?=\d|{_CARDINAL}\b|[a-z]\b)")
POWER_WORDS = re.compile(rf"\b({_OPERAND})\s+(squared|cubed)\b", re.IGNORECASE)
SAME_OPERATOR = {"x": "*", "×": "*", "÷": "/", "−": "-"}
QUOTED = re.compile(
    r"\"([^\"]{1,80})\"|“([^”]{1,80})”|`([^`]{1,80})`|(?:^|\s)'([^']{1,80})'(?=$|[\s.,;:?!])"
)
# "the best way to" says nothing about which answer: drop it before "best" reads as scope.
FILLER_PHRASES = re.compile(
    r"\b(?:best|right|proper|correct|easiest|simplest|recommended|good|quickest|fastest"
    r"|most effective|most efficient|ideal)\s+(?:way|ways|method|approach)\b",
    re.IGNORECASE,
)
# Politeness around the ask: carries no content, but its words would look like content.
POLITE_PHRASES = re.compile(
    r"\b(?:thanks|thank you)(?: so much| very much| a lot)?(?: in advance)?\b|\bin advance\b"
    r"|\bquick question\b|\bany help (?:would be |is )?(?:greatly |much )?appreciated\b"
    r"|\b(?:just )?asking for a friend\b|\bi was wondering(?: if)?\b|\bif possible\b"
    r"|\bif you (?:can|could|don't mind)\b|\bsorry to bother you\b",
    re.IGNORECASE,
)
# "What makes the sky blue?" asks why: one form, so the question-word veto compares asks.
WHY_PHRASES = re.compile(
    r"\b(?:what (?:makes|causes|is the (?:reason|cause)|are the (?:reasons|causes))"
    r"(?: of| for)?|how come)\b",
    re.IGNORECASE,
)
STEP_BY_STEP = re.compile(r"\bstep[- ]by[- ]step\b", re.IGNORECASE)
# "What year was it signed?" asks when, "which person" who.
WHEN_PHRASES = re.compile(
    r"\b(?:what|which) (?:time of (?:the )?(?:year|day)|date|year|month|season)\b",
    re.IGNORECASE,
)
WHEN_ASKS = re.compile(  # "what is the best season to visit" asks when
    r"\b(?:what|which)(?= (?:is|are|was) the (?:(?:best|ideal|right|good|perfect|usual) )?"
    r"(?:time|season|month|date|year)\b)",
    re.IGNORECASE,
)
WHO_PHRASES = re.compile(r"\bwhich (?:person|people)\b", re.IGNORECASE)
# One spelling per name, so that "the United States" and "the US" are the same name. "US"
# only in capitals: "us" is a pronoun.
NAME_ALIASES = (
    (re.compile(r"\b(?:the )?united states(?: of america)?\b|\bu\.s\.(?:a\.)?", re.I), "USA"),
    (re.compile(r"\bUS\b"), "USA"),
    (re.compile(r"\b(?:the )?united kingdom\b|\bgreat britain\b", re.I), "UK"),
    (re.compile(r"\bnode(?:\.| )?js\b", re.I), "nodejs"),
    (re.compile(r"\bjs\b", re.I), "javascript"),
    (re.compile(r"\bTS\b"), "typescript"),
    (re.compile(r"\bk8s\b", re.I), "kubernetes"),
    (re.compile(r"\b(?:in|with|using) Go\b"), "in golang"),  # "Go" alone is a verb
    (re.compile(r"\b(?:new york city|nyc)\b", re.I), "NYC"),
    (re.compile(r"\b(?:world war (?:two|2|ii)|ww ?2|wwii|second world war)\b", re.I), "WW2"),
    (re.compile(r"\b(?:world war (?:one|1|i)|ww ?1|wwi|first world war)\b", re.I), "WW1"),
)
# Scope words inside a set phrase that narrows nothing: "how long" asks a duration, "short
# for" an expansion, "a web page" is a page of the web; "in short" asks for a summary.
SET_PHRASES = tuple(
    (re.compile(pattern, re.IGNORECASE), replacement)
    for pattern, replacement in (
        (r"\bhow long\b", "how duration"),
        (r"\b(?:short|stand|stands) for\b", "abbreviates"),
        (r"\bin (?:short|brief|a nutshell)\b", "summary"),
        (r"\ball the time\b", "constantly"),
        (r"\banother word for\b", "synonym for"),
        (r"\bbullet(?:ed)? (?:points?|list)\b|\bbullet points? list\b", "bullets"),
        (r"\bmost recent\b", "latest"),
        (r"\bthe (?:word|term)\b", "the term"),
        (r"\bweb ?page\b", "webpage"),
        (r"\bbest man\b", "groomsman"),
        (r"\bperiodic table\b", "periodictable"),
        (r"\bcommand line\b", "commandline"),
    )
)
TRIGRAM_CHARS = 600  # enough to tell a typo from a rewording; bounds the cache entry
APOSTROPHES = str.maketrans({"’": "'", "‘": "'", "´": "'"})


@dataclass(frozen=True, eq=False)  # hashed by identity: analyse() caches per artifact
class WordStats:
    """Corpus statistics from the artifact: rarity and how a word is usually written."""

    idf: dict[str, float] = field(default_factory=dict)
    capitalised: dict[str, float] = field(default_factory=dict)  # share written Capitalised
    max_idf: float = 10.0

    def weight(self, word: str) -> float:
        return self.idf.get(word, self.max_idf)

    def known(self, word: str) -> bool:
        return word in self.idf

    def usually_capitalised(self, word: str) -> bool:
        return self.capitalised.get(word, 0.0) >= 0.6

    def usually_lower(self, word: str) -> bool:
        return word in self.capitalised and self.capitalised[word] < 0.4


@dataclass(frozen=True)
class Token:
    raw: str  # as written: case matters to a question about case
    lower: str
    capitalised: bool  # first letter upper in the original text
    initial: bool  # first word of a sentence (capital tells nothing there)
    opens_clause: bool  # first word, or after a comma or a sentence's end


@dataclass(frozen=True)
class PairText:
    normalised: str  # lower case, words joined by one space: the exact-repeat form
    tokens: tuple[Token, ...]
    words: frozenset[str]  # every lower-case word
    content: dict[str, str]  # key (synonym or stem) -> the word it came from
    keys: frozenset[str]  # content_key of every word, function words too ("get" ~ "obtain")
    numbers: tuple[str, ...]  # sorted multiset: digits, number words, operators
    units: frozenset[str]
    dates: frozenset[str]
    negations: int
    quoted: frozenset[str]
    asks: frozenset[str]  # question words that ask (asked_words)
    entities: frozenset[str]  # lower-case words that name something
    trigrams: frozenset[str]  # of `normalised`: typos keep most of them
    asks_case: bool  # asks about letter case (CASE_ASK): then case must match too


CONTRACTION = re.compile(
    "|".join(
        (re.escape(short) if short[0] in "'n" else r"\b" + re.escape(short)) + r"\b"
        for short in sorted(lx.CONTRACTIONS, key=len, reverse=True)
    ),
    re.IGNORECASE,
)


def expand_contractions(text: str) -> str:
    text = CONTRACTION.sub(
        lambda m: lx.CONTRACTIONS[m.group().lower()], text.translate(APOSTROPHES)
    )
    return re.sub(r"'s\b", "", text)  # possessive: "Python's" names Python


def stem(word: str) -> str:
    """A crude stemmer: plural, -ing, -ed and a final e go, so make/making/makes meet."""
    w = word
    if len(w) > 4 and w.endswith("ies"):
        w = w[:-3] + "y"
    elif len(w) > 3 and w.endswith("s") and not w.endswith(("ss", "us", "is")):
        w = w[:-1]
    if len(w) > 5 and w.endswith("ing"):
        w = w[:-3]
    elif len(w) > 4 and w.endswith("ed"):
        w = w[:-2]
    if len(w) > 3 and w[-1] == w[-2] and w[-1] not in "aeiouls":
        w = w[:-1]  # running -> runn -> run
    if len(w) > 2 and w.endswith("e"):
        w = w[:-1]
    return w


def lemma_candidates(word: str) -> list[str]:
    out = [word]
    if word.endswith("ies"):
        out.append(word[:-3] + "y")
    if word.endswith("es"):
        out.append(word[:-2])
    if word.endswith("s"):
        out.append(word[:-1])
    if word.endswith("ing"):
        out += [word[:-3], word[:-3] + "e"]
    if word.endswith("ed"):
        out += [word[:-2], word[:-1]]
    return out


@lru_cache(maxsize=65536)  # words repeat across texts; a bounded vocabulary
def content_key(word: str) -> str:
    for candidate in lemma_candidates(word):
        if candidate in lx.SYNONYMS:
            return "=" + lx.SYNONYMS[candidate]
    return stem(word)


def tokenize(text: str) -> list[Token]:
    out, prev_end = [], 0
    for m in WORD.finditer(text):
        raw = m.group()
        between = text[prev_end : m.start()]
        initial = not out or any(c in ".?!:;\n" for c in between)
        opens_clause = initial or any(c in ",(" for c in between)
        out.append(Token(raw, raw.lower(), raw[0].isupper(), initial, opens_clause))
        prev_end = m.end()
    return out


def _numbers(lower: str, tokens: list[Token]) -> tuple[str, ...]:
    lower = SUPERSCRIPT.sub(lambda m: "^" + m.group().translate(SUPERSCRIPT_DIGITS), lower)
    lower = ORDINAL.sub(r"\1", lower)
    found = ["op!" for _ in FACTORIAL.findall(lower)]
    for raw in NUMBER.findall(lower):
        if re.fullmatch(r"\d{1,3}(,\d{3})+", raw):
            raw = raw.replace(",", "")
        if "." in raw:
            raw = raw.rstrip("0").rstrip(".")
        found.append(raw.lstrip("0") or "0")
    for run in _number_word_runs(tokens):
        if len(run) > 1:
            found.append(str(_cardinal_value(run)))  # "ninety-one", "one hundred forty four"
        elif run[0] not in lx.WEAK_NUMBER_WORDS:
            found.append(lx.NUMBER_WORDS[run[0]].lstrip("#x"))
    operators = OPERATOR.findall(lower) + OPERATOR_AFTER_WORD.findall(lower)
    found += ["op" + SAME_OPERATOR.get(op, op) for op in operators]
    return tuple(sorted(found))


def _number_word_runs(tokens: list[Token]) -> list[list[str]]:
    """Number words, those in a row that spell one number joined ("ninety one", "one hundred
    and five"; not "two two")."""
    runs: list[list[str]] = []
    end = -2  # the token index of the last run's last word
    for i, t in enumerate(tokens):
        if t.lower not in lx.NUMBER_WORDS:
            continue
        gap = [x.lower for x in tokens[end + 1 : i]]
        adjacent = gap in ([], ["and"]) and end >= 0
        if runs and adjacent and _continues(runs[-1][-1], t.lower):
            runs[-1].append(t.lower)
        else:
            runs.append([t.lower])
        end = i
    return runs


def _continues(previous: str, word: str) -> bool:
    """`word` after `previous` goes on spelling the same number."""
    if previous not in lx.CARDINALS or word not in lx.CARDINALS:
        return False
    p, w = lx.CARDINALS[previous], lx.CARDINALS[word]
    tens = 20 <= p < 100 and p % 10 == 0
    return w >= 100 > p or (p >= 100 and w < 100) or (tens and 0 < w < 10)


def _cardinal_value(run: list[str]) -> int:
    total = current = 0
    for w in run:
        value = lx.CARDINALS[w]
        if value == 100:
            current = max(current, 1) * 100
        elif value >= 1000:
            total += max(current, 1) * value
            current = 0
        else:
            current += value
    return total + current


def _units(tokens: list[Token]) -> frozenset[str]:
    units = set()
    for i, t in enumerate(tokens):
        unit = lx.UNITS.get(t.lower)
        if unit is None:
            continue
        after_number = i > 0 and tokens[i - 1].lower.isdigit()
        if t.lower not in lx.AMBIGUOUS_UNITS or after_number:
            units.add(unit)
    return frozenset(units)


def _dates(tokens: list[Token]) -> frozenset[str]:
    return frozenset(t.lower for t in tokens if t.lower in lx.DATES)


def _quoted(text: str) -> frozenset[str]:
    terms = set()
    for groups in QUOTED.findall(text):
        term = next(g for g in groups if g)
        words = " ".join(w.lower() for w in WORD.findall(term))
        if words:
            terms.add(words)
    return frozenset(terms)


def asked_words(tokens: list[Token]) -> frozenset[str]:
    """Question words that ask: opening a clause, after "tell me"... or last ("by whom?")."""
    return frozenset(
        "who" if t.lower == "whom" else t.lower
        for i, t in enumerate(tokens)
        if t.lower in qw.QUESTION_WORDS
        and (t.opens_clause or tokens[i - 1].lower in qw.ASKING_WORDS or i == len(tokens) - 1)
    )


def rewrite_phrases(text: str) -> str:
    """One wording for the phrases that have several (names, why/when/who, set phrases)."""
    text = POLITE_PHRASES.sub(" ", expand_contractions(text))
    text = WHY_PHRASES.sub("why", FILLER_PHRASES.sub("way", text))
    text = WHEN_ASKS.sub("when", WHEN_PHRASES.sub("when", text))
    text = WHO_PHRASES.sub("who", text)
    for pattern, replacement in (*NAME_ALIASES, *SET_PHRASES):
        text = pattern.sub(replacement, text)
    text = HYPHENATED_NUMBER.sub(r"\1 \2", text)  # "ninety-one" is no subtraction
    text = POWER_WORDS.sub(lambda m: m[1] + ("^2" if m[2].lower() == "squared" else "^3"), text)
    for pattern, operator in OPERATOR_WORDS:
        text = pattern.sub(operator, text)
    return STEP_BY_STEP.sub("stepwise", text)  # asks for another answer; "steps" alone not


def is_entity(t: Token, stats: WordStats) -> bool:
    w = t.lower
    if w in names.GAZETTEER:
        return True
    if w in lx.STOPWORDS or len(w) < 2 or w.isdigit():
        return False
    if stats.usually_capitalised(w):
        return True
    return t.capitalised and not t.initial and not stats.usually_lower(w)


# Bounded: an entry of a 2,048-character text holds ~100 KB (tokens, trigrams).
@lru_cache(maxsize=1024)
def analyse(text: str, stats: WordStats) -> PairText:
    text = rewrite_phrases(text)
    tokens = tokenize(text)
    words = [t.lower for t in tokens]
    lower = text.lower()
    content = {
        content_key(w): w
        for w in words
        if w not in lx.STOPWORDS and not w.isdigit() and w not in lx.NUMBER_WORDS
    }
    counts = Counter(words)
    return PairText(
        normalised=" ".join(words),
        tokens=tuple(tokens),
        words=frozenset(words),
        content=content,
        keys=frozenset(content_key(w) for w in words),
        numbers=_numbers(lower, tokens),
        units=_units(tokens),
        dates=_dates(tokens),
        negations=sum(counts[n] for n in lx.NEGATIONS),
        quoted=_quoted(text),
        asks=asked_words(tokens),
        entities=frozenset(t.lower for t in tokens if is_entity(t, stats)),
        trigrams=trigrams(" ".join(words)[:TRIGRAM_CHARS]),
        asks_case=CASE_ASK.search(text) is not None,
    )


def trigrams(text: str) -> frozenset[str]:
    padded = f" {text} "
    return frozenset(padded[i : i + 3] for i in range(len(padded) - 2))
