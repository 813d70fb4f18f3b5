"""The difficulty score in [0, 1]: a classifier on the request embedding and prompt signals,
and terms that score it by the examples most similar to it (gateway/routing/nearest.py),
blended with the signals by the policy's weights.

The classifier is a logistic regression trained when the policy loads, on the policy's
labelled example prompts (embedded in one batch: seconds). At request time scoring is one
dot product over 384 + 8 numbers and, for the example terms, one (examples x 384)
product: well under a millisecond on top of the embedding, which the request pipeline
computes once and shares with the semantic cache.
"""

import asyncio
import hashlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from gateway.policy import (
    Blend,
    EmbedderSettings,
    ExamplePrompt,
    Policy,
    PolicyError,
    PolicyIssue,
)
from gateway.policy.examples import policy_examples
from gateway.routing.example_vectors import cached_vectors, store_dir
from gateway.routing.features import extract_features
from gateway.routing.lexical import LexicalIndex
from gateway.routing.nearest import Kernel, Neighbours, centre_indices, centre_similarities
from gateway.routing.router import RoutingInput, Scored
from gateway.routing.signals import NAMES, Signals, compute_signals

logger = logging.getLogger("tiergate.difficulty")

EMBEDDING = "embedding"  # how explanations name the embedding's share of the classifier
EXAMPLE_TERMS = ("neighbours", "kernel")  # blend weights (and explanation names) of nearest.py
TOP_FEATURES = 3


@dataclass(frozen=True)
class Classifier:
    """Logistic regression over [embedding, signals]; `center` is the training mean, so a
    contribution says how much a part moves this prompt away from the average one."""

    weights: np.ndarray  # (dim + len(NAMES),) float32
    bias: float
    center: np.ndarray  # same shape as weights

    def logit_parts(self, x: np.ndarray, dim: int) -> tuple[float, np.ndarray]:
        parts = self.weights * (x - self.center)
        base = self.bias + float(self.weights @ self.center)
        return base, np.concatenate(([parts[:dim].sum()], parts[dim:]))


class DifficultyScorer:
    def __init__(
        self,
        classifier: Classifier | None,
        blend: Blend,
        dim: int,
        terms: dict[str, Neighbours | Kernel] | None = None,
    ) -> None:
        """`terms`: the example terms by their blend name; those absent weigh nothing."""
        self.classifier = classifier
        self.terms = {n: t for n, t in (terms or {}).items() if getattr(blend, n) > 0}
        self.dim = dim
        signal_weights = np.array([getattr(blend, n) for n in NAMES], dtype=np.float64)
        classifier_weight = blend.classifier if classifier is not None else 0.0
        term_weights = {n: float(getattr(blend, n)) for n in self.terms}
        total = classifier_weight + sum(term_weights.values()) + signal_weights.sum()
        if total <= 0:
            raise ValueError("difficulty.blend: every weight is 0 (or no examples to train on)")
        self._classifier_weight = classifier_weight / total
        self._term_weights = {n: w / total for n, w in term_weights.items()}
        self._signal_weights = signal_weights / total

    @property
    def needs_embedding(self) -> bool:
        return self._classifier_weight > 0 or bool(self.terms)

    async def score(self, inp: RoutingInput, signals: Signals) -> Scored | None:
        """The router's Scorer: embeds (through the request's shared, memoised `embed`)
        only when the classifier takes part."""
        embedding = None
        if self.needs_embedding:
            if inp.embed is None:
                return None
            embedding = await inp.embed()
        return self.score_embedded(embedding, signals, inp.features.last_user_text)

    def score_embedded(
        self, embedding: np.ndarray | None, signals: Signals, text: str = ""
    ) -> Scored:
        """`text`: what was embedded (the last user message), for the kernel's word term."""
        s = signals.vector().astype(np.float64)
        contributions = dict(zip(NAMES, self._signal_weights * s, strict=True))
        score = float(self._signal_weights @ s)
        for name, term in self.terms.items():
            assert embedding is not None
            predicted = term.predict(embedding, text)
            score += self._term_weights[name] * predicted
            # Around the examples' mean target, as the classifier's parts are.
            contributions[name] = self._term_weights[name] * (predicted - term.center)
        if self._classifier_weight > 0:
            assert embedding is not None and self.classifier is not None
            x = np.concatenate((embedding.astype(np.float64), s))
            base, parts = self.classifier.logit_parts(x, self.dim)
            probability = 1.0 / (1.0 + np.exp(-(base + parts.sum())))
            score += self._classifier_weight * probability
            # Logit parts, scaled to the score by the sigmoid's slope at this point.
            slope = self._classifier_weight * probability * (1 - probability)
            for name, part in zip((EMBEDDING, *NAMES), parts, strict=True):
                contributions[name] = contributions.get(name, 0.0) + slope * float(part)
        ranked = sorted(contributions.items(), key=lambda kv: -abs(kv[1]))
        top = tuple((n, round(v, 4)) for n, v in ranked[:TOP_FEATURES] if v != 0)
        return Scored(min(1.0, max(0.0, score)), top)


