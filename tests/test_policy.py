"""Policy schema, loader messages, the example files, and rule routing (no server, no model)."""

import textwrap
from pathlib import Path

import pytest

from gateway.cli import main
from gateway.policy import PolicyError, parse_policy
from gateway.routing.features import extract_features
from gateway.routing.router import Router, RoutingInput, Scored

ROOT = Path(__file__).resolve().parent.parent
POLICY_FILES = sorted((ROOT / "router_policies").rglob("*.yaml"))

TIERS = """
tiers:
  small:
    deployments: [{model: smollm2-135m}]
  large:
    deployments: [{model: hosted_vllm/big, api_base: "http://127.0.0.1:1/v1"}]
    fallback: small
"""
NO_AUTH = "auth: {mode: none}\n"
BASE = TIERS + NO_AUTH


def issues_of(text: str, env: dict[str, str] | None = None) -> list[str]:
    """Issues of a policy; one that says nothing about auth gets `auth: {mode: none}`."""
    text = textwrap.dedent(text)
    if "auth:" not in text and text.lstrip().startswith(("tiers", "server")):
        text += NO_AUTH
    with pytest.raises(PolicyError) as caught:
        parse_policy(text, env=env or {})
    return [str(i) for i in caught.value.issues]


def test_valid_policy_loads() -> None:
    policy = parse_policy(BASE + "routes: {auto: {default: small}}", env={})
    assert policy.is_local(policy.tiers["small"].deployments[0])
    assert not policy.is_local(policy.tiers["large"].deployments[0])
    assert list(policy.local_engines()) == ["smollm2-135m"]


def test_bad_yaml_reports_line_and_column() -> None:
    assert issues_of("tiers:\n  small: {deployments: [}\n") == [
        "invalid YAML at line 2, column 25: expected the node content, but found '}'"
    ]


def test_duplicate_key_is_refused() -> None:
    text = "tiers:\n  a: {deployments: [{model: smollm2-135m}]}\n  a: {}\n"
    assert issues_of(text) == ["invalid YAML at line 3, column 3: duplicate key 'a'"]


def test_not_a_mapping() -> None:
    assert issues_of("- one\n- two\n") == ["the policy must be a YAML mapping"]


def test_unknown_fallback_tier() -> None:
    text = BASE.replace("fallback: small", "fallback: huge")
    assert issues_of(text) == ["tiers.large.fallback: unknown tier 'huge'"]


def test_fallback_cycle() -> None:
    self_loop = TIERS + "  tiny:\n    deployments: [{model: smollm2-135m}]\n    fallback: tiny\n"
    assert issues_of(self_loop) == ["tiers.tiny.fallback: fallback cycle: tiny -> tiny"]
    two = BASE.replace("[{model: smollm2-135m}]", "[{model: smollm2-135m}]\n    fallback: large")
    assert issues_of(two) == ["tiers.small.fallback: fallback cycle: small -> large -> small"]


def test_threshold_out_of_range() -> None:
    text = (
        BASE + "routes:\n  auto:\n    default: small\n    rules: [{tier: large, min_score: 1.5}]\n"
    )
    assert issues_of(text) == ["routes.auto.rules[0].min_score: must be between 0 and 1"]


def test_unknown_tiers_in_routes() -> None:
    text = BASE + "routes:\n  auto:\n    default: medium\n    rules: [{tier: xl}]\n"
    assert issues_of(text) == [
        "routes.auto.default: unknown tier 'medium'",
        "routes.auto.rules[0].tier: unknown tier 'xl'",
    ]


def test_schema_errors_are_all_reported_with_paths() -> None:
    text = """
    server: {port: 70000}
    tiers:
      small:
        deployments: []
        timout_s: 3
        retries: -1
    """
    assert issues_of(text) == [
        "server.port: must be between 1 and 65535",
        "tiers.small.deployments: must not be empty",
        "tiers.small.retries: must be 0 or greater",
        "tiers.small.timout_s: unknown key",
    ]


def test_missing_tiers() -> None:
    assert issues_of("server: {port: 8080}\n") == ["tiers: required"]


def test_deployment_that_is_neither_local_nor_litellm() -> None:
    text = "tiers:\n  a: {deployments: [{model: gpt4}]}\n"
    (issue,) = issues_of(text)
    assert issue.startswith("tiers.a.deployments[0].model: 'gpt4' is neither a local engine (")
    assert issue.endswith("nor a litellm model string 'provider/model'")


def test_issues_know_their_line() -> None:
    text = (
        "tiers:\n  a:\n    deployments: [{model: smollm2-135m}]\n    retries: -2\n"
        "routes:\n  r: {}\n" + NO_AUTH
    )
    with pytest.raises(PolicyError) as caught:
        parse_policy(text, env={})
    lines = {str(i): i.line for i in caught.value.issues}
    assert lines == {"tiers.a.retries: must be 0 or greater": 4, "routes.r.default: required": 6}


def test_self_hosted_models_need_an_api_base() -> None:
    text = "tiers:\n  a: {deployments: [{model: hosted_vllm/x}]}\n"
    assert issues_of(text) == ["tiers.a.deployments[0].api_base: required for hosted_vllm/ models"]


def test_env_expansion() -> None:
    text = TIERS + "auth:\n  keys: [{key: '${KEY}', tenant: t}]\n  admin_key: '${ADMIN:-adm}'\n"
    policy = parse_policy(text, env={"KEY": "sk-from-env"})
    assert policy.auth.keys[0].key == "sk-from-env"
    assert policy.auth.admin_key == "adm"
    assert issues_of(text) == ["auth.keys[0].key: environment variable KEY is not set"]


