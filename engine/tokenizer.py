"""Tokenizer and chat template from the model files (GGUF metadata or an HF folder).

GGUF files carry either a byte-level BPE vocabulary, merges and the name of the
pre-tokenizer (`tokenizer.ggml.model` "gpt2", with tokenizer.ggml.pre), or a sentencepiece
BPE vocabulary with scores and token types ("llama": Llama 2, Mistral, TinyLlama...); we
rebuild the `tokenizers` pipeline llama.cpp runs for each.
The built tokenizer is cached as JSON next to the converted weights, because parsing
the GGUF metadata arrays takes seconds.
"""

import contextlib
import functools
import json
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

import jinja2.ext
from jinja2.exceptions import TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import AddedToken, Regex, decoders, models, normalizers, pre_tokenizers
from tokenizers import Tokenizer as HFTokenizer

from engine.cache_files import atomic_path, cache_path
from engine.model_registry import ResolvedModel

_GPT2_SPLIT = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# llama.cpp's pre-tokenizer names (llama-vocab.cpp) -> (split regex, digits one by one first)
_PRE: dict[str, tuple[str, bool]] = {
    "gpt2": (_GPT2_SPLIT, False),
    "smollm": (_GPT2_SPLIT, True),
    "starcoder": (_GPT2_SPLIT, True),
    "refact": (_GPT2_SPLIT, True),
    "llama3": (_LLAMA3_SPLIT, False),
    "llama-bpe": (_LLAMA3_SPLIT, False),
    "qwen2": (_QWEN2_SPLIT, False),
    "deepseek-r1-qwen": (_QWEN2_SPLIT, False),
}
_SPM_SPACE = "\u2581"  # sentencepiece's visible space, "▁"
# Tokens that end a turn in common chat formats; llama.cpp also stops on these.
_END_OF_TURN = ("<|im_end|>", "<|endoftext|>", "<|eot_id|>", "<|end|>", "<|end_of_text|>")
_CHATML = (
    "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\n' + m['content'] + '<|im_end|>\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


@dataclass
class TokenizerMeta:
    bos_token_id: int | None
    eos_token_ids: list[int]
    add_bos: bool
    chat_template: str | None
    special_tokens: dict[str, str] = field(default_factory=dict)  # bos_token, eos_token, ...


class Tokenizer:
    def __init__(self, backend: HFTokenizer, meta: TokenizerMeta) -> None:
        self.backend = backend
        self.meta = meta
        self.bos_token_id = meta.bos_token_id
        self.eos_token_ids: set[int] = set(meta.eos_token_ids)
        self.vocab_size = backend.get_vocab_size(with_added_tokens=True)
        self._template = _compile(meta.chat_template or _CHATML)

    def encode(self, text: str) -> list[int]:
        """Special tokens written in the text (e.g. from a chat template) stay whole."""
        ids = self.backend.encode(text, add_special_tokens=False).ids
        if self.meta.add_bos and self.bos_token_id is not None:
            ids = [self.bos_token_id, *ids]
        return ids

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return self.backend.decode(ids, skip_special_tokens=skip_special_tokens)

    def apply_chat_template(
        self,
        messages: list[dict],
        add_generation_prompt: bool = True,
        tools: list[dict] | None = None,
        **extra: object,
    ) -> str:
        return self._template.render(
            messages=messages,
            tools=tools,
            add_generation_prompt=add_generation_prompt,
            **self.meta.special_tokens,
            **extra,
        )

    @functools.cached_property
    def carries_tools(self) -> bool:
        """Whether the chat template shows the model a request's `tools`: some (SmolLM2's)
        drop them silently. A probe conversation rendered with a tool must name it."""
        probe = {"type": "function", "function": {"name": _PROBE_TOOL, "parameters": {}}}
        try:
            text = self.apply_chat_template([{"role": "user", "content": "hi"}], tools=[probe])
        except Exception:  # a template that fails on tools cannot carry them either
            return False
        return _PROBE_TOOL in text


_PROBE_TOOL = "tiergate_probe_tool"

# ---- chat template (as Hugging Face renders it) -------------------------------------


def _raise_exception(message: str) -> None:
    raise TemplateError(message)


def _tojson(
    x: object,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    # jinja's own tojson escapes HTML characters, which changes prompts; HF's does not
    return json.dumps(
        x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _compile(source: str) -> jinja2.Template:
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env.from_string(source)


# ---- building from GGUF --------------------------------------------------------------


def _bpe_from_gguf(fields: dict) -> HFTokenizer:
    tokens: list[str] = fields["tokenizer.ggml.tokens"]
    merges = [tuple(m.split(" ", 1)) for m in fields["tokenizer.ggml.merges"]]
    pre = fields.get("tokenizer.ggml.pre", "gpt2")
    split, digits = _PRE.get(pre, _PRE["gpt2"])
    vocab = {t: i for i, t in enumerate(tokens)}
    tok = HFTokenizer(
        models.BPE(vocab, merges, ignore_merges=split is _LLAMA3_SPLIT, fuse_unk=False)
    )
    steps = [pre_tokenizers.Digits(individual_digits=True)] if digits else []
    steps.append(pre_tokenizers.Split(Regex(split), behavior="isolated"))
    steps.append(pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False))
    tok.pre_tokenizer = pre_tokenizers.Sequence(steps)
    if split is _QWEN2_SPLIT:
        tok.normalizer = normalizers.NFC()
    tok.decoder = decoders.ByteLevel()
    _add_special(tok, tokens, fields.get("tokenizer.ggml.token_type") or [])
    return tok


def _spm_merges(tokens: list[str], scores: list[float]) -> list[tuple[str, str]]:
    """Sentencepiece BPE merges by score: joining two pieces into a higher-scored piece
    goes first, as in sentencepiece's (and llama.cpp's) encoder. Every split of a piece
    into two pieces of the vocabulary is a merge (transformers' SentencePieceExtractor)."""
    vocab = {t: i for i, t in enumerate(tokens)}
    merges = []
    for piece_id, (piece, score) in enumerate(zip(tokens, scores, strict=True)):
        for cut in range(1, len(piece)):
            left, right = piece[:cut], piece[cut:]
            if left in vocab and right in vocab:
                merges.append((-score, piece_id, vocab[left], vocab[right], left, right))
    return [(left, right) for *_, left, right in sorted(merges)]


def _spm_from_gguf(fields: dict) -> HFTokenizer:
    tokens: list[str] = fields["tokenizer.ggml.tokens"]
    scores: list[float] = fields["tokenizer.ggml.scores"]
    unk_id = fields.get("tokenizer.ggml.unknown_token_id")
    unk = tokens[unk_id] if unk_id is not None else None
    vocab = {t: i for i, t in enumerate(tokens)}
    bpe = models.BPE(
        vocab, _spm_merges(tokens, scores), unk_token=unk, fuse_unk=True, byte_fallback=True
    )
    tok = HFTokenizer(bpe)
    # Spaces are "▁"; llama.cpp adds one before the text and after every special token,
    # as the normalizer here does for each piece of text between added tokens.
    replace = normalizers.Replace(" ", _SPM_SPACE)
    decode = [decoders.Replace(_SPM_SPACE, " "), decoders.ByteFallback(), decoders.Fuse()]
    if fields.get("tokenizer.ggml.add_space_prefix", True):
        tok.normalizer = normalizers.Sequence([normalizers.Prepend(_SPM_SPACE), replace])
        decode.append(decoders.Strip(" ", 1, 0))  # the space the encoder added
    else:
        tok.normalizer = replace
    tok.decoder = decoders.Sequence(decode)
    _add_special(tok, tokens, fields.get("tokenizer.ggml.token_type") or [])
    return tok


def _add_special(tok: HFTokenizer, tokens: list[str], types: list[int]) -> None:
    """Control tokens (type 3) are special; user-defined ones (type 4, e.g. <tool_call>)
    are plain added tokens. Both must match whole, never be split by BPE."""
    control = [
        AddedToken(t, special=True, normalized=False)
        for t, k in zip(tokens, types, strict=True)
        if k == 3
    ]
    user = [
        AddedToken(t, special=False, normalized=False)
        for t, k in zip(tokens, types, strict=True)
        if k == 4
    ]
    tok.add_special_tokens(control)
    tok.add_tokens(user)


def _meta_from_gguf(fields: dict) -> TokenizerMeta:
    tokens: list[str] = fields["tokenizer.ggml.tokens"]
    bos = fields.get("tokenizer.ggml.bos_token_id")
    eos = fields.get("tokenizer.ggml.eos_token_id")
    eos_ids = {eos} if eos is not None else set()
    if (eot := fields.get("tokenizer.ggml.eot_token_id")) is not None:
        eos_ids.add(eot)
    index = {t: i for i, t in enumerate(tokens)}
    eos_ids |= {index[t] for t in _END_OF_TURN if t in index}
    names = {"bos_token": bos, "eos_token": eos, "unk_token": None, "pad_token": None}
    names["unk_token"] = fields.get("tokenizer.ggml.unknown_token_id")
    names["pad_token"] = fields.get("tokenizer.ggml.padding_token_id")
    return TokenizerMeta(
        bos_token_id=bos,
        eos_token_ids=sorted(eos_ids),
        add_bos=bool(fields.get("tokenizer.ggml.add_bos_token", False)),
        chat_template=fields.get("tokenizer.chat_template"),
        special_tokens={k: tokens[v] for k, v in names.items() if v is not None},
    )


# tokenizer.ggml.model -> builder: byte-level BPE, sentencepiece BPE
_GGUF_TOKENIZERS = {"gpt2": _bpe_from_gguf, "llama": _spm_from_gguf}


def _from_gguf(path: Path) -> Tokenizer:
    cached = cache_path(path, "tokenizer", ".json")
    if cached.is_file():
        with contextlib.suppress(Exception):  # a corrupt cache is rebuilt below
            data = json.loads(cached.read_text())
            return Tokenizer(HFTokenizer.from_str(data["tokenizer"]), TokenizerMeta(**data["meta"]))
    from gguf import GGUFReader

    reader = GGUFReader(path)
    fields = {k: f.contents() for k, f in reader.fields.items() if k.startswith("tokenizer.")}
    build = _GGUF_TOKENIZERS.get(fields.get("tokenizer.ggml.model"))
    if build is None:
        kinds = " and ".join(f"{k!r}" for k in _GGUF_TOKENIZERS)
        raise ValueError(f"only {kinds} GGUF tokenizers are supported: {path}")
    backend, meta = build(fields), _meta_from_gguf(fields)
    payload = json.dumps({"tokenizer": backend.to_str(), "meta": meta.__dict__})
    with contextlib.suppress(OSError), atomic_path(cached) as tmp:
        Path(tmp).write_text(payload)
    return Tokenizer(backend, meta)


# ---- building from a Hugging Face folder ----------------------------------------------


def _token_str(value: object) -> str | None:
    return value.get("content") if isinstance(value, dict) else value  # AddedToken dicts


def _read_json(path: Path) -> dict:
    return json.loads(path.read_text()) if path.is_file() else {}


def _hf_template(folder: Path, cfg: dict) -> str | None:
    if (folder / "chat_template.jinja").is_file():  # newer exports keep it apart
        return (folder / "chat_template.jinja").read_text()
    template = cfg.get("chat_template")
    if isinstance(template, list):  # named templates: take the default one
        template = next((t["template"] for t in template if t.get("name") == "default"), None)
    return template


def _hf_eos_ids(folder: Path, backend: HFTokenizer, specials: dict[str, str]) -> list[int]:
    ids = {backend.token_to_id(specials["eos_token"])} if "eos_token" in specials else set()
    gen_eos = _read_json(folder / "generation_config.json").get("eos_token_id")
    ids |= set(gen_eos if isinstance(gen_eos, list) else [gen_eos])
    ids |= {backend.token_to_id(t) for t in _END_OF_TURN}
    return sorted(i for i in ids if i is not None)


def _from_hf(folder: Path) -> Tokenizer:
    backend = HFTokenizer.from_file(str(folder / "tokenizer.json"))
    cfg = _read_json(folder / "tokenizer_config.json")
    names = ("bos_token", "eos_token", "unk_token", "pad_token")
    specials = {k: v for k in names if (v := _token_str(cfg.get(k)))}
    bos = backend.token_to_id(specials["bos_token"]) if "bos_token" in specials else None
    add_bos = cfg.get("add_bos_token")
    if add_bos is None:  # no flag: the folder's post-processor decides (Llama 3 adds BOS)
        add_bos = bos is not None and backend.encode("a").ids[:1] == [bos]
    eos_ids = _hf_eos_ids(folder, backend, specials)
    meta = TokenizerMeta(bos, eos_ids, bool(add_bos), _hf_template(folder, cfg), specials)
    return Tokenizer(backend, meta)


def load_tokenizer(resolved: ResolvedModel) -> Tokenizer:
    path = Path(resolved.path)
    return _from_gguf(path) if resolved.format == "gguf" else _from_hf(path)
