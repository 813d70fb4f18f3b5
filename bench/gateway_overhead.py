"""What a gateway adds in front of a backend: ours vs LiteLLM's proxy, over one stub backend.

The targets get the same chat requests in the same run: the stub backend directly, our
gateway (cache off, one tier pointing at the stub through litellm `openai/<name>`), our
gateway with the semantic cache on, and LiteLLM's proxy (`litellm --config`, one worker,
master key, no cache) over the same stub. The cached gateway gets a new question every
request, so each one pays the whole cache path and still goes to the stub: embed, exact
and semantic lookup, store (and the verifier whenever a neighbour is close enough).
`--torch-embedder` adds the same cached gateway with its embedder on torch instead of
ONNX Runtime (the reference the embedder's speed-up is read against).
`--verifier-model logistic nli` adds, per model, a cached gateway with that
`cache.verifier_model` (nli as docs/cache.md recommends it: balanced at the 0.4 floor, one
model read a lookup) fed questions people reworded: each train pair's stored question is
sent first (not measured), then the measured requests ask the rewordings and the must-not
edits of the pairs (training/data/cache_pairs_real, train split, people's and rule-made), so
most requests have a close neighbour for the verifier to read; some are hits (no backend
call), the rest pay the verifier and the backend.
Figures: added latency p50/p99 at concurrency 1 (stream and not), requests/s at
concurrency 16, and CPU seconds per request of each gateway's server process tree.
Goals: our added p50 and CPU/request <= 1/3 of LiteLLM's, our requests/s >= 3x, and our
CPU/request with the cache on (all misses) <= LiteLLM's without a cache.
All traffic stays on 127.0.0.1; every loop is bounded by a count or a deadline.
"""

import argparse
import asyncio
import contextlib
import itertools
import sys
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Any

from bench import common
from bench.cache_eval import NLI_RECOMMENDED
from bench.gateway_load import (
    KEY,
    Target,
    latencies_interleaved,
    reworded_pairs,
    store_first,
    throughput,
    unique_questions,
)
from bench.servers import wait_ready
from tests.servers import free_port, session_process, tiergate_serve

GOALS = {
    "added_p50_share": 1 / 3,
    "cpu_per_request_share": 1 / 3,
    "rps_ratio": 3.0,
    "cache_cpu_per_request_share": 1.0,
}


# ---------------------------------------------------------------- configs


def tiergate_policy(
    stub_port: int, port: int, cache: str = "{enabled: false}", embedder: str = "auto"
) -> str:
    return f"""
server: {{host: 127.0.0.1, port: {port}, reload_interval_s: 0}}
auth:
  keys:
    - {{key: {KEY}, tenant: bench}}
cache: {cache}
embedder: {{backend: {embedder}}}
tiers:
  stub:
    deployments:
      - model: openai/stub-model
        api_base: http://127.0.0.1:{stub_port}/v1
        api_key_env: STUB_API_KEY
    retries: 0
routes:
  auto:
    default: stub
"""


def litellm_config(stub_port: int) -> str:
    return f"""
model_list:
  - model_name: stub
    litellm_params:
      model: openai/stub-model
      api_base: http://127.0.0.1:{stub_port}/v1
      api_key: sk-stub
general_settings:
  master_key: {KEY}
"""


# ---------------------------------------------------------------- report


def latency_summary(samples: dict[str, list[float]]) -> dict[str, dict[str, float]]:
    direct = samples["direct"]
    d50, d99 = common.percentile(direct, 50), common.percentile(direct, 99)
    out = {}
    for name, values in samples.items():
        p50, p99 = common.percentile(values, 50), common.percentile(values, 99)
        out[name] = {
            "p50_ms": round(p50 * 1000, 3),
            "p99_ms": round(p99 * 1000, 3),
            "added_p50_ms": round((p50 - d50) * 1000, 3),
            "added_p99_ms": round((p99 - d99) * 1000, 3),
        }
    return out


def share(ours: float | None, theirs: float | None) -> float | None:
    if ours is None or not theirs:
        return None
    return round(max(ours, 0.0) / theirs, 3)


