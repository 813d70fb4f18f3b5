"""The semantic cache's pair verifier: each veto, paraphrases accepted, strictness ordering,
the labelled pair set's shape (tests/test_training.py: the training command reproduces
the artifact)."""

import json

import pytest

from gateway.cache.pair_features import align
from gateway.cache.pair_text import analyse
from gateway.cache.verifier import DEFAULT_ARTIFACT, STRICTNESS, PairVerifier
from gateway.embedding.embedder import Embedder
from tests.pair_verifiers import cosine
from training.cache import train_verifier


@pytest.fixture(scope="module")
def verifier() -> PairVerifier:
    return PairVerifier.load()


@pytest.fixture(scope="module")
def pairs() -> list[dict]:
    return train_verifier.load_pairs()


VETOES = [
    ("What is 2+2?", "What is 2+3?", "numbers differ"),
    ("What is 2+2?", "What is 2*2?", "numbers differ"),
    ("Solve x^2 - 5x + 6 = 0", "Solve x^2 - 5x - 6 = 0", "numbers differ"),  # a variable
    ("If a + b = 10, what is a?", "If a - b = 10, what is a?", "numbers differ"),
    ("What happened in the year 1776?", "What happened in the year 1777?", "numbers differ"),
    ("What is 2³?", "What is 23?", "numbers differ"),  # one text under NFKC
    ("What is 2³?", "What is 2?", "numbers differ"),
    ("Compute 10!", "Compute 10", "numbers differ"),
    ("Convert to lowercase: Hello World", "Convert to lowercase: hello world", "letter case"),
    ('Is "hello world" in title case?', 'Is "Hello World" in title case?', "letter case"),
    ("How many feet are in 10 km?", "How many feet are in 10 miles?", "units differ"),
    ("What's on TV on Monday night?", "What's on TV on Tuesday night?", "dates differ"),
    (
        'What does the error "permission denied" mean?',
        'What does the error "connection refused" mean?',
        "quoted term",
    ),
    ("Is Python a compiled language?", "Is Python not a compiled language?", "negation"),
    ("Why does my code work?", "Why doesn't my code work?", "negation"),
    (
        "How do I enable two-factor authentication?",
        "How do I disable two-factor authentication?",
        "antonym",
    ),
    ("How do I install Docker on Ubuntu?", "How do I uninstall Docker on Ubuntu?", "antonym"),
    ("What is the largest planet?", "What is the smallest planet?", "antonym"),
    (
        "How do I convert Celsius to Fahrenheit?",
        "How do I convert Fahrenheit to Celsius?",
        "direction",
    ),
    ("What is the capital of France?", "What is the capital of Germany?", "entity"),
    ("what is the capital of france", "what is the capital of germany", "entity"),
    ("How do I sort a list in Python?", "How do I sort a list in Rust?", "entity"),
    ("Who painted the Mona Lisa?", "Who painted the Last Supper?", "entity"),
    ("Explain recursion for beginners", "Explain recursion for experts", "scope"),
    ("Write a poem about the sea", "Write a story about the sea", "scope"),
    ("Summarize the causes of World War I", "Explain the causes of World War I", "scope"),
    ("Who founded Microsoft?", "When was Microsoft founded?", "question word"),
]


@pytest.mark.parametrize(("query", "stored", "reason"), VETOES)
def test_each_veto_refuses_even_when_lenient(
    verifier: PairVerifier, embedder: Embedder, query: str, stored: str, reason: str
) -> None:
    verdict = verifier.verify(query, stored, cosine(embedder, query, stored), "lenient")
    assert not verdict.accept
    assert verdict.reason == reason
    assert verdict.probability == 0.0


