"""Score terms that remember the examples: a prompt scores what the examples most similar
to it scored. They catch task families whose difficulty is not linear in the embedding,
which the logistic regression cannot.

Both compute the prompt's cosine similarity to every example with `einsum`, not a BLAS
gemv: a threaded gemv makes the calling thread spin for its helper thread, 4 ms of CPU at
p99 against 0.26 ms this way (bench/router_eval.py's latency check, with two busy loops
holding both cores).
"""

from dataclasses import dataclass

import numpy as np

KERNEL_MAX_EXAMPLES = 5000  # the solve: 400 MB at peak and ~3 s here; beyond, `neighbours`


def similarities(vectors: np.ndarray, embedding: np.ndarray) -> np.ndarray:
    """Cosine similarity of a unit embedding to each unit row of `vectors`."""
    return np.einsum("ij,j->i", vectors, embedding.astype(vectors.dtype))


@dataclass(frozen=True)
class Neighbours:
    """The mean target of the `k` most similar examples. `center` is the mean target,
    the explanation's zero, as the classifier's."""

    vectors: np.ndarray  # (examples, dim) float32, L2-normalised as the embedder's
    targets: np.ndarray  # (examples,) float64 in [0, 1]
    k: int

    @property
    def center(self) -> float:
        return float(self.targets.mean())

    def predict(self, embedding: np.ndarray) -> float:
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
    """Kernel ridge regression of the targets on the examples' vectors, with the kernel
    exp((cosine - 1) / width): every example votes, the similar ones most. Training solves
    one examples x examples system: a fraction of a second for a thousand examples, and the
    reason to keep example sets to a few thousand."""

    vectors: np.ndarray  # (examples, dim) float32, unit rows
    alpha: np.ndarray  # (examples,) dual weights
    center: float  # the mean target: the prediction far from every example
    width: float

    @classmethod
    def fit(cls, vectors: np.ndarray, targets: np.ndarray, width: float, ridge: float) -> "Kernel":
        if len(targets) > KERNEL_MAX_EXAMPLES:
            raise ValueError(
                f"difficulty.blend.kernel: {len(targets)} examples, over the kernel's "
                f"{KERNEL_MAX_EXAMPLES} (it solves an examples x examples system); "
                "use blend.neighbours instead"
            )
        v = vectors.astype(np.float64)
        gram = np.exp((v @ v.T - 1) / width)
        center = float(targets.mean())
        alpha = np.linalg.solve(gram + ridge * np.eye(len(targets)), targets - center)
        return cls(vectors.astype(np.float32), alpha, center, width)

    def predict(self, embedding: np.ndarray) -> float:
        return float(self._from_similarity(similarities(self.vectors, embedding)))

    def predict_many(self, queries: np.ndarray) -> np.ndarray:
        """predict for each row of `queries` at once (offline: the CV benchmarks)."""
        return self._from_similarity(queries.astype(self.vectors.dtype) @ self.vectors.T)

    def _from_similarity(self, similarity: np.ndarray) -> np.ndarray:
        weights = np.exp((similarity.astype(np.float64) - 1) / self.width)
        return self.center + weights @ self.alpha
