"""Routing rules, the tier override, lazy scoring and the example files (no model, no server)."""

import dataclasses
import textwrap
from pathlib import Path

import numpy as np
import pytest

from engine.entrypoints.openai.errors import OpenAIError
from gateway.cli import main
from gateway.policy import Blend, PolicyError, key_digest, load_policy, parse_policy
from gateway.policy.signal_names import SIGNAL_NAMES
from gateway.routing.difficulty import Classifier, DifficultyScorer
from gateway.routing.features import extract_features
from gateway.routing.nearest import Kernel, Neighbours
from gateway.routing.router import Router, RoutingInput, Scored
from gateway.routing.signals import NAMES, Signals, compute_signals

ALLOWED, OTHER = "sk-allowed-key", "sk-other-key"
POLICY = f"""
auth:
  keys:
    - {{key: {ALLOWED}, tenant: a, tier_override: true}}
    - {{key: {OTHER}, tenant: b}}
tiers:
  small: {{deployments: [{{model: smollm2-135m}}]}}
  medium: {{deployments: [{{model: smollm2-135m}}]}}
  large: {{deployments: [{{model: smollm2-135m}}]}}
routes:
  auto:
    aliases: [gpt-4o]
    rules:
      - {{name: beta, tier: large, headers: {{x-beta: "yes"}}}}
      - {{name: tools, tier: medium, tools: true}}
      - {{name: alias, tier: medium, models: [gpt-4o], max_score: 0.2}}
      - {{name: hard, tier: large, min_score: 0.7}}
      - {{name: mid, tier: medium, min_score: 0.4}}
      - {{name: mathy, tier: large, min_signals: {{math: 0.5}}}}
    default: small
  plain:
    rules: [{{tier: large, contains_code: true}}]
    default: small
"""


class CountingScorer:
    def __init__(self, score: float) -> None:
        self.value, self.calls = score, 0

    async def score(self, inp: RoutingInput, signals: object) -> Scored:
        self.calls += 1
        await inp.embed()
        return Scored(self.value, (("embedding", 0.1),))


class CountingEmbed:
    def __init__(self) -> None:
        self.calls = 0

    async def __call__(self) -> np.ndarray:
        self.calls += 1
        return np.zeros(4, dtype=np.float32)


def routing_input(text: str = "hello", model: str = "auto", **kwargs) -> RoutingInput:
    features = extract_features([{"role": "user", "content": text}], None)
    return RoutingInput(model, features, **kwargs)


async def decide(score: float, text: str = "hello", model: str = "auto", **kwargs):
    scorer, embed = CountingScorer(score), CountingEmbed()
    router = Router(parse_policy(POLICY, env={}), scorer)
    decision = await router.decide(routing_input(text, model, embed=embed, **kwargs))
    return decision, scorer.calls, embed.calls


async def test_first_matching_rule_wins_in_order() -> None:
    assert (await decide(0.9))[0].rule == "hard"
    assert (await decide(0.5))[0].tier == "medium"
    low, _, _ = await decide(0.1)
    assert (low.tier, low.rule, low.score) == ("small", "default", 0.1)
    # A header rule before the score rules wins, and the score is never asked for.
    beta, scored, embedded = await decide(0.9, headers={"x-beta": "yes"})
    assert (beta.tier, beta.rule, scored, embedded) == ("large", "beta", 0, 0)
    tools, scored, _ = await decide(0.9, tools=True)
    assert (tools.rule, scored) == ("tools", 0)
    # An alias picks the route; a rule may test which name was asked for.
    alias, _, _ = await decide(0.1, model="gpt-4o")
    assert (alias.route, alias.rule, alias.tier) == ("auto", "alias", "medium")


async def test_signal_rules_read_the_prompt() -> None:
    text = "Solve the equation 3*x + 4 = 19 and compute x^2 - 2 = ?"
    assert compute_signals(routing_input(text).features).math >= 0.5
    decision, _, _ = await decide(0.1, text=text)
    assert decision.rule == "mathy"


