"""A prompt's words and word pairs, hashed: the part of difficulty a sentence embedding blurs.

"What day is it 2 days after Monday?" and "... 47 days before Monday?" embed almost alike,
yet one tier answers the first and not the second. Here numbers become their digit count
("#1", "#2"), so two prompts share a feature when they share a word, a word pair or the
size of a number in the same place. The kernel term (gateway/routing/nearest.py) mixes this
cosine with the embedding's.

Each prompt is a set of hashed features (binary, unit length: the cosine of two prompts is
the features they share over the geometric mean of their counts). Tokenizing is one regex
pass over at most MAX_CHARS, hashing is crc32: stable across processes, unlike `hash`.
"""

import re
import zlib
from dataclasses import dataclass
from itertools import pairwise

import numpy as np

DIM = 1 << 15  # hashed feature space; collisions at a few thousand examples are rare
MAX_CHARS = 4096  # the embedding reads ~256 word pieces; this reads a little more
MAX_DIGITS = 8  # longer numbers all read "#8"
_TOKEN = re.compile(r"\d+(?:\.\d+)?|[^\W\d_]+|[^\w\s]")


def lexical_tokens(text: str) -> list[str]:
    """Lower-cased words, single punctuation marks, and numbers as `#<digits>` (a decimal
    `#<digits>f`)."""
    tokens = []
    for token in _TOKEN.findall(text[:MAX_CHARS].lower()):
        if token[0].isdigit():
            whole, _, fraction = token.partition(".")
            token = f"#{min(len(whole), MAX_DIGITS)}{'f' if fraction else ''}"
        tokens.append(token)
    return tokens


def lexical_features(text: str) -> np.ndarray:
    """Sorted unique hashed indices of the prompt's tokens, token pairs and number count."""
    tokens = lexical_tokens(text)
    numbers = sum(t[0] == "#" for t in tokens)
    names = [*tokens, *(f"{a} {b}" for a, b in pairwise(tokens)), f"numbers={numbers}"]
    return np.unique(np.array([zlib.crc32(n.encode()) % DIM for n in names], dtype=np.int64))


@dataclass(frozen=True)
class LexicalIndex:
    """The examples' features as an inverted index: feature -> the examples that have it."""

    postings: np.ndarray  # example ids, grouped by feature
    starts: np.ndarray  # (DIM + 1,) where each feature's group starts in `postings`
    inverse_norms: np.ndarray  # (examples,) 1 / sqrt(feature count)

    @classmethod
    def build(cls, texts: list[str]) -> "LexicalIndex":
        features = [lexical_features(t) for t in texts]
        counts = np.array([len(f) for f in features], dtype=np.float64)
        flat = np.concatenate(features)
        owners = np.repeat(np.arange(len(texts)), [len(f) for f in features])
        order = np.argsort(flat, kind="stable")
        starts = np.searchsorted(flat[order], np.arange(DIM + 1))
        return cls(owners[order], starts, 1.0 / np.sqrt(np.maximum(counts, 1.0)))

    def __len__(self) -> int:
        return len(self.inverse_norms)

    def similarities(self, text: str) -> np.ndarray:
        """Cosine of the prompt to every example: shared features, counted by posting."""
        features = lexical_features(text)
        lists = [self.postings[self.starts[f] : self.starts[f + 1]] for f in features]
        shared = np.bincount(np.concatenate(lists), minlength=len(self))
        return shared * self.inverse_norms / np.sqrt(max(len(features), 1))

    def gram(self) -> np.ndarray:
        """Every example's cosine to every other (training only: examples x examples)."""
        out = np.zeros((len(self), len(self)))
        self.add_gram(out, 1.0)
        return out

    def add_gram(self, out: np.ndarray, share: float, rows: int = 256) -> None:
        """out += share x gram(), a block of rows at a time: the whole sparse product at
        once would take more memory than the dense result."""
        from scipy import sparse  # imported on use: training only

        features = np.repeat(np.arange(DIM), np.diff(self.starts))
        ones = np.ones(len(self.postings))
        incidence = sparse.csr_matrix((ones, (self.postings, features)), shape=(len(self), DIM))
        column_scale = share * self.inverse_norms
        for start in range(0, len(self), rows):
            block = (incidence[start : start + rows] @ incidence.T).toarray()
            block *= self.inverse_norms[start : start + rows, None]
            block *= column_scale
            out[start : start + rows] += block
