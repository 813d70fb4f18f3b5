"""Requested model name -> tier: routes apply their ordered rules, concrete names pass through.

The difficulty score comes from a `Scorer` (gateway/routing/difficulty.py, built per policy
by the `ScorerFactory` given to create_app). A rule's conditions are checked cheapest first
and the score is asked for only when a rule that reads it is reached, so a request whose
route never needs the score is never embedded for routing. Without a scorer (or when it
cannot score, e.g. the embedder failed) score conditions do not match.
"""

import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from engine.entrypoints.openai.errors import OpenAIError
from gateway.policy import Policy, Route, Rule
from gateway.routing.features import PromptFeatures
from gateway.routing.signals import Signals, compute_signals

logger = logging.getLogger("tiergate.router")
OVERRIDE_HEADER = "x-tiergate-tier"

# The request's embedding, computed at most once and shared with the semantic cache.
Embed = Callable[[], Awaitable[np.ndarray]]


@dataclass(frozen=True)
class RoutingInput:
    model: str  # the requested model name
    features: PromptFeatures
    embed: Embed | None = None  # None: no embedder, rules on the score do not match
    headers: Mapping[str, str] = field(default_factory=dict)  # lower-case names
    tenant: str = "default"
    key_digest: str | None = None  # the bearer key's SHA-256 (policy.key_digest): tier_override
    max_tokens: int | None = None
    tools: bool = False


@dataclass(frozen=True)
class Scored:
    score: float  # in [0, 1]
    top: tuple[tuple[str, float], ...] = ()  # largest signed contributions, largest first


class Scorer(Protocol):
    """Difficulty of a request; None when it cannot tell. Calls `inp.embed` only if it
    needs the embedding."""

    async def score(self, inp: RoutingInput, signals: Signals) -> Scored | None: ...


# Builds the scorer a policy asks for (e.g. a classifier trained on the policy's labelled
# prompts); called at start-up and on every reload, before the new policy serves.
ScorerFactory = Callable[[Policy], Awaitable[Scorer | None]]


@dataclass(frozen=True)
class Decision:
    tier: str
    route: str | None = None  # set when a route picked the tier
    deployment: str | None = None  # set when the request named a deployment's model
    score: float | None = None  # set when a rule needed the score
    rule: str | None = None  # the rule that fired (its name or rules[i]), default, override
    top: tuple[tuple[str, float], ...] = ()  # what drove the score

    def explain(self) -> dict[str, Any]:
        """What x-tiergate-explain carries."""
        score = None if self.score is None else round(self.score, 4)
        return {
            "route": self.route,
            "rule": self.rule,
            "tier": self.tier,
            "score": score,
            "top": dict(self.top),
        }


def _within(value: float, low: float | None, high: float | None) -> bool:
    return (low is None or value >= low) and (high is None or value <= high)


def _uses_score(rule: Rule) -> bool:
    return rule.min_score is not None or rule.max_score is not None


def _header_matches(headers: Mapping[str, str], name: str, want: str) -> bool:
    got = headers.get(name.lower())
    return got is not None and (want == "*" or got == want)


def static_match(rule: Rule, inp: RoutingInput, signals: Signals) -> bool:
    """Every condition but the score (the only one that can cost an embedding)."""
    f = inp.features
    if rule.contains_code is not None and rule.contains_code != f.contains_code:
        return False
    if rule.tools is not None and rule.tools != inp.tools:
        return False
    if rule.models is not None and inp.model not in rule.models:
        return False
    values = signals.as_dict()
    return (
        _within(f.approx_tokens, rule.min_prompt_tokens, rule.max_prompt_tokens)
        and _within(f.chars, rule.min_chars, rule.max_chars)
        and _within(f.messages, rule.min_messages, rule.max_messages)
        and all(values[n] >= v for n, v in rule.min_signals.items())
        and all(values[n] <= v for n, v in rule.max_signals.items())
        and all(_header_matches(inp.headers, n, v) for n, v in rule.headers.items())
    )