# Names, question words and scope words that another wording keeps: no veto refuses these
# (the model decides, or the words are the same once the phrases are rewritten), while the
# look-alikes below them still differ.
NOT_VETOED = [
    ("What is the GDP of the United States?", "What is the GDP of the US?"),  # one name
    ("Who was the first US president?", "Who was the first president of the USA?"),
    ("What is the GDP of France?", "What is the gross domestic product of France?"),
    ("What language is spoken in Brazil?", "Which language do Brazilians speak?"),
    ("how do i reverse a list in python", "What's the Pythonic way to reverse a list?"),
    ("What is the longest river in the world?", "Which river is the longest on Earth?"),
    ("Why do earthquakes happen?", "What is the cause of an earthquake?"),
    ("When was the treaty signed?", "What year was the treaty signed?"),
    ("When is the best time to visit Japan?", "What time of year is best for visiting Japan?"),
    ("The app keeps crashing when I open it", "app crashes on startup, what do I do"),
    ("How long does it take to fly to Rome?", "How many hours is a flight to Rome?"),
    ("What does DNA stand for?", "What is DNA short for?"),
    ("Summarise the plot of Hamlet", "what happens in Hamlet, in short"),
    ("What is the best laptop for coding?", "What's a good laptop for coding?"),
    ("How do I undo the last commit in git?", "How can I revert my most recent git commit?"),
    ("How do I make a bulleted list in Markdown?", "How can I create bullet points in Markdown?"),
    ("Give me a synonym for happy", "another word for happy?"),
    # numbers and operators in words, contractions typed without the apostrophe, other names
    ("What is seven times eight?", "7 x 8 = ?"),
    ("Is ninety-one a prime?", "is 91 prime"),
    ("solve x squared minus 4 equals 0", "solve x^2 - 4 = 0"),
    ("my package hasnt shipped", "my package hasn't shipped"),
    ("make soup w/o a blender", "make soup without a blender"),
    ("How do I scale a k8s deployment?", "How do I scale a Kubernetes deployment?"),
    ("best pizza in NYC", "best pizza in New York City"),
    ("js sort an array of numbers", "JavaScript sort an array of numbers"),
    ("read a file in node js", "read a file in Node.js"),
    ("When did World War 2 start?", "When did WWII start?"),
    ("write a short poem about rain", "write a brief poem about rain"),
    ("What's your favourite colour?", "What's your favorite color?"),
    # a question word that ends the question asks, and "whom" asks what "who" does
    ("Who wrote Pride and Prejudice?", "Pride and Prejudice was written by whom?"),
    # "how to" starts a verb, not a direction
    ("How do I read a CSV file into a pandas dataframe?", "How to read a CSV file in pandas"),
]
STILL_VETOED = [
    ("How do I sort a list in Java?", "How do I sort a list in JavaScript?", "entity"),
    ("What language is spoken in Brazil?", "What language is spoken in Bolivia?", "entity"),
    ("What is the GDP of the US?", "What is the GDP of the UK?", "entity"),
    ("Tell me who founded Microsoft", "Tell me when Microsoft was founded", "question word"),
    ("Who founded Microsoft?", "What year was Microsoft founded?", "question word"),
    ("How long is the Nile?", "How long is the Nile for kids?", "scope"),
    ("Summarise the plot of Hamlet", "Explain the plot of Hamlet in detail", "scope"),
    ("What is the best laptop for coding?", "What is the cheapest laptop for coding?", "scope"),
    ("What is 7 times 8?", "What is 7 plus 8?", "numbers differ"),
    ("Is ninety-one a prime?", "Is 19 a prime?", "numbers differ"),
    ("Why did World War 2 start?", "Why did World War I start?", "numbers differ"),
    ("js sort an array of numbers", "TS sort an array of numbers", "entity"),
    ("my package has shipped", "my package hasnt shipped", "negation"),
    ("When was penicillin discovered?", "Penicillin was discovered by whom?", "question word"),
    # "to" and "into" point the same way
    (
        "how to convert a JSON string to a dict in python",
        "How do I convert a Python dict into a JSON string?",
        "direction",
    ),
    ("How do I turn a PDF to a Word file?", "How do I turn a Word file into a PDF?", "direction"),
]


@pytest.mark.parametrize(("query", "stored"), NOT_VETOED)
def test_other_wordings_of_a_name_an_ask_or_a_scope_are_not_vetoed(
    verifier: PairVerifier, query: str, stored: str
) -> None:
    assert verifier.decide(query, stored) in (None, (1.0, ""))
    assert verifier.decide(stored, query) in (None, (1.0, ""))


@pytest.mark.parametrize(("query", "stored", "reason"), STILL_VETOED)
def test_their_look_alikes_are_still_vetoed(
    verifier: PairVerifier, query: str, stored: str, reason: str
) -> None:
    assert verifier.decide(query, stored) == (0.0, reason)
    assert verifier.decide(stored, query) == (0.0, reason)


PARAPHRASES = [
    ("How do I reset my password?", "how do i reset my password"),
    ("What is the capital of France?", "what's the capital of france??"),
    ("How can I reverse a string in Python?", "How do I reverse a string in Python?"),
    ("How do I install numpy on Windows?", "How do I instal numpy on Windows?"),
    ("Can you explain how photosynthesis works?", "Please explain how photosynthesis works."),
    ("What are the symptoms of the flu?", "hey, what are the symptoms of the flu? thanks"),
    ("How do I make a budget?", "How can I create a budget?"),
]


