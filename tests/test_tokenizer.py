"""Tokenizer from GGUF metadata vs transformers' own GGUF tokenizer; chat templates."""

import json
from pathlib import Path

import pytest
import transformers
from jinja2.exceptions import TemplateError

from engine.model_registry import resolve_model
from engine.tokenizer import Tokenizer, load_tokenizer

TEXTS = [
    "Hello, world!",
    "  leading spaces,\ttabs\n\nand newlines  \n",
    "Ünïcödé: 日本語のテキスト, emoji 🤖🎉 and Ελληνικά; naïve café",
    "def f(x: int) -> int:\n    return x ** 2  # square\n\n\nclass A:\n\tpass",
    "12345 + 678 = 13023; pi=3.14159, 1,000,000 and 2024-11-29",
    "don't I'LL we've THEY'RE",
    "a\r\nb   c\u00a0d\u200be",
    "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n",
    'JSON {"key": [1, 2.5, null], "s": "\\u00e9"}',
    "",
]
MESSAGES = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Hi there"},
    {"role": "assistant", "content": "Hello!"},
    {"role": "user", "content": "What is 2+2?"},
]
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather for a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    }
]
# transformers needs ~10-25 s to build the Qwen tokenizer from GGUF: run it with -m slow
MODELS = ["smollm2-135m", pytest.param("qwen2.5-coder-0.5b", marks=pytest.mark.slow)]


@pytest.fixture(scope="module", params=MODELS)
def pair(request: pytest.FixtureRequest) -> tuple[Tokenizer, object]:
    resolved = resolve_model(request.param)
    ref = transformers.AutoTokenizer.from_pretrained(
        str(resolved.path.parent), gguf_file=resolved.path.name
    )
    return load_tokenizer(resolved), ref


def test_encode_matches_transformers(pair: tuple[Tokenizer, object]) -> None:
    ours, ref = pair
    for text in TEXTS:
        assert ours.encode(text) == ref.encode(text, add_special_tokens=False), text


def test_decode_roundtrip(pair: tuple[Tokenizer, object]) -> None:
    ours, _ = pair
    for text in TEXTS:
        assert ours.decode(ours.encode(text), skip_special_tokens=False) == text
    assert ours.decode(ours.encode("<|im_start|>hi<|im_end|>")) == "hi"


def test_chat_template_matches_transformers(pair: tuple[Tokenizer, object]) -> None:
    ours, ref = pair
    for msgs, gen, tools in [
        (MESSAGES, True, None),
        (MESSAGES[1:], False, None),
        (MESSAGES[1:], True, TOOLS),
    ]:
        want = ref.apply_chat_template(msgs, tools=tools, add_generation_prompt=gen, tokenize=False)
        assert ours.apply_chat_template(msgs, add_generation_prompt=gen, tools=tools) == want


def test_special_ids(pair: tuple[Tokenizer, object]) -> None:
    ours, ref = pair
    assert ref.eos_token_id in ours.eos_token_ids
    assert ours.encode("<|im_end|>")[0] in ours.eos_token_ids  # chat turns end generation
    assert ours.vocab_size == len(ref)


def test_raise_exception_in_template() -> None:
    tok = load_tokenizer(resolve_model("smollm2-135m"))
    tok._template = tok._template.environment.from_string(
        "{% if messages|length == 0 %}{{ raise_exception('no messages') }}{% endif %}ok"
    )
    with pytest.raises(TemplateError, match="no messages"):
        tok.apply_chat_template([])


def test_hf_folder(tmp_path: Path) -> None:
    """An HF folder (tokenizer.json + tokenizer_config.json) gives the same tokenizer."""
    gguf_tok = load_tokenizer(resolve_model("smollm2-135m"))
    gguf_tok.backend.save(str(tmp_path / "tokenizer.json"))
    config = {
        "chat_template": gguf_tok.meta.chat_template,
        "bos_token": "<|im_start|>",
        "eos_token": {"content": "<|im_end|>"},
    }
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    (tmp_path / "config.json").write_text("{}")
    tok = load_tokenizer(resolve_model(str(tmp_path)))
    for text in TEXTS:
        assert tok.encode(text) == gguf_tok.encode(text)
    assert tok.apply_chat_template(MESSAGES) == gguf_tok.apply_chat_template(MESSAGES)
    assert tok.eos_token_ids >= {2} and tok.bos_token_id == 1


def test_hf_folder_post_processor_bos(tmp_path: Path) -> None:
    """No add_bos_token flag: BOS comes when the folder's post-processor adds one."""
    from tokenizers import processors

    backend = load_tokenizer(resolve_model("smollm2-135m")).backend
    backend.post_processor = processors.TemplateProcessing(
        single="<|im_start|> $A", special_tokens=[("<|im_start|>", 1)]
    )
    backend.save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"bos_token": "<|im_start|>"}))
    (tmp_path / "config.json").write_text("{}")
    tok = load_tokenizer(resolve_model(str(tmp_path)))
    assert (
        tok.encode("hi")[0] == 1
        and tok.encode("hi")[1:] == backend.encode("hi", add_special_tokens=False).ids
    )


@pytest.mark.parametrize(
    ("name", "carries"), [("smollm2-135m", False), ("qwen2.5-coder-0.5b", True)]
)
def test_carries_tools(name: str, carries: bool) -> None:
    """#29.7: SmolLM2's template drops `tools` (same prompt with or without); Qwen's shows them."""
    assert load_tokenizer(resolve_model(name)).carries_tools is carries
