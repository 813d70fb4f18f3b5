"""Token ids as text and bytes, for logprobs (OpenAI reports each token's `token` and `bytes`).

A byte-level BPE token may hold part of a UTF-8 character: its decoded text is then
"\\ufffd", and its bytes come from the vocabulary entry through GPT-2's byte-to-character map.
"""

from typing import Any

from engine.outputs import Logprob, TokenLogprobs
from engine.sampler import SampledLogprobs


def _gpt2_byte_decoder() -> dict[str, int]:
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    chars = {b: chr(b) for b in printable}
    extra = (b for b in range(256) if b not in chars)
    chars |= {b: chr(256 + n) for n, b in enumerate(extra)}
    return {c: b for b, c in chars.items()}


_BYTE_OF = _gpt2_byte_decoder()


class TokenNames:
    """Cached id -> (text, bytes) for one tokenizer (the vocabulary bounds the cache)."""

    def __init__(self, tokenizer: Any) -> None:
        self._tokenizer = tokenizer
        self._cache: dict[int, tuple[str, bytes]] = {}

    def __call__(self, token_id: int) -> tuple[str, bytes]:
        named = self._cache.get(token_id)
        if named is None:
            named = self._cache[token_id] = self._name(token_id)
        return named

    def _name(self, token_id: int) -> tuple[str, bytes]:
        backend = getattr(self._tokenizer, "backend", None)
        if backend is None:  # a tokenizer without a vocabulary to read (test doubles)
            text = self._tokenizer.decode([token_id])
            return text, text.encode()
        text = backend.decode([token_id], skip_special_tokens=False)
        piece = backend.id_to_token(token_id)
        if "\ufffd" in text and piece and all(c in _BYTE_OF for c in piece):
            return text, bytes(_BYTE_OF[c] for c in piece)
        return text, text.encode()

    def logprob(self, token_id: int, value: float) -> Logprob:
        text, raw = self(token_id)
        return Logprob(token_id, text, raw, value)

    def named(self, sampled: SampledLogprobs) -> TokenLogprobs:
        pairs = zip(sampled.top_ids, sampled.top_logprobs, strict=True)
        top = [self.logprob(t, v) for t, v in pairs]
        return TokenLogprobs(self.logprob(sampled.token_id, sampled.logprob), top)
