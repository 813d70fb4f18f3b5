"""Edits that turn one question into a pair for the verifier's data (build_pairs.py).

Should-hit edits keep the ask (near repeats, rewordings); must-not edits change it the
way the cache's wrong hits do (negation, an opposite, another name, number or scope).
Each edit returns None when it does not apply to the question. The synonym and entity
tables here are the generator's own, not the verifier's (gateway/cache/lexicon.py), so
the data does not simply echo the rules it is scored on; some overlap is unavoidable
(France and Germany are in both).
"""

import random
import re
from collections.abc import Callable


def _pairs(text: str) -> list[tuple[str, str]]:
    """Word pairs written as "a b, c d" (one line holds many)."""
    return [tuple(p.split()) for p in text.split(",") if p.strip()]  # type: ignore[misc]


def _words(text: str) -> list[str]:
    """A word list written as one string (shorter to read than a list of strings)."""
    return text.split()


Edit = Callable[[str, random.Random], str | None]

FILLER_PREFIXES = [
    "please ",
    "hey, ",
    "hi! ",
    "quick question: ",
    "can you tell me ",
    "I was wondering, ",
    "ok so ",
    "hello, ",
    "hey there, ",
    "question: ",
]
FILLER_SUFFIXES = [
    " please",
    " thanks",
    " thank you!",
    " thx",
    " :)",
    "??",
    " pls",
    " (asking for a friend)",
    " - thanks in advance",
]
# Reworded question openings, each list one meaning.
FRAMES = [
    [
        "how do i ",
        "how can i ",
        "how should i ",
        "what's the way to ",
        "how would i ",
        "what is the best way to ",
        "how to ",
        "what are the steps to ",
    ],
    ["what is ", "what's ", "can you tell me what is ", "could you explain what is "],
    ["can you ", "could you ", "would you ", "please ", "will you "],
    ["why is ", "what is the reason ", "how come "],
    ["is it possible to ", "can i ", "is there a way to "],
    ["what are ", "what're ", "could you tell me what are "],
    ["give me ", "can you give me ", "i'd like ", "provide "],
    ["tell me about ", "what can you tell me about ", "explain ", "describe "],
]
GEN_SYNONYMS = _pairs(
    """make create, build create, fix solve, error issue, show display, get obtain, big
    large, use utilize, start begin, buy purchase, help assist, need require, choose
    pick, tips advice, write compose, movie film, car vehicle, kids children, photo
    picture, quick fast, delete remove, change modify, find locate, job position, idea
    suggestion, app application, ways methods, improve enhance, understand grasp, common
    frequent, important crucial, main primary, simple easy, begin start, shows displays,
    creating making, using utilizing"""
)
NEGATABLE = re.compile(
    r"\b(is|are|was|were|can|could|should|would|will|do|does|did|has|have)\b", re.IGNORECASE
)
EXISTING_NEGATION = re.compile(r"\b(not|never)\b\s*|n't\b", re.IGNORECASE)
ANTONYM_SWAPS = _pairs(
    """enable disable, increase decrease, add remove, best worst, before after, start stop,
    open close, buy sell, install uninstall, import export, upload download, max min,
    maximum minimum, more less, positive negative, good bad, advantages disadvantages,
    pros cons, first last, hot cold, easy hard, cheap expensive, fast slow, high low,
    long short, large small, big small, encrypt decrypt, include exclude, input output,
    send receive, win lose, true false, always never, benefits risks, love hate, connect
    disconnect, lock unlock, show hide, public private, possible impossible, legal
    illegal, like dislike, old new, strengths weaknesses, success failure, better worse,
    up down"""
)
ENTITY_CLASSES = [
    _words(
        """France Germany Spain Italy Japan China India Brazil Canada Mexico Egypt Kenya Norway
        Poland Vietnam Chile Turkey Greece Sweden Argentina Australia Nigeria Peru"""
    ),
    _words(
        """Paris London Berlin Tokyo Madrid Rome Chicago Boston Seattle Toronto Sydney Dubai
        Amsterdam Vienna Prague Lisbon Mumbai Seoul Bangkok Cairo Denver Austin"""
    ),
    _words(
        """Python Java JavaScript TypeScript Rust Go Ruby PHP Swift Kotlin Scala Haskell C++ C#
        Perl Elixir Dart Lua"""
    ),
    _words("""React Angular Vue Django Flask Spring Rails Laravel Express Svelte Next.js"""),
    _words("""Windows Linux macOS Ubuntu Android iOS Debian Fedora"""),
    _words(
        """Google Microsoft Apple Amazon Meta Netflix Tesla IBM Oracle Intel Nvidia Samsung Spotify
        Uber Airbnb Shopify Salesforce"""
    ),
    _words("""MySQL PostgreSQL MongoDB Redis SQLite Cassandra DynamoDB Elasticsearch"""),
    ["AWS", "Azure", "GCP", "Heroku", "DigitalOcean", "Vercel", "Netlify"],
    _words("""Excel Word PowerPoint Notion Slack Jira Trello Figma Photoshop WordPress"""),
    ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"],
    _words("""January February April June July August September October November December"""),
    _words(
        """Shakespeare Einstein Newton Darwin Napoleon Lincoln Gandhi Picasso Mozart Beethoven"""
    ),
]
SCOPE_SWAPS = [
    ("explain", "summarize"),
    ("explain", "list"),
    ("write", "summarize"),
    ("poem", "story"),
    ("essay", "poem"),
    ("short", "detailed"),
    ("beginners", "experts"),
    ("kids", "adults"),
    ("example", "definition"),
    ("email", "letter"),
    ("blog post", "tweet"),
    ("list", "table"),
    ("code", "pseudocode"),
    ("students", "teachers"),
    ("funny", "serious"),
    ("formal", "casual"),
    ("brief", "detailed"),
    ("simple", "advanced"),
]
SCOPE_SUFFIXES = [
    " for beginners",
    " for experts",
    " for a 5 year old",
    " in one sentence",
    " in detail",
    " in Python",
    " in JavaScript",
    " on Windows",
    " on a Mac",
    " step by step",
    " with examples",
    " in bullet points",
    " in 100 words",
    " for a small business",
    " in French",
    " as a table",
    " for kids",
]
CASE_WORD = re.compile(r"\b[A-Za-z][A-Za-z+#.]*[A-Za-z+#]|\b[A-Za-z]\b")