async def test_score_is_computed_once_and_only_when_a_rule_needs_it() -> None:
    # Two score rules read one score: one scorer call, one embedding.
    _, scored, embedded = await decide(0.1)
    assert (scored, embedded) == (1, 1)
    policy = parse_policy(POLICY, env={})
    scorer, embed = CountingScorer(0.9), CountingEmbed()
    decision = await Router(policy, scorer).decide(routing_input("hi", "plain", embed=embed))
    assert (decision.tier, decision.score, scorer.calls, embed.calls) == ("small", None, 0, 0)


async def test_difficulty_scorer_embeds_only_when_its_classifier_takes_part() -> None:
    dim = 4
    weights = np.ones(dim + len(NAMES))
    classifier = Classifier(weights, 0.0, np.zeros_like(weights))
    embed = CountingEmbed()
    inp = routing_input("prove it", embed=embed)
    signals = compute_signals(inp.features)
    trained = DifficultyScorer(classifier, Blend(classifier=1.0), dim)
    scored = await trained.score(inp, signals)
    assert 0 <= scored.score <= 1 and embed.calls == 1
    signals_only = DifficultyScorer(None, Blend(classifier=0.0, tokens=1.0), 0)
    scored = await signals_only.score(inp, signals)
    assert scored.score == pytest.approx(signals.tokens) and embed.calls == 1
    assert scored.top[0][0] == "tokens"


def unit(v: np.ndarray) -> np.ndarray:
    return (v / np.linalg.norm(v, axis=-1, keepdims=True)).astype(np.float32)


def test_neighbours_move_the_score_where_the_nearest_examples_agree() -> None:
    """Two families of examples in two directions of the embedding: a prompt near the hard
    family scores their mean target, whatever the signals say; k picks how many vote."""
    rng = np.random.default_rng(0)
    hard, easy = np.eye(8)[0], np.eye(8)[1]
    vectors = unit(
        np.vstack(
            [hard + 0.1 * rng.standard_normal((6, 8)), easy + 0.1 * rng.standard_normal((6, 8))]
        )
    )
    targets = np.array([1.0] * 5 + [0.0] + [0.0] * 6)  # one hard-family example disagrees
    signals = compute_signals(extract_features([{"role": "user", "content": "x"}], None))
    blend = Blend(classifier=0.0, neighbours=1.0, tokens=1.0)
    near_hard, near_easy = unit(hard + 0.05 * easy), unit(easy + 0.05 * hard)
    scorer = DifficultyScorer(None, blend, 8, {"neighbours": Neighbours(vectors, targets, k=5)})
    signals_only = DifficultyScorer(None, Blend(classifier=0.0, tokens=1.0), 0)
    assert scorer.needs_embedding and not signals_only.needs_embedding
    base = signals_only.score_embedded(None, signals).score
    high = scorer.score_embedded(near_hard, signals)
    low = scorer.score_embedded(near_easy, signals)
    # The five nearest to near_hard: the hard family's six minus one, mean 4/5 or 5/5.
    assert high.score >= (0.8 + signals.tokens) / 2 - 1e-6 > base > low.score
    assert low.score == pytest.approx(signals.tokens / 2, abs=1e-6)
    assert high.top[0][0] == "neighbours" and high.top[0][1] > 0 > dict(low.top)["neighbours"]
    everyone = DifficultyScorer(None, blend, 8, {"neighbours": Neighbours(vectors, targets, k=100)})
    spread = everyone.score_embedded(near_hard, signals).score
    assert spread == pytest.approx((targets.mean() + signals.tokens) / 2, abs=1e-6)


