"""A tiny, fast OpenAI-compatible backend: a fixed chat completion, streamed or not.

A bare ASGI app (no framework), so the backend's own cost is small and the same for every
gateway in front of it. Run: python -m bench.stub_backend --port 9000
"""

import argparse
import json
import time
from collections.abc import Awaitable, Callable
from typing import Any

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]

ANSWER = "Hello! I am a stub backend and this is a fixed answer."
PIECES = ANSWER.split(" ")
USAGE = {"prompt_tokens": 12, "completion_tokens": len(PIECES), "total_tokens": 12 + len(PIECES)}
MODELS = json.dumps(
    {"object": "list", "data": [{"id": "stub-model", "object": "model", "owned_by": "bench"}]}
).encode()


async def _read_body(receive: Receive) -> bytes:
    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if not message.get("more_body"):
            return body


async def _respond(send: Send, status: int, body: bytes, content_type: str) -> None:
    length = str(len(body)).encode()
    headers = [(b"content-type", content_type.encode()), (b"content-length", length)]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def completion(model: str) -> bytes:
    return json.dumps(
        {
            "id": "chatcmpl-stub",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": model,
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": ANSWER},
                    "finish_reason": "stop",
                }
            ],
            "usage": USAGE,
        }
    ).encode()


def _chunk(model: str, delta: dict[str, Any], finish: str | None, usage: Any = None) -> bytes:
    body: dict[str, Any] = {
        "id": "chatcmpl-stub",
        "object": "chat.completion.chunk",
        "created": int(time.time()),
        "model": model,
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }
    if usage is not None:  # the usage chunk has no choices, as OpenAI sends it
        body["choices"], body["usage"] = [], usage
    return b"data: " + json.dumps(body).encode() + b"\n\n"


def stream_chunks(model: str, include_usage: bool) -> list[bytes]:
    """Role chunk, one chunk per word, the finish chunk, optional usage, then [DONE]."""
    chunks = [_chunk(model, {"role": "assistant", "content": ""}, None)]
    for i, piece in enumerate(PIECES):
        chunks.append(_chunk(model, {"content": piece if i == 0 else " " + piece}, None))
    chunks.append(_chunk(model, {}, "stop"))
    if include_usage:
        chunks.append(_chunk(model, {}, None, usage=USAGE))
    chunks.append(b"data: [DONE]\n\n")
    return chunks


async def _stream(send: Send, model: str, include_usage: bool) -> None:
    headers = [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache")]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    for chunk in stream_chunks(model, include_usage):
        await send({"type": "http.response.body", "body": chunk, "more_body": True})
    await send({"type": "http.response.body", "body": b""})


async def app(scope: Scope, receive: Receive, send: Send) -> None:
    if scope["type"] == "lifespan":
        while (await receive())["type"] != "lifespan.shutdown":
            await send({"type": "lifespan.startup.complete"})
        await send({"type": "lifespan.shutdown.complete"})
        return
    path, method = scope["path"], scope["method"]
    if method == "GET" and path in ("/v1/models", "/models"):
        await _respond(send, 200, MODELS, "application/json")
    elif method == "GET" and path == "/health":
        await _respond(send, 200, b"{}", "application/json")
    elif method == "POST" and path in ("/v1/chat/completions", "/chat/completions"):
        request = json.loads(await _read_body(receive) or b"{}")
        model = request.get("model", "stub-model")
        if request.get("stream"):
            options = request.get("stream_options") or {}
            await _stream(send, model, bool(options.get("include_usage")))
        else:
            await _respond(send, 200, completion(model), "application/json")
    else:
        await _respond(send, 404, b'{"error": {"message": "not found"}}', "application/json")


def main() -> None:
    import uvicorn

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning", access_log=False)


if __name__ == "__main__":
    main()
