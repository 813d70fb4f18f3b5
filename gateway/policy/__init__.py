"""The routing policy: one pydantic schema, the YAML loader, and the file watcher.

The schema (settings.py and tiers.py, whole in schema.py) is the single source of truth
for what a policy file may say; loading.py reads a file in three passes (YAML, `${ENV}`,
schema then cross-section checks), each reporting `yaml.path: reason` with its line;
watcher.py reloads a changed file. Everything callers use is importable from here.
"""

from gateway.policy.batch import BatchSettings
from gateway.policy.budgets import PERIODS, Budget, BudgetSettings, PricingSettings
from gateway.policy.loading import load_policy, parse_policy, policy_from_text, with_lines
from gateway.policy.schema import Policy, PolicyError, PolicyIssue
from gateway.policy.settings import (
    ApiKey,
    AuthSettings,
    CacheSettings,
    EmbedderSettings,
    EngineSettings,
    LimitSet,
    LimitsSettings,
    RouteCacheSettings,
    ServerSettings,
    Strictness,
    default_cache_path,
    key_digest,
    key_label,
)
from gateway.policy.tiers import (
    Blend,
    Deployment,
    DifficultySettings,
    ExamplePrompt,
    Price,
    Route,
    Rule,
    Tier,
)
from gateway.policy.watcher import PolicyWatcher

__all__ = [
    "PERIODS",
    "ApiKey",
    "AuthSettings",
    "BatchSettings",
    "Blend",
    "Budget",
    "BudgetSettings",
    "CacheSettings",
    "Deployment",
    "DifficultySettings",
    "EmbedderSettings",
    "EngineSettings",
    "ExamplePrompt",
    "LimitSet",
    "LimitsSettings",
    "Policy",
    "PolicyError",
    "PolicyIssue",
    "PolicyWatcher",
    "Price",
    "PricingSettings",
    "Route",
    "RouteCacheSettings",
    "Rule",
    "ServerSettings",
    "Strictness",
    "Tier",
    "default_cache_path",
    "key_digest",
    "key_label",
    "load_policy",
    "parse_policy",
    "policy_from_text",
    "with_lines",
]
