"""POST /v1/responses (OpenAI's Responses API) over the chat pipeline; GET and DELETE
/v1/responses/{id} for stored responses.

A request becomes a chat completions request (responses_request.py) and goes through the
same steps as /v1/chat/completions (`openai.serve`: limits, cache, router, tier, stats);
the chat answer comes back as a response object, or its stream as the Responses events.
"""

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from engine.entrypoints.openai.errors import OpenAIError
from gateway.api import response_store
from gateway.api.deps import State, authenticate, parse_body
from gateway.api.openai import chat_shape, serve
from gateway.api.responses_output import ResponseHead, as_chat_messages, whole_response
from gateway.api.responses_request import ResponsesRequest, input_messages, to_chat
from gateway.api.responses_stream import ResponsesEvents
from gateway.api.translated import TranslatedStream, chat_json
from gateway.state import GatewayState

router = APIRouter()


def _not_found(response_id: str, param: str | None = None) -> OpenAIError:
    message = f"Response with id '{response_id}' not found."
    return OpenAIError(404, message, param=param, code="response_not_found")


async def _history(state: GatewayState, tenant: str, body: ResponsesRequest) -> list[dict]:
    """The stored conversation `previous_response_id` continues (the tenant's own only)."""
    if body.previous_response_id is None:
        return []
    stored = await response_store.load(state.cache, tenant, body.previous_response_id)
    if stored is None:
        raise _not_found(body.previous_response_id, "previous_response_id")
    return stored["messages"]


async def _create(request: Request, state: GatewayState) -> Response:
    try:
        tenant = await authenticate(request, state.runtime)
        body = await parse_body(request, ResponsesRequest)
        history = await _history(state, tenant, body)
        chat = to_chat(body, history)
    except OpenAIError as exc:  # refused before the pipeline, which counts the rest
        state.stats.request_done("-", "-", "-", exc.status)
        raise
    asked = history + input_messages(body)

    async def save(response: dict[str, Any] | None) -> None:
        if body.store and response is not None:
            messages = asked + as_chat_messages(response["output"])
            await response_store.save(state.cache, tenant, response, messages)

    head = ResponseHead(body)
    answer = await serve(request, state, tenant, chat, chat_shape)
    if body.stream:
        events = ResponsesEvents(head)
        return TranslatedStream(answer, events, lambda: save(events.final))
    completion = chat_json(answer)
    if completion is None:  # the client left: nothing to translate
        return answer
    response = whole_response(head, completion)
    await save(response)
    return JSONResponse(response)


@router.post("/v1/responses")
async def create_response(request: Request, state: State) -> Response:
    return await _create(request, state)


@router.get("/v1/responses/{response_id}")
async def get_response(response_id: str, request: Request, state: State) -> dict:
    tenant = await authenticate(request, state.runtime)
    stored = await response_store.load(state.cache, tenant, response_id)
    if stored is None:
        raise _not_found(response_id)
    return stored["response"]


@router.delete("/v1/responses/{response_id}")
async def delete_response(response_id: str, request: Request, state: State) -> dict:
    tenant = await authenticate(request, state.runtime)
    if not await response_store.delete(state.cache, tenant, response_id):
        raise _not_found(response_id)
    return {"id": response_id, "object": "response", "deleted": True}
