"""Score terms that remember the examples: a prompt scores what the examples most similar
to it scored. They catch task families whose difficulty is not linear in the embedding,
which the logistic regression cannot.

Both compute the prompt's cosine similarity to every example with `einsum`, not a BLAS
gemv: a threaded gemv makes the calling thread spin for its helper thread, 4 ms of CPU at
p99 against 0.26 ms this way (bench/router_eval.py's latency check, with two busy loops
holding both cores). They keep the examples' vectors column by column (`vectors` is a
transposed view): einsum then adds whole contiguous rows, 0.13 ms against 0.20 ms p50 for
3,590 examples.
"""

import hashlib
from dataclasses import dataclass

import numpy as np

from gateway.routing.lexical import LexicalIndex

# Without centres, training peaks at one 5,000² float64 array (200 MB); with them at one
# examples x centres array, and the limit is on the centres.
KERNEL_MAX_EXAMPLES = 5000


def similarities(vectors: np.ndarray, embedding: np.ndarray) -> np.ndarray:
    """Cosine similarity of a unit embedding to each unit row of `vectors`."""
    return np.einsum("ji,j->i", vectors.T, embedding.astype(vectors.dtype))


def by_columns(vectors: np.ndarray) -> np.ndarray:
    """The same (examples, dim) array in float32, stored dim by dim (what `similarities`
    reads fastest)."""
    return np.ascontiguousarray(vectors.T, dtype=np.float32).T


@dataclass(frozen=True)
class Neighbours:
    """The mean target of the `k` most similar examples. `center` is the mean target,
    the explanation's zero, as the classifier's."""

    vectors: np.ndarray  # (examples, dim) float32, L2-normalised as the embedder's
    targets: np.ndarray  # (examples,) float64 in [0, 1]
    k: int

    def __post_init__(self) -> None:
        object.__setattr__(self, "vectors", by_columns(self.vectors))

    @property
    def center(self) -> float:
        return float(self.targets.mean())

    def predict(self, embedding: np.ndarray, text: str = "") -> float:
        """`text` plays no part: neighbours are by embedding alone."""
        return float(self._from_similarity(similarities(self.vectors, embedding)))

    def predict_many(self, queries: np.ndarray) -> np.ndarray:
        """predict for each row of `queries` at once (offline: the CV benchmarks)."""
        return self._from_similarity(queries.astype(self.vectors.dtype) @ self.vectors.T)

    def _from_similarity(self, similarity: np.ndarray) -> np.ndarray:
        k = min(self.k, similarity.shape[-1])
        nearest = np.argpartition(-similarity, k - 1, axis=-1)[..., :k]
        return self.targets[nearest].mean(axis=-1)


