"""The Batch API's objects as OpenAI's API (and so the openai SDK) shapes them: a file, a
batch, a list page, and the lines of a batch's output and error files."""

import json
import time
import uuid
from typing import Any

FILE_PURPOSES = ("batch",)  # what /v1/files accepts; outputs are written as "batch_output"
COMPLETION_WINDOWS = {"24h": 24 * 3600}
# A batch's statuses: it ends in one of ENDED.
ENDED = ("completed", "failed", "cancelled", "expired")


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


def file_object(name: str, size: int, purpose: str) -> dict[str, Any]:
    return {
        "id": new_id("file"),
        "object": "file",
        "bytes": size,
        "created_at": int(time.time()),
        "filename": name,
        "purpose": purpose,
        "status": "processed",
        "expires_at": None,
        "status_details": None,
    }


def batch_object(
    input_file_id: str, endpoint: str, window: str, metadata: dict | None, total: int
) -> dict[str, Any]:
    now = int(time.time())
    return {
        "id": new_id("batch"),
        "object": "batch",
        "endpoint": endpoint,
        "errors": None,
        "input_file_id": input_file_id,
        "completion_window": window,
        "status": "validating",
        "output_file_id": None,
        "error_file_id": None,
        "created_at": now,
        "in_progress_at": None,
        "expires_at": now + COMPLETION_WINDOWS[window],
        "finalizing_at": None,
        "completed_at": None,
        "failed_at": None,
        "expired_at": None,
        "cancelling_at": None,
        "cancelled_at": None,
        "request_counts": {"total": total, "completed": 0, "failed": 0},
        "usage": None,
        "metadata": metadata,
    }


def moved(batch: dict[str, Any], status: str) -> dict[str, Any]:
    """The batch in its next status, with that status's timestamp."""
    stamp = {"in_progress": "in_progress_at", "completed": "completed_at"}.get(status)
    stamp = stamp or f"{status}_at"
    return batch | {"status": status, stamp: int(time.time())}


def page(items: list[dict[str, Any]], has_more: bool) -> dict[str, Any]:
    return {
        "object": "list",
        "data": items,
        "first_id": items[0]["id"] if items else None,
        "last_id": items[-1]["id"] if items else None,
        "has_more": has_more,
    }


def answered(custom_id: str, status: int, request_id: str, body: dict) -> dict[str, Any]:
    """A line the pipeline answered (2xx or not): it carries the response."""
    response = {"status_code": status, "request_id": request_id, "body": body}
    return {"id": new_id("batch_req"), "custom_id": custom_id, "response": response, "error": None}


def not_run(custom_id: str, code: str, message: str) -> dict[str, Any]:
    """A line the batch ended before running (cancelled, expired)."""
    error = {"code": code, "message": message}
    return {"id": new_id("batch_req"), "custom_id": custom_id, "response": None, "error": error}


def succeeded(result: dict[str, Any]) -> bool:
    response = result.get("response")
    return response is not None and 200 <= response["status_code"] < 300


def usage_of(results: list[dict[str, Any]]) -> dict[str, Any]:
    """The batch's tokens, summed over the lines that were answered."""
    prompt = completion = 0
    for result in results:
        if succeeded(result):
            usage = result["response"]["body"].get("usage") or {}
            prompt += usage.get("prompt_tokens", 0)
            completion += usage.get("completion_tokens", 0)
    return {
        "input_tokens": prompt,
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": completion,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": prompt + completion,
    }


def jsonl_line(value: dict[str, Any]) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":")) + "\n"


def public(batch: dict[str, Any]) -> dict[str, Any]:
    """The batch as the API shows it: without the record's own fields (`_key_digest`)."""
    return {key: value for key, value in batch.items() if not key.startswith("_")}