def _replace_word(text: str, old: str, new: str) -> str | None:
    pattern = re.compile(r"(?<![\w+#])" + re.escape(old) + r"(?![\w+#])", re.IGNORECASE)
    if not pattern.search(text):
        return None

    def keep_case(m: re.Match) -> str:
        return new[0].upper() + new[1:] if m.group()[0].isupper() else new

    return pattern.sub(keep_case, text, count=1)


# ---------------------------------------------------------------- should hit


def typo(text: str, rng: random.Random) -> str | None:
    words = [m for m in re.finditer(r"[A-Za-z]{5,}", text)]
    if not words:
        return None
    m = rng.choice(words)
    w, i = m.group(), rng.randrange(1, len(m.group()) - 2)
    kind = rng.choice(["swap", "drop", "double"])
    if kind == "swap":
        w = w[:i] + w[i + 1] + w[i] + w[i + 2 :]
    elif kind == "drop":
        w = w[:i] + w[i + 1 :]
    else:
        w = w[:i] + w[i] + w[i:]
    return text[: m.start()] + w + text[m.end() :]


def near_repeat(text: str, rng: random.Random) -> str | None:
    out = text
    steps = rng.sample(["case", "punct", "space", "typo", "prefix", "suffix"], rng.randint(1, 3))
    for step in steps:
        if step == "case":
            out = rng.choice(
                [
                    out.lower(),
                    out.upper() if len(out) < 60 else out.lower(),
                    out[:1].lower() + out[1:],
                ]
            )
        elif step == "punct":
            out = out.rstrip("?.! ") if out[-1:] in "?.!" else out + "?"
        elif step == "space":
            out = re.sub(r" ", "  ", out, count=rng.randint(1, 3)) + rng.choice(["", " ", "\n"])
        elif step == "typo":
            out = typo(out, rng) or out
        elif step == "prefix":
            out = rng.choice(FILLER_PREFIXES) + out[:1].lower() + out[1:]
        else:
            out = out.rstrip() + rng.choice(FILLER_SUFFIXES)
    return out if out != text else None


def reword(text: str, rng: random.Random) -> str | None:
    """A paraphrase by rule: another question opening, a synonym, a contraction."""
    out, changed = text, 0
    lower = out.lower()
    for frame in rng.sample(FRAMES, len(FRAMES)):
        start = next((f for f in frame if lower.startswith(f)), None)
        if start:
            new = rng.choice([f for f in frame if f != start])
            out = new[:1].upper() + new[1:] + out[len(start) :]
            changed += 1
            break
    for old, new in rng.sample(GEN_SYNONYMS, len(GEN_SYNONYMS)):
        pair = (old, new) if rng.random() < 0.5 else (new, old)
        replaced = _replace_word(out, *pair)
        if replaced:
            out, changed = replaced, changed + 1
            break
    if rng.random() < 0.3:
        out = out.replace("do not", "don't").replace("What is", "What's")
    return out if changed and out != text else None