def test_the_kernel_term_scores_a_prompt_as_the_examples_around_it() -> None:
    """Kernel ridge on two families: near the hard one the term predicts near 1, near the
    easy one near 0, far from both the mean target; with the classifier's blend weight 0
    and the kernel's > 0 it moves the score, and names itself in the explanation."""
    rng = np.random.default_rng(1)
    hard, easy, far = np.eye(8)[0], np.eye(8)[1], np.eye(8)[2]
    vectors = unit(
        np.vstack(
            [hard + 0.1 * rng.standard_normal((6, 8)), easy + 0.1 * rng.standard_normal((6, 8))]
        )
    )
    targets = np.array([1.0] * 6 + [0.0] * 6)
    kernel = Kernel.fit(vectors, targets, width=0.2, ridge=0.3)
    assert kernel.predict(unit(hard)) > 0.8 and kernel.predict(unit(easy)) < 0.2
    assert kernel.predict(far) == pytest.approx(0.5, abs=0.01)
    signals = compute_signals(extract_features([{"role": "user", "content": "x"}], None))
    blend = Blend(classifier=0.0, kernel=3.0, tokens=1.0)
    scorer = DifficultyScorer(
        None, blend, 8, {"kernel": kernel, "neighbours": Neighbours(vectors, targets, 5)}
    )
    assert list(scorer.terms) == ["kernel"]  # neighbours weigh 0: not computed
    high = scorer.score_embedded(unit(hard), signals)
    low = scorer.score_embedded(unit(easy), signals)
    assert high.score > 0.6 > 0.15 > low.score
    assert high.top[0][0] == "kernel" and dict(low.top)["kernel"] < 0


async def test_a_broken_embedder_falls_back_to_the_other_rules() -> None:
    async def broken() -> np.ndarray:
        raise RuntimeError("embedder down")

    class Embeds:
        async def score(self, inp: RoutingInput, signals: object) -> Scored:
            await inp.embed()
            return Scored(1.0)

    router = Router(parse_policy(POLICY, env={}), Embeds())
    decision = await router.decide(routing_input(embed=broken))
    assert (decision.tier, decision.rule, decision.score) == ("small", "default", None)


async def test_tier_override_only_for_keys_the_policy_allows() -> None:
    header = {"x-tiergate-tier": "large"}
    decision, scored, _ = await decide(0.0, headers=header, key_digest=key_digest(ALLOWED.encode()))
    assert (decision.tier, decision.rule, scored) == ("large", "override", 0)
    for digest in (key_digest(OTHER.encode()), None):
        with pytest.raises(OpenAIError) as refused:
            await decide(0.0, headers=header, key_digest=digest)
        assert (refused.value.status, refused.value.code) == (403, "tier_override_not_allowed")
        assert refused.value.param == "x-tiergate-tier"
    with pytest.raises(OpenAIError) as unknown:
        await decide(
            0.0, headers={"x-tiergate-tier": "huge"}, key_digest=key_digest(ALLOWED.encode())
        )
    assert (unknown.value.status, unknown.value.code) == (400, "unknown_tier")


def test_bad_rule_signals_and_aliases_are_policy_errors() -> None:
    text = POLICY.replace("math: 0.5", "maths: 0.5").replace("[gpt-4o]", "[small]")
    with pytest.raises(PolicyError) as caught:
        parse_policy(text, env={})
    messages = [str(i) for i in caught.value.issues]
    assert "routes.auto.aliases[0]: 'small' is taken" in messages
    assert any(
        m.startswith("routes.auto.rules[5].min_signals.maths: unknown signal") for m in messages
    )


def test_one_list_names_the_signals_their_blend_weights_and_the_rule_keys() -> None:
    """gateway/policy/signal_names.py is the only place a signal is named: routing's
    Signals, the policy's blend weights and the rule keys it accepts all follow it."""
    assert [f.name for f in dataclasses.fields(Signals)] == list(SIGNAL_NAMES) == list(NAMES)
    assert list(Blend.model_fields) == ["classifier", "neighbours", "kernel", *SIGNAL_NAMES]
    every = ", ".join(f"{name}: 0.5" for name in SIGNAL_NAMES)
    text = POLICY.replace("{math: 0.5}", f"{{{every}}}")
    assert text != POLICY
    rule = parse_policy(text, env={}).routes["auto"].rules[5]
    assert list(rule.min_signals) == list(SIGNAL_NAMES)
    assert list(compute_signals(extract_features(None, "x")).as_dict()) == list(SIGNAL_NAMES)


