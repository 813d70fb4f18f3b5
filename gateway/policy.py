"""The routing policy: one pydantic schema, the YAML loader, and the file watcher.

The schema is the single source of truth for what a policy file may say. Loading runs in
three passes, each reporting errors as `yaml.path: reason`:

1. YAML parsing (errors carry a line and column; duplicate keys are refused),
2. `${ENV}` / `${ENV:-default}` expansion of every string value (as in the shell, the
   default also replaces a variable that is set but empty),
3. schema validation, then the checks that span several sections (tier references,
   fallback cycles, local engines), which pydantic cannot place on a path by itself.
"""

import asyncio
import hashlib
import logging
import os
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from engine.entrypoints.body_limit import DEFAULT_MAX_BODY_BYTES
from engine.model_registry import BUNDLED

logger = logging.getLogger("tiergate.policy")

_ENV_PATTERN = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


class _Strict(BaseModel):
    # Unknown keys are typos more often than not: refuse them instead of ignoring them.
    model_config = ConfigDict(extra="forbid")


def _between_0_and_1(value: float | None) -> float | None:
    if value is not None and not 0 <= value <= 1:
        raise ValueError("must be between 0 and 1")
    return value


def _positive(value: float | int | None) -> float | int | None:
    if value is not None and value <= 0:
        raise ValueError("must be greater than 0")
    return value


def _not_negative(value: float | int | None) -> float | int | None:
    if value is not None and value < 0:
        raise ValueError("must be 0 or greater")
    return value


class ServerSettings(_Strict):
    host: str = "127.0.0.1"
    port: int = 8000
    reload_interval_s: float = 1.0  # how often the policy file's mtime is polled; 0 turns it off
    # SIGTERM: in-flight requests get this long to finish, then the rest are aborted. 25 s:
    # with the abort margin that fits Kubernetes' default 30 s before it kills the pod.
    shutdown_grace_s: float = 25.0
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES  # larger request bodies get 413

    _check_interval = field_validator("reload_interval_s", "shutdown_grace_s")(_not_negative)
    _check_body = field_validator("max_body_bytes")(_positive)

    @field_validator("port")
    @classmethod
    def _port(cls, value: int) -> int:
        if not 0 < value < 65536:
            raise ValueError("must be between 1 and 65535")
        return value


class ApiKey(_Strict):
    """One bearer key: the key itself, or its SHA-256 (`tiergate hash-key`) so the policy
    file holds no usable secret."""

    key: str | None = None
    key_sha256: str | None = None
    tenant: str

    @field_validator("key")
    @classmethod
    def _non_empty(cls, value: str | None) -> str | None:
        if value is not None and not value.strip():
            raise ValueError("must not be empty")
        return value

    @field_validator("key_sha256")
    @classmethod
    def _hex_digest(cls, value: str | None) -> str | None:
        if value is not None and not re.fullmatch(r"[0-9a-fA-F]{64}", value):
            raise ValueError("must be 64 hex digits (the output of `tiergate hash-key`)")
        return value.lower() if value is not None else None

    @model_validator(mode="after")
    def _one_of(self) -> "ApiKey":
        if (self.key is None) == (self.key_sha256 is None):
            raise ValueError("set exactly one of key and key_sha256")
        return self

    def digest(self) -> str:
        return self.key_sha256 or key_digest(self.key.encode())  # type: ignore[union-attr]


def key_digest(key: bytes) -> str:
    """How keys are compared: by SHA-256, so a stored hash and a plain key work alike."""
    return hashlib.sha256(key).hexdigest()


def _secret(value: str | None) -> str | None:
    # An empty secret would match an empty bearer token: refuse it rather than open the door.
    if value is not None and not value.strip():
        raise ValueError("must not be empty (leave the key out to disable what it guards)")
    return value


class AuthSettings(_Strict):
    # keys: every caller needs one of `keys`. none: no auth, every caller is tenant
    # "default"; it must be said explicitly, so an edit that empties `keys` cannot open it.
    mode: Literal["keys", "none"] = "keys"
    keys: list[ApiKey] = []
    admin_key: str | None = None  # None: the /admin API is disabled
    metrics_key: str | None = None  # bearer key for /metrics (the admin key works too)
    # Secret mixed into the cache salt sent to remote engines (HMAC of the tenant), so a
    # salt cannot be guessed from a tenant's name. None: a random one per process.
    cache_salt_secret: str | None = None

    _check_secrets = field_validator("admin_key", "metrics_key", "cache_salt_secret")(_secret)

    @model_validator(mode="after")
    def _keys_match_mode(self) -> "AuthSettings":
        if self.mode == "keys" and not self.keys:
            raise ValueError(
                "no keys: list at least one under auth.keys, or set `mode: none` to serve "
                "without authentication"
            )
        if self.mode == "none" and self.keys:
            raise ValueError("mode none takes no keys: remove them or the mode")
        return self


