"""Resuming a cut answer, decided in the chain with scripted backends (the live path, a
killed `tiergate engine`, is tests/test_stream_resume.py): what the continuation asks,
how tokens and usage add up, and what is never resumed."""

from collections.abc import AsyncIterator

import pytest

from engine.entrypoints.openai.chat_template import check_continuation, continued
from engine.entrypoints.openai.protocol import ChatCompletionRequest, CompletionRequest, Usage
from engine.entrypoints.openai.tool_calls import ToolCallDelta
from engine.errors import InvalidParamError
from gateway.backends.base import BackendError, GenerationRequest, Piece
from gateway.backends.fallback import Cooldowns, FallbackChain, TierBackends
from gateway.policy import parse_policy

POLICY = """
tiers:
  a:
    deployments: [{model: hosted_vllm/a1, api_base: "http://a1"}, {model: openai/a2, api_base: "http://a2"}]
    retries: 0
    fallback: b
  b:
    deployments: [{model: hosted_vllm/b1, api_base: "http://b1"}]
    retries: 0
auth: {mode: none}
"""
CUT = BackendError(502, "a1: the connection failed", retry=False, fallback=True)


class Scripted:
    """Sends its pieces, then fails with `error` (if any); records the requests it got."""

    def __init__(self, name: str, pieces: list[Piece], error: BackendError | None = None):
        self.name, self.pieces, self.error = name, pieces, error
        self.continues_chat = name.startswith("hosted_vllm/")
        self.requests: list[GenerationRequest] = []

    async def generate(self, request: GenerationRequest) -> AsyncIterator[Piece]:
        self.requests.append(request)
        for piece in self.pieces:
            yield Piece(**vars(piece))
        if self.error is not None:
            raise self.error


def chat(**fields: object) -> GenerationRequest:
    body = {"model": "a", "messages": [{"role": "user", "content": "x"}], "max_tokens": 10}
    return GenerationRequest("r", ChatCompletionRequest.model_validate(body | fields), "t")


def chain(backends: dict[str, Scripted]) -> FallbackChain:
    policy = parse_policy(POLICY, env={})
    tiers = {
        name: TierBackends(name, tier, [(d, backends[d.model]) for d in tier.deployments])
        for name, tier in policy.tiers.items()
    }
    return FallbackChain(tiers, Cooldowns(), on_resume=lambda *outcome: events.append(outcome))


events: list[tuple[str, str, str]] = []


def scripted(a1: list[Piece], b1: list[Piece], a2: list[Piece] | None = None) -> dict:
    return {
        "hosted_vllm/a1": Scripted("hosted_vllm/a1", a1, CUT),
        "openai/a2": Scripted("openai/a2", a2 or [Piece("never", "stop")]),
        "hosted_vllm/b1": Scripted("hosted_vllm/b1", b1),
    }


async def read(served_pieces: AsyncIterator[Piece]) -> tuple[str, list[Piece]]:
    pieces = [piece async for piece in served_pieces]
    return "".join(p.text for p in pieces), pieces


async def test_a_cut_chat_goes_on_where_it_stopped_with_usage_summed() -> None:
    so_far = [Usage.of(5, 1), Usage.of(5, 2)]
    first = [Piece("Hello", so_far=so_far[0]), Piece(" wor", so_far=so_far[1])]
    rest = [Piece("ld", so_far=Usage.of(7, 1)), Piece("!", "length", Usage.of(7, 8))]
    backends = scripted(first, rest)
    served = await chain(backends).open(chat(), "a", resume=True)
    text, pieces = await read(served.pieces)
    assert text == "Hello world!" and pieces[-1].finish_reason == "length"
    assert pieces[-1].usage == Usage.of(5 + 7, 2 + 8)  # both prompts, every token
    # openai/a2 cannot continue a chat: the fallback tier's vLLM-style deployment did
    (again,) = backends["hosted_vllm/b1"].requests
    assert backends["openai/a2"].requests == []
    body = again.body
    assert body.continue_final_message and not body.add_generation_prompt
    assert [m.role for m in body.messages] == ["user", "assistant"]
    assert body.messages[-1].content == "Hello wor" and body.max_tokens == 10 - 2
    assert events[-1] == ("a", "b", "resumed")


async def test_without_usage_so_far_a_piece_counts_as_a_token() -> None:
    rest = [Piece("c", "stop", Usage.of(9, 1))]
    backends = scripted([Piece("a"), Piece("b")], rest)
    served = await chain(backends).open(chat(), "a", resume=True)
    text, pieces = await read(served.pieces)
    assert text == "abc"
    assert backends["hosted_vllm/b1"].requests[0].body.max_tokens == 8
    # the first attempt's prompt: the continuation's less the 2 tokens it was given
    assert pieces[-1].usage == Usage.of(7 + 9, 2 + 1)


