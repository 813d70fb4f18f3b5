"""The tool-call parser on fixed strings: Qwen2.5's tagged blocks, bare JSON, and streaming."""

import json

import pytest

from engine.tool_calls import ParsedAnswer, ToolCallStream, parse_tool_calls

NAMES = {"get_weather", "add"}
WEATHER = '{"name": "get_weather", "arguments": {"city": "Paris"}}'


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


def stream(pieces: list[str]) -> tuple[str, ParsedAnswer]:
    s = ToolCallStream(NAMES)
    shown = "".join(s.feed(p) for p in pieces)
    return shown, s.finish()


def test_stream_plain_text_goes_out_at_once_but_a_possible_tag() -> None:
    s = ToolCallStream(NAMES)
    assert s.feed("Hello") == "Hello"
    assert s.feed(" wor") == " wor"
    assert s.feed("ld <tool") == "ld "  # could be the tag: held
    assert s.feed("box>") == "<toolbox>"  # it was not
    assert s.finish() == ParsedAnswer(None)


def test_stream_holds_a_tagged_call_and_parses_it_at_the_end() -> None:
    text = f"Checking.\n<tool_call>\n{WEATHER}\n</tool_call>"
    shown, end = stream([text[i : i + 3] for i in range(0, len(text), 3)])
    assert shown == "Checking.\n"
    assert calls(end) == [("get_weather", {"city": "Paris"})] and end.content is None


def test_stream_holds_bare_json_and_gives_it_back_when_it_is_no_call() -> None:
    shown, end = stream(["  ", "{", '"name": "get_weather", ', '"arguments": {"city": "Paris"}}'])
    assert shown == "" and calls(end) == [("get_weather", {"city": "Paris"})]
    shown, end = stream(["{", '"city": "Paris"}'])
    assert shown == "" and end == ParsedAnswer('{"city": "Paris"}')
    shown, end = stream(["Sure: ", "{", "}"])  # JSON after text is content, as it comes
    assert shown == "Sure: {}" and end == ParsedAnswer(None)
