"""The policy's spend sections: what cached answers cost (`pricing`) and USD budgets per
tenant and per key (`budgets`); enforced by gateway/limits/budget.py."""

from pydantic import field_validator

from gateway.policy.common import StrictModel, between_0_and_1, positive

PERIODS = ("day", "month")  # calendar periods in UTC


class PricingSettings(StrictModel):
    """How spend is priced on top of each tier's `price` (see docs/policies.md, "Budgets")."""

    # A cached answer costs this share of what its tier would have charged: 0 = free, 1 =
    # full price (to bill tenants as if the cache were not there).
    cache_hit_factor: float = 0.0
    # Prompt tokens an upstream reports as cached (`prompt_tokens_details.cached_tokens`)
    # cost this share of the input price: 1 = no discount; OpenAI bills them at 0.5 or less.
    cached_prompt_factor: float = 1.0

    _check = field_validator("cache_hit_factor", "cached_prompt_factor")(between_0_and_1)


class Budget(StrictModel):
    """USD ceilings for one tenant or one key; one left out (or null) sets none."""

    usd_per_day: float | None = None
    usd_per_month: float | None = None

    _check = field_validator("usd_per_day", "usd_per_month")(positive)

    def limits(self) -> dict[str, float]:
        """Period -> USD, for the periods this budget caps."""
        values = {"day": self.usd_per_day, "month": self.usd_per_month}
        return {period: usd for period, usd in values.items() if usd is not None}

    def over(self, base: "Budget") -> "Budget":
        """This budget on top of `base`: fields written here win, even an explicit null."""
        return base.model_copy(update={f: getattr(self, f) for f in self.model_fields_set})


class BudgetSettings(StrictModel):
    """Spend ceilings, counted where `limits` counts (its Redis, else this process)."""

    default: Budget = Budget()  # every tenant without an entry under `tenants`
    tenants: dict[str, Budget] = {}  # per tenant, field by field over `default`
    keys: dict[str, Budget] = {}  # per key in auth.keys, by its SHA-256 hex

    def for_tenant(self, tenant: str) -> Budget:
        own = self.tenants.get(tenant)
        return self.default if own is None else own.over(self.default)