class CacheSettings(_Strict):
    # The semantic cache lands in a later issue; the section exists so policies keep working.
    enabled: bool = False
    similarity_threshold: float = 0.9
    ttl_s: float = 3600.0
    max_entries: int = 100_000
    store: Literal["embedded", "redis"] = "embedded"
    redis_url: str | None = None

    _check_threshold = field_validator("similarity_threshold")(_between_0_and_1)
    _check_positive = field_validator("ttl_s", "max_entries")(_positive)

    @field_validator("enabled")
    @classmethod
    def _not_yet(cls, value: bool) -> bool:
        # Accepting `true` would silently serve every request uncached.
        if value:
            raise ValueError("the semantic cache is not available in this release yet")
        return value


class EmbedderSettings(_Strict):
    model: str = "all-MiniLM-L6-v2"
    batch_size: int = 32
    max_wait_ms: float = 2.0  # micro-batching window across concurrent requests

    _check_batch = field_validator("batch_size")(_positive)
    _check_wait = field_validator("max_wait_ms")(_not_negative)


class EngineSettings(_Strict):
    """One in-process engine; deployments name it by its key under `engines`."""

    model: str | None = None  # bundled name, GGUF path or HF folder; None: the engines key
    kv_cache_mb: int = 256
    page_size: int = 16
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 2048
    max_waiting: int = 256
    max_waiting_per_tenant: int | None = None  # one tenant's share of max_waiting; None: all
    max_model_len: int | None = None
    enable_prefix_caching: bool = True
    num_threads: int | None = None

    _check_positive = field_validator(
        "kv_cache_mb",
        "page_size",
        "max_num_seqs",
        "max_num_batched_tokens",
        "max_waiting",
        "max_waiting_per_tenant",
        "max_model_len",
        "num_threads",
    )(_positive)


class Deployment(_Strict):
    """A local engine (model names an `engines` entry or a bundled model) or a litellm model."""

    model: str
    api_base: str | None = None  # remote only: e.g. http://vllm:8000/v1
    api_key_env: str | None = None  # remote only: environment variable holding the key
    timeout_s: float | None = None  # overrides the tier's timeout for this deployment
    # remote only. auto: OpenAI-speaking providers (hosted_vllm/, openai/) are called
    # directly, the rest through litellm; litellm: always through litellm.
    client: Literal["auto", "litellm"] = "auto"

    _check_timeout = field_validator("timeout_s")(_positive)


class Price(_Strict):
    input: float = 0.0  # USD per 1M prompt tokens
    output: float = 0.0  # USD per 1M completion tokens

    _check = field_validator("input", "output")(_not_negative)


class Tier(_Strict):
    deployments: list[Deployment] = Field(min_length=1)
    price: Price = Price()
    timeout_s: float = 60.0  # per attempt: whole answer, or first token of a stream
    retries: int = 1  # extra attempts per deployment on retryable errors
    backoff_s: float = 0.2  # first retry delay; doubles each retry
    cooldown_s: float = 30.0  # a deployment that exhausted its retries is skipped this long
    fallback: str | None = None  # tier tried when every deployment of this one failed
    # Several deployments (replicas): which goes first (README "Balancing replicas").
    balance: Literal["ordered", "round_robin", "least_outstanding", "prefix_affinity"] = "ordered"
    # prefix_affinity: requests in flight the replica holding a prefix may have above the
    # least loaded replica before the request goes to that one instead.
    affinity_slack: int = 8
    health_check_s: float = 0.0  # probe remote replicas' /health this often; 0: off

    _check_positive = field_validator("timeout_s")(_positive)
    _check_not_negative = field_validator(
        "retries", "backoff_s", "cooldown_s", "affinity_slack", "health_check_s"
    )(_not_negative)


