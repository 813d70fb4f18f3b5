"""The `nli` verifier: the `aligned` verifier's vetoes and features, plus a natural-language
inference model's reading of the pair in both directions (nli_scores.py).

Fitted as `aligned` is (`python -m training cache nli`: the people's train pairs with the
rule-made ones, thresholds picked out of fold), shipped as
nli_model.json. Costs two passes of the NLI model per pair no veto decides (~11 ms of one
core each for short questions) on top of `aligned`'s: opt-in, for deployments that trade
lookup time for served rewordings (docs/cache.md).
"""

import json
from pathlib import Path

from gateway.cache.aligned_verifier import ALL_FEATURES as ALIGNED_FEATURES
from gateway.cache.aligned_verifier import AlignedVerifier
from gateway.cache.nli_scores import MARGIN_RANGE, NLI_FEATURES, NliScores, nli_features
from gateway.cache.pair_features import align, vetoes
from gateway.cache.pair_text import WordStats, analyse
from gateway.cache.token_states import TokenStates
from gateway.cache.verifier import LogisticModel, logit, sigmoid

NLI_MODEL = Path(__file__).with_name("nli_model.json")
# A scope word on one side only (beginners, short, list...) is a feature here, not a
# refusal: the NLI model reads whether the scope changes the ask. Out of fold over the
# train pairs (479 people's must-not pairs) this served 48.0 / 61.6 / 65.2% of the people's
# should-hit pairs at 0 / 1 / 2 wrong, against 45.7 / 60.7 / 61.0% with the scope veto.
LEFT_TO_THE_MODEL = ("scope",)
ALL_FEATURES = (*ALIGNED_FEATURES, *(f"{v} veto" for v in LEFT_TO_THE_MODEL), *NLI_FEATURES)


class NliVerifier(AlignedVerifier):
    ARTIFACT = NLI_MODEL
    FEATURES = ALL_FEATURES
    SOFT_VETOES = LEFT_TO_THE_MODEL

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
        # the highest margin any train pair's direction reached (nli_model.json): what a
        # direction not read yet is taken to reach at most
        self.margin_seen = MARGIN_RANGE[1]

    @classmethod
    def load(cls, path: str | Path | None = None) -> "NliVerifier":
        verifier = super().load(path)
        artifact = json.loads(Path(path or cls.ARTIFACT).read_text())
        verifier.margin_seen = float(artifact.get("margin_seen", MARGIN_RANGE[1]))
        return verifier

    @classmethod
    def assemble(
        cls, model: LogisticModel, thresholds: dict[str, float], stats: WordStats
    ) -> "NliVerifier":
        return cls(model, thresholds, stats, TokenStates(), NliScores())

    def pair_features(self, query: str, candidate: str, cosine: float) -> list[float]:
        """ALL_FEATURES of a pair (what training fits on, for pairs no rule decides)."""
        return self._before_nli(query, candidate, cosine) + self.nli.features(query, candidate)

    def _before_nli(self, query: str, candidate: str, cosine: float) -> list[float]:
        """The aligned verifier's features and the soft vetoes' flags."""
        a, b = analyse(query, self.stats), analyse(candidate, self.stats)
        fired = set(vetoes(a, b, align(a, b, self.stats), self.stats))
        flags = [float(v in fired) for v in self.SOFT_VETOES]
        return super().pair_features(query, candidate, cosine) + flags

    def probability_against(
        self, query: str, candidate: str, cosine: float, needed: float
    ) -> tuple[float, str]:
        """The pair's probability, with NLI passes skipped where they cannot matter: when
        even margins as high as the train pairs ever reached leave the pair short of
        `needed`, no pass is run (9-20% of the train pairs no veto decides, by strictness);
        after one direction, the second is skipped the same way (about a third). A skip
        can only refuse, never serve: the best it could reach is returned, below `needed`.
        """
        decided = self.decide(query, candidate)
        if decided is not None:
            return decided
        rest = self._before_nli(query, candidate, cosine)
        best = self._best_logit(rest, None)
        if best < logit(needed):
            return sigmoid(best), ""
        first = self.nli.margin(query, candidate)
        best = self._best_logit(rest, first)
        if best < logit(needed):
            return sigmoid(best), ""
        x = rest + nli_features(first, self.nli.margin(candidate, query))
        return self.model.probability(x), ""

    def _best_logit(self, rest: list[float], first: float | None) -> float:
        """The highest logit the margins not read yet can give, each within the lowest
        margin the features hold and the highest a train pair reached. The logit is linear
        in (min, mean), so its best lies at an end of the range, or where the two margins
        are equal."""
        low, high = MARGIN_RANGE[0], self.margin_seen
        if first is None:
            ends = [(low, low), (high, high), (low, high)]
        else:
            ends = [(first, low), (first, high), (first, first)]
        return max(self.model.logit(rest + nli_features(ab, ba)) for ab, ba in ends)
