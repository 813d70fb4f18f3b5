"""What a deployment's tokens cost: the tier's price, or litellm's offline price map.

A local tier is priced by the policy only (its cost is what the operator says a token is
worth). A remote tier that sets no `price` gets the price litellm ships for its model in
`model_prices_and_context_window_backup.json`, read from the installed package (no
network, and no import of litellm itself: that takes seconds).
"""

import functools
import importlib.util
import json
import logging
from pathlib import Path

from engine.entrypoints.openai.protocol import Usage
from gateway.policy import BatchSettings, Deployment, Policy, Price, PricingSettings, Tier

logger = logging.getLogger("tiergate.pricing")

_PRICE_FILE = "model_prices_and_context_window_backup.json"
_PER_MILLION = 1_000_000


@functools.cache
def _litellm_prices() -> dict[str, dict]:
    spec = importlib.util.find_spec("litellm")
    if spec is None or spec.origin is None:
        return {}
    path = Path(spec.origin).parent / _PRICE_FILE
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        logger.warning("litellm's price map %s is unreadable: %s", path, exc)
        return {}


def litellm_price(model: str) -> Price | None:
    """USD per 1M tokens for a litellm model string (`openai/gpt-4o-mini` or `gpt-4o-mini`)."""
    prices = _litellm_prices()
    for name in (model, model.split("/", 1)[-1]):
        entry = prices.get(name)
        if entry and "input_cost_per_token" in entry:
            return Price(
                input=entry["input_cost_per_token"] * _PER_MILLION,
                output=entry.get("output_cost_per_token", 0.0) * _PER_MILLION,
            )
    return None


def deployment_price(policy: Policy, tier: Tier, deployment: Deployment) -> Price:
    if "price" in tier.model_fields_set or policy.is_local(deployment):
        return tier.price
    return litellm_price(deployment.model) or tier.price


def policy_prices(policy: Policy) -> dict[tuple[str, str], Price]:
    """(tier, deployment model) -> price, for every deployment of the policy."""
    return {
        (name, dep.model): deployment_price(policy, tier, dep)
        for name, tier in policy.tiers.items()
        for dep in tier.deployments
    }


def most_expensive(prices: dict[tuple[str, str], Price]) -> tuple[str, Price]:
    """The tier whose deployment costs most per token (input + output per 1M), and that price."""
    if not prices:
        return "-", Price()
    (tier, _), price = max(prices.items(), key=lambda item: item[1].input + item[1].output)
    return tier, price


def spend_usd(usage: Usage, price: Price, pricing: PricingSettings, cached: bool = False) -> float:
    """What a request costs its tenant: `price` for its usage, prompt tokens the upstream
    served from its prefix cache at `cached_prompt_factor`, and a whole answer from the
    semantic cache (`cached`) at `cache_hit_factor` of what its tier would have charged."""
    details = usage.prompt_tokens_details
    reused = min(details.cached_tokens if details else 0, usage.prompt_tokens)
    prompt = usage.prompt_tokens - reused + reused * pricing.cached_prompt_factor
    usd = (prompt * price.input + usage.completion_tokens * price.output) / _PER_MILLION
    return usd * pricing.cache_hit_factor if cached else usd


def reservation_usd(policy: Policy, prompt_tokens: int, completion_tokens: int) -> float:
    """The most a request can cost before it is routed: its tokens at the highest input and
    output prices among the policy's deployments (a budget reserves this until it ends)."""
    prices = policy_prices(policy).values()
    top_in = max((p.input for p in prices), default=0.0)
    top_out = max((p.output for p in prices), default=0.0)
    return (prompt_tokens * top_in + completion_tokens * top_out) / _PER_MILLION


def batch_price(price: Price, batch: BatchSettings) -> Price:
    """A batch line's price: the deployment's, times the policy's batch price factor."""
    factor = batch.price_factor
    return Price(input=price.input * factor, output=price.output * factor)
