"""Streams that survive a dying deployment (issue #28.4): a `tiergate engine` subprocess
SIGKILLed mid-stream, the other engine of the tier continuing the same answer.

Three streams run on the first engine when it is killed: a chat and a text completion on a
route that resumes (the default), and a chat on a route with `resume_streams: false`.
Greedy answers: the resumed ones' text equals that of the same request served without the
failure, nothing repeated or missing, one id, usage summed over both engines, the finish
reason the continuation's. The other ends with an error event, as before. Then the engine
left dies mid-stream too: with nowhere to continue, the stream ends with an error event
at once. One kill each, no restarts: the module's time is the engines' start.
"""

import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import pytest

from tests.processes import Engine
from tests.resume_streams import Streamed, body_for, engines_and_gateway, metric, stream

PROMPT = "Write a long story about a lighthouse keeper and a storm."
# A text prompt the model goes on with in plain text: one it answers as a chat instead
# starts with special tokens, which no text carries (docs/operations.md, "Resumed streams")
TEXT_PROMPT = "The lighthouse keeper climbed the stairs as the storm"
MAX_TOKENS = 64
KILL_AFTER = 16  # text pieces each client has read when the serving engine dies
STREAMS = {"chat": (True, "auto"), "completion": (False, "auto"), "off": (True, "fixed")}


def _body(chat: bool, route: str = "auto") -> dict:
    return body_for(PROMPT if chat else TEXT_PROMPT, MAX_TOKENS, chat, route)


@dataclass
class FirstKill:
    clean: dict[str, Streamed]  # the same requests, served without a failure
    cut: dict[str, Streamed]  # served while the first engine died
    continued: float  # requests the second engine served meanwhile
    resumed: float  # tiergate_stream_resumes_total{outcome="resumed"} added


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[list[Engine], str]]:
    with engines_and_gateway(tmp_path_factory.mktemp("resume")) as running:
        yield running


@pytest.fixture(scope="module")
def first_kill(fleet: tuple[list[Engine], str]) -> FirstKill:
    (first, second), url = fleet
    with ThreadPoolExecutor(len(STREAMS)) as pool:  # served by the first (balance: ordered)
        answers = pool.map(lambda how: stream(url, _body(*how)), STREAMS.values())
        clean = dict(zip(STREAMS, answers, strict=True))
    served, resumed = second.requests_served(), _resumed(url)
    reached = {name: threading.Event() for name in STREAMS}
    with ThreadPoolExecutor(len(STREAMS)) as pool:
        futures = {
            name: pool.submit(stream, url, _body(*how), KILL_AFTER, reached[name].set)
            for name, how in STREAMS.items()
        }
        for event in reached.values():
            assert event.wait(120), "a stream never reached the kill point"
        first.kill()  # as a spot reclaim does: SIGKILL, the connections drop
        cut = {name: future.result(timeout=180) for name, future in futures.items()}
    return FirstKill(clean, cut, second.requests_served() - served, _resumed(url) - resumed)


def _resumed(url: str, outcome: str = "resumed") -> float:
    return metric(url, "tiergate_stream_resumes_total", outcome=outcome)


@pytest.mark.parametrize("name", ["chat", "completion"])
def test_a_killed_engine_s_stream_goes_on_on_the_other(first_kill: FirstKill, name: str) -> None:
    clean, cut = first_kill.clean[name], first_kill.cut[name]
    assert clean.done and clean.error is None and clean.finish_reason == "length"
    assert clean.usage["completion_tokens"] == MAX_TOKENS
    assert cut.error is None and cut.done
    assert cut.text == clean.text  # nothing repeated, nothing missing
    assert cut.finish_reason == "length" and len(cut.ids) == 1
    usage, once = cut.usage, clean.usage
    assert usage["completion_tokens"] == once["completion_tokens"]  # counted across both
    # Both engines read the prompt; the second also the text the first had streamed.
    prompt = once["prompt_tokens"]
    assert 2 * prompt + KILL_AFTER <= usage["prompt_tokens"] < 2 * prompt + MAX_TOKENS
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]


def test_the_second_engine_continued_both_and_they_were_counted(first_kill: FirstKill) -> None:
    assert first_kill.continued == 2  # the chat and the completion, not the `off` one
    assert first_kill.resumed == 2


def test_off_per_route_the_stream_ends_with_an_error_event(first_kill: FirstKill) -> None:
    cut = first_kill.cut["off"]
    assert cut.error is not None and cut.done  # an error event, then [DONE]
    assert cut.error["message"].startswith("hosted_vllm/smol")
    assert KILL_AFTER <= cut.pieces < MAX_TOKENS and cut.finish_reason is None
    assert first_kill.clean["off"].text.startswith(cut.text)


def test_when_the_continuation_fails_too_the_error_is_clean(
    fleet: tuple[list[Engine], str], first_kill: FirstKill
) -> None:
    (first, second), url = fleet
    assert first.proc.poll() is not None  # still dead: the second serves, nowhere to go next
    failed = _resumed(url, "failed")
    cut = stream(url, _body(True), KILL_AFTER, second.kill)
    assert cut.error is not None and cut.done  # no hang: one error event, then [DONE]
    assert "continuing elsewhere failed" in cut.error["message"]
    assert KILL_AFTER <= cut.pieces < MAX_TOKENS and cut.finish_reason is None
    assert _resumed(url, "failed") == failed + 1
