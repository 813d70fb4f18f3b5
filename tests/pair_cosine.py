"""The embedder's cosine of two questions, as a cache lookup computes it: what the pair
verifiers' tests hand to `verify`."""

from gateway.embedding.embedder import Embedder


def cosine(embedder: Embedder, a: str, b: str) -> float:
    va, vb = embedder.embed_many([a, b])
    return float(va @ vb)
