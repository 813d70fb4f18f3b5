"""An upstream's answer read into pieces and dressed again (issue 23 (c)): tool calls,
refusal, reasoning and logprobs survive a remote tier, whole and streamed, chat and text.
The remote clients' mapper and the gateway's own Gathered and ChatShape, on fixed JSON."""

import json

from openai.types.chat import ChatCompletion as OaiChat

from engine.entrypoints.openai.protocol import Usage
from engine.entrypoints.openai.shapes import ChatShape
from gateway.api.respond import Gathered
from gateway.backends.upstream import choice_piece

CALL = {"id": "call_up", "type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}}
TOKEN = {"token": "Hi", "logprob": -0.1, "bytes": [72, 105], "top_logprobs": []}


def test_a_whole_message_keeps_its_calls_refusal_reasoning_and_logprobs() -> None:
    message = {"content": None, "tool_calls": [CALL], "refusal": "no", "reasoning_content": "hm"}
    choice = {"index": 0, "message": message, "finish_reason": "tool_calls"}
    choice["logprobs"] = {"content": [TOKEN]}
    answer = Gathered()
    answer.add(choice_piece(choice, is_chat=True, whole=True))
    body = json.loads(ChatShape("m", {"f"}).whole(answer.ended(), Usage.of(1, 1)))
    OaiChat.model_validate(body)  # the openai SDK reads it
    got = body["choices"][0]
    assert got["finish_reason"] == "tool_calls" and got["message"]["content"] is None
    assert got["message"]["tool_calls"] == [CALL]  # the upstream's id kept
    assert (got["message"]["refusal"], got["message"]["reasoning_content"]) == ("no", "hm")
    assert got["logprobs"]["content"][0]["token"] == "Hi"


def test_streamed_deltas_are_read_one_to_one() -> None:
    head = {"index": 0, "id": "call_up", "type": "function", "function": {"name": "f"}}
    args = {"index": 0, "function": {"arguments": '{"a": 1}'}}
    chunks = [
        {"index": 0, "delta": {"reasoning": "hm"}},
        {"index": 0, "delta": {"tool_calls": [head]}},
        {"index": 0, "delta": {"tool_calls": [args]}, "finish_reason": "tool_calls"},
    ]
    pieces = [choice_piece(c, is_chat=True, whole=False) for c in chunks]
    assert pieces[0].reasoning == "hm" and pieces[0].finish_reason is None
    assert [(d.id, d.name, d.arguments) for p in pieces[1:] for d in p.tool_calls or []] == [
        ("call_up", "f", ""),
        (None, None, '{"a": 1}'),
    ]
    answer = Gathered()
    for piece in pieces:
        answer.add(piece)
    assert answer.ended()[0].tool_calls == [CALL]


def test_text_completion_logprobs_come_back_as_entries() -> None:
    raw = {
        "tokens": ["Hi", "!"],
        "token_logprobs": [-0.1, -2.0],
        "top_logprobs": [{"Hi": -0.1, "Yo": -3.0}, None],
    }
    piece = choice_piece({"text": "Hi!", "logprobs": raw}, is_chat=False, whole=True)
    assert piece.finish_reason == "stop" and piece.text == "Hi!"
    entries = piece.logprobs or []
    assert [(e.chosen.token, e.chosen.logprob) for e in entries] == [("Hi", -0.1), ("!", -2.0)]
    assert [t.token for t in entries[0].top] == ["Hi", "Yo"] and entries[1].top == []
