"""The Batch API (/v1/files, /v1/batches) through the real gateway over loopback with the
openai client, on a local tier (the real SmolLM2-135M): upload, create, poll to completed,
read the output and error files, list, cancel, tenant isolation, bad input as OpenAI's
400, and batch lines priced at the policy's batch factor."""

import io
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from gateway.app import create_app
from gateway.policy import parse_policy
from tests.batch_helpers import chat_line, create, jsonl, records, upload, wait_ended
from tests.servers import run_uvicorn

KEY, OTHER_KEY, ADMIN = "sk-batch-a", "sk-batch-b", "sk-batch-admin"
SMOL = "smollm2-135m"


def policy(cache_path: Path) -> str:
    return f"""
auth:
  keys: [{{key: {KEY}, tenant: one}}, {{key: {OTHER_KEY}, tenant: two}}]
  admin_key: {ADMIN}
  managed_keys_path: {cache_path.parent / "keys.sqlite3"}
cache: {{enabled: true, store: embedded, path: {cache_path}}}
engines:
  {SMOL}: {{kv_cache_mb: 32, max_num_seqs: 4, max_model_len: 512, num_threads: 1}}
tiers:
  small: {{deployments: [{{model: {SMOL}}}], price: {{input: 1000, output: 1000}}}}
routes:
  auto: {{default: small}}
batch: {{price_factor: 0.5, max_concurrent: 2, max_file_mb: 0.01}}
"""


@pytest.fixture(scope="module")
def url(one_torch_thread: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    path = tmp_path_factory.mktemp("batches") / "cache.sqlite3"
    with run_uvicorn(create_app(parse_policy(policy(path), env={}))) as base:
        yield base


def client(url: str, key: str = KEY) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0)


def test_upload_create_poll_and_read_the_output(url: str) -> None:
    lines = [chat_line(f"q{i}", f"Name a colour, number {i}.") for i in range(3)]
    lines.append(chat_line("unknown", "Hi", model="no-such-model"))
    batch = create(client(url), lines, metadata={"job": "nightly"})
    assert batch.status in ("validating", "in_progress") and batch.metadata == {"job": "nightly"}
    assert batch.request_counts.total == 4
    done = wait_ended(client(url), batch.id)
    assert done.status == "completed" and done.completed_at and done.finalizing_at
    assert (done.request_counts.completed, done.request_counts.failed) == (3, 1)
    output = records(client(url), done.output_file_id)
    assert sorted(output) == ["q0", "q1", "q2"]
    for row in output.values():
        response = row["response"]
        assert response["status_code"] == 200 and row["error"] is None
        assert response["body"]["object"] == "chat.completion"
        assert response["body"]["choices"][0]["message"]["content"]
    errors = records(client(url), done.error_file_id)
    assert list(errors) == ["unknown"]
    assert errors["unknown"]["response"]["status_code"] == 404
    assert errors["unknown"]["response"]["body"]["error"]["code"] == "model_not_found"
    assert done.usage is not None and done.usage.output_tokens > 0
    assert client(url).files.retrieve(done.output_file_id).purpose == "batch_output"


def test_files_read_list_and_delete(url: str) -> None:
    lines = [chat_line("only", "Say yes.")]
    file_id = upload(client(url), lines, name="mine.jsonl")
    meta = client(url).files.retrieve(file_id)
    assert (meta.filename, meta.purpose, meta.bytes) == ("mine.jsonl", "batch", len(jsonl(lines)))
    assert client(url).files.content(file_id).content == jsonl(lines)
    assert file_id in [f.id for f in client(url).files.list()]
    assert client(url).files.delete(file_id).deleted
    with pytest.raises(openai.NotFoundError):
        client(url).files.retrieve(file_id)


def test_list_batches_newest_first_with_paging(url: str) -> None:
    first = create(client(url), [chat_line("a", "One.")])
    second = create(client(url), [chat_line("b", "Two.")])
    page = client(url).batches.list(limit=1)
    assert [b.id for b in page.data] == [second.id] and page.has_more
    after = client(url).batches.list(limit=1, after=second.id)
    assert [b.id for b in after.data] == [first.id]
    for batch in (first, second):
        wait_ended(client(url), batch.id)


