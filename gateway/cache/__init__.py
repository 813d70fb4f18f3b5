"""The semantic cache: embedder, per-scope vector index, stores, verifier and the lookup."""