@pytest.mark.parametrize(("query", "stored"), PARAPHRASES)
def test_repeats_and_paraphrases_are_accepted(
    verifier: PairVerifier, embedder: Embedder, query: str, stored: str
) -> None:
    verdict = verifier.verify(query, stored, cosine(embedder, query, stored))
    assert verdict.accept, verdict
    assert verdict.reason == "ok"
    assert 0.0 < verdict.probability <= 1.0


def test_strict_never_accepts_what_balanced_refuses(
    verifier: PairVerifier, pairs: list[dict]
) -> None:
    t = verifier.thresholds
    assert t["strict"] >= t["balanced"] >= t["lenient"]
    held_out = [p for p in pairs if p["split"] != "train"]
    for p in held_out:
        verdicts = {s: verifier.verify(p["a"], p["b"], p["cosine"], s) for s in STRICTNESS}
        assert verdicts["balanced"].accept or not verdicts["strict"].accept, p
        assert verdicts["lenient"].accept or not verdicts["balanced"].accept, p
    accepted = {
        s: sum(verifier.verify(p["a"], p["b"], p["cosine"], s).accept for p in held_out)
        for s in STRICTNESS
    }
    assert accepted["strict"] < accepted["lenient"]  # the knob does something


def test_a_calibrated_threshold_replaces_the_strictness(verifier: PairVerifier) -> None:
    query, stored = "How do I make a budget?", "How can I create a budget?"
    p = verifier.verify(query, stored, 0.9).probability
    assert 0 < p < 1
    assert verifier.verify(query, stored, 0.9, "strict", threshold=p).accept
    assert not verifier.verify(query, stored, 0.9, "lenient", threshold=min(1.0, p + 1e-6)).accept
    negation = verifier.verify("How do I enable 2FA?", "How do I disable 2FA?", 0.95, threshold=0)
    assert not negation.accept  # a veto stands whatever the threshold


def test_long_texts_are_compared_word_for_word(verifier: PairVerifier) -> None:
    document = "def f(x):\n    return x + 1\n" * 200  # a pasted file, past the comparison limit
    assert verifier.verify(document, document.replace("  ", " "), 0.99).accept
    assert not verifier.verify(document, document.upper(), 0.99, "lenient").accept  # code: case
    edited = document[:-3] + "2\n"
    verdict = verifier.verify(document, edited, 0.999, "lenient")
    assert not verdict.accept and verdict.reason == "too long to compare"
    assert not verifier.verify("", "What is Python?", 0.1, "lenient").accept


def test_bad_strictness_and_stale_artifact_are_refused(verifier: PairVerifier) -> None:
    with pytest.raises(ValueError, match="strictness"):
        verifier.verify("a b c", "a b c", 1.0, "paranoid")
    artifact = json.loads(DEFAULT_ARTIFACT.read_text())
    artifact["features"] = artifact["features"][:-1]
    with pytest.raises(ValueError, match="retrain"):
        PairVerifier.from_artifact(artifact)


def test_pair_set_is_split_by_source_with_enough_must_not_pairs(pairs: list[dict]) -> None:
    assert len(pairs) >= 2000
    assert sum(1 for p in pairs if p["split"] == "test" and p["label"] == 0) >= 300
    split_of: dict[str, set[str]] = {}
    for p in pairs:
        prefix, ids = p["source"].split(":", 1)  # "sharegpt:12+40": two sources, one pair
        for i in ids.split("+"):
            split_of.setdefault(f"{prefix}:{i}", set()).add(p["split"])
    assert all(len(splits) == 1 for splits in split_of.values())
    kinds = {p["kind"] for p in pairs if p["label"] == 0}
    assert {"negation", "antonym", "entity", "number", "scope", "unrelated"} <= kinds


def test_only_a_name_is_read_as_an_acronym(verifier: PairVerifier) -> None:
    """ "GDP" stands for "gross domestic product"; "cat" is not "can a turtle"."""

    def unmatched(a: str, b: str) -> set[str]:
        al = align(analyse(a, verifier.stats), analyse(b, verifier.stats), verifier.stats)
        return set(al.only_a.values()) | set(al.only_b.values())

    assert "gdp" not in unmatched("What is the GDP of France?", "gross domestic product of France")
    assert "cat" in unmatched("What does a cat eat?", "What can a turtle eat?")