class Rule(_Strict):
    """Matches when every condition it sets holds; unset conditions match anything."""

    tier: str
    min_score: float | None = None  # difficulty score conditions: need a scorer (later issue)
    max_score: float | None = None
    min_prompt_tokens: int | None = None  # approximate: characters / 4, before tokenizing
    max_prompt_tokens: int | None = None
    min_chars: int | None = None
    max_chars: int | None = None
    contains_code: bool | None = None
    min_messages: int | None = None
    max_messages: int | None = None

    _check_score = field_validator("min_score", "max_score")(_between_0_and_1)
    _check_counts = field_validator(
        "min_prompt_tokens",
        "max_prompt_tokens",
        "min_chars",
        "max_chars",
        "min_messages",
        "max_messages",
    )(_not_negative)


class Route(_Strict):
    rules: list[Rule] = []  # first match wins
    default: str  # tier when no rule matches


class LimitSet(_Strict):
    """Ceilings for one tenant or one key; a field left out (or null) sets no ceiling."""

    requests_per_minute: int | None = None
    tokens_per_minute: int | None = None  # prompt + completion
    max_concurrent: int | None = None  # requests in flight at once, streams included

    _check_positive = field_validator("requests_per_minute", "tokens_per_minute", "max_concurrent")(
        _positive
    )

    def over(self, base: "LimitSet") -> "LimitSet":
        """These limits on top of `base`: fields written here win, even an explicit null."""
        return base.model_copy(update={f: getattr(self, f) for f in self.model_fields_set})

    @property
    def empty(self) -> bool:
        return self.requests_per_minute is self.tokens_per_minute is self.max_concurrent is None


class LimitsSettings(_Strict):
    """Rate and concurrency limits; see README "Limits"."""

    # Where the counters live so gateway replicas share them. None: cache.redis_url when
    # that is set, else in this process.
    redis_url: str | None = None
    default: LimitSet = LimitSet()  # every tenant without an entry under `tenants`
    tenants: dict[str, LimitSet] = {}  # per tenant, field by field over `default`
    keys: dict[str, LimitSet] = {}  # per API key, by its SHA-256 hex; on top of its tenant's

    def for_tenant(self, tenant: str) -> LimitSet:
        own = self.tenants.get(tenant)
        return self.default if own is None else own.over(self.default)


class Policy(_Strict):
    server: ServerSettings = ServerSettings()
    auth: AuthSettings  # required: serving without keys must be a choice, not an omission
    limits: LimitsSettings = LimitsSettings()
    cache: CacheSettings = CacheSettings()
    embedder: EmbedderSettings = EmbedderSettings()
    engines: dict[str, EngineSettings] = {}
    tiers: Annotated[dict[str, Tier], Field(min_length=1)]
    routes: dict[str, Route] = {}

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


# --- pass 1: YAML -----------------------------------------------------------------------


