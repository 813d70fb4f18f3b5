"""What a caller's key brings to the limits: its id for counters, its own limits and budget."""

from dataclasses import dataclass

from gateway.policy import Budget, LimitSet, Policy


@dataclass(frozen=True)
class KeyTerms:
    """A YAML key's terms come from the policy (`limits.keys`, `budgets.keys`, by digest);
    a managed key's (POST /admin/keys) travel with its record."""

    digest: str  # the key's SHA-256 hex: the counters' name for it
    label: str  # what metrics and error messages show: a name, an id or a hash prefix
    managed: bool = False
    own_limits: LimitSet | None = None  # a managed key's
    own_budget: Budget | None = None  # a managed key's
    allowed_models: frozenset[str] | None = None  # None: every name the gateway serves

    def limits(self, policy: Policy) -> LimitSet | None:
        return self.own_limits if self.managed else policy.limits.keys.get(self.digest)

    def budget(self, policy: Policy) -> Budget | None:
        return self.own_budget if self.managed else policy.budgets.keys.get(self.digest)
