"""The same Qwen2.5 model as three tiers of one gateway, for tool flows on every path: in
process (`local`), and a real `tiergate engine` over HTTP through the direct client
(`direct`) and through litellm (`litellm`). The gateway runs under uvicorn in this process;
the cache is on (an embedded store in a temp folder): tests that want the tier itself
send `no_cache`."""

import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import openai

from gateway.app import create_app
from gateway.policy import parse_policy
from tests.processes import Engine
from tests.servers import eventually, run_uvicorn

T = TypeVar("T")
KEY = "sk-tool-tiers"
QWEN = "qwen2.5-coder-0.5b"
TIERS = ("local", "direct", "litellm")
NO_CACHE = {"cache-control": "no-cache, no-store"}
WEATHER: Any = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}
NAMED: Any = {"type": "function", "function": {"name": "get_weather"}}
ASK: Any = [{"role": "user", "content": "What is the weather in Paris right now?"}]


def policy_text(engine_api: str, store: Path) -> str:
    remote = f"hosted_vllm/qwen, api_base: '{engine_api}'"
    return f"""
auth:
  keys: [{{key: {KEY}, tenant: t}}]
cache: {{enabled: true, store: embedded, path: '{store}'}}
engines:
  {QWEN}: {{kv_cache_mb: 64, max_num_seqs: 4, max_model_len: 2048, num_threads: 1}}
tiers:
  local: {{deployments: [{{model: {QWEN}}}]}}
  direct: {{deployments: [{{model: {remote}, client: auto}}], retries: 0}}
  litellm: {{deployments: [{{model: {remote}, client: litellm}}], retries: 0}}
routes:
  auto: {{default: local}}
"""


@contextlib.contextmanager
def tool_tiers(folder: Path) -> Iterator[openai.OpenAI]:
    """The openai client of a gateway serving the three tiers."""
    engine = Engine(folder / "engine.log", model=QWEN, served="qwen")
    try:
        engine.start()
        policy = parse_policy(policy_text(engine.api_base(), folder / "cache.sqlite3"), env={})
        with run_uvicorn(create_app(policy)) as url:
            yield openai.OpenAI(base_url=f"{url}/v1", api_key=KEY, max_retries=0, timeout=300)
    finally:
        engine.kill()


class CacheSeen:
    """The `x-tiergate-cache` header of each answer a library's client got, read through an
    httpx event hook on the client passed in (the libraries hide the raw responses)."""

    def __init__(self) -> None:
        self.values: list[str | None] = []

    def _seen(self, response: Any) -> None:
        self.values.append(response.headers.get("x-tiergate-cache"))

    async def _seen_async(self, response: Any) -> None:
        self._seen(response)

    def http_client(self) -> openai.DefaultHttpxClient:
        return openai.DefaultHttpxClient(event_hooks={"response": [self._seen]})

    def async_http_client(self) -> openai.DefaultAsyncHttpxClient:
        return openai.DefaultAsyncHttpxClient(event_hooks={"response": [self._seen_async]})

    def client(self, url: str) -> openai.OpenAI:
        http = self.http_client()
        return openai.OpenAI(base_url=url, api_key=KEY, max_retries=0, http_client=http)

    def async_client(self, url: str) -> openai.AsyncOpenAI:
        client = self.async_http_client()
        return openai.AsyncOpenAI(base_url=url, api_key=KEY, max_retries=0, http_client=client)


def asked_twice(
    flow: Callable[[CacheSeen], T], repeat: list[str] | None = None, seconds: float = 60
) -> tuple[T, T]:
    """A flow's result, and its result again once a repeat's requests were answered from the
    cache: each a `hit`, or the headers `repeat` lists (`bypass` for a request the cache
    never serves, such as one whose last turn is a tool result). The store lands after the
    answer is sent: until then a repeat may miss."""
    first = flow(CacheSeen())
    again: list[T] = []

    def from_cache() -> bool:
        seen = CacheSeen()
        again[:] = [flow(seen)]
        return seen.values == (repeat or ["hit"] * max(len(seen.values), 1))

    assert eventually(from_cache, seconds), "the repeat was not answered from the cache"
    return first, again[0]
