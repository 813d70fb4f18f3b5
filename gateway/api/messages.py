"""POST /v1/messages (Anthropic's Messages API) over the chat pipeline.

A request becomes a chat completions request (messages_request.py) and goes through the
same steps as /v1/chat/completions (`openai.serve`: limits, cache, router, tier, stats);
the chat answer comes back as an Anthropic message, or its stream as Anthropic's events.
The key may come as `x-api-key` (Anthropic's SDKs) or as a bearer token; every error is in
Anthropic's shape, `{"type": "error", "error": {"type": ..., "message": ...}}`.
"""

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from engine.entrypoints.openai.errors import OpenAIError
from gateway.api.deps import State, authenticate, parse_body
from gateway.api.messages_output import error_body, whole_message
from gateway.api.messages_request import MessagesRequest, to_chat
from gateway.api.messages_stream import MessagesEvents
from gateway.api.openai import chat_shape, serve
from gateway.api.translated import TranslatedStream, chat_json
from gateway.state import GatewayState

router = APIRouter()


async def _create(request: Request, state: GatewayState) -> Response:
    try:
        tenant = await authenticate(request, state.runtime, x_api_key=True)
        body = await parse_body(request, MessagesRequest)
        chat = to_chat(body)
    except OpenAIError as exc:  # refused before the pipeline, which counts the rest
        state.stats.request_done("-", "-", "-", exc.status)
        raise
    answer = await serve(request, state, tenant, chat, chat_shape)
    if body.stream:
        return TranslatedStream(answer, MessagesEvents(body.model))
    completion = chat_json(answer)
    if completion is None:  # the client left: nothing to translate
        return answer
    return JSONResponse(whole_message(body.model, completion))


@router.post("/v1/messages")
async def create_message(request: Request, state: State) -> Response:
    try:
        return await _create(request, state)
    except OpenAIError as exc:
        body = error_body(exc.status, exc.message)
        return JSONResponse(body, status_code=exc.status, headers=exc.headers)
