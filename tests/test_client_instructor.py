"""instructor's quick-start flows (`instructor.from_openai(client)`, `response_model=` a
pydantic model) in TOOLS mode (its default), TOOLS_STRICT, JSON and JSON_SCHEMA, whole and
as streamed partials, on the three paths of tests/tool_tiers.py, each asked twice so that the
repeat is answered from the cache.

TOOLS modes force the model's tool by name and JSON_SCHEMA sends the schema as
response_format: both are decoded under a grammar, which is what makes Qwen 0.5B's answers
reliable here. JSON mode (a json_object format, the schema only in the prompt) is checked
for a valid model, the fields' wording being the model's."""

from collections.abc import Iterator

import instructor
import pytest
from pydantic import BaseModel

from tests.tool_tiers import TIERS, CacheSeen, asked_twice, tool_tiers

ASK = [{"role": "user", "content": "Which city is the capital of France?"}]


class Capital(BaseModel):
    city: str
    country: str


@pytest.fixture(scope="module")
def url(tmp_path_factory: pytest.TempPathFactory, one_torch_thread: None) -> Iterator[str]:
    with tool_tiers(tmp_path_factory.mktemp("instructor")) as client:
        yield str(client.base_url).rstrip("/")


def patched(url: str, seen: CacheSeen, mode: instructor.Mode | None) -> instructor.Instructor:
    by = {"mode": mode} if mode else {}
    return instructor.from_openai(seen.client(url), **by)


MODES = [None, instructor.Mode.TOOLS_STRICT, instructor.Mode.JSON_SCHEMA, instructor.Mode.JSON]


@pytest.mark.parametrize("mode", MODES, ids=lambda m: m.name if m else "default")
@pytest.mark.parametrize("tier", TIERS)
def test_response_model(url: str, tier: str, mode: instructor.Mode | None) -> None:
    def extract(seen: CacheSeen) -> dict:
        capital = patched(url, seen, mode).chat.completions.create(
            model=tier,
            response_model=Capital,
            messages=ASK,  # type: ignore[arg-type]
            max_tokens=40,
            temperature=0,
            max_retries=0,
        )
        assert isinstance(capital, Capital)
        if mode is not instructor.Mode.JSON:
            assert capital.city == "Paris"
        return capital.model_dump()  # the instance also holds its raw completion

    first, again = asked_twice(extract)
    assert again == first


STREAMED = [None, instructor.Mode.JSON_SCHEMA]


@pytest.mark.parametrize("mode", STREAMED, ids=lambda m: m.name if m else "default")
@pytest.mark.parametrize("tier", TIERS)
def test_streamed_partials(url: str, tier: str, mode: instructor.Mode | None) -> None:
    def partials(seen: CacheSeen) -> list[dict]:
        stream = patched(url, seen, mode).chat.completions.create_partial(
            model=tier,
            response_model=Capital,
            messages=ASK,  # type: ignore[arg-type]
            max_tokens=40,
            temperature=0,
            max_retries=0,
        )
        parts = [part.model_dump() for part in stream]
        assert len(parts) > 1 and parts[-1] == {"city": "Paris", "country": parts[-1]["country"]}
        return parts

    first, again = asked_twice(partials)
    assert again[-1] == first[-1]
