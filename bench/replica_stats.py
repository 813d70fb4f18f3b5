"""What sharing stats between gateway replicas costs: one sync round, and /admin/stats.

The synthetic registry of `admin_stats.py` (an hour of snapshots, 5 s apart) stands for
each replica. Measured in one run, each against its baseline:
- one stats write (every 5 s, on the event loop): this replica's three windows read and
  encoded (`replica_report` + JSON), and the round trips to a real redis-server (stats
  written, the shared policy's head read, which alone is every second); payload bytes;
- one GET /admin/stats with 3 other replicas (their reports decoded and summed, each
  one's headline row) vs the same view alone (no replicas), warm.

    python -m bench.replica_stats [--quick]
"""

import argparse
import asyncio
import sys
import time

from bench import common
from bench.admin_stats import PRICE, traffic
from bench.common import cpu_model
from gateway.replicas import Fleet, FleetStats, ReplicaReport
from gateway.replicas.sync import STATS_EVERY_S
from gateway.stats.counters import Stats, read_samples
from gateway.stats.history import StatsHistory
from gateway.stats.view import replica_report, stats_view
from tests.servers import run_redis

ROUNDS = 30


def replica(tenants: int, snapshots: int) -> StatsHistory:
    stats, clock = Stats(), [1_000_000.0]
    for step in range(4):
        traffic(stats, step, tenants)
    history = StatsHistory(lambda: read_samples(stats.registry), clock=lambda: clock[0])
    for step in range(snapshots):
        clock[0] += 5.0
        traffic(stats, step, tenants)
        history.take()
    clock[0] += 2.0
    return history


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


async def redis_round_s(redis_url: str, report: ReplicaReport) -> float:
    fleet = Fleet(redis_url, "bench:replicas")
    times = []
    for _ in range(ROUNDS):
        start = time.perf_counter()
        await fleet.publish_stats(report)
        await fleet.policy_head()
        times.append(time.perf_counter() - start)
    await fleet.close()
    return common.median(times)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="20 tenants and 10 minutes of snapshots")
    args = p.parse_args()
    tenants, snapshots = (20, 121) if args.quick else (60, 721)
    history = replica(tenants, snapshots)
    others = [
        ReplicaReport.from_json(replica_report(history, f"other-{i}").to_json()) for i in range(3)
    ]
    prices = {("premium", "premium-model"): PRICE}
    top = ("premium", PRICE)
    report = replica_report(history, "me")
    payload = len(report.to_json())
    encode = [timed(lambda: replica_report(history, "me").to_json()) for _ in range(ROUNDS)]
    alone, fleet = [], []
    fleet_stats = FleetStats("me", True, None, others)
    stats_view(history, prices, top, {})  # memoize the chart intervals, as a live gateway has
    for _ in range(ROUNDS // 3):
        alone.append(timed(lambda: stats_view(history, prices, top, {})))
        fleet.append(timed(lambda: stats_view(history, prices, top, {}, fleet_stats)))
    with run_redis() as redis_url:
        round_trip = asyncio.run(redis_round_s(redis_url, report))

    result = {
        "cpu_model": cpu_model(),
        "tenants": tenants,
        "sync_round": {
            "encode_median_s": round(common.median(encode), 5),
            "encode_share_of_a_core": round(common.median(encode) / STATS_EVERY_S, 4),
            "redis_round_trip_median_s": round(round_trip, 5),
            "payload_bytes": payload,
            "redis_commands": 4,  # SET + ZADD (one pipeline), HMGET; HGET only on a change
        },
        "admin_stats_s": {
            "fleet_of_4_median": round(common.median(fleet), 4),
            "baseline_alone_median": round(common.median(alone), 4),
            "ratio": common.ratio(common.median(fleet), common.median(alone)),
        },
    }
    print(result)
    common.write_result("replica_stats", result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