def test_cancel_stops_the_lines_not_yet_run(url: str) -> None:
    lines = [chat_line(f"c{i}", f"Count to {i}.", max_tokens=24) for i in range(30)]
    batch = create(client(url), lines)
    cancelling = client(url).batches.cancel(batch.id)
    assert cancelling.status in ("cancelling", "cancelled") and cancelling.cancelling_at
    done = wait_ended(client(url), batch.id)
    assert done.status == "cancelled" and done.cancelled_at
    assert done.request_counts.completed < 30
    output = records(client(url), done.output_file_id)
    errors = records(client(url), done.error_file_id)
    assert set(output) | set(errors) == {f"c{i}" for i in range(30)}
    skipped = [r for r in errors.values() if r["error"] is not None]
    assert skipped and all(r["error"]["code"] == "batch_cancelled" for r in skipped)
    assert client(url).batches.cancel(batch.id).status == "cancelled"  # ended: stays so


def test_tenants_see_only_their_own(url: str) -> None:
    batch = create(client(url), [chat_line("mine", "Hello.")])
    other = client(url, OTHER_KEY)
    with pytest.raises(openai.NotFoundError):
        other.batches.retrieve(batch.id)
    with pytest.raises(openai.NotFoundError):
        other.batches.cancel(batch.id)
    with pytest.raises(openai.NotFoundError):
        other.files.retrieve(batch.input_file_id)
    with pytest.raises(openai.NotFoundError):
        other.files.content(batch.input_file_id)
    assert batch.id not in [b.id for b in other.batches.list()]
    assert batch.input_file_id not in [f.id for f in other.files.list()]
    with pytest.raises(openai.BadRequestError) as refused:  # another's file cannot be run
        other.batches.create(
            input_file_id=batch.input_file_id,
            endpoint="/v1/chat/completions",
            completion_window="24h",
        )
    assert refused.value.code == "file_not_found"
    wait_ended(client(url), batch.id)


def _upload_raw(url: str, content: bytes, purpose: str = "batch") -> httpx.Response:
    files = {"file": ("x.jsonl", content)}
    headers = {"authorization": f"Bearer {KEY}"}
    return httpx.post(f"{url}/v1/files", files=files, data={"purpose": purpose}, headers=headers)


@pytest.mark.parametrize(
    ("content", "words"),
    [
        (b"{not json\n", "Line 1: is not valid JSON"),
        (
            b'{"custom_id": "a", "method": "GET", "url": "/v1/chat/completions", "body": {}}\n',
            "method",
        ),
        (jsonl([chat_line("a", "x"), chat_line("a", "y")]), "used twice"),
        (jsonl([chat_line("a", "x") | {"url": "/v1/images"}]), "url must be one of"),
        (jsonl([chat_line("a", "x") | {"body": {"model": "auto"}}]), "Line 1:"),
        (
            jsonl(
                [chat_line("a", "x") | {"body": {"model": "auto", "messages": [], "stream": True}}]
            ),
            "cannot stream",
        ),
        (b"\n\n", "no requests"),
        (b"\xff\xfe", "UTF-8"),
    ],
)
def test_a_bad_file_is_refused_at_upload(url: str, content: bytes, words: str) -> None:
    response = _upload_raw(url, content)
    assert response.status_code == 400
    error = response.json()["error"]
    assert words in error["message"] and error["type"] == "invalid_request_error"


def test_wrong_purpose_too_large_and_not_multipart(url: str) -> None:
    wrong = _upload_raw(url, jsonl([chat_line("a", "x")]), purpose="fine-tune")
    assert wrong.status_code == 400 and wrong.json()["error"]["param"] == "purpose"
    large = _upload_raw(url, jsonl([chat_line(f"l{i}", "x" * 100) for i in range(100)]))
    assert large.status_code == 413 and large.json()["error"]["code"] == "file_too_large"
    headers = {"authorization": f"Bearer {KEY}"}
    plain = httpx.post(f"{url}/v1/files", json={"purpose": "batch"}, headers=headers)
    assert plain.status_code == 400 and "error" in plain.json()
    with pytest.raises(openai.BadRequestError):  # through the SDK too
        client(url).files.create(file=("x.jsonl", io.BytesIO(b"nope\n")), purpose="batch")


