"""The learned parts' pipelines: the router's labelled tasks and the cache's labelled pairs,
from data to the artefacts the gateway loads (run them with `python -m training`)."""
