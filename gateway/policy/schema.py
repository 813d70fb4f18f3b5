"""The whole policy, and the errors a policy file can have."""

from dataclasses import dataclass
from typing import Annotated

from pydantic import (
    Field,
)

from engine.model_registry import BUNDLED
from gateway.policy.batch import BatchSettings
from gateway.policy.budgets import BudgetSettings, PricingSettings
from gateway.policy.common import StrictModel
from gateway.policy.settings import (
    AuthSettings,
    CacheSettings,
    EmbedderSettings,
    EngineSettings,
    LimitsSettings,
    ServerSettings,
)
from gateway.policy.tiers import Deployment, DifficultySettings, Route, Tier


class Policy(StrictModel):
    server: ServerSettings = ServerSettings()
    auth: AuthSettings  # required: serving without keys must be a choice, not an omission
    limits: LimitsSettings = LimitsSettings()
    budgets: BudgetSettings = BudgetSettings()
    pricing: PricingSettings = PricingSettings()
    cache: CacheSettings = CacheSettings()
    embedder: EmbedderSettings = EmbedderSettings()
    difficulty: DifficultySettings = DifficultySettings()
    engines: dict[str, EngineSettings] = {}
    tiers: Annotated[dict[str, Tier], Field(min_length=1)]
    routes: dict[str, Route] = {}
    batch: BatchSettings = BatchSettings()

    def local_engines(self) -> dict[str, EngineSettings]:
        """Every engine a deployment uses: declared ones, plus bundled names used bare."""
        used = {d.model for t in self.tiers.values() for d in t.deployments}
        engines = {name: s for name, s in self.engines.items() if name in used}
        for name in sorted(used - engines.keys()):
            if name in BUNDLED:
                engines[name] = EngineSettings()
        return engines

    def is_local(self, deployment: Deployment) -> bool:
        return deployment.model in self.engines or deployment.model in BUNDLED

    def limits_redis_url(self) -> str | None:
        return self.limits.redis_url or self.cache.redis_url

    def replicas_redis_url(self) -> str | None:
        return self.server.redis_url or self.limits_redis_url()


@dataclass(frozen=True)
class PolicyIssue:
    path: str  # e.g. "tiers.large.fallback"; empty for whole-file problems
    message: str
    line: int | None = None  # where the path (or its nearest parent) is written in the file

    def __str__(self) -> str:
        return f"{self.path}: {self.message}" if self.path else self.message


class PolicyError(Exception):
    """The policy file is invalid; `issues` lists every problem found."""

    def __init__(self, source: str, issues: list[PolicyIssue]) -> None:
        self.source = source
        self.issues = issues
        super().__init__(f"invalid policy {source}:\n" + "\n".join(f"  {i}" for i in issues))
