"""The tool-call parser on fixed strings: Qwen2.5's tagged blocks, bare JSON, and streaming."""

import json

import pytest

from engine.entrypoints.openai.tool_calls import (
    ParsedAnswer,
    ToolCallStream,
    as_deltas,
    merge_deltas,
    parse_tool_calls,
    split_answer,
)

NAMES = {"get_weather", "add"}
WEATHER = '{"name": "get_weather", "arguments": {"city": "Paris"}}'
PARIS = ("get_weather", {"city": "Paris"})


def calls(parsed: ParsedAnswer | None) -> list[tuple[str, dict]]:
    assert parsed is not None
    out = []
    for call in parsed.tool_calls:
        assert call["type"] == "function" and call["id"].startswith("call_")
        out.append((call["function"]["name"], json.loads(call["function"]["arguments"])))
    return out


def test_qwen_tagged_blocks_with_text_around() -> None:
    add = '{"name": "add", "arguments": {"a": 1, "b": 2}}'
    text = f"Let me check.\n<tool_call>\n{WEATHER}\n</tool_call>\n<tool_call>\n{add}\n</tool_call>"
    parsed = parse_tool_calls(text, NAMES)
    assert calls(parsed) == [("get_weather", {"city": "Paris"}), ("add", {"a": 1, "b": 2})]
    assert parsed is not None and parsed.content == "Let me check."
    ids = [c["id"] for c in parsed.tool_calls]
    assert len(set(ids)) == 2


@pytest.mark.parametrize(
    "text",
    [
        WEATHER,
        f"  {WEATHER}\n",
        f"```json\n{WEATHER}\n```",
        f"[{WEATHER}]",
        f"<tool_call>\n{WEATHER}",  # cut before the closing tag (a stop or max_tokens)
        '{"name": "get_weather", "arguments": "{\\"city\\": \\"Paris\\"}"}',
    ],
)
def test_the_forms_small_models_write(text: str) -> None:
    parsed = parse_tool_calls(text, NAMES)
    assert calls(parsed) == [("get_weather", {"city": "Paris"})]
    assert parsed is not None and parsed.content is None


@pytest.mark.parametrize(
    "text",
    [
        "The weather in Paris is sunny.",
        '{"name": "unknown_tool", "arguments": {}}',  # not a declared tool: plain JSON content
        '{"city": "Paris"}',
        "<tool_call>\n{not json}\n</tool_call>",
        '<tool_call>{"name": "get_weather", "arguments": [1]}</tool_call>',
        "[]",
    ],
)
def test_anything_else_stays_content(text: str) -> None:
    assert parse_tool_calls(text, NAMES) is None


def stream(pieces: list[str]) -> tuple[str, list[dict], ParsedAnswer]:
    s = ToolCallStream(NAMES)
    shown, sent = "", []
    for piece in pieces:
        text, calls = s.feed(piece)
        shown, sent = shown + text, sent + calls
    return shown, sent, s.finish()


def test_stream_plain_text_goes_out_at_once_but_a_possible_tag() -> None:
    s = ToolCallStream(NAMES)
    assert s.feed("Hello") == ("Hello", [])
    assert s.feed(" wor") == (" wor", [])
    assert s.feed("ld <tool") == ("ld ", [])  # could be the tag: held
    assert s.feed("box>") == ("<toolbox>", [])  # it was not
    assert s.finish() == ParsedAnswer(None)


def test_stream_sends_each_tagged_call_once_it_closes() -> None:
    text = f"Checking.\n<tool_call>\n{WEATHER}\n</tool_call>\n<tool_call>\n{WEATHER}\n</tool_call>"
    s = ToolCallStream(NAMES)
    cut = text.index("</tool_call>") + len("</tool_call>")
    shown, first = s.feed(text[:cut])
    assert shown == "Checking.\n" and calls(ParsedAnswer(None, first)) == [PARIS]
    shown, second = s.feed(text[cut:])
    assert shown == "" and calls(ParsedAnswer(None, second)) == [PARIS]  # no "\n" between
    assert s.finish() == ParsedAnswer(None)


def test_stream_holds_bare_json_and_gives_it_back_when_it_is_no_call() -> None:
    shown, sent, end = stream(
        ["  ", "{", '"name": "get_weather", ', '"arguments": {"city": "Paris"}}']
    )
    assert shown == "" and not sent and calls(end) == [PARIS]
    shown, sent, end = stream(["{", '"city": "Paris"}'])
    assert shown == "" and end == ParsedAnswer('{"city": "Paris"}')
    shown, sent, end = stream(["Sure: ", "{", "}"])  # JSON after text is content, as it comes
    assert shown == "Sure: {}" and end == ParsedAnswer(None)


CUT = '<tool_call>\n{"name": "get_weather", "arguments": {"ci'


def test_a_call_cut_by_the_end_is_dropped_and_the_complete_ones_kept() -> None:
    """Issue 23 (a): the complete calls, finish_reason tool_calls, no markup in content."""
    text = f"<tool_call>\n{WEATHER}\n</tool_call>\n{CUT}"
    content, tool_calls, reason = split_answer(text, "length", NAMES)
    assert content is None and reason == "tool_calls"
    assert calls(ParsedAnswer(None, tool_calls or [])) == [PARIS]
    shown, sent, end = stream([text[i : i + 5] for i in range(0, len(text), 5)])
    assert shown == "" and calls(ParsedAnswer(None, sent)) == [PARIS] and end == ParsedAnswer(None)


def test_a_lone_cut_call_leaves_no_markup_and_the_reason_as_it_was() -> None:
    assert split_answer(f"Let me look.\n{CUT}", "length", NAMES) == (
        "Let me look.\n",
        None,
        "length",
    )
    assert split_answer("plain text", "length", NAMES) == ("plain text", None, "length")
    assert split_answer(CUT, "length", set()) == (CUT, None, "length")  # no tools: no parsing


def test_deltas_are_openais_id_and_name_first_then_the_arguments() -> None:
    call = {"id": "call_1", "type": "function", "function": {"name": "add", "arguments": "{}"}}
    deltas = as_deltas([call], first=2)
    assert [d.openai() for d in deltas] == [
        {
            "index": 2,
            "id": "call_1",
            "type": "function",
            "function": {"name": "add", "arguments": ""},
        },
        {"index": 2, "function": {"arguments": "{}"}},
    ]
    assert merge_deltas(deltas) == [call]