# ---------------------------------------------------------------- must not hit


NEGATIVE_AUX = {
    "can": "can't",
    "will": "won't",
    "do": "don't",
    "does": "doesn't",
    "did": "didn't",
    "is": "isn't",
    "are": "aren't",
    "was": "wasn't",
    "were": "weren't",
    "should": "shouldn't",
    "could": "couldn't",
    "would": "wouldn't",
    "has": "hasn't",
    "have": "haven't",
}
AUX_SUBJECT = re.compile(
    r"\b(do|does|did|can|could|should|would|will) (I|you|we|they|he|she|it|my \w+)\b",
    re.IGNORECASE,
)


def negate(text: str, rng: random.Random) -> str | None:
    """Add a negation where English puts one (or drop the one that is there)."""
    if EXISTING_NEGATION.search(text):
        return re.sub(r"\s+", " ", EXISTING_NEGATION.sub(" ", text, count=1)).replace(" ?", "?")
    first = text.split(" ", 1)[0]
    if first.lower() in NEGATIVE_AUX and " " in text:
        neg = NEGATIVE_AUX[first.lower()]
        return neg[:1].upper() + neg[1:] + text[len(first) :]
    m = AUX_SUBJECT.search(text)
    if m:
        return text[: m.end()] + " not" + text[m.end() :]
    if " with " in text and rng.random() < 0.5:
        return text.replace(" with ", " without ", 1)
    matches = list(NEGATABLE.finditer(text))
    if not matches:
        return None
    m = rng.choice(matches)
    return text[: m.end()] + " not" + text[m.end() :]


def antonym(text: str, rng: random.Random) -> str | None:
    for a, b in rng.sample(ANTONYM_SWAPS, len(ANTONYM_SWAPS)):
        for old, new in ((a, b), (b, a)):
            out = _replace_word(text, old, new)
            if out:
                return out
    return None


def swap_entity(text: str, rng: random.Random, names: list[str]) -> str | None:
    for cls in rng.sample(ENTITY_CLASSES, len(ENTITY_CLASSES)):
        for name in cls:
            out = _replace_word(text, name, rng.choice([n for n in cls if n != name]))
            if out:
                return out
    # A capitalised word inside the sentence: swap in another question's name.
    caps = [
        m
        for m in CASE_WORD.finditer(text)
        if m.start() > 0
        and m.group()[0].isupper()
        and text[m.start() - 2 : m.start()].strip() not in {".", "?", "!"}
        and m.group() not in {"I", "I'm"}
    ]
    if not caps or not names:
        return None
    m = rng.choice(caps)
    new = rng.choice(names)
    return None if new.lower() == m.group().lower() else text[: m.start()] + new + text[m.end() :]


def change_number(text: str, rng: random.Random) -> str | None:
    numbers = list(re.finditer(r"\d+(?:\.\d+)?", text))
    if not numbers:
        return None
    m = rng.choice(numbers)
    value = float(m.group())
    new = value + rng.choice([1, 2, 3, 5, 10, -1]) if value > 1 else value + rng.choice([1, 2])
    new_text = str(int(new)) if new == int(new) and "." not in m.group() else f"{new:g}"
    return text[: m.start()] + new_text + text[m.end() :]


def change_scope(text: str, rng: random.Random) -> str | None:
    for a, b in rng.sample(SCOPE_SWAPS, len(SCOPE_SWAPS)):
        for old, new in ((a, b), (b, a)):
            out = _replace_word(text, old, new)
            if out:
                return out
    body = text.rstrip(" ?.!")
    return body + rng.choice(SCOPE_SUFFIXES) + text[len(body) :]


def swap_direction(text: str, rng: random.Random) -> str | None:
    """ "from X to Y" -> "from Y to X"; "is A faster than B" -> "is B faster than A"."""
    patterns = [
        r"\bfrom (?P<x>[A-Za-z][\w+#]{2,}) (?:to|into) (?P<y>[A-Za-z][\w+#]{2,})\b",
        r"\b(?P<x>[A-Z][\w+#]*) (?:\w+er|more \w+|better|worse) than (?P<y>[A-Z][\w+#]*)",
        r"\b(?P<x>[A-Z][\w+#]+) (?:to|into) (?P<y>[A-Z][\w+#]+)\b",
    ]
    for pattern in rng.sample(patterns, len(patterns)):
        m = re.search(pattern, text)
        if m and m.group("x").lower() != m.group("y").lower():
            x, y = m.group("x"), m.group("y")
            middle = text[m.end("x") : m.start("y")]
            return text[: m.start("x")] + y + middle + x + text[m.end("y") :]
    return None
