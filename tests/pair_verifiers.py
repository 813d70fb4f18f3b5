"""For the pair verifiers' tests: the embedder's cosine of two questions, as a cache lookup
computes it (what they hand to `verify`), a shipped artifact checked against its class's
features, and lookups through a real cache."""

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from gateway.cache.semantic import CachedAnswer, CacheQuery, Lookup, SemanticCache
from gateway.cache.verifier import STRICTNESS
from gateway.cache.verifiers import load_verifier
from gateway.embedding.embedder import Embedder
from gateway.policy import CacheSettings
from gateway.policy.tiers import Strictness


def cosine(embedder: Embedder, a: str, b: str) -> float:
    va, vb = embedder.embed_many([a, b])
    return float(va @ vb)


async def cached_lookups(
    tmp_path: Path,
    embedder: Embedder,
    model: str,
    stored: str,
    asked: list[str],
    strictness: Strictness = "strict",
) -> list[Lookup]:
    """Through a real cache (SQLite, `verifier_model: model` at `strictness`): `stored`
    answered, then each of `asked` looked up in the same scope."""
    path = str(tmp_path / "c.sqlite3")
    settings = CacheSettings(enabled=True, path=path, verifier_model=model, verifier=strictness)
    cache = await SemanticCache.open(settings, embedder, load_verifier(model))
    route = settings.for_route(None)

    def query(text: str) -> CacheQuery:
        return CacheQuery("s", "t", "auto", text, None, 0.0)

    async def embed(text: str) -> np.ndarray:
        return await embedder.embed(text)

    answer = CachedAnswer(f"the answer to {stored}", "stop", 10, 5, "small", "m", None)
    try:
        await cache.store(query(stored), lambda: embed(stored), answer, None)
        return [await cache.lookup(query(a), lambda a=a: embed(a), route) for a in asked]
    finally:
        await cache.close()


def check_shipped_artifact(verifier: Any, tmp_path: Path) -> None:
    """`verifier` (a class with ARTIFACT, FEATURES and load): its shipped artifact has one
    weight per feature and ordered thresholds, and one with other features is refused."""
    artifact = json.loads(verifier.ARTIFACT.read_text())
    assert tuple(artifact["features"]) == verifier.FEATURES
    assert len(artifact["model"]["weights"]) == len(verifier.FEATURES)
    t = artifact["thresholds"]
    assert set(t) == set(STRICTNESS) and t["strict"] >= t["balanced"] >= t["lenient"] > 0
    stale = artifact | {"features": artifact["features"][:-1]}
    (tmp_path / "stale.json").write_text(json.dumps(stale))
    with pytest.raises(ValueError, match="retrain"):
        verifier.load(tmp_path / "stale.json")
