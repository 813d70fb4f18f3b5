"""Windows from the snapshot ring, histogram quantiles, cooldown counting and prices."""

import pytest

from engine.entrypoints.openai.protocol import Usage
from gateway.policy import Price, parse_policy
from gateway.pricing import deployment_price, litellm_price, most_expensive, policy_prices
from gateway.stats.counters import CountedCooldowns, Stats, read_samples
from gateway.stats.history import StatsHistory, difference
from gateway.stats.view import quantile, window


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_windows_difference_the_snapshot_before_them() -> None:
    stats, clock = Stats(), Clock()
    history = StatsHistory(lambda: read_samples(stats.registry), interval_s=5, clock=clock)
    price = Price(input=1.0, output=2.0)
    for t in range(0, 120, 5):  # one request every 5 s for two minutes, then a snapshot
        clock.now = 1000.0 + t
        stats.request_done("auto", "small", "m", 200)
        stats.usage("small", "m", Usage.of(10, 1), price)
        history.take()
    clock.now = 1000.0 + 122
    stats.request_done("auto", "large", "m2", 200)  # a sample no stored snapshot has
    now = history.now()
    minute = difference(now.samples, history.baseline(60, now.at).samples)
    hour = difference(now.samples, history.baseline(3600, now.at).samples)
    top = ("small", price)
    # The baseline is the snapshot at t=60 (taken after that second's request): 61..115.
    assert window(minute, 62, top)["tiers"]["small"]["requests"] == 11
    assert window(hour, 122, top)["tiers"]["small"]["requests"] == 24  # younger than an hour
    assert window(minute, 62, top)["tiers"]["large"]["requests"] == 1
    assert window(hour, 122, top)["tiers"]["small"]["cost_usd"] == pytest.approx(24 * 12e-6)


def test_ring_keeps_an_hour_and_the_start() -> None:
    clock = Clock()
    value = {"n": 0.0}
    history = StatsHistory(lambda: {"x_total": {(): value["n"]}}, interval_s=60, clock=clock)
    for _ in range(200):  # more snapshots than an hour holds
        clock.now += 60
        value["n"] += 1
        history.take()
    clock.now += 30
    now = history.now()
    assert difference(now.samples, history.baseline(None, now.at).samples)["x_total"][()] == 200
    hour = difference(now.samples, history.baseline(3600, now.at).samples)
    assert hour["x_total"][()] == 60
    points = history.points(600, now)
    assert [p.at for p in points][-1] == now.at and len(points) == 12  # 10, one before, now


def test_a_counter_that_went_down_was_reset() -> None:
    new = {"a": {(): 3.0}, "b": {(("k", "v"),): 9.0}, "c": {(): 1.0}}
    old = {"a": {(): 5.0}, "b": {(("k", "v"),): 4.0}}
    assert difference(new, old) == {"a": {(): 3.0}, "b": {(("k", "v"),): 5.0}, "c": {(): 1.0}}


def test_quantile_interpolates_like_prometheus() -> None:
    buckets = {0.1: 2.0, 0.5: 4.0, float("inf"): 4.0}
    assert quantile(buckets, 0.5) == pytest.approx(0.1)
    assert quantile(buckets, 0.99) == pytest.approx(0.1 + 0.4 * 1.96 / 2)
    assert quantile({0.1: 0.0, 1.0: 1.0, float("inf"): 2.0}, 0.99) == 1.0  # beyond the top
    assert quantile({0.1: 0.0, float("inf"): 0.0}, 0.5) is None


def test_cooldowns_are_counted_by_model() -> None:
    stats = Stats()
    cooldowns = CountedCooldowns(stats)
    cooldowns.trip("openai/gpt-4o@https://user@host/v1", 30)
    cooldowns.trip("smollm2-135m@local", 30)
    cooldowns.trip("smollm2-135m@local", 0)  # no cooldown configured: not a trip
    assert cooldowns.cooling("smollm2-135m@local")
    counts = stats.snapshot()["tiergate_cooldowns"]
    assert counts == {"model=openai/gpt-4o": 1.0, "model=smollm2-135m": 1.0}


POLICY = """
auth: {mode: none}
tiers:
  local: {deployments: [{model: smollm2-135m}]}
  mini: {deployments: [{model: openai/gpt-4o-mini, api_base: "http://127.0.0.1:1/v1"}]}
  own: {deployments: [{model: hosted_vllm/mine, api_base: "http://127.0.0.1:1/v1"}]}
  priced:
    deployments: [{model: openai/gpt-4o, api_base: "http://127.0.0.1:1/v1"}]
    price: {input: 0, output: 0}
routes: {auto: {default: local}}
"""


def test_prices_come_from_the_policy_or_litellms_map() -> None:
    policy = parse_policy(POLICY, env={})
    mini = litellm_price("openai/gpt-4o-mini")
    assert mini is not None and mini.input > 0 and mini.output > mini.input
    assert litellm_price("gpt-4o-mini") == mini
    assert litellm_price("hosted_vllm/mine") is None
    prices = policy_prices(policy)
    assert prices["mini", "openai/gpt-4o-mini"] == mini  # remote, no price: the map's
    assert prices["own", "hosted_vllm/mine"] == Price()  # not in the map: free
    assert prices["local", "smollm2-135m"] == Price()  # local: the policy's only
    tier = policy.tiers["priced"]
    assert deployment_price(policy, tier, tier.deployments[0]) == Price()  # set explicitly
    assert most_expensive(prices) == ("mini", mini)
