"""The sentence embedder through ONNX Runtime: the torch model's numbers at ~2.5x less CPU.

One embedding of a 17-word-piece question on one core (AMD EPYC): sentence-transformers'
`encode` 13.8 ms, this 5.9 ms, and the vectors agree to within 1e-6 of cosine (the verifier
and the difficulty router, trained on torch vectors, see the same numbers). The time goes
in eager PyTorch's per-layer dispatch and weight packing for tiny matrices, and in `encode`
moving and re-`eval()`ing the whole module tree on every call; ONNX Runtime packs the
weights once when the session opens.

The graph (BERT, mean pooling over the attention mask, L2 normalisation) is exported once
from the torch model, with the last layer's word-piece states as a second output (what the
`aligned` and `nli` verifiers compare: token_states.py), and kept under the cache dir, so
later starts open it in ~0.3 s without loading torch's copy. Only mean-pooled, normalised
sentence-transformers models are exported; anything else (or a missing onnxruntime / onnx)
stays on torch.
"""

import json
import logging
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from engine.cache_files import atomic_path, cache_path

log = logging.getLogger(__name__)

_EXPORT_KIND = "embedder-onnx-2"  # bump when the exported graph changes
_INPUTS = ("input_ids", "attention_mask", "token_type_ids")


class OnnxUnavailable(RuntimeError):
    """This model cannot run on ONNX Runtime here (package missing, layout not supported)."""


def weights_file(model_dir: Path) -> Path:
    for name in ("model.safetensors", "pytorch_model.bin"):
        if (model_dir / name).is_file():
            return model_dir / name
    raise OnnxUnavailable(f"no model.safetensors or pytorch_model.bin in {model_dir}")


def exported_path(model_dir: Path) -> Path:
    """Where the graph of this model folder lives; a new one when the weights change."""
    return cache_path(weights_file(model_dir), _EXPORT_KIND, ".onnx")


def export(model_dir: Path, target: Path) -> None:
    """Trace the torch model (with its pooling and normalisation) into an ONNX file."""
    import torch
    from sentence_transformers import SentenceTransformer

    st = SentenceTransformer(str(model_dir), device="cpu")
    layout = [type(m).__name__ for m in st]
    pooling = st[1].get_config_dict().get("pooling_mode") if len(st) > 1 else None
    if layout != ["Transformer", "Pooling", "Normalize"] or pooling != "mean":
        raise OnnxUnavailable(f"only mean-pooled, normalised models are exported: {layout}")
    graph = _pooled(st[0].auto_model).eval()
    # A padded batch, so the trace keeps the attention-mask path (an all-ones mask may be
    # dropped by the model's own shortcut).
    example = st.tokenizer(["a short one", "a longer example sentence"], padding=True)
    args = tuple(torch.tensor(example[name]) for name in _INPUTS)
    axes = {name: {0: "batch", 1: "tokens"} for name in _INPUTS}
    with atomic_path(target) as tmp, torch.inference_mode(), warnings.catch_warnings():
        # The tracer warns of shape-dependent branches; the batch and token axes stay
        # dynamic, and tests check padded batches and long texts against torch.
        warnings.simplefilter("ignore")
        torch.onnx.export(
            graph,
            args,
            tmp,
            input_names=list(_INPUTS),
            output_names=["embedding", "states"],
            dynamic_axes={**axes, "embedding": {0: "batch"}, "states": {0: "batch", 1: "tokens"}},
            opset_version=17,
            dynamo=False,  # the TorchScript tracer: no onnxscript needed, ~2 s
        )


