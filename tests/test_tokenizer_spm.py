"""A sentencepiece GGUF vocabulary (`tokenizer.ggml.model: llama`) against sentencepiece.

No bundled model has one, so the test trains a small sentencepiece BPE model with Llama's
settings (identity normalisation, a dummy prefix, kept whitespace, digits split, byte
fallback), writes its vocabulary into GGUF metadata as llama.cpp's converter does, and
compares our tokenizer built from that GGUF with sentencepiece itself.
"""

import io
import json
from pathlib import Path

import gguf
import pytest
import sentencepiece as spm

from engine.detokenizer import IncrementalDetokenizer
from engine.model_registry import ResolvedModel
from engine.tokenizer import Tokenizer, load_tokenizer

ROOT = Path(__file__).resolve().parent.parent
TEXTS = [
    "Hello world",
    "Hello world!  Two  spaces, then\ttabs\tand\nnew\nlines.",
    " leading space and trailing space ",
    "   ",
    "Numbers: 12345 and 3.14159, dates 2024-01-31.",
    "def fibonacci(n):\n    return n if n < 2 else fibonacci(n - 1) + fibonacci(n - 2)\n",
    "Ünïcödé façade naïve café — “quotes” …",
    "日本語のテキストと中文 mixed in 🎉🚀 with emoji",
    "tiergate routes requests between tiers; the semantic cache answers repeats.",
    "",
]
# sentencepiece's piece kinds -> llama.cpp's token types
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6


def _train() -> spm.SentencePieceProcessor:
    docs = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    corpus = [line for doc in docs for line in doc.read_text().splitlines()] * 2
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(corpus),
        model_writer=model,
        model_type="bpe",
        vocab_size=800,
        character_coverage=1.0,
        byte_fallback=True,
        split_digits=True,
        allow_whitespace_only_pieces=True,
        normalization_rule_name="identity",
        remove_extra_whitespaces=False,
        add_dummy_prefix=True,
        user_defined_symbols=["<|user|>"],
        num_threads=1,
        minloglevel=2,
    )
    return spm.SentencePieceProcessor(model_proto=model.getvalue())


def _token_type(sp: spm.SentencePieceProcessor, i: int) -> int:
    if sp.IsUnknown(i):
        return UNKNOWN
    if sp.IsControl(i):
        return CONTROL
    if sp.IsByte(i):
        return BYTE
    if sp.IsUnused(i):
        return UNUSED
    return USER_DEFINED if sp.IdToPiece(i) == "<|user|>" else NORMAL


def _write_gguf(sp: spm.SentencePieceProcessor, path: Path) -> Path:
    size = sp.GetPieceSize()
    writer = gguf.GGUFWriter(path, "llama")
    writer.add_tokenizer_model("llama")
    writer.add_token_list([sp.IdToPiece(i) for i in range(size)])
    writer.add_token_scores([sp.GetScore(i) for i in range(size)])
    writer.add_token_types([_token_type(sp, i) for i in range(size)])
    writer.add_bos_token_id(sp.bos_id())
    writer.add_eos_token_id(sp.eos_id())
    writer.add_unk_token_id(sp.unk_id())
    writer.add_add_bos_token(True)
    writer.add_bool("tokenizer.ggml.add_space_prefix", True)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[Tokenizer, spm.SentencePieceProcessor]:
    folder = tmp_path_factory.mktemp("spm")
    sp = _train()
    path = _write_gguf(sp, folder / "spm.gguf")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TIERGATE_CACHE_DIR", str(folder / "cache"))
        built = load_tokenizer(ResolvedModel("spm", path, "gguf"))
        cached = load_tokenizer(ResolvedModel("spm", path, "gguf"))  # from the JSON cache
    assert cached.backend.to_str() == built.backend.to_str()
    return built, sp


@pytest.mark.parametrize("text", TEXTS)
def test_encode_and_decode_equal_sentencepiece(
    pair: tuple[Tokenizer, spm.SentencePieceProcessor], text: str
) -> None:
    tok, sp = pair
    want = sp.encode(text)
    assert tok.encode(text) == [sp.bos_id(), *want]  # the GGUF asks for BOS
    assert tok.decode(want) == sp.decode(want) == text


def test_unknown_characters_fall_back_to_bytes(
    pair: tuple[Tokenizer, spm.SentencePieceProcessor],
) -> None:
    tok, sp = pair
    ids = tok.encode("🎉")[1:]
    assert [sp.IdToPiece(i) for i in ids][-4:] == ["<0xF0>", "<0x9F>", "<0x8E>", "<0x89>"]
    assert sp.unk_id() not in ids


def test_special_tokens_match_whole_and_meta(
    pair: tuple[Tokenizer, spm.SentencePieceProcessor],
) -> None:
    tok, sp = pair
    assert tok.bos_token_id == sp.bos_id() and tok.eos_token_ids == {sp.eos_id()}
    assert tok.meta.special_tokens["bos_token"] == "<s>"
    # In a rendered prompt, control tokens are one id each and the text after one gets
    # its own leading space, as llama.cpp does
    ids = tok.encode("<s>Hi</s><|user|>there")
    user = sp.PieceToId("<|user|>")
    hi, there = sp.encode("Hi"), sp.encode("there")
    assert ids == [sp.bos_id(), sp.bos_id(), *hi, sp.eos_id(), user, *there]
    assert tok.decode(ids) == "Hi<|user|> there"  # control tokens skipped, user ones kept


def test_many_unseen_texts_equal_sentencepiece(
    pair: tuple[Tokenizer, spm.SentencePieceProcessor],
) -> None:
    """Text it was not trained on: the routing examples' prompts and this file's code
    (less the parts that name special tokens: those are matched whole, unlike in
    sentencepiece; the test above covers them)."""
    tok, sp = pair
    lines = (ROOT / "router_policies" / "difficulty_examples.jsonl").read_text().splitlines()
    texts = [json.loads(line)["prompt"] for line in lines if line.strip()]
    code = Path(__file__).read_text().split("\n\n")
    texts += [t for t in code if not any(s in t for s in ("<s>", "</s>", "<|user|>"))]
    mismatched = [t for t in texts if tok.encode(t)[1:] != sp.encode(t)]
    assert mismatched == [] and len(texts) > 100


@pytest.mark.parametrize("text", [t for t in TEXTS if t.strip()])
def test_streamed_decoding_equals_sentencepiece(
    pair: tuple[Tokenizer, spm.SentencePieceProcessor], text: str
) -> None:
    """Token by token through the engine's incremental detokenizer: byte-fallback
    characters arrive whole, spaces land where sentencepiece puts them."""
    tok, sp = pair
    prompt = tok.encode("Answer:")
    ids = sp.encode(text)
    detok = IncrementalDetokenizer(tok, prompt, stop=[])
    streamed = "".join(detok.add(i) for i in ids) + detok.flush()
    assert "\ufffd" not in streamed
    assert streamed == sp.decode(sp.encode("Answer:") + ids)[len("Answer:") :]
