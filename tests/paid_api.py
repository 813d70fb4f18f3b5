"""A stand-in for a paid OpenAI-compatible API (which cannot be called from tests).

It answers every chat completion at once with usage derived from the request, so a test
knows each answer's exact tokens: prompt = words in the messages, completion = max_tokens
(default 2). Its `calls` counts what reached it.
"""

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse


def usage_of(messages: list[dict], max_tokens: int | None) -> tuple[int, int]:
    prompt = sum(len(str(m.get("content", "")).split()) for m in messages)
    return prompt, max_tokens or 2


def paid_api_app() -> FastAPI:
    app = FastAPI()
    app.state.calls = 0

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> JSONResponse:
        app.state.calls += 1
        body = await request.json()
        prompt, completion = usage_of(body["messages"], body.get("max_tokens"))
        return JSONResponse(
            {
                "id": f"chatcmpl-paid-{app.state.calls}",
                "object": "chat.completion",
                "created": 1,
                "model": body["model"],
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": "paid " * completion},
                        "finish_reason": "length",
                    }
                ],
                "usage": {
                    "prompt_tokens": prompt,
                    "completion_tokens": completion,
                    "total_tokens": prompt + completion,
                },
            }
        )

    return app
