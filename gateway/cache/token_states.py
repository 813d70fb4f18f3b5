"""The embedder's word-piece states, and how well each content piece of one question finds
a match in the other: what the `aligned` verifier adds to the lexical features.

A sentence embedding averages its word pieces, so one changed piece ("build an API" /
"what is an API", "land" / "sea animal") moves it little. The last layer's state of each
piece still says what that piece means in context: a piece of one question with no close
piece in the other is a change of ask, whatever the cosine. The states are the embedder's
own: its ONNX graph gives them beside the sentence vector (onnx_backend.py), so a text the
request path embedded (the lookup's query; a stored question, when it was asked) hands its
states over from that pass (`take_from`: ~1.5-4 ms of a core less per lookup). Any other
text runs the same graph once (one text per pass). A text's content states are kept in an
LRU bounded in bytes.
"""

import threading
from collections import OrderedDict
from pathlib import Path

import numpy as np

from gateway.cache.lexicon import STOPWORDS
from gateway.embedding.embedder import MAX_CHARS, Embedder, default_model_path
from gateway.embedding.onnx_backend import OnnxBackend, PieceStates

# ~15 KB per short question (its content pieces x 384 floats); a long prompt's up to ~400 KB
LRU_BYTES = 48 * 2**20
# Each side's figure is read as the lower and the higher of the two, not as the query's
# and the stored question's: which of two questions is stored first is chance, so a
# verdict must not depend on it (the pair files always put the question first and its
# rewording or edit second, and a model reading the sides apart learned that order).
TOKEN_FEATURES = (
    "tok_min",  # the piece, of either side, whose best match in the other is worst
    "tok_min_high",  # the other side's worst-matched piece
    "tok_mean_low",  # the lower of the two sides' means of their pieces' best matches
    "tok_mean_high",
    "tok_low2",  # the mean of the two worst matches of either side
)


class TokenStates:
    """Content states of texts, from the embedder's passes or a pass of the same graph;
    thread-safe."""

    def __init__(self, model_dir: Path | None = None) -> None:
        self.model_dir = model_dir or default_model_path()
        self._backend: OnnxBackend | None = None  # opened at the first text not handed over
        self._embedder: Embedder | None = None  # whose request path hands its states over
        self._lru: OrderedDict[str, np.ndarray] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()
        self.passes = 0  # passes of our own, so tests can see the hand-over at work

    def take_from(self, embedder: Embedder) -> None:
        """Keep the states of what `embedder` embeds on the request path (and run misses on
        its graph), where it is this model on ONNX Runtime."""
        if embedder.model_dir == self.model_dir and embedder.onnx_backend is not None:
            self._backend = embedder.onnx_backend
            embedder.states_sink = self.remember
            self._embedder = embedder

    def release(self) -> None:
        """Stop taking the embedder's states (its cache closed)."""
        if self._embedder is not None and self._embedder.states_sink == self.remember:
            self._embedder.states_sink = None
        self._embedder = None

    def remember(self, text: str, pieces: PieceStates) -> np.ndarray:
        """Keep a text's content states (from a pass that read it); returns them."""
        states = _content_states(pieces)
        with self._lock:
            if text not in self._lru:
                self._lru[text] = states
                self._bytes += states.nbytes
            while self._bytes > LRU_BYTES and len(self._lru) > 1:
                self._bytes -= self._lru.popitem(last=False)[1].nbytes
        return states

    def content_states(self, text: str) -> np.ndarray:
        """Unit vectors of the text's content pieces (no [CLS]/[SEP], punctuation or
        stop word); all pieces when none is content."""
        text = text[:MAX_CHARS]  # as the embedder reads it
        with self._lock:
            if text in self._lru:
                self._lru.move_to_end(text)
                return self._lru[text]
            if self._backend is None:
                self._backend = OnnxBackend(self.model_dir)
            backend = self._backend
        _, (pieces,) = backend.encode_with_states([text])
        self.passes += 1
        return self.remember(text, pieces)

    def features(self, a: str, b: str) -> list[float]:
        """TOKEN_FEATURES of a pair, in that order."""
        return alignment(self.content_states(a), self.content_states(b))


def _content_states(pieces: PieceStates) -> np.ndarray:
    keep = [i for i, t in enumerate(pieces.pieces) if _is_content(t)]
    states = pieces.states[keep or list(range(len(pieces.pieces)))]
    return states / np.maximum(np.linalg.norm(states, axis=1, keepdims=True), 1e-9)


def _is_content(piece: str) -> bool:
    word = piece.removeprefix("##")
    return piece not in ("[CLS]", "[SEP]") and word.isalnum() and piece not in STOPWORDS


def alignment(sa: np.ndarray, sb: np.ndarray) -> list[float]:
    """TOKEN_FEATURES of two texts' content states: the same either way round."""
    sim = sa @ sb.T
    best_a, best_b = sim.max(axis=1), sim.max(axis=0)
    low2 = np.sort(np.concatenate([best_a, best_b]))[:2].mean()
    minima = sorted((float(best_a.min()), float(best_b.min())))
    means = sorted((float(best_a.mean()), float(best_b.mean())))
    return [*minima, *means, float(low2)]
