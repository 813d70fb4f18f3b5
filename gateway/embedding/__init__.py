"""The gateway's text embedder, which serves the semantic cache, the difficulty router and
/v1/embeddings: the model and its backends, its batches, and the one shared instance.
Callers import the submodules."""
