"""The semantic cache: per-scope vector index, stores, verifier and the lookup (the embedder
it looks up with lives in gateway/embedding/)."""
