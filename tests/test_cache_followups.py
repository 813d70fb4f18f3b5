"""Follow-ups ("make it shorter", "and in French?") are only ever served their own
conversation's answer, through the live gateway with the openai client: the earlier turns
are in the cache's scope, a `previous_response_id` chain is expanded into them, and a
Responses `conversation` (turns the gateway cannot read) is refused, not dropped.

The upstream answers with a digest of the messages it got (bench/cache_followups.py's), so
a served answer names the conversation that first got it.
"""

import time
from collections.abc import Iterator

import openai
import pytest

from bench.cache_followups import digest, upstream
from gateway.app import create_app
from gateway.policy import parse_policy
from tests.servers import run_uvicorn

KEY = "sk-followups-tenant-01"
HAIKU = [
    {"role": "user", "content": "Write a haiku about autumn"},
    {"role": "assistant", "content": "Red leaves drift and fall / the cold wind hums a low song"},
]
LIMERICK = [
    {"role": "user", "content": "Write a limerick about a cat"},
    {
        "role": "assistant",
        "content": "There once was a cat from Peru / who dreamed she was eating a shoe",
    },
]


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[openai.OpenAI]:
    path = tmp_path_factory.mktemp("followups") / "cache.sqlite3"
    with run_uvicorn(upstream()) as up:
        text = f"""
auth: {{keys: [{{key: {KEY}, tenant: acme}}]}}
cache: {{enabled: true, path: {path}}}
tiers:
  stand_in: {{deployments: [{{model: openai/stand-in, api_base: "{up}/v1"}}]}}
routes:
  auto: {{default: stand_in}}
"""
        with run_uvicorn(create_app(parse_policy(text, env={}))) as base:
            yield openai.OpenAI(base_url=f"{base}/v1", api_key=KEY, max_retries=0)


def chat(client: openai.OpenAI, messages: list[dict]) -> tuple[str, str]:
    raw = client.chat.completions.with_raw_response.create(
        model="auto", messages=messages, temperature=0
    )
    return raw.headers["x-tiergate-cache"], raw.parse().choices[0].message.content


def settle() -> None:
    time.sleep(0.5)  # stores run after the answer went out


def test_a_followup_is_served_only_after_its_own_earlier_turns(client: openai.OpenAI) -> None:
    shorter = {"role": "user", "content": "make it shorter"}
    status, haiku_answer = chat(client, [*HAIKU, shorter])
    assert status == "miss" and haiku_answer == f"answer {digest([*HAIKU, shorter])}"
    settle()
    status, answer = chat(client, [*LIMERICK, shorter])
    assert status == "miss" and answer != haiku_answer  # another conversation: its own
    assert chat(client, [shorter]) == ("miss", f"answer {digest([shorter])}")  # no turns
    settle()
    assert chat(client, [*HAIKU, shorter]) == ("hit", haiku_answer)  # the same conversation
    assert chat(client, [*HAIKU, {"role": "user", "content": "Make it shorter."}])[0] == "hit"
    longer = chat(client, [*HAIKU, {"role": "user", "content": "make it longer"}])
    assert longer[0] == "miss"  # same turns, the opposite ask: the verifier's veto


def test_previous_response_id_keeps_followups_apart(client: openai.OpenAI) -> None:
    first = client.responses.create(model="auto", input="Write a haiku about the sea")
    other = client.responses.create(model="auto", input="Write a haiku about the desert")

    def follow(previous: str):
        raw = client.responses.with_raw_response.create(
            model="auto", input="and in French?", previous_response_id=previous
        )
        return raw.headers["x-tiergate-cache"], raw.parse().output_text

    status, sea = follow(first.id)
    assert status == "miss"
    settle()
    status, desert = follow(other.id)
    assert status == "miss" and desert != sea
    settle()
    assert follow(first.id) == ("hit", sea)


def test_a_conversation_object_is_refused_not_dropped(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as refused:
        client.responses.create(model="auto", input="continue", conversation="conv_123")
    assert refused.value.body["param"] == "conversation"
    assert "previous_response_id" in refused.value.body["message"]
