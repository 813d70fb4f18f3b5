"""The optional third tier, Qwen2.5-Coder-1.5B (`make models-large`), end to end: the
three-tier example policy serves it through the gateway (openai client, real HTTP), and its
greedy answers equal a plain, non-paged forward over the same weights
(tests/test_model_reference.py). Skipped when the model's packages are not installed.

It is 1.5B parameters on a small CPU: a few tokens per check.
"""

import gc
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import openai
import pytest

from engine.model_registry import BUNDLED, ModelNotFoundError, _bundle_files, resolve_model
from engine.tokenizer import Tokenizer, load_tokenizer
from engine.weights import load_model
from gateway.app import create_app
from gateway.policy import load_policy
from tests.servers import run_uvicorn
from tests.test_model_reference import _plain_greedy

NAME = "qwen2.5-coder-1.5b"
ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "router_policies" / "examples" / "three-tiers.yaml"
KEY = "sk-tiergate-local"  # the example's key with tier_override
TOKENS = 5


def _installed(name: str) -> bool:
    try:
        _bundle_files(name, BUNDLED[name])
    except ModelNotFoundError:
        return False
    return True


pytestmark = [
    pytest.mark.skipif(not _installed(NAME), reason=f"{NAME} not installed (make models-large)"),
    pytest.mark.usefixtures("one_torch_thread"),
]


PROMPT = "def fibonacci(n):"
MESSAGES = [{"role": "user", "content": "Write a haiku about the sea."}]


@dataclass
class Reference:
    tokenizer: Tokenizer
    completion: list[int]  # greedy tokens of the plain forward after PROMPT
    chat: list[int]  # ... after MESSAGES rendered by the chat template


@pytest.fixture(scope="module")
def reference() -> Reference:
    """Greedy tokens of the plain forward, computed before the gateway starts and the
    weights dropped after: two fp32 copies of a 1.5B model at once (~12 GB) are too many."""
    resolved = resolve_model(NAME)
    tokenizer = load_tokenizer(resolved)
    model = load_model(resolved)[1]
    chat_ids = tokenizer.encode(tokenizer.apply_chat_template(MESSAGES))
    completion = _plain_greedy(model, tokenizer.encode(PROMPT), TOKENS)
    chat = _plain_greedy(model, chat_ids, TOKENS)
    del model
    gc.collect()
    return Reference(tokenizer, completion, chat)


@pytest.fixture(scope="module")
def client(
    reference: Reference, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[openai.OpenAI]:
    """The example policy as shipped, with small engines (KV budget, one thread each). Its
    medium tier's engine runs SmolLM2 instead of the 0.5B model, to keep memory down
    (~7.5 GB in all): the tier under test is the large one."""
    examples = str(ROOT / "router_policies" / "difficulty_examples.jsonl")
    text = EXAMPLE.read_text().replace("../difficulty_examples.jsonl", examples)
    small = "kv_cache_mb: 16, max_num_seqs: 2, max_model_len: 512, num_threads: 1"
    engines = (
        f"  smollm2-135m: {{{small}}}\n"
        f"  qwen2.5-coder-0.5b: {{model: smollm2-135m, {small}}}\n"
        f"  {NAME}: {{{small}}}\n"
    )
    path = tmp_path_factory.mktemp("policy") / "three-tiers.yaml"
    path.write_text(f"{text}\nengines:\n{engines}")
    with run_uvicorn(create_app(load_policy(path, env={}))) as url:
        yield openai.OpenAI(base_url=f"{url}/v1", api_key=KEY, max_retries=0)


LARGE = {"model": "auto", "temperature": 0, "max_tokens": TOKENS}
PINNED = {"x-tiergate-tier": "large"}  # the example's override header, for its first key


def test_large_tier_completion_equals_plain_forward(
    client: openai.OpenAI, reference: Reference
) -> None:
    raw = client.completions.with_raw_response.create(prompt=PROMPT, extra_headers=PINNED, **LARGE)
    assert (raw.headers["x-tiergate-tier"], raw.headers["x-tiergate-model"]) == ("large", NAME)
    answer = raw.parse()
    assert answer.usage.completion_tokens == TOKENS
    assert answer.choices[0].text == reference.tokenizer.decode(reference.completion)


def test_large_tier_chat_equals_plain_forward(client: openai.OpenAI, reference: Reference) -> None:
    raw = client.chat.completions.with_raw_response.create(
        messages=MESSAGES, extra_headers=PINNED, **LARGE
    )
    assert raw.headers["x-tiergate-model"] == NAME
    content = raw.parse().choices[0].message.content
    assert content == reference.tokenizer.decode(reference.chat)