def example_signals(prompt: str) -> Signals:
    """Examples are single user prompts: no tools, no history, no max_tokens."""
    return compute_signals(extract_features([{"role": "user", "content": prompt}], None))


def train_classifier(
    embeddings: np.ndarray, signals: np.ndarray, targets: np.ndarray, c: float
) -> Classifier:
    """Targets in [0, 1]; a graded target t counts as t of a positive and 1 - t of a
    negative, which is the cross-entropy of the soft label."""
    from sklearn.linear_model import LogisticRegression  # import on use: ~0.5 s

    x = np.hstack((embeddings, signals)).astype(np.float64)
    hard = np.isin(targets, (0.0, 1.0))
    xs = np.vstack((x[hard], x[~hard], x[~hard]))
    ys = np.concatenate((targets[hard], np.ones((~hard).sum()), np.zeros((~hard).sum())))
    ws = np.concatenate((np.ones(hard.sum()), targets[~hard], 1 - targets[~hard]))
    if len(set(ys[ws > 0])) < 2:
        raise ValueError("difficulty.examples: need examples of both kinds (label 0 and 1)")
    model = LogisticRegression(C=c, max_iter=1000)
    model.fit(xs, ys, sample_weight=ws)
    return Classifier(model.coef_[0].copy(), float(model.intercept_[0]), x.mean(axis=0))


EmbedMany = Callable[[list[str]], np.ndarray]


def build_scorer(policy: Policy, embed_many: EmbedMany | None) -> DifficultyScorer:
    """Train on the policy's examples (embedded with `embed_many`) and apply its blend."""
    settings = policy.difficulty
    examples = policy_examples(policy)
    classifier, terms = None, {}
    if examples and learns_from_examples(settings.blend):
        if embed_many is None:
            raise ValueError("the difficulty classifier needs the embedder")
        kernel = None
        if settings.blend.kernel:
            kernel = (
                settings.kernel_width,
                settings.kernel_ridge,
                settings.kernel_lexical,
                settings.kernel_centres,
            )
        key = (policy.embedder.model, settings.regularization, kernel)
        trained = _trained(examples, key, embed_many)
        classifier = trained.classifier
        if settings.blend.neighbours > 0:
            k = settings.k_nearest
            terms["neighbours"] = Neighbours(trained.vectors, trained.targets, k)
        if trained.kernel is not None:
            terms["kernel"] = trained.kernel
    return DifficultyScorer(classifier, settings.blend, _dim(classifier), terms)


def learns_from_examples(blend: Blend) -> bool:
    return blend.classifier > 0 or any(getattr(blend, n) > 0 for n in EXAMPLE_TERMS)


def _dim(classifier: Classifier | None) -> int:
    return 0 if classifier is None else len(classifier.weights) - len(NAMES)


@dataclass(frozen=True)
class Trained:
    classifier: Classifier
    vectors: np.ndarray  # the examples' embeddings, for the neighbours term
    targets: np.ndarray
    kernel: Kernel | None  # fitted when the blend weighs it: it solves an n x n system


# model, C, and the kernel's width, ridge, lexical share and centres
TrainSettings = tuple[str, float, tuple[float, float, float, int | None] | None]


# Reloads that leave the examples alone reuse the trained classifier.
_trained_cache: dict[str, Trained] = {}


