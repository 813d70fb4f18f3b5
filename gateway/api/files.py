"""/v1/files for the Batch API: upload a batch input file (multipart, purpose "batch",
JSONL checked line by line), read a file or its content, list and delete the tenant's own.

Files live in the cache's store (gateway/batch/store.py); another tenant's id is a 404.
"""

from fastapi import APIRouter, Request
from fastapi.responses import Response
from starlette.datastructures import UploadFile

from engine.entrypoints.openai.errors import OpenAIError
from gateway.api.deps import State, authenticate
from gateway.batch.lines import parse_lines
from gateway.batch.objects import FILE_PURPOSES, file_object, page
from gateway.batch.runner import BatchRunner

router = APIRouter()
_MB = 1024 * 1024


def _not_found(file_id: str) -> OpenAIError:
    return OpenAIError(404, f"No such File object: {file_id}", param="id", code="file_not_found")


async def _upload(request: Request) -> tuple[UploadFile, str]:
    try:
        form = await request.form(max_files=1, max_fields=8)
    except Exception:  # not multipart, or a broken one
        raise OpenAIError(400, "Send the file as multipart/form-data.", param="file") from None
    purpose, upload = form.get("purpose"), form.get("file")
    if purpose not in FILE_PURPOSES:
        message = f"purpose must be one of {', '.join(FILE_PURPOSES)}; got {purpose!r}."
        raise OpenAIError(400, message, param="purpose")
    if not isinstance(upload, UploadFile):
        raise OpenAIError(400, "The multipart body needs a `file` part.", param="file")
    return upload, purpose


async def _content(upload: UploadFile, max_mb: float) -> str:
    cap = int(max_mb * _MB)
    data = await upload.read(cap + 1)
    if len(data) > cap:
        message = f"The file is larger than batch.max_file_mb ({max_mb:g} MB)."
        raise OpenAIError(413, message, param="file", code="file_too_large")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise OpenAIError(400, "The file is not UTF-8 text (JSONL).", param="file") from None


@router.post("/v1/files")
async def create_file(request: Request, state: State) -> dict:
    tenant = await authenticate(request, state.runtime)
    upload, purpose = await _upload(request)
    content = await _content(upload, state.runtime.policy.batch.max_file_mb)
    parse_lines(content)  # a bad line is refused now, not when a batch runs it
    meta = file_object(upload.filename or "batch.jsonl", len(content.encode()), purpose)
    await BatchRunner.of(request).store().put_file(tenant, meta, content)
    return meta


@router.get("/v1/files")
async def list_files(
    request: Request,
    state: State,
    purpose: str | None = None,
    limit: int = 100,
    after: str | None = None,
) -> dict:
    tenant = await authenticate(request, state.runtime)
    store = BatchRunner.of(request).store()
    ids = list(reversed(await store.file_ids(tenant)))  # newest first
    if after is not None and after in ids:
        ids = ids[ids.index(after) + 1 :]
    limit = min(max(limit, 1), 10_000)
    found: list[dict] = []
    for file_id in ids:
        meta = await store.file(tenant, file_id)
        if meta is not None and purpose in (None, meta["purpose"]):
            found.append(meta)
        if len(found) > limit:
            break
    return page(found[:limit], len(found) > limit)


@router.get("/v1/files/{file_id}")
async def get_file(file_id: str, request: Request, state: State) -> dict:
    tenant = await authenticate(request, state.runtime)
    meta = await BatchRunner.of(request).store().file(tenant, file_id)
    if meta is None:
        raise _not_found(file_id)
    return meta


@router.get("/v1/files/{file_id}/content")
async def file_content(file_id: str, request: Request, state: State) -> Response:
    tenant = await authenticate(request, state.runtime)
    content = await BatchRunner.of(request).store().file_content(tenant, file_id)
    if content is None:
        raise _not_found(file_id)
    return Response(content.encode(), media_type="application/octet-stream")


@router.delete("/v1/files/{file_id}")
async def delete_file(file_id: str, request: Request, state: State) -> dict:
    tenant = await authenticate(request, state.runtime)
    if not await BatchRunner.of(request).store().delete_file(tenant, file_id):
        raise _not_found(file_id)
    return {"id": file_id, "object": "file", "deleted": True}
