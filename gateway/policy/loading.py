"""The routing policy: one pydantic schema, the YAML loader, and the file watcher.

The schema is the single source of truth for what a policy file may say. Loading runs in
three passes, each reporting errors as `yaml.path: reason`:

1. YAML parsing (errors carry a line and column; duplicate keys are refused, and size,
   aliases and nesting are bounded: yaml_bounds.py),
2. `${ENV}` / `${ENV:-default}` expansion of every string value (as in the shell, the
   default also replaces a variable that is set but empty),
3. schema validation, then the checks that span several sections (tier references,
   fallback cycles, local engines), which pydantic cannot place on a path by itself.
"""

import logging
import os
import re
from pathlib import Path
from typing import Any

import yaml
from pydantic import (
    ValidationError,
)

from engine.model_registry import BUNDLED
from gateway.policy.examples import resolve_example_files
from gateway.policy.schema import Policy, PolicyError, PolicyIssue
from gateway.policy.signal_names import SIGNAL_NAMES
from gateway.policy.tiers import Deployment, Rule, Tier
from gateway.policy.yaml_bounds import MAX_BYTES, load_bounded

logger = logging.getLogger("tiergate.policy")

_ENV_PATTERN = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


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
        return load_bounded(text, _UniqueKeyLoader), []
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
    issues += _name_issues(policy)
    return issues


def _name_issues(policy: Policy) -> list[PolicyIssue]:
    """A model name must pick one thing: aliases may not shadow a tier, route or alias."""
    taken = {*policy.tiers, *policy.routes}
    issues = []
    for route_name, route in policy.routes.items():
        for i, alias in enumerate(route.aliases):
            if alias in taken:
                issues.append(
                    PolicyIssue(f"routes.{route_name}.aliases[{i}]", f"{alias!r} is taken")
                )
            taken.add(alias)
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
    reason = "no key in auth.keys has this SHA-256 (printf %s KEY | sha256sum)"
    for section, digests in (("limits", policy.limits.keys), ("budgets", policy.budgets.keys)):
        for digest in digests:
            if digest.lower() not in hashes:
                issues.append(PolicyIssue(f"{section}.keys.{digest}", reason))
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
    for key in ("min_signals", "max_signals"):
        for name, value in getattr(rule, key).items():
            if name not in SIGNAL_NAMES:
                known = ", ".join(SIGNAL_NAMES)
                issues.append(PolicyIssue(f"{path}.{key}.{name}", f"unknown signal ({known})"))
            elif not 0 <= value <= 1:
                issues.append(PolicyIssue(f"{path}.{key}.{name}", "must be between 0 and 1"))
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


def with_lines(text: str, issues: list[PolicyIssue]) -> list[PolicyIssue]:
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
            exc.issues = with_lines(text, exc.issues)
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


def read_policy_text(path: Path) -> str:
    try:
        with path.open("rb") as file:
            data = file.read(MAX_BYTES + 1)  # a bigger file is refused unread
    except OSError as exc:
        raise PolicyError(str(path), [PolicyIssue("", f"cannot read: {exc.strerror}")]) from None
    if len(data) > MAX_BYTES:
        reason = f"the policy is over the {MAX_BYTES:,} bytes allowed"
        raise PolicyError(str(path), [PolicyIssue("", reason)])
    try:
        return data.decode()
    except UnicodeDecodeError as exc:
        reason = f"not UTF-8 text (byte {exc.start})"
        raise PolicyError(str(path), [PolicyIssue("", reason)]) from None


def load_policy(path: str | Path, env: dict[str, str] | None = None) -> Policy:
    path = Path(path)
    return policy_from_text(read_policy_text(path), path, env)


def policy_from_text(
    text: str, path: Path, env: dict[str, str] | None = None, source: str | None = None
) -> Policy:
    """Policy text as if read from `path`: relative example files are read beside it.
    `source` names the text in errors (default: the path), e.g. another replica's policy."""
    policy = parse_policy(text, source or str(path), env)
    try:
        return resolve_example_files(policy, path)
    except PolicyError as exc:
        exc.issues = with_lines(text, exc.issues)
        raise