def _trained(
    examples: list[ExamplePrompt], settings: TrainSettings, embed_many: EmbedMany
) -> Trained:
    """`settings`: part of the cache key."""
    digest = hashlib.sha256(repr((settings, [(e.prompt, e.target) for e in examples])).encode())
    key = digest.hexdigest()
    if key not in _trained_cache:
        prompts = [e.prompt for e in examples]
        embeddings = embeddings_of(prompts, settings[0], embed_many)
        signals = np.stack([example_signals(p).vector() for p in prompts])
        targets = np.array([e.target for e in examples], dtype=np.float64)
        _trained_cache.clear()  # one policy's classifier at a time is all a gateway serves
        classifier = train_classifier(embeddings, signals, targets, settings[1])
        kernel = None
        if settings[2] is not None:
            kernel = fit_kernel(prompts, embeddings, targets, *settings[2])
        _trained_cache[key] = Trained(classifier, embeddings, targets, kernel)
        logger.info("difficulty classifier trained on %d examples", len(examples))
    return _trained_cache[key]


def fit_kernel(
    prompts: list[str],
    embeddings: np.ndarray,
    targets: np.ndarray,
    width: float,
    ridge: float,
    lexical_share: float,
    centres: int | None = None,
) -> Kernel:
    """The kernel term on the examples, with their words indexed when it reads them; over
    `centres` of them (subset of regressors, nearest.py) when there are more examples."""
    chosen = centre_indices(prompts, centres)
    if chosen is None:
        lexical = LexicalIndex.build(prompts) if lexical_share > 0 else None
        return Kernel.fit(embeddings, targets, width, ridge, lexical, lexical_share)
    lexical = None
    if lexical_share > 0:
        lexical = LexicalIndex.build([prompts[i] for i in chosen])
    cross = centre_similarities(embeddings, chosen, prompts, lexical, lexical_share)
    return Kernel.solve_centres(
        embeddings, cross, chosen, targets, width, ridge, lexical, lexical_share
    )


def _embed_in_batches(prompts: list[str], embed_many: EmbedMany, size: int = 64) -> np.ndarray:
    """Batches of similar length: one batch of everything would pad every prompt to the
    longest one."""
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
    parts = [
        embed_many([prompts[i] for i in order[k : k + size]]) for k in range(0, len(order), size)
    ]
    vectors = np.empty((len(prompts), parts[0].shape[1]), dtype=np.float32)
    vectors[order] = np.concatenate(parts)
    return vectors


def embeddings_of(prompts: list[str], model: str, embed_many: EmbedMany) -> np.ndarray:
    """The examples' vectors, kept on disk per text (example_vectors.py): a restart, a
    refit's longer examples file or `tiergate calibrate` embeds only the prompts not seen
    before."""
    from engine.model_registry import cache_dir

    folder = store_dir(cache_dir() / "difficulty", model)
    return cached_vectors(prompts, folder, lambda texts: _embed_in_batches(texts, embed_many))


def difficulty_scorer_factory(
    get_embedder: Callable[[EmbedderSettings], Awaitable[Any]],
) -> Callable[[Policy], Awaitable[DifficultyScorer | None]]:
    """The gateway's ScorerFactory: a DifficultyScorer for policies whose routes read the
    score, trained with the shared embedder (`get_embedder` creates it on first use)."""

    async def factory(policy: Policy) -> DifficultyScorer | None:
        if not any(
            r.min_score is not None or r.max_score is not None
            for route in policy.routes.values()
            for r in route.rules
        ):
            return None
        blend = policy.difficulty.blend
        trains = bool(policy.difficulty.examples) and learns_from_examples(blend)
        if not trains and not any(getattr(blend, n) for n in NAMES):
            logger.warning("score rules without difficulty.examples or signal weights never match")
            return None
        embedder = await get_embedder(policy.embedder) if trains else None
        embed_many = embedder.embed_many if embedder is not None else None
        try:
            return await asyncio.to_thread(build_scorer, policy, embed_many)
        except ValueError as exc:
            issue = PolicyIssue("difficulty.examples", str(exc))
            raise PolicyError("the policy's difficulty examples", [issue]) from None

    return factory
