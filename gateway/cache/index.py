"""FAISS vectors per scope: exact inner product while small, IVF above a size the policy sets.

Each scope has its own index, so a search can only ever return that scope's entries. Entry
ids are strings (shared by replicas); FAISS labels are per-process integers mapped to them.
Nothing here is thread-safe: the cache runs every call on one worker thread (and IVF
training, which touches only its own copy of the vectors, on another).
"""

import logging
import math
from concurrent.futures import Executor, Future, wait
from dataclasses import dataclass

import faiss
import numpy as np

logger = logging.getLogger("tiergate.cache")

MIN_LISTS = 16
PROBES = 16  # inverted lists searched per query: recall against speed
POINTS_PER_LIST = 64  # training sample per list: k-means cost stays well under a second
RETRAIN_GROWTH = 4  # an IVF trained at n is retrained (more lists) once it holds 4n


def use_one_thread() -> None:
    """Run this thread's FAISS calls single-threaded (OpenMP's setting is per thread).

    One query has too little work to split: measured on a loaded 2-core machine, a 10k flat
    search took 70-85 ms p50 with two OpenMP threads spin-waiting on a descheduled sibling,
    and 0.4-0.5 ms with one.
    """
    faiss.omp_set_num_threads(1)


@dataclass(frozen=True)
class Hit:
    entry_id: str
    similarity: float


class ScopeIndex:
    """One scope's vectors. Turning approximate (or retraining a grown IVF) happens on the
    `trainer` thread when one is given and the index already serves: searches go on against
    the current index meanwhile, changes are logged and replayed onto the new one."""

    def __init__(self, dim: int, approximate_above: int, trainer: Executor | None = None):
        self.dim = dim
        self.approximate_above = approximate_above
        self._trainer = trainer
        self._labels: dict[str, int] = {}
        self._ids: dict[int, str] = {}
        self._next_label = 0
        self._trained_at = 0  # size the IVF was trained at; 0: the index is flat
        self._index: faiss.Index = _flat(dim)
        self._training: Future | None = None  # -> (new index, size trained at)
        self._added_since: list[tuple[np.ndarray, np.ndarray]] = []  # (labels, rows)
        self._removed_since: list[np.ndarray] = []

    def __len__(self) -> int:
        return len(self._labels)

    def __contains__(self, entry_id: str) -> bool:
        return entry_id in self._labels

    @property
    def kind(self) -> str:
        return "ivf" if self._trained_at else "flat"

    def add(self, ids: list[str], vectors: np.ndarray) -> None:
        """Add (or replace) vectors; rows of `vectors` are float32, L2-normalised."""
        self.remove([i for i in ids if i in self._labels])
        self._swap_if_trained()
        rows = _rows(vectors, self.dim)
        labels = np.arange(self._next_label, self._next_label + len(ids), dtype=np.int64)
        self._next_label += len(ids)
        for entry_id, label in zip(ids, labels.tolist(), strict=True):
            self._labels[entry_id] = label
            self._ids[label] = entry_id
        n = len(self)
        grown = n > self.approximate_above and (
            not self._trained_at or n > RETRAIN_GROWTH * self._trained_at
        )
        if grown and self._training is None and (self._trainer is None or n == len(ids)):
            old_labels, old_rows = self._contents(exclude=len(ids))
            all_labels = np.concatenate([old_labels, labels])
            all_rows = np.concatenate([old_rows, rows])
            self._index, self._trained_at = _build(self.dim, all_labels, all_rows, True)
            return
        self._index.add_with_ids(rows, labels)
        if self._training is not None:
            self._added_since.append((labels, rows))
        elif grown:
            self._training = self._trainer.submit(_build, self.dim, *self._contents(), True)

    def remove(self, ids: list[str]) -> int:
        self._swap_if_trained()
        labels = [self._labels.pop(i) for i in ids if i in self._labels]
        for label in labels:
            del self._ids[label]
        if labels:
            removed = np.asarray(labels, dtype=np.int64)
            self._index.remove_ids(removed)
            if self._training is not None:
                self._removed_since.append(removed)
        if self._trained_at and len(self) < self.approximate_above // 2:
            self._forget_training()
            self._index, self._trained_at = _build(self.dim, *self._contents(), False)
        return len(labels)

    def search(self, vector: np.ndarray, k: int) -> list[Hit]:
        self._swap_if_trained()
        if not self._labels:
            return []
        scores, labels = self._index.search(_rows(vector, self.dim), min(k, len(self)))
        return [
            Hit(self._ids[label], float(score))
            for score, label in zip(scores[0].tolist(), labels[0].tolist(), strict=True)
            if label >= 0
        ]

    def wait_for_training(self) -> None:
        if self._training is not None:
            wait([self._training])
            self._swap_if_trained()

    def bytes_per_entry(self) -> int:
        """FAISS storage per vector plus the id maps (measured figures: bench/cache_lookup.py)."""
        vector = 4 * self.dim + 8  # the float32 row and its int64 label
        if self._trained_at:
            vector += 16  # the direct map's hash-table slot, needed for deletes
        return vector + 2 * 100  # two dict items with a 32-character id string

    # --- internals ---------------------------------------------------------------------

    def _contents(self, exclude: int = 0) -> tuple[np.ndarray, np.ndarray]:
        """Labels and rows in the current index (the newest `exclude` labels left out)."""
        labels = np.fromiter(self._ids, dtype=np.int64, count=len(self._ids) - exclude)
        if not len(labels):
            return labels, np.zeros((0, self.dim), dtype=np.float32)
        return labels, self._index.reconstruct_batch(labels)

    def _swap_if_trained(self) -> None:
        if self._training is None or not self._training.done():
            return
        training, added, removed = self._training, self._added_since, self._removed_since
        self._forget_training()
        try:
            index, trained_at = training.result()
        except Exception:  # keep serving from the current index; the next add retries
            logger.exception("training the approximate index failed")
            return
        for labels, rows in added:  # replay what changed while it trained, in order
            index.add_with_ids(rows, labels)
        for labels in removed:
            index.remove_ids(labels)
        self._index, self._trained_at = index, trained_at

    def _forget_training(self) -> None:
        self._training, self._added_since, self._removed_since = None, [], []