class _UniqueKeyLoader(yaml.SafeLoader):
    """PyYAML keeps the last of two equal keys silently; a policy must not."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {key!r}", key_node.start_mark
                )
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def _parse_yaml(text: str) -> tuple[Any, list[PolicyIssue]]:
    try:
        return yaml.load(text, Loader=_UniqueKeyLoader), []
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        reason = getattr(exc, "problem", None) or str(exc)
        if mark is None:
            return None, [PolicyIssue("", f"invalid YAML: {reason}")]
        where = f"line {mark.line + 1}, column {mark.column + 1}"
        return None, [PolicyIssue("", f"invalid YAML at {where}: {reason}")]


# --- pass 2: environment ----------------------------------------------------------------


def _format_path(loc: tuple[str | int, ...]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _expand_env(value: Any, env: dict[str, str], loc: tuple, issues: list[PolicyIssue]) -> Any:
    if isinstance(value, dict):
        return {k: _expand_env(v, env, (*loc, k), issues) for k, v in value.items()}
    if isinstance(value, list):
        return [_expand_env(v, env, (*loc, i), issues) for i, v in enumerate(value)]
    if not isinstance(value, str):
        return value

    def substitute(match: re.Match) -> str:
        name, default = match.group(1), match.group(2)
        if default is not None:  # like the shell's ${X:-d}: d when X is unset or empty
            return env.get(name) or default
        if name in env:
            return env[name]
        issues.append(PolicyIssue(_format_path(loc), f"environment variable {name} is not set"))
        return ""

    return _ENV_PATTERN.sub(substitute, value)


# --- pass 3: schema and cross-references ------------------------------------------------

_PYDANTIC_MESSAGES = {
    "missing": "required",
    "extra_forbidden": "unknown key",
    "too_short": "must not be empty",
}


def _schema_issues(exc: ValidationError) -> list[PolicyIssue]:
    issues = []
    for err in exc.errors():
        # Dict keys are strings already; validator-function names never appear in a path.
        loc = tuple(p for p in err["loc"] if not str(p).startswith("function-"))
        message = _PYDANTIC_MESSAGES.get(err["type"], err["msg"])
        if loc == ("auth",) and err["type"] == "missing":
            message = "required: list keys under auth.keys, or write `auth: {mode: none}`"
        message = message.removeprefix("Value error, ")
        issues.append(PolicyIssue(_format_path(loc), message))
    return issues


def _reference_issues(policy: Policy) -> list[PolicyIssue]:
    tiers = policy.tiers
    issues = []
    for name, tier in tiers.items():
        if tier.fallback is not None and tier.fallback not in tiers:
            issues.append(PolicyIssue(f"tiers.{name}.fallback", f"unknown tier {tier.fallback!r}"))
        for i, dep in enumerate(tier.deployments):
            issues += _deployment_issues(policy, dep, f"tiers.{name}.deployments[{i}]")
    issues += _cycle_issues(tiers)
    issues += _limits_issues(policy)
    for route_name, route in policy.routes.items():
        if route_name in tiers:
            issues.append(PolicyIssue(f"routes.{route_name}", "a route cannot share a tier's name"))
        if route.default not in tiers:
            issues.append(
                PolicyIssue(f"routes.{route_name}.default", f"unknown tier {route.default!r}")
            )
        for i, rule in enumerate(route.rules):
            path = f"routes.{route_name}.rules[{i}]"
            issues += _rule_issues(rule, path, tiers)
    return issues


def _deployment_issues(policy: Policy, dep: Deployment, path: str) -> list[PolicyIssue]:
    if policy.is_local(dep):
        if dep.api_base or dep.api_key_env:
            return [PolicyIssue(path, "a local engine deployment takes no api_base/api_key_env")]
        return []
    if "/" not in dep.model:
        known = ", ".join(sorted({*policy.engines, *BUNDLED}))
        reason = (
            f"{dep.model!r} is neither a local engine ({known}) "
            "nor a litellm model string 'provider/model'"
        )
        return [PolicyIssue(f"{path}.model", reason)]
    if dep.model.startswith("hosted_vllm/") and not dep.api_base:
        return [PolicyIssue(f"{path}.api_base", "required for hosted_vllm/ models")]
    return []


def _limits_issues(policy: Policy) -> list[PolicyIssue]:
    """Limits for a tenant or key the policy does not know are typos: refuse them."""
    keys = policy.auth.keys
    tenants = {k.tenant for k in keys} if keys else {"default"}
    hashes = {k.digest() for k in keys}  # a key may be written as itself or as its hash
    known = ", ".join(sorted(tenants))
    issues = [
        PolicyIssue(f"limits.tenants.{name}", f"unknown tenant (known: {known})")
        for name in policy.limits.tenants
        if name not in tenants
    ]
    for digest in policy.limits.keys:
        if digest.lower() not in hashes:
            reason = "no key in auth.keys has this SHA-256 (printf %s KEY | sha256sum)"
            issues.append(PolicyIssue(f"limits.keys.{digest}", reason))
    return issues


def _rule_issues(rule: Rule, path: str, tiers: dict[str, Tier]) -> list[PolicyIssue]:
    issues = []
    if rule.tier not in tiers:
        issues.append(PolicyIssue(f"{path}.tier", f"unknown tier {rule.tier!r}"))
    for low, high in (
        ("min_score", "max_score"),
        ("min_prompt_tokens", "max_prompt_tokens"),
        ("min_chars", "max_chars"),
        ("min_messages", "max_messages"),
    ):
        lo, hi = getattr(rule, low), getattr(rule, high)
        if lo is not None and hi is not None and lo > hi:
            issues.append(PolicyIssue(f"{path}.{low}", f"must not exceed {high} ({hi})"))
    return issues


def _cycle_issues(tiers: dict[str, Tier]) -> list[PolicyIssue]:
    issues, reported = [], set()
    for start in tiers:
        chain, current = [start], tiers[start].fallback
        while current in tiers and current not in chain:
            chain.append(current)
            current = tiers[current].fallback
        if current == start and start not in reported:
            reported.update(chain)
            cycle = " -> ".join([*chain, start])
            issues.append(PolicyIssue(f"tiers.{start}.fallback", f"fallback cycle: {cycle}"))
    return issues


def _line_index(node: yaml.Node, loc: tuple = (), index: dict | None = None) -> dict[str, int]:
    """YAML path -> 1-based line of its key (mappings) or item (sequences)."""
    index = {} if index is None else index
    if isinstance(node, yaml.MappingNode):
        children = [((*loc, k.value), k, v) for k, v in node.value]
    elif isinstance(node, yaml.SequenceNode):
        children = [((*loc, i), v, v) for i, v in enumerate(node.value)]
    else:
        return index
    for child_loc, marker, value in children:
        index[_format_path(child_loc)] = marker.start_mark.line + 1
        _line_index(value, child_loc, index)
    return index


def _with_lines(text: str, issues: list[PolicyIssue]) -> list[PolicyIssue]:
    index = _line_index(yaml.compose(text, Loader=yaml.SafeLoader))
    located = []
    for issue in issues:
        path = issue.path
        while path and path not in index:  # a missing key: point at its parent
            path = path.rpartition(".")[0] if "." in path else ""
        located.append(PolicyIssue(issue.path, issue.message, index.get(path)))
    return located


def parse_policy(text: str, source: str = "<policy>", env: dict[str, str] | None = None) -> Policy:
    """Validate policy text; raises PolicyError listing every issue found."""
    try:
        return _validate(text, source, env)
    except PolicyError as exc:
        if exc.issues and exc.issues[0].path:  # YAML syntax errors carry their line already
            exc.issues = _with_lines(text, exc.issues)
        raise


def _validate(text: str, source: str, env: dict[str, str] | None) -> Policy:
    data, issues = _parse_yaml(text)
    if issues:
        raise PolicyError(source, issues)
    if not isinstance(data, dict):
        raise PolicyError(source, [PolicyIssue("", "the policy must be a YAML mapping")])
    data = _expand_env(data, dict(os.environ) if env is None else env, (), issues)
    try:
        policy = Policy.model_validate(data)
    except ValidationError as exc:
        # A variable that is not set already explains why its value is then invalid.
        unset = {i.path for i in issues}
        issues += [i for i in _schema_issues(exc) if i.path not in unset]
        raise PolicyError(source, issues) from None
    # Cross-section checks need a valid schema, so they only run once it is.
    issues += _reference_issues(policy)
    if issues:
        raise PolicyError(source, issues)
    return policy


def load_policy(path: str | Path, env: dict[str, str] | None = None) -> Policy:
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise PolicyError(str(path), [PolicyIssue("", f"cannot read: {exc.strerror}")]) from None
    return parse_policy(text, str(path), env)


# --- hot reload -------------------------------------------------------------------------


class PolicyWatcher:
    """Polls the policy file's mtime and calls `apply` with each new valid policy.

    An invalid file leaves the running policy in force: the error is logged and kept in
    `last_error` (shown by GET /admin/policy) until a later load succeeds.
    """

    def __init__(
        self,
        path: Path,
        apply: Callable[[Policy], Awaitable[None]],
        interval_s: float = 1.0,
        on_result: Callable[[bool], None] | None = None,
    ) -> None:
        self.path = path
        self._apply = apply  # raises PolicyError to refuse a policy it cannot put in force
        self.interval_s = interval_s
        self._on_result = on_result or (lambda ok: None)
        self.last_error: PolicyError | None = None
        self._mtime = self._current_mtime()
        self._lock = asyncio.Lock()

    def _current_mtime(self) -> int | None:
        try:
            return self.path.stat().st_mtime_ns
        except OSError:
            return None

    async def reload(self) -> Policy | None:
        """Load and apply the file now; returns the new policy, or None when it is invalid."""
        async with self._lock:
            self._mtime = self._current_mtime()
            try:
                policy = await asyncio.to_thread(load_policy, self.path)
                await self._apply(policy)
            except PolicyError as exc:
                self.last_error = exc
                self._on_result(False)
                logger.error("policy reload refused, keeping the running policy: %s", exc)
                return None
            self.last_error = None
            self._on_result(True)
            logger.info("policy reloaded from %s", self.path)
            return policy

    async def watch(self) -> None:
        """Run until cancelled; reloads whenever the file's mtime changes."""
        while True:
            await asyncio.sleep(self.interval_s)
            if self._current_mtime() == self._mtime:
                continue
            try:
                await self.reload()
            except Exception:  # a bug in one reload must not end hot reload for good
                logger.exception("policy reload failed")