def test_bad_batch_requests(url: str) -> None:
    file_id = upload(client(url), [chat_line("a", "x")])

    def refused(**fields: object) -> openai.BadRequestError:
        body = {"input_file_id": file_id, "endpoint": "/v1/chat/completions"}
        body |= {"completion_window": "24h"} | fields
        with pytest.raises(openai.BadRequestError) as caught:
            client(url).batches.create(**body)  # type: ignore[arg-type]
        return caught.value

    assert refused(input_file_id="file-nope").code == "file_not_found"
    assert refused(completion_window="1h").param == "completion_window"
    assert refused(endpoint="/v1/completions").param == "endpoint"  # the lines call chat
    assert refused(endpoint="/v1/moderations").param == "endpoint"
    headers = {"authorization": f"Bearer {KEY}"}
    paged = httpx.get(f"{url}/v1/batches", params={"limit": "many"}, headers=headers)
    assert paged.status_code == 400 and paged.json()["error"]["param"] == "query.limit"
    with pytest.raises(openai.NotFoundError):
        client(url).batches.retrieve("batch_nope")
    with pytest.raises(openai.AuthenticationError):
        client(url, "sk-wrong").batches.list()


def _cost(url: str) -> float:
    text = httpx.get(f"{url}/metrics", headers={"authorization": f"Bearer {ADMIN}"}).text
    families = text_string_to_metric_families(text)
    return sum(s.value for f in families for s in f.samples if s.name == "tiergate_cost_usd_total")


def _tokens(usage: object) -> int:
    return usage.prompt_tokens + usage.completion_tokens  # type: ignore[attr-defined]


def test_batch_lines_are_priced_at_the_batch_factor(url: str) -> None:
    before = _cost(url)
    answer = client(url).chat.completions.create(
        model="auto", messages=[{"role": "user", "content": "Price me now."}], max_tokens=6
    )
    interactive = _cost(url) - before
    assert interactive == pytest.approx(_tokens(answer.usage) * 1000 / 1e6)
    before = _cost(url)
    done = wait_ended(client(url), create(client(url), [chat_line("p", "Price me later.")]).id)
    body = records(client(url), done.output_file_id)["p"]["response"]["body"]
    tokens = body["usage"]["prompt_tokens"] + body["usage"]["completion_tokens"]
    time.sleep(0.2)
    assert _cost(url) - before == pytest.approx(tokens * 1000 / 1e6 * 0.5)


def test_a_managed_keys_terms_hold_for_its_batch_lines(url: str) -> None:
    """A batch's lines run under the key that created it: its allowed models refuse a line,
    and once the key is revoked its batch's remaining lines spend nothing."""
    admin = httpx.Client(base_url=url, headers={"authorization": f"Bearer {ADMIN}"})
    made = admin.post(
        "/admin/keys", json={"tenant": "one", "name": "batcher", "allowed_models": ["small"]}
    ).json()
    own = client(url, made["key"])
    lines = [chat_line("ok", "Hi.", "small"), chat_line("no", "Hi.")]
    done = wait_ended(own, create(own, lines).id)
    assert done.request_counts.completed == 1 and done.request_counts.failed == 1
    refused = records(own, done.error_file_id)["no"]["response"]
    assert refused["status_code"] == 404
    assert refused["body"]["error"]["code"] == "model_not_found"
    batch = create(own, [chat_line(f"late-{i}", f"Line {i}.", "small") for i in range(12)])
    assert admin.delete(f"/admin/keys/{made['id']}").status_code == 200
    tenant = client(url)  # the tenant's policy key still sees the tenant's batches
    ended = wait_ended(tenant, batch.id)
    counts = ended.request_counts
    assert counts.completed + counts.failed == 12 and counts.failed >= 1
    for row in records(tenant, ended.error_file_id).values():
        assert row["response"]["status_code"] == 401
        assert row["response"]["body"]["error"]["code"] == "invalid_api_key"
