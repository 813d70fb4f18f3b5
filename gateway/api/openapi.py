"""The gateway's OpenAPI document: the request and response bodies the handlers really take.

The completion handlers read their bodies by hand (so a bad body is OpenAI's 400, not
FastAPI's 422), which leaves FastAPI's generated document without request bodies. This
fills them in from the same pydantic models the handlers validate with, declares every
error status as an OpenAI error body, and names the bearer scheme, so clients and fuzzers
(schemathesis in the tests) read one correct contract.
"""

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel

from engine.entrypoints.openai.error_bodies import ErrorResponse
from engine.entrypoints.openai.protocol import (
    ChatCompletion,
    ChatCompletionRequest,
    Completion,
    CompletionRequest,
    ModelList,
)

_BODIES: dict[str, tuple[type[BaseModel], type[BaseModel]]] = {
    "/v1/chat/completions": (ChatCompletionRequest, ChatCompletion),
    "/v1/completions": (CompletionRequest, Completion),
}
_ERRORS = {
    "400": "Invalid body, unknown parameter value, or prompt too long",
    "401": "Missing, wrong, revoked or expired API key",
    "404": "Unknown model, or one the key may not use",
    "413": "Body larger than server.max_body_bytes",
    "429": "Rate limited, over budget or the engine's queue is full (see Retry-After)",
    "502": "Every deployment of the tier and its fallbacks failed",
    "503": "No deployment available, or the managed keys' store is down",
    "504": "Every deployment timed out",
}


def _ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


def _add_model(schemas: dict[str, Any], model: type[BaseModel], mode: str) -> dict[str, str]:
    schema = model.model_json_schema(ref_template="#/components/schemas/{model}", mode=mode)
    schemas.update(schema.pop("$defs", {}))
    schemas[model.__name__] = schema
    return _ref(model.__name__)


def _error_responses(schemas: dict[str, Any]) -> dict[str, Any]:
    error = _add_model(schemas, ErrorResponse, "serialization")
    body = {"content": {"application/json": {"schema": error}}}
    return {status: {"description": text, **body} for status, text in _ERRORS.items()}


def _completion_operation(
    operation: dict[str, Any], schemas: dict[str, Any], request: type[BaseModel], answer: type
) -> None:
    operation["requestBody"] = {
        "required": True,
        "content": {"application/json": {"schema": _add_model(schemas, request, "validation")}},
    }
    answer_ref = _add_model(schemas, answer, "serialization")
    operation["responses"] = {
        "200": {
            "description": "The answer; `stream: true` sends it as server-sent events",
            "content": {
                "application/json": {"schema": answer_ref},
                "text/event-stream": {"schema": {"type": "string"}},
            },
        },
        **_error_responses(schemas),
    }
    operation["security"] = [{"bearer": []}]


def build_openapi(app: FastAPI) -> dict[str, Any]:
    document = get_openapi(title=app.title, version=app.version, routes=app.routes)
    components = document.setdefault("components", {})
    schemas = components.setdefault("schemas", {})
    components["securitySchemes"] = {"bearer": {"type": "http", "scheme": "bearer"}}
    for path, (request, answer) in _BODIES.items():
        _completion_operation(document["paths"][path]["post"], schemas, request, answer)
    models = document["paths"]["/v1/models"]["get"]
    model_list = _add_model(schemas, ModelList, "serialization")
    ok = {"description": "Routes, tiers and models"}
    ok["content"] = {"application/json": {"schema": model_list}}
    models["responses"] = {"200": ok, "401": _error_responses(schemas)["401"]}
    models["security"] = [{"bearer": []}]
    return document


def install_openapi(app: FastAPI) -> None:
    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            app.openapi_schema = build_openapi(app)
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
