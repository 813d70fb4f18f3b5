"""The cache sections of the policy: defaults, validation paths, per-route resolution."""

import textwrap

import pytest

from gateway.policy import CacheSettings, PolicyError, parse_policy

TIERS = """
auth: {mode: none}
tiers:
  small:
    deployments: [{model: smollm2-135m}]
"""
BASE = TIERS + "routes:\n  auto:\n    default: small\n"


def issues_of(text: str) -> list[str]:
    with pytest.raises(PolicyError) as caught:
        parse_policy(textwrap.dedent(text), env={})
    return [str(i) for i in caught.value.issues]


def test_cache_can_be_enabled_with_defaults(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("TIERGATE_CACHE_DIR", str(tmp_path))
    policy = parse_policy(BASE + "cache: {enabled: true}\n", env={})
    cache = policy.cache
    assert cache.enabled and cache.store == "embedded"
    assert cache.sqlite_path() == tmp_path / "semantic-cache.sqlite3"
    assert CacheSettings(path="~/c.db").sqlite_path().is_absolute()


def test_route_overrides_resolve_over_the_cache_section() -> None:
    text = TIERS + textwrap.dedent("""
        cache: {enabled: true, min_similarity: 0.85, verifier: balanced, ttl_s: 600}
        routes:
          auto: {default: small, cache: {min_similarity: 0.9, verifier: strict}}
          chat: {default: small, cache: {enabled: false}}
          code: {default: small, cache: {verifier: "off", ttl_s: 60}}
        """)
    policy = parse_policy(text, env={})
    auto = policy.cache.for_route(policy.routes["auto"])
    assert (auto.enabled, auto.min_similarity, auto.verifier, auto.ttl_s) == (
        True, 0.9, "strict", 600.0,
    )  # fmt: skip
    assert policy.cache.for_route(policy.routes["chat"]).enabled is False
    code = policy.cache.for_route(policy.routes["code"])
    assert (code.verifier, code.ttl_s, code.min_similarity) == ("off", 60.0, 0.85)
    assert policy.cache.for_route(None).min_similarity == 0.85  # a tier name: no route


def test_a_route_cannot_enable_a_disabled_cache() -> None:
    text = BASE.replace("default: small", "default: small\n    cache: {enabled: true}")
    policy = parse_policy(text, env={})
    assert policy.cache.for_route(policy.routes["auto"]).enabled is False


def test_cache_validation_errors_name_their_path() -> None:
    assert issues_of(BASE + "cache: {enabled: true, store: redis}\n") == [
        "cache.redis_url: required when store is redis"
    ]
    bad = BASE + "cache: {min_similarity: 1.5, max_entries: 0, verifier: loose, colour: red}\n"
    assert issues_of(bad) == [
        "cache.max_entries: must be greater than 0",
        "cache.min_similarity: must be between 0 and 1",
        "cache.verifier: Input should be 'strict', 'balanced', 'lenient' or 'off'",
        "cache.colour: unknown key",
    ]
    route = BASE.replace("default: small", "default: small\n    cache: {min_similarity: -1}")
    assert issues_of(route) == ["routes.auto.cache.min_similarity: must be between 0 and 1"]


def test_temperature_above_the_limit_is_not_stored() -> None:
    settings = CacheSettings(max_temperature=0.7)
    assert settings.stores_temperature(None) and settings.stores_temperature(0.7)
    assert not settings.stores_temperature(0.71)
