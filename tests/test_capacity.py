"""bench/capacity.py's arithmetic on small fixture results (not the real measurements)."""

import json
from pathlib import Path

import pytest

from bench import capacity

MACHINE = {"cpu_model": "Fixture CPU", "time": "2026-01-01T00:00:00+0000"}


def phase(gw_cpu: float, redis_cpu: float, commands: float, net_in: float, memory: float):
    return {
        "gateway_cpu_ms_per_request": gw_cpu,
        "redis_cpu_ms_per_request": redis_cpu,
        "redis_commands_per_request": commands,
        "redis_net_in_bytes_per_request": net_in,
        "redis_net_out_bytes_per_request": 100.0,
        "redis_memory_bytes_per_request": memory,
    }


FIXTURE = {
    "gateway_overhead": {"throughput_c16": {"tiergate": {"cpu_ms_per_request": 2.0}}},
    "redis_usage": {
        "miss": phase(10.0, 0.2, 8.0, 900.0, 6000.0),
        "hit": phase(1.0, 0.05, 4.0, 200.0, 1000.0),  # exact: unused (semantic_hit is)
        "semantic_hit": phase(4.0, 0.1, 5.0, 300.0, 1000.0),
        "cache_memory": {"entries": 100, "bytes_per_entry": 5000.0, "events_stream_bytes": 9},
    },
    "throughput": {"workload": {"threads": 2}, "ours": {"tokens_per_s": 400.0}},
    "cache_lookup": {
        "cpu_model": "Fixture CPU",
        "sizes": {"10000": {"rss_bytes_per_entry": 9000}, "30000": {"rss_bytes_per_entry": 3000}},
    },
}
LOAD = capacity.Load(
    requests_per_s=1000,
    hit_rate=0.4,
    output_tokens=100,
    model="smollm2-135m",
    gateway_cores=4,
    engine_cores=8,
    utilisation=0.5,
    cache_entries=1000,
)


@pytest.fixture
def results(tmp_path: Path) -> Path:
    for name, body in FIXTURE.items():
        (tmp_path / f"{name}.json").write_text(json.dumps({"machine": MACHINE, **body}))
    return tmp_path


def test_figures_are_read_from_each_benchmark(results: Path) -> None:
    fig = capacity.load_figures(results)
    assert fig.gateway_cpu_ms_cache_off == 2.0
    assert (fig.gateway_cpu_ms_miss, fig.gateway_cpu_ms_hit) == (10.0, 4.0)
    assert fig.redis_net_bytes == {"miss": 1000.0, "hit": 400.0}  # a hit: the semantic one
    assert fig.redis_bytes_per_entry == 5000
    assert fig.engine_tokens_per_s_per_core == {"smollm2-135m": 200.0}  # 400 tokens/s, 2 threads
    assert fig.index_bytes_per_entry == 3000  # the largest size measured, not the first
    assert "Fixture CPU" in fig.sources["cache_lookup"]


def test_engine_figure_prefers_tokens_per_cpu_second(results: Path) -> None:
    body = {"machine": MACHINE, **FIXTURE["throughput"]}
    body["ours"] = {"tokens_per_s": 400.0, "tokens_per_cpu_s": 250.0}
    (results / "throughput.json").write_text(json.dumps(body))
    assert capacity.load_figures(results).engine_tokens_per_s_per_core == {"smollm2-135m": 250.0}


def test_replicas_for_a_load(results: Path) -> None:
    rows = {r.component: r for r in capacity.plan(capacity.load_figures(results), LOAD)}
    gateway = rows["gateway, cache on"]
    # 0.4 * 4 ms + 0.6 * 10 ms = 7.6 CPU ms; 4 cores serve 4000 / 7.6 = 526.3 requests/s
    assert gateway.replica_rps == pytest.approx(526.3, abs=0.1)
    assert (gateway.replicas, gateway.cores) == (4, 16)  # 1000 / (526.3 * 0.5) = 3.8
    assert gateway.memory_bytes == 1000 * 3000
    off = rows["gateway, cache off"]
    assert off.replica_rps == 2000 and off.replicas == 1
    engine = rows["engine (smollm2-135m)"]
    # misses only: 0.6 * 100 = 60 tokens per request; 8 cores * 200 = 1600 tokens/s
    assert engine.replica_rps == pytest.approx(1600 / 60)
    assert (engine.replicas, engine.cores) == (75, 600)
    assert capacity.per_core_rps(engine) == pytest.approx(1600 / 60 / 8)
    redis = rows["redis (instances/shards)"]
    assert redis.replica_rps == pytest.approx(1000 / 0.16)  # 0.4 * 0.1 + 0.6 * 0.2 ms
    assert redis.replicas == 1
    assert redis.memory_bytes == 1000 * 5000
    assert "6.8 commands" in redis.per_request and "760 bytes" in redis.per_request


def test_the_engine_saturates_first_unless_every_request_hits(results: Path) -> None:
    fig = capacity.load_figures(results)
    assert capacity.saturates_first(capacity.plan(fig, LOAD)) == "engine (smollm2-135m)"
    all_hits = capacity.Load(**{**LOAD.__dict__, "hit_rate": 1.0})
    rows = capacity.plan(fig, all_hits)
    assert (
        capacity.saturates_first(rows) == "gateway, cache on"
    )  # engines idle: nothing to generate


def test_markdown_table_and_json_from_the_command(results: Path, capsys) -> None:
    assert capacity.main(["--results", str(results), "--rps", "1000", "--markdown"]) == 0
    table = capsys.readouterr().out
    assert "| component | per request |" in table and "Saturates first: engine" in table
    assert "One Redis serves 6,250 requests/s" in table
    assert capacity.main(["--results", str(results)]) == 0
    written = json.loads((results / "capacity.json").read_text())
    assert written["saturates_first"].startswith("engine")
    assert written["load"]["requests_per_s"] == 1000


def test_a_missing_result_names_the_benchmark_to_run(results: Path) -> None:
    (results / "redis_usage.json").unlink()
    with pytest.raises(SystemExit, match=r"python -m bench\.redis_usage"):
        capacity.load_figures(results)


def test_an_unmeasured_model_is_refused(results: Path) -> None:
    other = capacity.Load(model="qwen2.5-coder-0.5b")
    with pytest.raises(SystemExit, match=r"no engine throughput measured for qwen2\.5-coder-0\.5b"):
        capacity.plan(capacity.load_figures(results), other)


def test_the_deploy_readme_table_is_the_output_for_its_snapshot(capsys) -> None:
    """deploy/README.md's table comes from the results kept beside it, unedited."""
    root = Path(__file__).resolve().parent.parent
    snapshot = root / "deploy" / "capacity-results"
    assert capacity.main(["--results", str(snapshot), "--markdown"]) == 0
    table = capsys.readouterr().out
    assert table.strip() in (root / "deploy" / "README.md").read_text()
    assert not (snapshot / "capacity.json").exists()  # --markdown writes nothing
