"""The `nli` verifier: the `aligned` verifier's vetoes and features, plus a natural-language
inference model's reading of the pair in both directions (nli_scores.py).

Fitted as `aligned` is (`python -m training cache nli`: the people's train pairs with the
rule-made ones, thresholds picked out of fold), shipped as
nli_model.json. Costs two passes of the NLI model per pair no veto decides (~15 ms of one
core each for short questions) on top of `aligned`'s: opt-in, for deployments that trade
lookup time for served rewordings (docs/cache.md).
"""

from pathlib import Path

from gateway.cache.aligned_verifier import ALL_FEATURES as ALIGNED_FEATURES
from gateway.cache.aligned_verifier import AlignedVerifier
from gateway.cache.nli_scores import MARGIN_RANGE, NLI_FEATURES, NliScores, nli_features
from gateway.cache.pair_text import WordStats
from gateway.cache.token_states import TokenStates
from gateway.cache.verifier import LogisticModel, logit, sigmoid

NLI_MODEL = Path(__file__).with_name("nli_model.json")
ALL_FEATURES = (*ALIGNED_FEATURES, *NLI_FEATURES)


class NliVerifier(AlignedVerifier):
    ARTIFACT = NLI_MODEL
    FEATURES = ALL_FEATURES

    def __init__(
        self,
        model: LogisticModel,
        thresholds: dict[str, float],
        stats: WordStats,
        states: TokenStates,
        nli: NliScores,
    ):
        super().__init__(model, thresholds, stats, states)
        self.nli = nli

    @classmethod
    def assemble(
        cls, model: LogisticModel, thresholds: dict[str, float], stats: WordStats
    ) -> "NliVerifier":
        return cls(model, thresholds, stats, TokenStates(), NliScores())

    def pair_features(self, query: str, candidate: str, cosine: float) -> list[float]:
        """ALL_FEATURES of a pair (what training fits on, for pairs no rule decides)."""
        aligned = super().pair_features(query, candidate, cosine)
        return aligned + self.nli.features(query, candidate)

    def probability_against(
        self, query: str, candidate: str, cosine: float, needed: float
    ) -> tuple[float, str]:
        """The pair read one way first: when even the best the other way can add leaves it
        short of `needed`, the second pass is skipped (about a third of the pairs no veto
        decides, on the people's train pairs) and that best is returned."""
        decided = self.decide(query, candidate)
        if decided is not None:
            return decided
        rest = super().pair_features(query, candidate, cosine)
        first = self.nli.margin(query, candidate)
        # The logit is linear in (min, mean), so its best over the other margin lies at
        # an end of its range or where it equals the first.
        best = max(
            self.model.logit(rest + nli_features(first, other)) for other in (*MARGIN_RANGE, first)
        )
        if best < logit(needed):
            return sigmoid(best), ""
        x = rest + nli_features(first, self.nli.margin(candidate, query))
        return self.model.probability(x), ""
