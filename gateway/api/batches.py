"""/v1/batches: create a batch from an uploaded file, read it, list the tenant's own,
cancel it. The lines run in the background (gateway/batch/runner.py) through the same
pipeline as /v1/chat/completions, at the engines' batch priority and the batch price."""

from typing import Any

from fastapi import APIRouter, Request
from pydantic import BaseModel, ConfigDict, Field

from engine.entrypoints.openai.errors import OpenAIError
from gateway.api.deps import State, authenticate, parse_body
from gateway.batch.lines import ENDPOINTS, endpoint_of, parse_lines
from gateway.batch.objects import COMPLETION_WINDOWS, batch_object, page, public
from gateway.batch.runner import BatchRunner

router = APIRouter()


class BatchRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    input_file_id: str = Field(min_length=1, max_length=200)
    endpoint: str
    completion_window: str
    metadata: dict[str, str] | None = Field(default=None, max_length=16)
    output_expires_after: dict[str, Any] | None = None  # accepted; outputs live 30 days


def _not_found(batch_id: str) -> OpenAIError:
    return OpenAIError(404, f"No batch found with id '{batch_id}'.", param="id")


async def _checked(request: Request, tenant: str, body: BatchRequest) -> int:
    """The number of requests in the batch's file, after checking it fits the request."""
    if body.endpoint not in ENDPOINTS:
        message = f"endpoint must be one of {', '.join(ENDPOINTS)}."
        raise OpenAIError(400, message, param="endpoint")
    if body.completion_window not in COMPLETION_WINDOWS:
        message = f"completion_window must be one of {', '.join(COMPLETION_WINDOWS)}."
        raise OpenAIError(400, message, param="completion_window")
    store = BatchRunner.of(request).store()
    meta = await store.file(tenant, body.input_file_id)
    content = await store.file_content(tenant, body.input_file_id)
    if meta is None or content is None:
        message = f"No such File object: {body.input_file_id}"
        raise OpenAIError(400, message, param="input_file_id", code="file_not_found")
    if meta["purpose"] != "batch":
        message = "The input file's purpose must be 'batch'."
        raise OpenAIError(400, message, param="input_file_id")
    lines = parse_lines(content)
    if endpoint_of(lines) != body.endpoint:
        message = f"The file's lines call {endpoint_of(lines)}, not {body.endpoint}."
        raise OpenAIError(400, message, param="endpoint")
    return len(lines)


@router.post("/v1/batches")
async def create_batch(request: Request, state: State) -> dict:
    tenant = await authenticate(request, state.runtime)
    body = await parse_body(request, BatchRequest)
    total = await _checked(request, tenant, body)
    batch = batch_object(
        body.input_file_id, body.endpoint, body.completion_window, body.metadata, total
    )
    batch["_key_digest"] = getattr(request.state, "key_digest", None)  # its key's limits
    runner = BatchRunner.of(request)
    await runner.store().put_batch(tenant, batch, new=True)
    runner.start(tenant, batch["id"])
    return public(batch)


@router.get("/v1/batches")
async def list_batches(
    request: Request, state: State, limit: int = 20, after: str | None = None
) -> dict:
    tenant = await authenticate(request, state.runtime)
    store = BatchRunner.of(request).store()
    ids = list(reversed(await store.batch_ids(tenant)))  # newest first
    if after is not None and after in ids:
        ids = ids[ids.index(after) + 1 :]
    limit = min(max(limit, 1), 100)
    found: list[dict] = []
    for batch_id in ids:
        if (batch := await store.batch(tenant, batch_id)) is not None:
            found.append(public(batch))
        if len(found) > limit:
            break
    return page(found[:limit], len(found) > limit)


@router.get("/v1/batches/{batch_id}")
async def get_batch(batch_id: str, request: Request, state: State) -> dict:
    tenant = await authenticate(request, state.runtime)
    batch = await BatchRunner.of(request).store().batch(tenant, batch_id)
    if batch is None:
        raise _not_found(batch_id)
    return public(batch)


@router.post("/v1/batches/{batch_id}/cancel")
async def cancel_batch(batch_id: str, request: Request, state: State) -> dict:
    tenant = await authenticate(request, state.runtime)
    batch = await BatchRunner.of(request).cancel(tenant, batch_id)
    if batch is None:
        raise _not_found(batch_id)
    return public(batch)
