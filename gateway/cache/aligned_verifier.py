"""The `aligned` verifier: the lexical vetoes, then a logistic model over the lexical
features and the word-piece alignment of the two questions (token_states.py).

The rules (PairVerifier.decide, with the word statistics of verifier_model.json) settle
what they can, as for `logistic`; every other pair is scored by a logistic model fitted on
the people's train pairs with the rule-made ones (`python -m training cache aligned`) over
FEATURES plus TOKEN_FEATURES, shipped as aligned_model.json with its thresholds picked out
of fold.
"""

import json
from collections.abc import Callable
from pathlib import Path

from gateway.cache.pair_features import FEATURES
from gateway.cache.pair_text import WordStats
from gateway.cache.token_states import TOKEN_FEATURES, TokenStates
from gateway.cache.verifier import LogisticModel, PairVerifier, with_one_candidate
from gateway.embedding.embedder import Embedder

ALIGNED_MODEL = Path(__file__).with_name("aligned_model.json")
ALL_FEATURES = (*FEATURES, *TOKEN_FEATURES)


class AlignedVerifier(PairVerifier):
    ARTIFACT = ALIGNED_MODEL
    FEATURES = ALL_FEATURES

    def __init__(
        self,
        model: LogisticModel,
        thresholds: dict[str, float],
        stats: WordStats,
        states: TokenStates,
    ):
        super().__init__(model, thresholds, stats)
        self.states = states

    @classmethod
    def load(cls, path: str | Path | None = None) -> "AlignedVerifier":
        """The fitted model and thresholds of `path` (default: the class's ARTIFACT)."""
        return cls.from_artifact(json.loads(Path(path or cls.ARTIFACT).read_text()))

    @classmethod
    def from_artifact(cls, artifact: dict) -> "AlignedVerifier":
        """The verifier an artifact's JSON describes."""
        if tuple(artifact["features"]) != cls.FEATURES:
            raise ValueError(f"{cls.ARTIFACT.name} has other features: retrain it")
        m = artifact["model"]
        model = LogisticModel(m["mean"], m["scale"], m["weights"], m["bias"])
        verifier = cls.assemble(model, artifact["thresholds"], PairVerifier.load().stats)
        return with_one_candidate(verifier, artifact)

    @classmethod
    def assemble(
        cls, model: LogisticModel, thresholds: dict[str, float], stats: WordStats
    ) -> "AlignedVerifier":
        """The verifier around a fitted (or placeholder) model: its feature sources added."""
        return cls(model, thresholds, stats, TokenStates())

    def serve(self, embedder: Embedder, crowded: Callable[[], bool]) -> None:
        """Set up for a cache's lookups: the word-piece states of what `embedder` embeds
        (`crowded`: whether other lookups are under way, for verifiers that use two cores)."""
        self.states.take_from(embedder)

    async def close(self) -> None:
        self.states.release()

    def pair_features(self, query: str, candidate: str, cosine: float) -> list[float]:
        """ALL_FEATURES of a pair (what training fits on, for pairs no rule decides)."""
        lexical = super().pair_features(query, candidate, cosine)
        return lexical + self.states.features(query, candidate)

    def probability(self, query: str, candidate: str, cosine: float) -> tuple[float, str]:
        """The model's probability and the veto reason ("" when none); 0 when vetoed."""
        decided = self.decide(query, candidate)
        if decided is not None:
            return decided
        return self.model.probability(self.pair_features(query, candidate, cosine)), ""