def _pooled(transformer: Any) -> Any:  # torch types: torch is imported on use only
    """The transformer followed by sentence-transformers' mean pooling and Normalize; the
    last layer's states too."""
    import torch

    class Pooled(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.transformer = transformer

        def forward(self, input_ids: Any, attention_mask: Any, token_type_ids: Any) -> Any:
            hidden = self.transformer(
                input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids
            ).last_hidden_state
            mask = attention_mask.unsqueeze(-1).to(hidden.dtype)
            mean = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
            return torch.nn.functional.normalize(mean, dim=-1), hidden

    return Pooled()


@dataclass
class _Tokenized:
    arrays: dict[str, np.ndarray]
    lengths: list[int]
    pieces: list[list[str]]


@dataclass(frozen=True)
class PieceStates:
    """One text's word pieces and the last layer's state of each ([pieces, dim])."""

    pieces: list[str]
    states: np.ndarray


class OnnxBackend:
    """Tokenizer and ONNX Runtime session for one model folder; `encode` is thread-safe."""

    name = "onnx"

    def __init__(self, model_dir: Path) -> None:
        try:
            import onnxruntime  # noqa: F401  (the session is opened below)
        except ImportError as exc:
            raise OnnxUnavailable("onnxruntime is not installed") from exc
        from tokenizers import Tokenizer

        try:  # a folder without these files is left to sentence-transformers on torch
            config = json.loads((model_dir / "sentence_bert_config.json").read_text())
            self._tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
        except Exception as exc:
            raise OnnxUnavailable(f"no tokenizer.json or sentence_bert_config.json: {exc}") from exc
        self.max_seq_length: int = int(config.get("max_seq_length", 256))
        # The file's own settings (fixed padding to 128, cut at 128) are not the model's.
        self._tokenizer.enable_truncation(self.max_seq_length)
        self._tokenizer.no_padding()
        self._session = _open_session(model_dir)
        self.dim: int = int(self._session.get_outputs()[0].shape[-1])

    def encode(self, texts: list[str]) -> np.ndarray:
        arrays = self._tokenize(texts).arrays
        (vectors,) = self._session.run(["embedding"], arrays)
        return np.ascontiguousarray(vectors, dtype=np.float32)

    def encode_with_states(self, texts: list[str]) -> tuple[np.ndarray, list[PieceStates]]:
        """`encode`'s vectors and each text's word-piece states, from the same pass."""
        tokenized = self._tokenize(texts)
        vectors, hidden = self._session.run(["embedding", "states"], tokenized.arrays)
        states = [
            PieceStates(pieces, hidden[row, : len(pieces)])
            for row, pieces in enumerate(tokenized.pieces)
        ]
        return np.ascontiguousarray(vectors, dtype=np.float32), states

    def token_counts(self, texts: list[str]) -> list[int]:
        return self._tokenize(texts).lengths

    def _tokenize(self, texts: list[str]) -> _Tokenized:
        encodings = self._tokenizer.encode_batch(texts)
        lengths = [len(e.ids) for e in encodings]
        width = max(lengths)
        arrays = {name: np.zeros((len(texts), width), dtype=np.int64) for name in _INPUTS}
        for row, e in enumerate(encodings):
            n = len(e.ids)
            arrays["input_ids"][row, :n] = e.ids
            arrays["attention_mask"][row, :n] = 1
            arrays["token_type_ids"][row, :n] = e.type_ids
        return _Tokenized(arrays, lengths, [e.tokens for e in encodings])


def one_core_session(path: Path) -> Any:
    """An ONNX Runtime session on one core (the embedder's and the verifiers' graphs): as
    the torch embedder, beside the engine's threads a second one only waits for a core."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def _open_session(model_dir: Path) -> Any:
    path = exported_path(model_dir)
    if path.is_file():
        try:
            return one_core_session(path)
        except Exception as exc:  # an unreadable cache file is rebuilt, not trusted
            log.warning("embedder: cached graph %s unreadable (%s); exporting again", path, exc)
    try:
        export(model_dir, path)
    except OnnxUnavailable:
        raise
    except Exception as exc:  # onnx missing, a tracer failure: torch still serves
        raise OnnxUnavailable(f"ONNX export failed: {exc!r}") from exc
    log.info("embedder: exported %s to %s", model_dir.name, path)
    return one_core_session(path)
