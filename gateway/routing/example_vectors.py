"""The difficulty examples' embeddings, kept on disk per text: one store per embedder model
(`<cache>/difficulty/<model digest>/`: vectors.npy and the texts' digests in keys.json, row
by row). A load embeds only the texts the store lacks, so an examples file that grows by a
refit's traffic (`tiergate router learn`) or a restart costs the new prompts alone, not
the thousands of prior examples again.

A damaged or torn store (the two files disagree) is embedded again and replaced. The store
keeps every text it has seen up to MAX_ROWS; past that it is rewritten with the current
prompts only.
"""

import hashlib
import json
import logging
from pathlib import Path

import numpy as np

logger = logging.getLogger("tiergate.routing")

MAX_ROWS = 100_000  # ~150 MB of 384-d float32 vectors


def text_key(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def store_dir(root: Path, model: str) -> Path:
    return root / hashlib.sha256(model.encode()).hexdigest()[:16]


def load(folder: Path) -> tuple[list[str], np.ndarray | None]:
    """The stored keys and their vectors (none when the store is missing or torn)."""
    try:
        keys = json.loads((folder / "keys.json").read_text())
        vectors = np.load(folder / "vectors.npy")
    except (OSError, ValueError):
        return [], None
    if not isinstance(keys, list) or vectors.ndim != 2 or vectors.shape[0] != len(keys):
        return [], None
    return keys, vectors


def save(folder: Path, keys: list[str], vectors: np.ndarray) -> None:
    """Vectors first, keys last, each by an atomic rename: a reader sees the old pair, the
    new pair, or a mismatch that `load` refuses."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        np.save(folder / "vectors.tmp.npy", vectors)
        (folder / "vectors.tmp.npy").replace(folder / "vectors.npy")
        (folder / "keys.tmp.json").write_text(json.dumps(keys))
        (folder / "keys.tmp.json").replace(folder / "keys.json")
    except OSError:
        logger.warning("cannot keep the example embeddings in %s", folder)


def cached_vectors(prompts: list[str], folder: Path, embed) -> np.ndarray:
    """The prompts' vectors in their order: stored ones read, the rest embedded by
    `embed(texts) -> array` and added to the store."""
    keys = [text_key(p) for p in prompts]
    stored, vectors = load(folder)
    row = {k: i for i, k in enumerate(stored)}
    missing = list(dict.fromkeys(k for k in keys if k not in row))
    if missing:
        text_of = dict(zip(keys, prompts, strict=True))
        new = embed([text_of[k] for k in missing])
        if vectors is None or vectors.shape[1] != new.shape[1]:
            stored, vectors = [], np.empty((0, new.shape[1]), dtype=np.float32)
        stored, vectors = [*stored, *missing], np.concatenate([vectors, new.astype(np.float32)])
        if len(stored) > MAX_ROWS:
            wanted = set(keys)
            kept = [i for i, k in enumerate(stored) if k in wanted]
            stored, vectors = [stored[i] for i in kept], vectors[kept]
        save(folder, stored, vectors)
        row = {k: i for i, k in enumerate(stored)}
    return vectors[[row[k] for k in keys]]
