"""Streams through a gateway whose engine dies midway: two `tiergate engine` processes as two
deployments of one tier, a gateway in this process, and a reader that SIGKILLs the engine
serving a stream after some pieces (as a spot reclaim does). Shared by
tests/test_stream_resume.py and bench/stream_resume.py."""

import contextlib
import json
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from gateway.app import create_app
from gateway.policy import parse_policy
from tests.processes import Engine
from tests.servers import run_uvicorn

KEY = "sk-resume-0123456789"


def policy_text(engines: list[Engine]) -> str:
    """Route `auto` resumes (the default), `fixed` does not; `ordered`: the first engine
    serves whenever it is up, and cooldown 0 brings it back as soon as it restarts."""
    deployments = ", ".join(
        f'{{model: hosted_vllm/smol, api_base: "{e.api_base()}"}}' for e in engines
    )
    return f"""
auth:
  keys: [{{key: {KEY}, tenant: resume}}]
  admin_key: {KEY}-admin
tiers:
  small:
    deployments: [{deployments}]
    balance: ordered
    retries: 0
    cooldown_s: 0
    timeout_s: 120
routes:
  auto: {{default: small}}
  fixed: {{default: small, resume_streams: false}}
"""


@contextlib.contextmanager
def engines_and_gateway(logs: Path, count: int = 2) -> Iterator[tuple[list[Engine], str]]:
    engines = [Engine(logs / f"engine{i}.log") for i in range(count)]
    try:
        for engine in engines:  # both load at once
            engine.launch()
        for engine in engines:
            engine.wait_ready()
        app = create_app(parse_policy(policy_text(engines), env={}))
        with run_uvicorn(app) as url:
            yield engines, url
    finally:
        for engine in engines:
            engine.kill()


@dataclass
class Streamed:
    """What a client read from one SSE stream."""

    text: str = ""
    ids: set[str] = field(default_factory=set)
    finish_reason: str | None = None
    usage: dict | None = None
    error: dict | None = None
    done: bool = False  # the stream ended with [DONE]
    pieces: int = 0  # chunks with text
    arrivals: list[float] = field(default_factory=list)  # when each text chunk came


def body_for(prompt: str, max_tokens: int, chat: bool = True, route: str = "auto") -> dict:
    body: dict = {"model": route, "max_tokens": max_tokens, "temperature": 0, "stream": True}
    body |= {"ignore_eos": True, "stream_options": {"include_usage": True}}
    if chat:
        return body | {"messages": [{"role": "user", "content": prompt}]}
    return body | {"prompt": prompt}


def stream(
    url: str, body: dict, after: int | None = None, action: Callable[[], None] = lambda: None
) -> Streamed:
    """Read the whole stream; `action` (e.g. killing an engine) runs after `after` text
    chunks. Errors in the stream are recorded, not raised."""
    path = "/v1/chat/completions" if "messages" in body else "/v1/completions"
    out = Streamed()
    headers = {"Authorization": f"Bearer {KEY}"}
    with httpx.stream("POST", url + path, json=body, headers=headers, timeout=180) as response:
        assert response.status_code == 200, response.read()
        for line in response.iter_lines():
            if not line.startswith("data: "):
                continue
            data = line[6:]
            if data == "[DONE]":
                out.done = True
                continue
            _read_chunk(out, json.loads(data))
            if after is not None and out.pieces >= after:
                action()
                after = None
    return out


def _read_chunk(out: Streamed, chunk: dict) -> None:
    if "error" in chunk:
        out.error = chunk["error"]
        return
    out.ids.add(chunk["id"])
    out.usage = chunk.get("usage") or out.usage
    for choice in chunk.get("choices") or []:
        delta = choice.get("delta") or {}
        text = choice["text"] if "text" in choice else delta.get("content")
        if text:
            out.text += text
            out.pieces += 1
            out.arrivals.append(time.perf_counter())
        out.finish_reason = choice.get("finish_reason") or out.finish_reason


def metric(url: str, name: str, **labels: str) -> float:
    text = httpx.get(f"{url}/metrics", headers={"Authorization": f"Bearer {KEY}-admin"}).text
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name + "{") and all(f'{k}="{v}"' in line for k, v in labels.items()):
            total += float(line.rsplit(" ", 1)[1])
    return total
