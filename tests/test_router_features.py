"""Prompt features: code detection agrees with the old pattern and stays linear in the input."""

import random
import re
import time

import pytest

from gateway.routing.features import extract_features, looks_like_code

# The pattern code detection used before (quadratic on some inputs): the reference for
# what counts as code, on inputs small enough for it.
OLD_PATTERN = re.compile(
    r"```"
    r"|^\s*(def|class|import|from\s+\S+\s+import|function|const|let|var|public|private|"
    r"#include|SELECT|fn|func|package)\b"
    r"|[;{}]\s*$"
    r"|=>|::|\w+\([^)]*\)\s*[{:]",
    re.MULTILINE,
)


@pytest.mark.parametrize(
    "text",
    [
        "def add(a, b):\n    return a + b",
        "  import os",
        "from x import y",
        "int main() {\n}",
        "x = 1;",
        "a => b",
        "std::vector",
        "```\nanything\n```",
        "call(x) :",
        "What is the capital of France?",
        "I like (round) brackets: a lot",
        "Please define class boundaries",
        "",
    ],
)
def test_code_detection_matches_the_old_pattern(text: str) -> None:
    assert looks_like_code(text) == bool(OLD_PATTERN.search(text))


def test_code_detection_agrees_on_random_text() -> None:
    rng = random.Random(3)
    alphabet = ["a", "x", " ", "\n", "(", ")", ":", "{", "}", ";", "=", ">", "def ", "\t"]
    for _ in range(3000):
        text = "".join(rng.choices(alphabet, k=rng.randint(0, 30)))
        assert looks_like_code(text) == bool(OLD_PATTERN.search(text)), repr(text)


@pytest.mark.parametrize(
    "text",
    [
        "x" * 1_000_000,  # froze the gateway for more than 5 minutes
        "\n" * 128_000 + "x",  # the `^\s*(def|...)` branch, likewise
        "f(" * 300_000,  # a `(` with no `)` after it, many times
        "a" + " " * 500_000 + "b",
    ],
)
def test_feature_extraction_is_linear(text: str) -> None:
    started = time.monotonic()
    features = extract_features([{"role": "user", "content": text}], None)
    assert time.monotonic() - started < 5  # the old pattern needed minutes
    assert features.chars == len(text) and features.contains_code is False


def test_code_at_the_end_of_a_huge_prompt_is_still_seen() -> None:
    text = "Summarise this log.\n" + "line of prose\n" * 20_000 + "def main():\n    pass\n"
    assert extract_features(None, text).contains_code
