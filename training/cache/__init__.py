"""The semantic cache verifier's training: the labelled pair set and the trained model
(gateway/cache/verifier_model.json)."""
