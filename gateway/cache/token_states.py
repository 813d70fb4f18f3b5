"""The embedder's word-piece states, and how well each content piece of one question finds
a match in the other: what the `aligned` verifier adds to the lexical features.

A sentence embedding averages its word pieces, so one changed piece ("build an API" /
"what is an API", "land" / "sea animal") moves it little. The last layer's state of each
piece still says what that piece means in context: a piece of one question with no close
piece in the other is a change of ask, whatever the cosine. all-MiniLM-L6-v2 (the
embedder's own weights) is exported once to ONNX with its token states as the output,
its weights quantised to int8 (fp32 took ~6 ms of a core per short question, twice per
pair: past the lookup's budget), and kept in the cache dir, as the embedder's pooled graph
is (onnx_backend.py). One text per pass: int8 activations are scaled per tensor, so a
text's states would move with its neighbours in a batch. A text's states are kept in a
small LRU, so a lookup's query is run once for all its candidates.
"""

import threading
import warnings
from collections import OrderedDict
from pathlib import Path
from typing import Any

import numpy as np

from engine.cache_files import atomic_path, cache_path
from gateway.cache.lexicon import STOPWORDS
from gateway.embedding.embedder import default_model_path
from gateway.embedding.onnx_backend import one_core_session, weights_file

_EXPORT_KIND = "embedder-tokens-int8-1"  # bump when the exported graph changes
_INPUTS = ("input_ids", "attention_mask", "token_type_ids")
MAX_TOKENS = 128  # word pieces read per text; the verifier compares questions, not documents
LRU_TEXTS = 1024
TOKEN_FEATURES = (
    "tok_min_a",  # the piece of a whose best match in b is worst
    "tok_min_b",
    "tok_mean_a",  # the mean of a's pieces' best matches in b
    "tok_mean_b",
    "tok_min",  # the worse of the two minima
    "tok_low2",  # the mean of the two worst matches of either side
)


class TokenStates:
    """One ONNX Runtime session (one thread) over the embedder's transformer; thread-safe."""

    def __init__(self, model_dir: Path | None = None) -> None:
        from tokenizers import Tokenizer

        model_dir = model_dir or default_model_path()
        self._tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
        self._tokenizer.enable_truncation(MAX_TOKENS)
        self._tokenizer.no_padding()
        path = cache_path(weights_file(model_dir), _EXPORT_KIND, ".onnx")
        if not path.is_file():
            export(model_dir, path)
        self._session = one_core_session(path)
        self._lru: OrderedDict[str, np.ndarray] = OrderedDict()
        self._lock = threading.Lock()
        self.passes = 0

    def content_states(self, text: str) -> np.ndarray:
        """Unit vectors of the text's content pieces (no [CLS]/[SEP], punctuation or
        stop word); all pieces when none is content."""
        with self._lock:
            if text in self._lru:
                self._lru.move_to_end(text)
                return self._lru[text]
        e = self._tokenizer.encode(text)
        ids = np.array([e.ids], dtype=np.int64)
        feed = {
            "input_ids": ids,
            "attention_mask": np.ones_like(ids),
            "token_type_ids": np.zeros_like(ids),
        }
        (hidden,) = self._session.run(None, feed)
        self.passes += 1
        keep = [i for i, t in enumerate(e.tokens) if _is_content(t)]
        states = hidden[0][keep or list(range(len(e.ids)))]
        states = states / np.maximum(np.linalg.norm(states, axis=1, keepdims=True), 1e-9)
        with self._lock:
            self._lru[text] = states
            if len(self._lru) > LRU_TEXTS:
                self._lru.popitem(last=False)
        return states

    def features(self, a: str, b: str) -> list[float]:
        """TOKEN_FEATURES of a pair, in that order."""
        return alignment(self.content_states(a), self.content_states(b))


def _is_content(piece: str) -> bool:
    word = piece.removeprefix("##")
    return piece not in ("[CLS]", "[SEP]") and word.isalnum() and piece not in STOPWORDS


def alignment(sa: np.ndarray, sb: np.ndarray) -> list[float]:
    sim = sa @ sb.T
    best_a, best_b = sim.max(axis=1), sim.max(axis=0)
    low2 = np.sort(np.concatenate([best_a, best_b]))[:2].mean()
    return [
        float(best_a.min()),
        float(best_b.min()),
        float(best_a.mean()),
        float(best_b.mean()),
        float(min(best_a.min(), best_b.min())),
        float(low2),
    ]


def export(model_dir: Path, target: Path) -> None:
    """Trace the transformer's last hidden state into an ONNX file with int8 weights
    (torch, once)."""
    import tempfile

    import torch
    from onnxruntime.quantization import QuantType, quantize_dynamic
    from transformers import AutoModel

    net = _states_module(AutoModel.from_pretrained(str(model_dir))).eval()
    ids = torch.tensor([[101, 2023, 2003, 1037, 3231, 102]])
    args = (ids, torch.ones_like(ids), torch.zeros_like(ids))
    with tempfile.TemporaryDirectory() as work, atomic_path(target) as tmp:
        fp32 = str(Path(work) / "fp32.onnx")
        with torch.inference_mode(), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the tracer's shape warnings: axes stay dynamic
            _trace(net, args, fp32)
        quantize_dynamic(fp32, tmp, weight_type=QuantType.QInt8)


def _trace(net: Any, args: tuple, path: str) -> None:
    import torch

    axes = {name: {0: "batch", 1: "tokens"} for name in (*_INPUTS, "states")}
    torch.onnx.export(
        net,
        args,
        path,
        input_names=list(_INPUTS),
        output_names=["states"],
        dynamic_axes=axes,
        opset_version=17,
        dynamo=False,
    )


def _states_module(transformer: Any) -> Any:  # torch is imported on use only
    import torch

    class States(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.transformer = transformer

        def forward(self, input_ids: Any, attention_mask: Any, token_type_ids: Any) -> Any:
            return self.transformer(
                input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids
            ).last_hidden_state

    return States()