def goals(lat: dict[str, Any], tput: dict[str, Any]) -> dict[str, Any]:
    ours, lite = lat["tiergate"], lat.get("litellm")
    if lite is None:
        return {"skipped": "LiteLLM proxy not measured"}
    cpu_o, cpu_l = tput["tiergate"]["cpu_ms_per_request"], tput["litellm"]["cpu_ms_per_request"]
    cpu_cache = tput["tiergate-cache"]["cpu_ms_per_request"]
    rps = tput["tiergate"]["requests_per_s"] / tput["litellm"]["requests_per_s"]
    torch_embedder = tput.get("tiergate-cache-torch", {}).get("cpu_ms_per_request")
    reference = {"cache_torch_embedder_cpu_share": share(torch_embedder, cpu_l)}  # no goal
    reworded = {
        f"cache_cpu_per_request_share_{name.removeprefix('tiergate-cache-')}_reworded": (
            common.goal(
                share(row["cpu_ms_per_request"], cpu_l), GOALS["cache_cpu_per_request_share"], False
            )
        )
        for name, row in tput.items()
        if name.startswith("tiergate-cache-") and name != "tiergate-cache-torch"
    }
    return {
        **(reference if torch_embedder else {}),
        **reworded,
        "cache_cpu_per_request_share": common.goal(
            share(cpu_cache, cpu_l), GOALS["cache_cpu_per_request_share"], False
        ),
        "added_p50_share": common.goal(
            share(ours["added_p50_ms"], lite["added_p50_ms"]), GOALS["added_p50_share"], False
        ),
        "cpu_per_request_share": common.goal(
            share(cpu_o, cpu_l), GOALS["cpu_per_request_share"], False
        ),
        "rps_ratio": common.goal(round(rps, 3), GOALS["rps_ratio"]),
    }


# ---------------------------------------------------------------- main


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--quick", action="store_true", help="fewer requests")
    p.add_argument("--skip-litellm", action="store_true", help="no LiteLLM proxy baseline")
    p.add_argument("--no-install", action="store_true", help="skip LiteLLM if not installed")
    p.add_argument(
        "--verifier-model",
        nargs="*",
        default=[],
        help="also a cached gateway per verifier model, asked rewordings of stored questions",
    )
    p.add_argument(
        "--torch-embedder",
        action="store_true",
        help="also the cached gateway with its embedder on torch (tiergate-cache-torch)",
    )
    return p.parse_args()


def litellm_cmd(venv: common.Venv, config: Path, port: int) -> list[str]:
    exe = str(Path(str(venv.python)).with_name("litellm"))
    listen = ["--host", "127.0.0.1", "--port", str(port)]
    return [exe, "--config", str(config), *listen, "--num_workers", "1"]


async def measure(targets: list[Target], n_latency: int, n_tput: int) -> dict[str, Any]:
    lat = {s: await latencies_interleaved(targets, n_latency, s) for s in (False, True)}
    tput = {t.name: await throughput(t, n_tput, 16) for t in targets}
    return {
        "latency_c1": latency_summary(lat[False]),
        "latency_c1_stream": latency_summary(lat[True]),
        "throughput_c16": tput,
    }


def start_cached(
    stack: contextlib.ExitStack,
    work: Path,
    stub_port: int,
    env: dict[str, str],
    name: str,
    settings: str = "",
    embedder: str = "auto",
) -> Target:
    """Our gateway with the cache on (embedded store, plus `settings`: more cache keys)."""
    port = free_port()
    policy = work / f"policy-{name}.yaml"
    store = f"{{enabled: true, path: {work / f'{name}.sqlite3'}{settings}}}"
    policy.write_text(tiergate_policy(stub_port, port, store, embedder))
    log = work / f"{name}.log"
    pid = stack.enter_context(session_process(tiergate_serve(policy, port), log, env))
    return Target(name, f"http://127.0.0.1:{port}/v1", "auto", pid, unique_questions())


def start_reworded(
    stack: contextlib.ExitStack,
    work: Path,
    stub_port: int,
    env: dict[str, str],
    model: str,
    asked: list[str],
) -> Target:
    """A cached gateway with `cache.verifier_model: model` (nli as docs/cache.md
    recommends it: balanced, floor 0.4, one model read), asked `asked` in turn (the
    questions they reword are stored by `run` once the gateway is up)."""
    settings = NLI_RECOMMENDED if model == "nli" else {"verifier_model": model}
    extra = "".join(f", {key}: {value}" for key, value in settings.items())
    target = start_cached(stack, work, stub_port, env, f"tiergate-cache-{model}", extra)
    return replace(target, questions=itertools.cycle(asked))


