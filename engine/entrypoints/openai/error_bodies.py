"""OpenAI error bodies, and the message and `param` for a request that fails validation.

Import-light (pydantic only), like protocol.py beside it.
"""

from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import BaseModel, ValidationError


class ErrorBody(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorResponse(BaseModel):
    error: ErrorBody


_ERROR_TYPES = {
    401: "authentication_error",
    403: "permission_error",
    429: "rate_limit_error",
    503: "service_unavailable",
}


def error_response_body(
    status: int,
    message: str,
    type: str | None = None,
    param: str | None = None,
    code: str | None = None,
) -> dict[str, Any]:
    """`{"error": {...}}` as OpenAI sends it; `type` defaults from the HTTP status."""
    default_type = "invalid_request_error" if status < 500 else "server_error"
    error_type = type or _ERROR_TYPES.get(status, default_type)
    body = ErrorBody(message=message, type=error_type, param=param, code=code)
    return ErrorResponse(error=body).model_dump()


def _param_path(loc: Sequence[int | str]) -> str | None:
    """`("messages", 0, "content", "str")` -> `messages[0].content`.

    Pydantic puts union member names (`str`, `list[int]`, `function-after[...]`) in the
    location; they are not fields, so they are dropped.
    """
    path = ""
    for part in loc:
        if isinstance(part, int):
            path += f"[{part}]"
        elif part == "body":
            continue  # FastAPI's prefix for the request body
        elif "[" in part or part in {"str", "int", "float", "bool", "dict", "list"}:
            continue
        else:
            path += f".{part}" if path else part
    return path or None


def validation_error_message(
    exc: ValidationError | Sequence[Mapping[str, Any]],
) -> tuple[str, str | None]:
    """An OpenAI-style message naming the first bad field, and that field as `param`."""
    errors = exc.errors() if isinstance(exc, ValidationError) else list(exc)
    if not errors:
        return "Invalid request body.", None
    # A union reports one error per member; the deepest one names the real culprit
    # (e.g. `messages[0].content[0].type`, not "content should be a string").
    same_field = [e for e in errors if e.get("loc", ())[:1] == errors[0].get("loc", ())[:1]]
    first = max(same_field, key=lambda e: len(e.get("loc", ())))
    param = _param_path(first.get("loc", ()))
    kind, msg = first.get("type", ""), str(first.get("msg", "invalid value"))
    msg = msg.removeprefix("Value error, ")
    if kind == "json_invalid":
        return "We could not parse the JSON body of your request.", None
    if kind == "missing":
        return f"Missing required parameter: '{param}'.", param
    if param is None:
        return f"Invalid request body: {msg}.", None
    shown = first.get("input")
    got = f" (got {shown!r})" if isinstance(shown, int | float | str) else ""
    return f"Invalid value for '{param}': {msg}{got}.", param
