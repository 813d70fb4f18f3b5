"""The same Qwen2.5 model as three tiers of one gateway, for tool flows on every path: in
process (`local`), and a real `tiergate engine` over HTTP through the direct client
(`direct`) and through litellm (`litellm`). The gateway runs under uvicorn in this process;
the cache is on (an embedded store in a temp folder): tests that want the tier itself
send `no_cache`."""

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai

from gateway.app import create_app
from gateway.policy import parse_policy
from tests.processes import Engine
from tests.servers import run_uvicorn

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
    engine.start()
    try:
        policy = parse_policy(policy_text(engine.api_base(), folder / "cache.sqlite3"), env={})
        with run_uvicorn(create_app(policy)) as url:
            yield openai.OpenAI(base_url=f"{url}/v1", api_key=KEY, max_retries=0, timeout=300)
    finally:
        engine.kill()