async def test_a_text_completion_gets_the_text_appended_on_any_deployment() -> None:
    body = CompletionRequest.model_validate({"model": "a", "prompt": "Once", "max_tokens": 5})
    backends = scripted([Piece(" upon")], [], a2=[Piece(" a time", "length", Usage.of(2, 4))])
    served = await chain(backends).open(GenerationRequest("r", body, "t"), "a", resume=True)
    text, pieces = await read(served.pieces)
    assert text == " upon a time"
    (again,) = backends["openai/a2"].requests
    assert again.body.prompt == "Once upon" and again.body.max_tokens == 4
    assert pieces[-1].usage == Usage.of(1 + 2, 1 + 4)


async def test_a_caller_s_own_prefix_is_kept_before_the_text() -> None:
    messages = [{"role": "user", "content": "x"}, {"role": "assistant", "content": "Sure:"}]
    request = chat(messages=messages, continue_final_message=True, add_generation_prompt=False)
    backends = scripted([Piece(" one")], [Piece(" two", "stop", Usage.of(3, 1))])
    served = await chain(backends).open(request, "a", resume=True)
    assert (await read(served.pieces))[0] == " one two"
    again = backends["hosted_vllm/b1"].requests[0].body
    assert len(again.messages) == 2 and again.messages[-1].content == "Sure: one"


@pytest.mark.parametrize(
    "request_, first, resume",
    [
        (chat(), [Piece("a")], False),  # the route's resume_streams: false
        (chat(tools=[{"type": "function", "function": {"name": "f"}}]), [Piece("a")], True),
        (chat(response_format={"type": "json_object"}), [Piece("{")], True),
        (chat(), [Piece(tool_calls=[ToolCallDelta(0, "c1", "f", "")])], True),
        (chat(), [Piece(reasoning="hmm")], True),
        (chat(), [Piece("a", "stop")], True),  # the finish reason went out: nothing to do
    ],
    ids=["off", "tools", "response-format", "tool-call-sent", "reasoning", "finished"],
)
async def test_what_is_never_resumed_ends_with_the_error(
    request_: GenerationRequest, first: list[Piece], resume: bool
) -> None:
    backends = scripted(first, [Piece("b", "stop")])
    served = await chain(backends).open(request_, "a", resume=resume)
    with pytest.raises(BackendError) as failed:
        await read(served.pieces)
    assert failed.value is CUT
    assert backends["hosted_vllm/b1"].requests == []


async def test_nowhere_to_continue_is_one_clean_error() -> None:
    backends = scripted([Piece("a")], [])
    backends["hosted_vllm/b1"].error = BackendError(502, "b1: down", True, True)
    served = await chain(backends).open(chat(), "a", resume=True)
    with pytest.raises(BackendError) as failed:
        await read(served.pieces)
    assert failed.value.status == 502 and not failed.value.fallback
    assert "continuing elsewhere failed" in failed.value.message
    assert events[-1] == ("a", "-", "failed")


async def test_a_continuation_cut_too_goes_on_once_more() -> None:
    backends = scripted([Piece("a")], [Piece("c", "stop", Usage.of(4, 1))])
    backends["openai/a2"].continues_chat = True  # tried next, and cut as well
    backends["openai/a2"].pieces, backends["openai/a2"].error = [Piece("b")], CUT
    served = await chain(backends).open(chat(), "a", resume=True)
    text, pieces = await read(served.pieces)
    assert text == "abc" and pieces[-1].usage.completion_tokens == 3
    again = backends["hosted_vllm/b1"].requests[0].body
    assert again.messages[-1].content == "ab" and again.max_tokens == 8


def test_the_rendered_chat_is_cut_after_the_final_message() -> None:
    rendered = "<|im_start|>user\nx<|im_end|>\n<|im_start|>assistant\nHello<|im_end|>\n"
    want = "<|im_start|>user\nx<|im_end|>\n<|im_start|>assistant\nHello"
    assert continued(rendered, "Hello") == want
    assert continued(rendered, "Hello  ").endswith("assistant\nHello")  # a trimming template
    with pytest.raises(InvalidParamError):
        continued(rendered, "Goodbye")


@pytest.mark.parametrize(
    "fields",
    [
        {"continue_final_message": True},  # add_generation_prompt defaults to true
        {"continue_final_message": True, "add_generation_prompt": False},  # user message last
    ],
)
def test_continue_final_message_needs_an_assistant_message_last(fields: dict) -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": "x"}], **fields}
    with pytest.raises(InvalidParamError) as refused:
        check_continuation(ChatCompletionRequest.model_validate(body))
    assert refused.value.param == "continue_final_message"