def _flat(dim: int) -> faiss.Index:
    return faiss.IndexIDMap2(faiss.IndexFlatIP(dim))


def _build(
    dim: int, labels: np.ndarray, rows: np.ndarray, approximate: bool
) -> tuple[faiss.Index, int]:
    """A new index holding `rows`: IVF trained on them, or flat; and the size trained at."""
    index = _ivf(dim, rows) if approximate else _flat(dim)
    if len(labels):
        index.add_with_ids(rows, labels)
    return index, len(labels) if approximate else 0


def _ivf(dim: int, vectors: np.ndarray) -> faiss.Index:
    n_lists = max(MIN_LISTS, int(math.sqrt(len(vectors))))
    quantizer = faiss.IndexFlatIP(dim)
    index = faiss.IndexIVFFlat(quantizer, dim, n_lists, faiss.METRIC_INNER_PRODUCT)
    index.cp.max_points_per_centroid = POINTS_PER_LIST
    index.cp.seed = 1234
    index.train(vectors)
    index.set_direct_map_type(faiss.DirectMap.Hashtable)
    index.nprobe = min(PROBES, n_lists)
    return index


class CacheIndex:
    """Every scope's index; a scope's index is dropped when its last entry goes."""

    def __init__(self, dim: int, approximate_above: int, trainer: Executor | None = None):
        self.dim = dim
        self.approximate_above = approximate_above
        self._trainer = trainer
        self._scopes: dict[str, ScopeIndex] = {}

    def add(self, scope: str, ids: list[str], vectors: np.ndarray) -> None:
        index = self._scopes.get(scope)
        if index is None:
            index = ScopeIndex(self.dim, self.approximate_above, self._trainer)
            self._scopes[scope] = index
        index.add(ids, vectors)

    def remove(self, scope: str, ids: list[str]) -> int:
        index = self._scopes.get(scope)
        if index is None:
            return 0
        removed = index.remove(ids)
        if not len(index):
            del self._scopes[scope]
        return removed

    def search(self, scope: str, vector: np.ndarray, k: int) -> list[Hit]:
        index = self._scopes.get(scope)
        return index.search(vector, k) if index is not None else []

    def clear(self) -> None:
        self._scopes.clear()

    def stats(self) -> dict:
        kinds = {"flat": 0, "ivf": 0}
        total_bytes = 0
        for index in list(self._scopes.values()):  # called from the event loop
            kinds[index.kind] += len(index)
            total_bytes += index.bytes_per_entry() * len(index)
        entries = sum(kinds.values())
        return {
            "scopes": len(self._scopes),
            "vectors": entries,
            "vectors_by_index_kind": kinds,
            "index_bytes_per_entry": round(total_bytes / entries) if entries else 0,
        }


def _rows(vectors: np.ndarray, dim: int) -> np.ndarray:
    return np.ascontiguousarray(np.asarray(vectors, dtype=np.float32).reshape(-1, dim))
