"""One batch line through the same pipeline as a request to its endpoint (limits, cache,
router, tier, stats), at the engines' batch priority and the policy's batch price.

The line runs as a request of the app with no client behind it: the tenant is the batch's
(authenticated when the batch was created), nobody can disconnect, and the answer is read
back from the response the endpoint would have sent.
"""

import asyncio
import json
from typing import Any

from fastapi import FastAPI
from pydantic import ValidationError
from starlette.requests import Request
from starlette.types import Message

from engine.entrypoints.openai.errors import OpenAIError
from gateway.api.deps import key_of_digest
from gateway.api.openai import ShapeOf, chat_shape, serve, text_shape
from gateway.backends.base import BATCH
from gateway.batch.lines import ENDPOINTS, Line
from gateway.batch.objects import answered
from gateway.limits.terms import KeyTerms

SHAPES: dict[str, ShapeOf] = {"/v1/chat/completions": chat_shape, "/v1/completions": text_shape}


async def _no_disconnect() -> Message:
    await asyncio.Event().wait()  # no client: the answer is always read to its end
    raise AssertionError("unreachable")


def _request(app: FastAPI, line: Line, request_id: str, key_digest: str | None) -> Request:
    state: dict[str, Any] = {"request_id": request_id, "priority": BATCH}
    if key_digest is not None:
        state["key_digest"] = key_digest  # the key's own limits apply to its batch's lines
    scope = {
        "type": "http",
        "app": app,
        "method": "POST",
        "path": line.url,
        "headers": [(b"content-type", b"application/json")],
        "query_string": b"",
        "state": state,
    }
    return Request(scope, _no_disconnect)


async def run_line(
    app: FastAPI, tenant: str, key_digest: str | None, line: Line, request_id: str
) -> dict[str, Any]:
    """The line's result for the output or error file: the endpoint's status and body."""
    state = app.state.gateway
    request = _request(app, line, request_id, key_digest)
    try:
        if key_digest is not None:  # the key's own limits, budget and allowed models
            request.state.key_terms = await _terms(request, state.runtime, key_digest)
        body = ENDPOINTS[line.url].model_validate(line.body | {"stream": False})
        response = await serve(request, state, tenant, body, SHAPES[line.url])
    except ValidationError as exc:  # checked at upload: only a changed schema gets here
        return answered(line.custom_id, 400, request_id, OpenAIError(400, str(exc)).body())
    except OpenAIError as exc:
        return answered(line.custom_id, exc.status, request_id, exc.body())
    return answered(line.custom_id, response.status_code, request_id, json.loads(response.body))


async def _terms(request: Request, runtime: Any, digest: str) -> KeyTerms:
    found = await key_of_digest(request, runtime, digest)
    if found is None:
        message = "The API key that created this batch no longer exists or was revoked."
        raise OpenAIError(401, message, code="invalid_api_key")
    return found[1]
