"""How far concurrent requests overspend a budget: reserve-then-settle against
check-then-charge, both through the gateway's `Limiter`, in process and in a real Redis.

Synthetic requests (a unit-level figure, not a traffic result): 64 workers each send
requests with a random prompt (5-50 tokens) and answer (1-16 of a 16-token budget) at $1
a token, holding each for 0-20 ms, until the budget refuses them. Ours reserves the most
a request can cost (its prompt bound and completion budget) and settles the real cost;
the baseline reserves nothing (a request is let in while spent < limit and charged when it
ends), which is what a counter updated after each call does. Same run, same workload.

    python -m bench.budget_overspend [--quick]
"""

import argparse
import asyncio
import random
import uuid

from bench import common
from engine.entrypoints.openai.errors import OpenAIError
from gateway.limits import Limiter
from gateway.policy import parse_policy
from tests.servers import run_redis

LIMIT_USD = 500.0
WORKERS = 64
MOST_PROMPT, COMPLETION_BUDGET = 50, 16
MOST_COST = float(MOST_PROMPT + COMPLETION_BUDGET)  # one request at most, USD


def policy(redis_url: str | None):
    limits = f"limits: {{redis_url: '{redis_url}', default: {{max_concurrent: null}}}}\n"
    return parse_policy(
        f"""
auth: {{keys: [{{key: sk-bench-budget, tenant: bench}}]}}
{limits if redis_url else "limits: {default: {max_concurrent: null}}"}
budgets: {{default: {{usd_per_day: {LIMIT_USD}}}}}
engines: {{fake: {{}}}}
tiers: {{small: {{deployments: [{{model: fake}}], price: {{input: 1000000, output: 1000000}}}}}}
""",
        env={},
    )


async def spend_until_refused(redis_url: str | None, reserve: bool, seed: int) -> dict:
    limiter, pol, rng = Limiter(), policy(redis_url), random.Random(seed)
    tenant = f"bench-{uuid.uuid4().hex[:8]}"  # a budget of its own in a shared Redis
    spent, answered, refused = 0.0, 0, 0

    async def worker() -> None:
        nonlocal spent, answered, refused
        while True:
            prompt, answer = rng.randint(5, MOST_PROMPT), rng.randint(1, COMPLETION_BUDGET)
            most = (prompt, COMPLETION_BUDGET, prompt) if reserve else (0, 0, 0)
            try:
                admission = await limiter.admit(pol, tenant, None, *most)
            except OpenAIError as exc:
                assert exc.code == "budget_exceeded", exc
                refused += 1
                return
            await asyncio.sleep(rng.uniform(0, 0.02))
            cost = float(prompt + answer)
            await admission.finish(prompt + answer, cost)
            spent += cost
            answered += 1

    await asyncio.gather(*(worker() for _ in range(WORKERS)))
    await limiter.close()
    over = max(0.0, spent - LIMIT_USD)
    return {
        "spent_usd": spent,
        "answered": answered,
        "overspend_usd": over,
        "overspend_in_request_costs": round(over / MOST_COST, 3),
    }


def run(redis_url: str | None, rounds: int) -> dict:
    out = {}
    for name, reserve in (("reserve_then_settle", True), ("check_then_charge", False)):
        runs = [asyncio.run(spend_until_refused(redis_url, reserve, s)) for s in range(rounds)]
        out[name] = {"runs": runs, "worst_overspend_usd": max(r["overspend_usd"] for r in runs)}
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="fewer rounds")
    rounds = 2 if p.parse_args().quick else 5
    in_process = run(None, rounds)
    with run_redis() as url:
        in_redis = run(url, rounds)
    worst = max(r["reserve_then_settle"]["worst_overspend_usd"] for r in (in_process, in_redis))
    base = min(r["check_then_charge"]["worst_overspend_usd"] for r in (in_process, in_redis))
    result = {
        "cpu_model": common.cpu_model(),
        "limit_usd": LIMIT_USD,
        "workers": WORKERS,
        "most_request_cost_usd": MOST_COST,
        "in_process": in_process,
        "redis": in_redis,
        # the same run's baseline: what check-then-charge overspent, in request costs
        "baseline_overspend_in_request_costs": round(base / MOST_COST, 3),
        "goals": {
            # the goal: overspend at most one request's cost (synthetic requests)
            "overspend_in_request_costs": common.goal(
                round(worst / MOST_COST, 3), 1.0, higher_is_better=False
            ),
        },
    }
    for key in ("in_process", "redis"):
        for name, r in result[key].items():
            print(f"{key} {name}: worst overspend ${r['worst_overspend_usd']:.0f}")
    print(f"baseline: {result['baseline_overspend_in_request_costs']} request costs")
    print(f"goals: {result['goals']}")
    common.write_result("budget_overspend", result)


if __name__ == "__main__":
    main()
