"""An uploaded batch input file, checked line by line: each line is
`{"custom_id", "method": "POST", "url", "body"}`, ids unique, the body a valid request of
its endpoint. A bad file is refused at upload with OpenAI's 400 naming the line."""

import json
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ValidationError

from engine.entrypoints.openai.error_bodies import validation_error_message
from engine.entrypoints.openai.errors import OpenAIError
from engine.entrypoints.openai.protocol import ChatCompletionRequest, CompletionRequest

# The endpoints a batch may run, and the request model each line's body must be.
ENDPOINTS: dict[str, type[BaseModel]] = {
    "/v1/chat/completions": ChatCompletionRequest,
    "/v1/completions": CompletionRequest,
}
MAX_LINES = 50_000  # OpenAI's limit per batch
MAX_CUSTOM_ID = 512


@dataclass(frozen=True)
class Line:
    custom_id: str
    url: str
    body: dict[str, Any]


def _bad(number: int, message: str, param: str | None = None) -> OpenAIError:
    return OpenAIError(400, f"Line {number}: {message}", param=param, code="invalid_batch_line")


def _parse_line(number: int, text: str) -> Line:
    try:
        value = json.loads(text)
    except ValueError:
        raise _bad(number, "is not valid JSON.") from None
    if not isinstance(value, dict):
        raise _bad(number, "must be a JSON object.")
    custom_id, url, body = value.get("custom_id"), value.get("url"), value.get("body")
    if not isinstance(custom_id, str) or not 0 < len(custom_id) <= MAX_CUSTOM_ID:
        raise _bad(number, f"custom_id must be a string of 1 to {MAX_CUSTOM_ID} characters.")
    if value.get("method") != "POST":
        raise _bad(number, "method must be 'POST'.", "method")
    if url not in ENDPOINTS:
        raise _bad(number, f"url must be one of {', '.join(ENDPOINTS)}.", "url")
    if not isinstance(body, dict):
        raise _bad(number, "body must be a JSON object (the request).", "body")
    if body.get("stream"):
        raise _bad(number, "a batch line cannot stream: remove `stream`.", "body.stream")
    try:
        ENDPOINTS[url].model_validate(body)
    except ValidationError as exc:
        message, param = validation_error_message(exc)
        raise _bad(number, message, f"body.{param}" if param else "body") from None
    return Line(custom_id, url, body)


def parse_lines(content: str) -> list[Line]:
    """The file's lines, or OpenAI's 400 for the first bad one (blank lines are skipped)."""
    lines: list[Line] = []
    seen: set[str] = set()
    for number, text in enumerate(content.splitlines(), start=1):
        if not text.strip():
            continue
        line = _parse_line(number, text)
        if line.custom_id in seen:
            raise _bad(number, f"custom_id {line.custom_id!r} is used twice.", "custom_id")
        seen.add(line.custom_id)
        lines.append(line)
        if len(lines) > MAX_LINES:
            raise _bad(number, f"a batch file holds at most {MAX_LINES} requests.")
    if not lines:
        raise OpenAIError(400, "The file has no requests.", code="invalid_batch_line")
    return lines


def endpoint_of(lines: list[Line]) -> str:
    """The one endpoint every line calls; a file mixing endpoints fits no batch."""
    urls = {line.url for line in lines}
    if len(urls) > 1:
        raise OpenAIError(400, "The file's lines call several endpoints; a batch runs one.")
    return next(iter(urls))