class Router:
    def __init__(self, policy: Policy, scorer: Scorer | None = None) -> None:
        self.policy = policy
        self.scorer = scorer
        self._deployment_tier: dict[str, str] = {}
        for tier_name, tier in policy.tiers.items():
            for dep in tier.deployments:
                self._deployment_tier.setdefault(dep.model, tier_name)
        self._route_of = {name: name for name in policy.routes}
        for name, route in policy.routes.items():
            self._route_of.update(dict.fromkeys(route.aliases, name))
        self._override_keys = frozenset(k.digest() for k in policy.auth.keys if k.tier_override)

    def model_names(self) -> list[str]:
        """Every name a request may put in `model`: routes, tiers, then deployment models."""
        names = [*self.policy.routes, *self.policy.tiers]
        names += [a for r in self.policy.routes.values() for a in r.aliases]
        return names + [m for m in self._deployment_tier if m not in names]

    def answer_headers(self, inp: RoutingInput) -> dict[str, str]:
        """The request's headers that can change which tier answers it: those its route's
        rules match on, and the tier override, checked as `decide` checks it (so a refused
        override is refused before the semantic cache could answer). The cache scope holds
        them."""
        route = self.policy.routes.get(self._route_of.get(inp.model, ""))
        if route is None:  # a tier or deployment asked by name: no header changes it
            return {}
        names = {name.lower() for rule in route.rules for name in rule.headers}
        found = {name: inp.headers[name] for name in names if name in inp.headers}
        override = self._override(inp)
        if override is not None:
            found[OVERRIDE_HEADER] = override
        return found

    def needs_score(self, model: str) -> bool:
        route = self.policy.routes.get(self._route_of.get(model, ""))
        return route is not None and any(_uses_score(r) for r in route.rules)

    async def decide(self, inp: RoutingInput) -> Decision | None:
        """None when the model names no route, tier or deployment (a 404 for the caller).
        Raises OpenAIError when the tier override header is refused or names no tier."""
        route_name = self._route_of.get(inp.model)
        if route_name is None:
            if inp.model in self.policy.tiers:
                return Decision(inp.model)
            if inp.model in self._deployment_tier:
                return Decision(self._deployment_tier[inp.model], deployment=inp.model)
            return None
        override = self._override(inp)
        if override is not None:
            return Decision(override, route=route_name, rule="override")
        return await self._apply_rules(route_name, self.policy.routes[route_name], inp)

    async def _apply_rules(self, route_name: str, route: Route, inp: RoutingInput) -> Decision:
        signals = compute_signals(inp.features, inp.tools, inp.max_tokens)
        scored: Scored | None = None
        asked = False
        for i, rule in enumerate(route.rules):
            if not static_match(rule, inp, signals):
                continue
            if _uses_score(rule):
                if not asked:
                    scored, asked = await self._score(inp, signals), True
                if scored is None or not _within(scored.score, rule.min_score, rule.max_score):
                    continue
            return self._decision(rule.tier, route_name, rule.name or f"rules[{i}]", scored)
        return self._decision(route.default, route_name, "default", scored)

    @staticmethod
    def _decision(tier: str, route: str, rule: str, scored: Scored | None) -> Decision:
        if scored is None:
            return Decision(tier, route=route, rule=rule)
        return Decision(tier, route=route, rule=rule, score=scored.score, top=scored.top)

    async def _score(self, inp: RoutingInput, signals: Signals) -> Scored | None:
        if self.scorer is None:
            return None
        try:
            return await self.scorer.score(inp, signals)
        except Exception:  # a broken embedder degrades routing to the other rules
            logger.exception("difficulty scoring failed; score rules are skipped")
            return None

    def _override(self, inp: RoutingInput) -> str | None:
        tier = inp.headers.get(OVERRIDE_HEADER, "").strip()
        if not tier:
            return None
        if inp.key_digest not in self._override_keys:
            raise OpenAIError(
                403,
                f"This API key may not choose the tier with {OVERRIDE_HEADER}; "
                "the policy allows it per key (auth.keys[].tier_override).",
                param=OVERRIDE_HEADER,
                code="tier_override_not_allowed",
                type="permission_error",
            )
        if tier not in self.policy.tiers:
            known = ", ".join(self.policy.tiers)
            raise OpenAIError(
                400,
                f"{OVERRIDE_HEADER}: unknown tier {tier!r} (tiers: {known})",
                param=OVERRIDE_HEADER,
                code="unknown_tier",
            )
        return tier
