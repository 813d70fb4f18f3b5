"""An OpenAI-shaped upstream that records what it receives and misbehaves on cue.

It stands in for a remote engine where a real one cannot be told to misbehave (a
malformed stream piece, a cut stream, a Retry-After of `inf`). The served model name
picks the behaviour:

  echo          answers "stub answer" (streamed or not), usage with 5 cached tokens; with
                `n`, choice i > 0 answers "stub answer i"
  ratelimit-V   429 with `Retry-After: V`
  badpiece      a good piece, then a piece that is not JSON
  nofinish      pieces, then [DONE] without any finish_reason
  cutchoice     like echo, but streamed choice 1 never gets its finish_reason
  seedbomb      500 when the request's seed is 666, else like echo
  slowbomb      stalls 5 s when the request asks for more than 1000 tokens, else like echo
  stall         stalls 5 s, then like echo
  tinyctx       400 context_length_exceeded, as a server whose context is too small
  leaky500      500 whose body names internal hosts
"""

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

LEAK = "Traceback: connect to internal-db-7.corp:5432 failed (TIERGATE_SECRET_TOKEN)"


def _chunk(model: str, content: str | None, finish: str | None, index: int = 0) -> str:
    delta = {"content": content} if content is not None else {}
    choice = {"index": index, "delta": delta, "finish_reason": finish}
    body = {"id": "c", "object": "chat.completion.chunk", "created": 1, "model": model}
    return "data: " + json.dumps({**body, "choices": [choice]}) + "\n\n"


def _usage() -> dict[str, Any]:
    return {
        "prompt_tokens": 7,
        "completion_tokens": 2,
        "total_tokens": 9,
        "prompt_tokens_details": {"cached_tokens": 5},
    }


def _suffix(index: int) -> str:
    return f" {index}" if index else ""


async def _events(model: str, kind: str, n: int = 1) -> AsyncIterator[str]:
    for i in range(n):
        yield _chunk(model, "stub ", None, i)
    if kind == "badpiece":
        yield "data: {this is not json\n\n"
    for i in range(n):
        yield _chunk(model, "answer" + _suffix(i), None, i)
    if kind != "nofinish":
        for i in range(n):
            if not (kind == "cutchoice" and i == 1):
                yield _chunk(model, None, "stop", i)
        usage = {"id": "c", "object": "chat.completion.chunk", "created": 1, "model": model}
        yield "data: " + json.dumps({**usage, "choices": [], "usage": _usage()}) + "\n\n"
    yield "data: [DONE]\n\n"


def _whole(model: str, n: int = 1) -> JSONResponse:
    choices = [
        {
            "index": i,
            "message": {"role": "assistant", "content": "stub answer" + _suffix(i)},
            "finish_reason": "stop",
        }
        for i in range(n)
    ]
    body = {"id": "c", "object": "chat.completion", "created": 1, "model": model}
    return JSONResponse({**body, "choices": choices, "usage": _usage()})


def _error(status: int, message: str, headers: dict[str, str] | None = None) -> JSONResponse:
    error = {"message": message, "type": "server_error", "param": None, "code": None}
    return JSONResponse({"error": error}, status_code=status, headers=headers)


def upstream_stub() -> FastAPI:
    app = FastAPI()
    app.state.bodies = []  # every JSON body received, in order

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> Response:
        body = await request.json()
        app.state.bodies.append(body)
        model = body["model"]
        if model.startswith("ratelimit-"):
            return _error(429, "slow down", {"Retry-After": model.removeprefix("ratelimit-")})
        if model == "tinyctx":
            error = {"message": "This model's maximum context length is 64 tokens.", "type": "x"}
            body = {"error": {**error, "param": "messages", "code": "context_length_exceeded"}}
            return JSONResponse(body, status_code=400)
        if model == "leaky500" or (model == "seedbomb" and body.get("seed") == 666):
            return _error(500, LEAK)
        if model == "stall" or (model == "slowbomb" and (body.get("max_tokens") or 0) > 1000):
            await asyncio.sleep(5)
        n = body.get("n") or 1
        if body.get("stream"):
            return StreamingResponse(_events(model, model, n), media_type="text/event-stream")
        return _whole(model, n)

    return app