EXAMPLE_POLICY = """
tiers:
  small: {deployments: [{model: smollm2-135m}]}
  large: {deployments: [{model: smollm2-135m}]}
difficulty:
  examples:
    - examples.jsonl
routes:
  auto: {rules: [{tier: large, min_score: 0.5}], default: small}
auth: {mode: none}
"""


@pytest.mark.parametrize(
    ("content", "reason"),
    [
        ('{"prompt": "a", "label": 1}\n{"prompt": "b", "label": 1\n', ":2: invalid JSON"),
        ('{"prompt": "a"}\n', ":1: give exactly one of label"),
        ('{"prompt": "a", "label": 3}\n', ":1: label must be 0 or 1"),
        ("", ": no examples"),
        (None, ": cannot read: No such file or directory"),
    ],
)
def test_a_bad_example_file_is_a_policy_error_naming_it(
    tmp_path: Path, capsys: pytest.CaptureFixture, content: str | None, reason: str
) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text(textwrap.dedent(EXAMPLE_POLICY))
    examples = tmp_path / "examples.jsonl"
    if content is not None:
        examples.write_text(content)
    with pytest.raises(PolicyError) as caught:
        load_policy(policy)
    (issue,) = caught.value.issues
    assert issue.path == "difficulty.examples[0]" and issue.line == 7
    assert issue.message.startswith(f"{examples}{reason}"), issue.message
    assert main(["check-policy", str(policy)]) == 1
    assert f"{policy}:7: difficulty.examples[0]: {examples}" in capsys.readouterr().err


def test_example_paths_resolve_beside_the_policy(tmp_path: Path) -> None:
    (tmp_path / "examples.jsonl").write_text('{"prompt": "a", "score": 0.25}\n')
    (tmp_path / "policy.yaml").write_text(textwrap.dedent(EXAMPLE_POLICY))
    policy = load_policy(tmp_path / "policy.yaml")
    assert policy.difficulty.examples == [str(tmp_path / "examples.jsonl")]


@pytest.mark.parametrize(
    ("knob", "where", "reason"),
    [
        ("k_nearest: 0", "difficulty.k_nearest", "must be greater than 0"),
        ("k_nearest: many", "difficulty.k_nearest", "valid integer"),
        ("blend: {neighbours: -1}", "difficulty.blend.neighbours", "must be 0 or greater"),
        ("blend: {neighbors: 1}", "difficulty.blend.neighbors", "unknown key"),
        ("blend: {kernel: -0.5}", "difficulty.blend.kernel", "must be 0 or greater"),
        ("kernel_width: 0", "difficulty.kernel_width", "must be greater than 0"),
        ("kernel_ridge: -1", "difficulty.kernel_ridge", "must be greater than 0"),
        ("kernel_lexical: 1.5", "difficulty.kernel_lexical", "between 0 and 1"),
    ],
)
def test_bad_example_term_knobs_are_policy_errors(knob: str, where: str, reason: str) -> None:
    text = textwrap.dedent(EXAMPLE_POLICY).replace("difficulty:\n", f"difficulty:\n  {knob}\n")
    with pytest.raises(PolicyError) as caught:
        parse_policy(text, env={})
    (issue,) = caught.value.issues
    assert issue.path == where and reason in issue.message, str(issue)


def test_the_kernel_refuses_more_examples_than_it_can_solve_for() -> None:
    from gateway.routing.nearest import KERNEL_MAX_EXAMPLES

    many = KERNEL_MAX_EXAMPLES + 1
    with pytest.raises(ValueError, match=rf"difficulty.blend.kernel: {many} examples"):
        Kernel.fit(np.zeros((many, 2), np.float32), np.zeros(many), width=0.2, ridge=0.3)
