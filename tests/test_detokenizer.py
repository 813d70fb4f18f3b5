"""Incremental detokenization: multi-byte characters and stop strings across tokens."""

import random
import time

from engine.detokenizer import IncrementalDetokenizer
from tests.fake_runner import FakeTokenizer

TOK = FakeTokenizer()


def _run(tokens: list[int], stop: list[str], prompt: str = "Q: ") -> tuple[list[str], str, bool]:
    d = IncrementalDetokenizer(TOK, TOK.encode(prompt), stop)
    deltas = [d.add(t) for t in tokens]
    if not d.stopped:
        deltas.append(d.flush())
    return deltas, "".join(deltas), d.stopped


def test_plain_text_streams_token_by_token() -> None:
    deltas, text, stopped = _run(TOK.encode("hello"), [])
    assert deltas[:5] == ["h", "e", "l", "l", "o"] and text == "hello" and not stopped


def test_multibyte_character_waits_for_all_bytes() -> None:
    deltas, text, _ = _run(TOK.encode("é!"), [])
    assert deltas[0] == "" and deltas[1] == "é" and text == "é!"


def test_stop_string_inside_one_token() -> None:
    _, text, stopped = _run([*TOK.encode("xy"), 258, *TOK.encode("zz")], ["\n"])  # "c\n"
    assert stopped and text == "xyc"


def test_stop_string_across_tokens_is_held_back_then_dropped() -> None:
    tokens = [*TOK.encode("say "), 257, *TOK.encode("cd")]  # "say " "ab" "c" "d"
    deltas, text, stopped = _run(tokens, ["abcd"])
    assert stopped and text == "say "
    assert "".join(deltas[:4]) == "say " and deltas[4:] == ["", "", ""]


def test_partial_match_that_fails_is_released() -> None:
    deltas, text, stopped = _run(TOK.encode("abx"), ["abc"])
    assert not stopped and text == "abx"
    assert deltas[:3] == ["", "", "abx"]


def test_held_text_flushed_when_request_ends_otherwise() -> None:
    deltas, text, stopped = _run(TOK.encode("xab"), ["abc"])
    assert not stopped and deltas[-1] == "ab" and text == "xab"


def test_earliest_of_several_stop_strings_wins() -> None:
    _, text, stopped = _run([*TOK.encode("1 "), 259, *TOK.encode(" x"), 260], ["end", "ST"])
    assert stopped and text == "1 "


def test_stop_string_spanning_multibyte_boundary() -> None:
    _, text, stopped = _run(TOK.encode("aé b"), ["é"])
    assert stopped and text == "a"


def _first_stop_reference(text: str, stops: list[str]) -> int | None:
    """Where the text is cut: the stop string that completes first (longest on a tie)."""
    ends = [(text.find(s) + len(s), -len(s)) for s in stops if s and s in text]
    if not ends:
        return None
    end, neg_len = min(ends)
    return end + neg_len


def test_stop_matching_agrees_with_a_plain_search() -> None:
    rng = random.Random(7)
    for _ in range(300):
        stops = ["".join(rng.choices("abc", k=rng.randint(1, 4))) for _ in range(3)]
        out = "".join(rng.choices("abc", k=rng.randint(0, 12)))
        deltas, text, stopped = _run(TOK.encode(out), stops, prompt="")
        cut = _first_stop_reference(out, stops)
        assert stopped == (cut is not None)
        assert text == (out if cut is None else out[:cut]), (stops, out)
        if not stopped:  # held text comes out at the end, never earlier than it is safe
            assert "".join(deltas[:-1]) == text[: len(text) - len(deltas[-1])]


def test_long_stop_lists_cost_little_per_token() -> None:
    # Regression: 2,000 stop strings plus one of 20,000 characters cost ~215 ms per token
    # (every step rescanned every stop string over the held-back tail), so 2,000 tokens took
    # minutes; matching now costs O(new text) per token.
    stops = [f"never-{i}" for i in range(2000)] + ["b" * 20_000]
    d = IncrementalDetokenizer(TOK, TOK.encode("Q: "), stops)
    out = "a" * 2000
    started = time.monotonic()
    deltas = [d.add(t) for t in TOK.encode(out)]
    assert time.monotonic() - started < 20  # the old code needed several minutes
    assert not d.stopped and "".join(deltas) == out
