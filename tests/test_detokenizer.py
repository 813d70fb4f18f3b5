"""Incremental detokenization: multi-byte characters and stop strings across tokens."""

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
