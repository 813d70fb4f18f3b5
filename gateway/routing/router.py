"""Requested model name -> tier: routes apply their ordered rules, concrete names pass through.

The difficulty router of a later issue plugs in as a `Scorer` (built per policy by the
`ScorerFactory` given to create_app): it turns a request into a score in [0, 1] that the
rules' `min_score` / `max_score` conditions read. Without a scorer those conditions never
match, so the prompt-feature rules and the route's default decide on their own.
"""

import re
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any, Protocol

from gateway.policy import Policy, Route, Rule

# A line that starts like a statement of a common language. Matched per line, at its start
# only, with no quantifier that can cross a line: linear in the line.
_STATEMENT = re.compile(
    r"[ \t]*(def|class|import|from[ \t]+\S+[ \t]+import|function|const|let|var|public|"
    r"private|#include|SELECT|fn|func|package)\b"
)
_CALL_OPEN = re.compile(r"\w\(")  # a call or definition: name(
_BLOCK_AFTER_CALL = re.compile(r"\s*[{:]")  # ...) {  or  ...):
# Code shows early or late in a prompt: the middle of a huge one is not scanned.
_CODE_SCAN_HEAD, _CODE_SCAN_TAIL = 64 * 1024, 16 * 1024
_CHARS_PER_TOKEN = 4  # rough English average; routing must decide before any tokenizer runs


@dataclass(frozen=True)
class PromptFeatures:
    chars: int  # all message text (or the prompt) together
    approx_tokens: int
    contains_code: bool
    messages: int  # chat messages; 1 for a plain completion prompt
    last_user_text: str  # what the difficulty scorer and the cache look at


class Scorer(Protocol):
    """Difficulty in [0, 1] for a request, or None when it cannot tell."""

    async def score(self, features: PromptFeatures) -> float | None: ...


# Builds the scorer a policy asks for (e.g. a classifier trained on the policy's labelled
# prompts); called at start-up and on every reload, before the new policy serves.
ScorerFactory = Callable[[Policy], Awaitable[Scorer | None]]


@dataclass(frozen=True)
class Decision:
    tier: str
    route: str | None = None  # set when a route picked the tier
    deployment: str | None = None  # set when the request named a deployment's model
    score: float | None = None


def message_text(content: Any) -> str:
    """Text of an OpenAI message content: a string or a list of parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(p.get("text", "") for p in content if isinstance(p, dict))
    return ""


def looks_like_code(text: str) -> bool:
    """Fenced blocks, statement-like lines, `=>` / `::`, or `name(...) {` / `name(...):`.

    Linear in the text and capped in what it reads: a prompt is a client's input, and this
    runs on the event loop (a backtracking regex here once froze it for minutes).
    """
    if len(text) > _CODE_SCAN_HEAD + _CODE_SCAN_TAIL:
        text = text[:_CODE_SCAN_HEAD] + "\n" + text[-_CODE_SCAN_TAIL:]
    if "```" in text or "=>" in text or "::" in text:
        return True
    for line in text.splitlines():
        if _STATEMENT.match(line) or line.rstrip().endswith((";", "{", "}")):
            return True
    return _call_with_block(text)


def _call_with_block(text: str) -> bool:
    """`\\w+\\([^)]*\\)\\s*[{:]` without its quadratic backtracking: every `name(` up to
    the next `)` closes at that same `)`, so each `)` is looked at once."""
    pos = 0
    while (opening := _CALL_OPEN.search(text, pos)) is not None:
        close = text.find(")", opening.end())
        if close < 0:
            return False  # no `)` after this `(`, nor after any later one
        if _BLOCK_AFTER_CALL.match(text, close + 1):
            return True
        pos = close + 1
    return False


def extract_features(messages: Iterable[dict] | None, prompt: str | None) -> PromptFeatures:
    if messages is None:
        texts, last_user = [prompt or ""], prompt or ""
    else:
        messages = list(messages)
        texts = [message_text(m.get("content")) for m in messages]
        users = [t for m, t in zip(messages, texts, strict=True) if m.get("role") == "user"]
        last_user = users[-1] if users else ""
    text = "\n".join(texts)
    return PromptFeatures(
        chars=len(text),
        approx_tokens=-(-len(text) // _CHARS_PER_TOKEN),
        contains_code=looks_like_code(text),
        messages=len(texts),
        last_user_text=last_user,
    )


def _within(value: float, low: float | None, high: float | None) -> bool:
    return (low is None or value >= low) and (high is None or value <= high)


def rule_matches(rule: Rule, features: PromptFeatures, score: float | None) -> bool:
    """Every condition the rule sets must hold; a score condition needs a score."""
    uses_score = rule.min_score is not None or rule.max_score is not None
    if uses_score and (score is None or not _within(score, rule.min_score, rule.max_score)):
        return False
    if rule.contains_code is not None and rule.contains_code != features.contains_code:
        return False
    return (
        _within(features.approx_tokens, rule.min_prompt_tokens, rule.max_prompt_tokens)
        and _within(features.chars, rule.min_chars, rule.max_chars)
        and _within(features.messages, rule.min_messages, rule.max_messages)
    )


def choose_tier(route: Route, features: PromptFeatures, score: float | None) -> str:
    for rule in route.rules:
        if rule_matches(rule, features, score):
            return rule.tier
    return route.default


def _needs_score(route: Route) -> bool:
    return any(r.min_score is not None or r.max_score is not None for r in route.rules)


class Router:
    def __init__(self, policy: Policy, scorer: Scorer | None = None) -> None:
        self.policy = policy
        self.scorer = scorer
        self._deployment_tier: dict[str, str] = {}
        for tier_name, tier in policy.tiers.items():
            for dep in tier.deployments:
                self._deployment_tier.setdefault(dep.model, tier_name)

    def model_names(self) -> list[str]:
        """Every name a request may put in `model`: routes, tiers, then deployment models."""
        names = [*self.policy.routes, *self.policy.tiers]
        return names + [m for m in self._deployment_tier if m not in names]

    async def decide(self, model: str, features: PromptFeatures) -> Decision | None:
        """None when `model` names no route, tier or deployment (a 404 for the caller)."""
        route = self.policy.routes.get(model)
        if route is not None:
            score = None
            if self.scorer is not None and _needs_score(route):
                score = await self.scorer.score(features)
            return Decision(choose_tier(route, features, score), route=model, score=score)
        if model in self.policy.tiers:
            return Decision(model)
        if model in self._deployment_tier:
            return Decision(self._deployment_tier[model], deployment=model)
        return None