@dataclass(frozen=True)
class Kernel:
    """Kernel ridge regression of the targets on the examples, with the kernel
    exp((similarity - 1) / width): every example votes, the similar ones most. The
    similarity is the embeddings' cosine mixed with the prompts' word cosine
    (gateway/routing/lexical.py) by `lexical_share`. Training solves one examples x
    examples system: a fraction of a second for a thousand examples, and the reason to
    keep example sets to a few thousand."""

    vectors: np.ndarray  # (examples, dim) float32, unit rows
    alpha: np.ndarray  # (examples,) dual weights
    center: float  # the mean target: the prediction far from every example
    width: float
    lexical: LexicalIndex | None = None  # the examples' words, when lexical_share > 0
    lexical_share: float = 0.0

    def __post_init__(self) -> None:
        object.__setattr__(self, "vectors", by_columns(self.vectors))

    @classmethod
    def fit(
        cls,
        vectors: np.ndarray,
        targets: np.ndarray,
        width: float,
        ridge: float,
        lexical: LexicalIndex | None = None,
        lexical_share: float = 0.0,
    ) -> "Kernel":
        if len(targets) > KERNEL_MAX_EXAMPLES:
            raise ValueError(
                f"difficulty.blend.kernel: {len(targets)} examples, over the kernel's "
                f"{KERNEL_MAX_EXAMPLES} (it solves an examples x examples system); "
                "set difficulty.kernel_centres or use blend.neighbours instead"
            )
        if lexical is None or lexical_share <= 0:
            lexical, lexical_share = None, 0.0
        similarity = example_similarities(vectors, lexical, lexical_share)
        return cls.solve(vectors, similarity, targets, width, ridge, lexical, lexical_share)

    @classmethod
    def solve(
        cls,
        vectors: np.ndarray,
        similarity: np.ndarray,
        targets: np.ndarray,
        width: float,
        ridge: float,
        lexical: LexicalIndex | None,
        lexical_share: float,
    ) -> "Kernel":
        """fit, given the examples' similarities, which it overwrites: they become the
        kernel matrix plus the ridge, solved by Cholesky in place (a kernel matrix plus a
        ridge is positive definite), so training holds one examples x examples array at a
        time. Benchmarks that reuse similarities across widths pass a copy."""
        from scipy.linalg import solve  # imported on use: training only

        gram = similarity
        gram -= 1.0
        gram /= width
        np.exp(gram, out=gram)
        gram.flat[:: len(targets) + 1] += ridge
        center = float(targets.mean())
        try:
            alpha = solve(gram, targets - center, assume_a="pos", overwrite_a=True)
        except np.linalg.LinAlgError:
            raise ValueError(
                f"difficulty.kernel_ridge: {ridge} is too small for these examples (their "
                "kernel system is singular in floating point); raise it"
            ) from None
        return cls(vectors, alpha, center, width, lexical, lexical_share)

    @classmethod
    def solve_centres(
        cls,
        vectors: np.ndarray,
        cross: np.ndarray,
        centres: np.ndarray,
        targets: np.ndarray,
        width: float,
        ridge: float,
        lexical: LexicalIndex | None,
        lexical_share: float,
    ) -> "Kernel":
        """Kernel ridge by subset of regressors: the prediction is a kernel sum over the
        `centres` (indices of examples) alone, fitted to every example's target, so scoring
        costs centres, not examples, and training one examples x centres array. `cross`:
        every example's similarity to each centre (overwritten). minimises
        |y - K_nc a|^2 + ridge a' K_cc a: a = (K_cn K_nc + ridge K_cc)^-1 K_cn y, which is
        plain kernel ridge when every example is a centre."""
        from scipy.linalg import solve  # imported on use: training only

        if len(centres) > KERNEL_MAX_EXAMPLES:
            raise ValueError(
                f"difficulty.kernel_centres: {len(centres)}, over the kernel's "
                f"{KERNEL_MAX_EXAMPLES} (it solves a centres x centres system)"
            )
        gram = cross
        gram -= 1.0
        gram /= width
        np.exp(gram, out=gram)
        center = float(targets.mean())
        system = gram.T @ gram
        system += ridge * gram[centres]
        # a jitter: near-duplicate centres make K_cc singular in floating point
        system.flat[:: len(centres) + 1] += 1e-9 * np.trace(system) / len(centres) + 1e-12
        try:
            alpha = solve(system, gram.T @ (targets - center), assume_a="pos", overwrite_a=True)
        except np.linalg.LinAlgError:
            raise ValueError(
                f"difficulty.kernel_ridge: {ridge} is too small for these examples (their "
                "kernel system is singular in floating point); raise it"
            ) from None
        return cls(vectors[centres], alpha, center, width, lexical, lexical_share)

    def predict(self, embedding: np.ndarray, text: str = "") -> float:
        similarity = similarities(self.vectors, embedding).astype(np.float64)
        if self.lexical is not None:
            words = self.lexical.similarities(text)
            similarity = (1 - self.lexical_share) * similarity + self.lexical_share * words
        return float(self._from_similarity(similarity))

    def predict_many(self, queries: np.ndarray, texts: list[str] | None = None) -> np.ndarray:
        """predict for each row of `queries` (and its text) at once (offline: the benchmarks)."""
        similarity = (queries.astype(self.vectors.dtype) @ self.vectors.T).astype(np.float64)
        if self.lexical is not None:
            assert texts is not None, "a kernel with a lexical share needs the texts"
            words = np.stack([self.lexical.similarities(t) for t in texts])
            similarity = (1 - self.lexical_share) * similarity + self.lexical_share * words
        return self._from_similarity(similarity)

    def _from_similarity(self, similarity: np.ndarray) -> np.ndarray:
        return self.center + np.exp((similarity - 1) / self.width) @ self.alpha


def centre_indices(prompts: list[str], centres: int | None) -> np.ndarray | None:
    """The examples the kernel scores against when `centres` is below their count: the
    first by a hash of their prompt (fixed whatever the file's order), in file order; None
    for all of them."""
    if centres is None or centres >= len(prompts):
        return None
    ranked = sorted(range(len(prompts)), key=lambda i: hashlib.sha256(prompts[i].encode()).digest())
    return np.sort(np.array(ranked[:centres], dtype=np.int64))


def centre_similarities(
    vectors: np.ndarray,
    centres: np.ndarray,
    prompts: list[str],
    lexical: LexicalIndex | None,
    lexical_share: float,
) -> np.ndarray:
    """Every example's similarity to each centre, as the kernel mixes them (`lexical`
    indexes the centres' prompts)."""
    v = vectors.astype(np.float64)
    similarity = v @ v[centres].T
    if lexical is not None and lexical_share > 0:
        similarity *= 1 - lexical_share
        similarity += lexical_share * np.stack([lexical.similarities(p) for p in prompts])
    return similarity


def example_similarities(
    vectors: np.ndarray, lexical: LexicalIndex | None, lexical_share: float
) -> np.ndarray:
    """Every example's similarity to every other, as the kernel mixes them."""
    v = vectors.astype(np.float64)
    similarity = v @ v.T
    if lexical is not None and lexical_share > 0:
        similarity *= 1 - lexical_share
        lexical.add_gram(similarity, lexical_share)
    return similarity
