"""What the Batch API tests share: a JSONL file of chat lines, upload + create, polling a
batch to its end, and reading an output file back as records by custom_id."""

import io
import json
import time

import openai
from openai.types import Batch

ENDED = ("completed", "failed", "cancelled", "expired")


def chat_line(custom_id: str, text: str, model: str = "auto", max_tokens: int = 6) -> dict:
    body = {
        "model": model,
        "messages": [{"role": "user", "content": text}],
        "max_tokens": max_tokens,
        "temperature": 0,
    }
    return {"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions", "body": body}


def jsonl(lines: list[dict]) -> bytes:
    return "".join(json.dumps(line) + "\n" for line in lines).encode()


def upload(client: openai.OpenAI, lines: list[dict], name: str = "in.jsonl") -> str:
    return client.files.create(file=(name, io.BytesIO(jsonl(lines))), purpose="batch").id


def create(client: openai.OpenAI, lines: list[dict], **extra: object) -> Batch:
    file_id = upload(client, lines)
    return client.batches.create(
        input_file_id=file_id, endpoint="/v1/chat/completions", completion_window="24h", **extra
    )


def wait_ended(client: openai.OpenAI, batch_id: str, timeout: float = 150) -> Batch:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        batch = client.batches.retrieve(batch_id)
        if batch.status in ENDED:
            return batch
        time.sleep(0.3)
    raise TimeoutError(f"batch {batch_id} still {batch.status} after {timeout}s")


def records(client: openai.OpenAI, file_id: str | None) -> dict[str, dict]:
    if file_id is None:
        return {}
    text = client.files.content(file_id).text
    rows = [json.loads(line) for line in text.splitlines()]
    assert len({row["custom_id"] for row in rows}) == len(rows)  # each line once
    return {row["custom_id"]: row for row in rows}