def run(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    n_latency, n_tput = (60, 240) if args.quick else (300, 1200)
    venv = lite_venv(args)
    stub_port, tg_port, lite_port = free_port(), free_port(), free_port()
    policy, config = work / "policy.yaml", work / "litellm.yaml"
    policy.write_text(tiergate_policy(stub_port, tg_port))
    config.write_text(litellm_config(stub_port))
    env = {"STUB_API_KEY": "sk-stub", "LITELLM_LOCAL_MODEL_COST_MAP": "True"}
    stub_cmd = [sys.executable, "-m", "bench.stub_backend", "--port", str(stub_port)]
    startup: dict[str, float] = {}
    with contextlib.ExitStack() as stack:
        stack.enter_context(session_process(stub_cmd, work / "stub.log"))
        tg_pid = stack.enter_context(
            session_process(tiergate_serve(policy, tg_port), work / "tg.log", env)
        )
        targets = [
            Target("direct", f"http://127.0.0.1:{stub_port}/v1", "stub-model", None),
            Target("tiergate", f"http://127.0.0.1:{tg_port}/v1", "auto", tg_pid),
            start_cached(stack, work, stub_port, env, "tiergate-cache"),
        ]
        if args.torch_embedder:  # the same cache path on the reference embedder
            torch = start_cached(stack, work, stub_port, env, "tiergate-cache-torch", "", "torch")
            targets.append(torch)
        stored, asked = reworded_pairs() if args.verifier_model else ([], [])
        reworded = [
            start_reworded(stack, work, stub_port, env, m, asked) for m in args.verifier_model
        ]
        targets.extend(reworded)
        lite_cmd = litellm_cmd(venv, config, lite_port) if venv.python else None
        if lite_cmd:
            lite_pid = stack.enter_context(session_process(lite_cmd, work / "litellm.log", env))
            targets.append(Target("litellm", f"http://127.0.0.1:{lite_port}/v1", "stub", lite_pid))
        auth = {"Authorization": f"Bearer {KEY}"}
        lite_status: dict[str, Any] = venv.versions or {"skipped": venv.skipped}
        for t in list(targets):
            try:
                startup[t.name] = round(asyncio.run(wait_ready(f"{t.url}/models", 180, auth)), 1)
            except TimeoutError as exc:
                if t.name != "litellm":
                    raise  # our side must start; the baseline may be skipped with a reason
                targets.remove(t)
                lite_status = {"skipped": f"proxy did not start: {exc}"}
        for t in reworded:
            asyncio.run(store_first(t, stored))
        figures = asyncio.run(measure(targets, n_latency, n_tput))
    return {
        "requests": {"latency_c1_each": n_latency, "throughput_c16": n_tput},
        "startup_s": startup,
        "litellm_proxy": lite_status,
        **figures,
        "goals": goals(figures["latency_c1"], figures["throughput_c16"]),
    }


def lite_venv(args: argparse.Namespace) -> common.Venv:
    if args.skip_litellm:
        return common.skipped_venv("litellm-proxy", "skipped by flag")
    marker = common.VENVS_DIR / "litellm-proxy" / ".tiergate-installed.json"
    if args.no_install and not marker.is_file():
        return common.skipped_venv("litellm-proxy", "not installed and --no-install given")
    return common.ensure_venv("litellm-proxy")


def main() -> None:
    args = parse_args()
    with tempfile.TemporaryDirectory(prefix="gw-bench-") as tmp:
        try:
            result = run(args, Path(tmp))
        except Exception:
            for log in sorted(Path(tmp).glob("*.log")):  # the servers' own words, for the reader
                print(f"--- {log.name}\n{log.read_text()[-3000:]}", file=sys.stderr)
            raise
    for kind in ("latency_c1", "latency_c1_stream"):
        for name, row in result[kind].items():
            print(f"{kind:18} {name:9} {row}")
    for name, row in result["throughput_c16"].items():
        print(f"throughput_c16     {name:9} {row}")
    print(f"goals: {result['goals']}")
    common.write_result("gateway_overhead", result)


if __name__ == "__main__":
    main()