@pytest.mark.parametrize("path", POLICY_FILES, ids=lambda p: p.name)
def test_shipped_policies_pass_check_policy(
    path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    for name in (
        "TIERGATE_API_KEY",
        "TIERGATE_ADMIN_KEY",
        "TIERGATE_METRICS_KEY",
        "TIERGATE_SALT_SECRET",
    ):
        monkeypatch.setenv(name, "sk-test-value")
    assert main(["check-policy", str(path)]) == 0
    assert ": ok (" in capsys.readouterr().out


def test_check_policy_prints_each_error(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(BASE.replace("fallback: small", "fallback: huge") + "server: {port: 0}\n")
    assert main(["check-policy", str(bad)]) == 1
    err = capsys.readouterr().err.splitlines()
    assert err == [
        f"{bad}:9: server.port: must be between 1 and 65535",
        f"1 error(s) in {bad}",
    ]  # schema errors first; cross-references are checked once the schema holds
    bad.write_text(BASE.replace("fallback: small", "fallback: huge"))
    assert main(["check-policy", str(bad)]) == 1
    assert (
        capsys.readouterr().err.splitlines()[0]
        == f"{bad}:7: tiers.large.fallback: unknown tier 'huge'"
    )


def test_default_policy_uses_bundled_local_models() -> None:
    text = (ROOT / "router_policies" / "default.yaml").read_text()
    policy = parse_policy(text, env={})
    assert policy.auth.keys[0].key == "sk-tiergate-local"
    engines = policy.local_engines()
    assert set(engines) == {"smollm2-135m", "qwen2.5-coder-0.5b"}
    # `make run` takes the fastest weight format within the quality bound, not fp32, and
    # twice the KV tokens per budget (bf16)
    configs = [s.to_config(name) for name, s in engines.items()]
    assert {(c.weights, c.kv_dtype) for c in configs} == {("blocks", "bf16")}
    assert policy.tiers["large"].fallback == "small"
    assert policy.cache.enabled and policy.cache.verifier == "balanced"  # on by default
    assert policy.routes["auto"].rules[0].min_score is not None  # routed by difficulty


RULES = (
    BASE
    + """
routes:
  auto:
    rules:
      - {tier: large, min_score: 0.6}
      - {tier: large, contains_code: true}
      - {tier: large, min_prompt_tokens: 100}
      - {tier: large, min_messages: 4}
    default: small
"""
)


def chat(*texts: str) -> list[dict]:
    return [{"role": "user", "content": t} for t in texts]


class FixedScore:
    def __init__(self, score: float | None) -> None:
        self.value = score

    async def score(self, inp: RoutingInput, signals: object) -> Scored | None:
        return None if self.value is None else Scored(self.value)


async def tier_of(messages: list[dict] | None, prompt: str | None = None, score=None) -> str:
    router = Router(parse_policy(RULES, env={}), FixedScore(score))
    return (await router.decide(RoutingInput("auto", extract_features(messages, prompt)))).tier


async def test_rules_pick_tiers_by_prompt_features() -> None:
    assert await tier_of(chat("hi there")) == "small"
    assert await tier_of(chat("fix this:\n```python\nprint(1)\n```")) == "large"
    assert await tier_of(chat("x" * 400)) == "large"
    assert await tier_of(chat("a", "b", "c", "d")) == "large"
    assert await tier_of(None, "hello") == "small"


async def test_score_rules_match_only_with_a_score() -> None:
    easy = chat("what is 2+2?")
    assert await tier_of(easy) == "small"
    assert await tier_of(easy, score=0.9) == "large"
    assert await tier_of(easy, score=0.3) == "small"


async def test_router_names_routes_tiers_and_deployments() -> None:
    policy = parse_policy(RULES, env={})
    features = extract_features(chat("hello"), None)
    router = Router(policy)

    async def decide(r: Router, model: str):
        return await r.decide(RoutingInput(model, features))

    assert (await decide(router, "auto")).tier == "small"
    assert (await decide(Router(policy, FixedScore(0.95)), "auto")).tier == "large"
    assert (await decide(router, "large")).tier == "large"
    pinned = await decide(router, "hosted_vllm/big")
    assert (pinned.tier, pinned.deployment) == ("large", "hosted_vllm/big")
    assert await decide(router, "nope") is None
    assert router.model_names() == ["auto", "small", "large", "smollm2-135m", "hosted_vllm/big"]


def test_engine_settings_are_the_engine_config_in_policy_units() -> None:
    from engine.config import EngineConfig
    from gateway.policy import EngineSettings

    assert EngineSettings().to_config("smollm2-135m") == EngineConfig(model="smollm2-135m")
    custom = EngineSettings(model="qwen2.5-coder-0.5b", kv_cache_mb=3, num_threads=1)
    config = custom.to_config("large")
    assert (config.model, config.kv_cache_bytes, config.num_threads) == (
        "qwen2.5-coder-0.5b",
        3 * 1024 * 1024,
        1,
    )


def test_engine_command_checks_its_flags_with_the_policy_schema(
    capsys: pytest.CaptureFixture,
) -> None:
    from gateway.cli import main

    assert main(["engine", "--model", "smollm2-135m", "--kv-cache-mb", "-5"]) == 2
    assert "--kv-cache-mb: must be greater than 0" in capsys.readouterr().err
