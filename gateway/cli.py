"""The `tiergate` command: serve | engine | check-policy | hash-key | stats | calibrate* | train |
router learn.

Heavy imports (uvicorn, the app, the engine and torch) happen inside each subcommand, so
`tiergate check-policy` answers in well under a second.
"""

import argparse
import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from pydantic import ValidationError

from engine.config import KV_DTYPES, WEIGHT_FORMATS
from engine.entrypoints.body_limit import DEFAULT_MAX_BODY_BYTES
from engine.omp_env import set_omp_defaults
from gateway.policy import EngineSettings, PolicyError, ServerSettings, key_digest, load_policy


def _print_policy_error(error: PolicyError) -> None:
    # FILE:LINE: like a compiler, so editors and terminals can jump to it.
    for issue in error.issues:
        where = f"{error.source}:{issue.line}" if issue.line else error.source
        print(f"{where}: {issue}", file=sys.stderr)


def check_policy(args: argparse.Namespace) -> int:
    try:
        policy = load_policy(args.file)
    except PolicyError as exc:
        _print_policy_error(exc)
        print(f"{len(exc.issues)} error(s) in {args.file}", file=sys.stderr)
        return 1
    print(
        f"{args.file}: ok ({len(policy.tiers)} tiers, {len(policy.routes)} routes, "
        f"{len(policy.local_engines())} local engines)"
    )
    return 0


def calibrate(args: argparse.Namespace) -> int:
    from gateway.embedding.embedder import Embedder
    from gateway.routing import calibrate as cal

    try:
        policy = load_policy(args.policy)
        route = args.route or next(iter(policy.routes), None)
        if route not in policy.routes:
            raise ValueError(f"no route {route!r} in {args.policy}")
        tier = args.tier or next((r.tier for r in policy.routes[route].rules if r.min_score), None)
        index = cal.score_rule_index(policy, route, tier)
        prompts = cal.read_prompts(Path(args.prompts))
        embedder = Embedder(policy.embedder.model, backend=policy.embedder.backend)
        scores = cal.score_prompts(policy, prompts, embedder.embed_many)
    except PolicyError as exc:
        _print_policy_error(exc)
        return 1
    except (ValueError, OSError, KeyError) as exc:
        print(f"tiergate calibrate: {exc}", file=sys.stderr)
        return 1
    result = cal.threshold_for_share(scores, args.large_share)
    print(
        f"routes.{route}.rules[{index}].min_score: {result.threshold} sends "
        f"{result.share:.1%} of {result.prompts} prompts to {tier} (asked {args.large_share:.1%})"
    )
    if args.write:
        cal.write_threshold(Path(args.policy), route, index, result.threshold)
        print(f"written to {args.policy}")
    return 0


def serve(args: argparse.Namespace) -> int:
    try:
        policy = load_policy(args.policy)
    except PolicyError as exc:  # refuse to start on an invalid file
        _print_policy_error(exc)
        return 1
    from engine.model_registry import ModelNotFoundError, resolve_model

    # Resolve local models first: a missing one is a one-line error, not a lifespan traceback.
    try:
        for name, settings in policy.local_engines().items():
            resolve_model(settings.model or name)
    except ModelNotFoundError as exc:
        print(f"tiergate: {exc}", file=sys.stderr)
        return 1
    from engine.entrypoints.shutdown import serve_gracefully
    from gateway.app import create_app

    app = create_app(policy, policy_path=args.policy)
    host = args.host or policy.server.host
    port = args.port or policy.server.port
    if policy.auth.mode == "none" and host not in ("127.0.0.1", "localhost", "::1"):
        logging.getLogger("tiergate").warning(
            "auth mode none on %s: anyone who reaches this port can use every tier", host
        )
    grace_s = policy.server.shutdown_grace_s  # read at start: a reload does not move it

    def abort_the_rest() -> None:
        app.state.drain.expire()

    serve_gracefully(app, host, port, grace_s, abort_the_rest, log_level=args.log_level)
    return 0


def engine(args: argparse.Namespace) -> int:
    from engine.model_registry import ModelNotFoundError

    try:  # the policy's engine schema checks the flags too (e.g. a negative KV budget)
        settings = EngineSettings(
            kv_cache_mb=args.kv_cache_mb,
            page_size=args.page_size,
            max_num_seqs=args.max_num_seqs,
            max_num_batched_tokens=args.max_num_batched_tokens,
            max_waiting=args.max_waiting,
            max_waiting_per_tenant=args.max_waiting_per_tenant,
            max_model_len=args.max_model_len,
            enable_prefix_caching=not args.no_prefix_caching,
            kv_watermark=args.kv_watermark,
            kv_reserve_tokens=args.kv_reserve_tokens,
            num_threads=args.threads,
            weights=args.weights,
            kv_dtype=args.kv_dtype,
        )
    except ValidationError as exc:
        print(f"tiergate engine: {_flag_errors(exc)}", file=sys.stderr)
        return 2
    config = settings.to_config(args.model)
    try:
        from engine.entrypoints.server import run_engine_server

        run_engine_server(
            config,
            args.host,
            args.port,
            args.served_name,
            args.shutdown_grace_s,
            args.api_key or None,
            args.max_body_bytes,
        )
    except ModelNotFoundError as exc:
        print(f"tiergate: {exc}", file=sys.stderr)
        return 1
    return 0


def hash_key(args: argparse.Namespace) -> int:
    """Print the SHA-256 a policy stores as `key_sha256` instead of the key itself."""
    key = args.key if args.key is not None else sys.stdin.read().removesuffix("\n")
    key = key.removesuffix("\r")
    if not key.strip():
        print("tiergate: hash-key needs a non-empty key (argument or stdin)", file=sys.stderr)
        return 1
    print(key_digest(key.encode()))
    return 0


def stats(args: argparse.Namespace) -> int:
    import httpx

    from gateway.stats.table import render

    logging.getLogger("httpx").setLevel(logging.WARNING)  # its request lines are noise here
    headers = {"Authorization": f"Bearer {args.key}"} if args.key else {}
    try:
        response = httpx.get(f"{args.url.rstrip('/')}/admin/stats", headers=headers, timeout=30)
    except httpx.HTTPError as exc:
        print(f"tiergate: cannot reach {args.url}: {exc}", file=sys.stderr)
        return 1
    if response.status_code != 200:
        try:
            message = response.json()["error"]["message"]
        except (ValueError, KeyError, TypeError):  # not the gateway's error body
            message = response.text[:200]
        print(f"tiergate: {response.status_code}: {message}", file=sys.stderr)
        return 1
    print(render(response.json(), args.window))
    return 0


def _flag_errors(exc: ValidationError) -> str:
    flag = {"num_threads": "threads", "enable_prefix_caching": "no-prefix-caching"}
    names = (str(e["loc"][0]) for e in exc.errors())
    return "; ".join(
        f"--{flag.get(n, n.replace('_', '-'))}: {str(e['msg']).removeprefix('Value error, ')}"
        for n, e in zip(names, exc.errors(), strict=True)
    )


def _threads(value: str) -> int | None:
    """--threads: "auto" (None: measured at start) or a thread count."""
    if value == "auto":
        return None
    try:
        return int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected auto or a number, not {value!r}") from None


def _add_engine_tuning(p: argparse.ArgumentParser) -> None:
    # Defaults come from EngineSettings, which reads them from EngineConfig.
    defaults = EngineSettings()
    p.add_argument("--page-size", type=int, default=defaults.page_size, help="tokens per KV page")
    p.add_argument("--max-num-seqs", type=int, default=defaults.max_num_seqs)
    p.add_argument(
        "--max-num-batched-tokens",
        type=int,
        default=defaults.max_num_batched_tokens,
        help="token budget per step (prefill chunks + decodes)",
    )
    p.add_argument(
        "--max-waiting",
        type=int,
        default=defaults.max_waiting,
        help="queued requests beyond this are refused with 429",
    )
    p.add_argument(
        "--max-waiting-per-tenant",
        type=int,
        default=defaults.max_waiting_per_tenant,
        help="queued requests per cache_salt (tenant) beyond this get 429 (default: no cap)",
    )
    p.add_argument("--max-model-len", type=int, default=None, help="default: the model's")
    p.add_argument("--no-prefix-caching", action="store_true", help="never share KV pages")
    p.add_argument(
        "--kv-watermark",
        type=float,
        default=defaults.kv_watermark,
        help="share of KV pages an admission leaves free, beyond --kv-reserve-tokens "
        "(default %(default)s)",
    )
    p.add_argument(
        "--kv-reserve-tokens",
        type=int,
        default=defaults.kv_reserve_tokens,
        help="admit a request only if every running one can still grow this many tokens "
        "(default %(default)s; 0 with --kv-watermark 0: admit whenever the prompt fits)",
    )
    p.add_argument(
        "--threads",
        type=_threads,
        default=None,
        help="torch threads: N, or auto (the default: one thread or all cores, whichever "
        "runs decode steps faster at start)",
    )
    p.add_argument(
        "--weights",
        choices=WEIGHT_FORMATS,
        default=defaults.weights,
        help="projection weights: fp32, bf16, int8, w8a8 (int8 activations too), blocks "
        "(a GGUF's Q4_0/Q4_1/Q5_0/Q8_0/Q4_K blocks kept compact), auto (the fastest per "
        "shape, blocks included, measured once per CPU)",
    )
    p.add_argument(
        "--kv-dtype",
        choices=KV_DTYPES,
        default=defaults.kv_dtype,
        help="K/V cache element type: fp32, bf16 (twice the tokens per KV budget), or int8 "
        "(scales per token and KV head: ~1.8x bf16's tokens)",
    )


def train(args: argparse.Namespace) -> int:
    try:
        from training.__main__ import main as run_step  # imported on use: it loads torch
    except ModuleNotFoundError as exc:
        if (exc.name or "").partition(".")[0] != "training":
            raise  # a dependency missing, not the package
        # e.g. an installed wheel: the pipelines and their data live in a source checkout
        print("tiergate train: no training/ here; run it from a source checkout", file=sys.stderr)
        return 1
    return run_step(args.step)


def router(args: argparse.Namespace) -> int:
    """`tiergate router learn ...`: the training step that fits the router to the tiers."""
    return train(argparse.Namespace(step=["router", args.action, *args.rest]))


def calibrate_cache(args: argparse.Namespace) -> int:
    """`python -m training cache calibrate`: the pairs and their scoring live in training/."""
    return train(argparse.Namespace(step=["cache", "calibrate", *args.options]))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tiergate", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("serve", help="run the gateway with a policy file")
    p.add_argument("--policy", required=True, help="policy YAML, e.g. router_policies/default.yaml")
    p.add_argument("--host", help="overrides server.host of the policy")
    p.add_argument("--port", type=int, help="overrides server.port of the policy")
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    p.set_defaults(func=serve)

    p = sub.add_parser("check-policy", help="validate a policy file; exit 1 on errors")
    p.add_argument("file")
    p.set_defaults(func=check_policy)

    p = sub.add_parser("calibrate", help="the score threshold for a share of large-tier calls")
    p.add_argument("--policy", required=True, help="policy YAML with a min_score rule")
    p.add_argument("--prompts", required=True, help="sample prompts: JSONL {prompt} or lines")
    p.add_argument("--large-share", type=float, required=True, help="e.g. 0.3 for 30%%")
    p.add_argument("--route", help="default: the policy's first route")
    p.add_argument("--tier", help="default: the tier of the route's first min_score rule")
    p.add_argument("--write", action="store_true", help="write the threshold into the policy")
    p.set_defaults(func=calibrate)

    p = sub.add_parser(
        "calibrate-cache",
        help="the cache's floor and verifier threshold for a wrong-hit bound",
        add_help=False,  # --help reaches the step's own parser
    )
    p.set_defaults(func=calibrate_cache, passes_options=True)  # its options: the step's

    p = sub.add_parser("engine", help="serve one local model over an OpenAI-compatible API")
    p.add_argument("--model", required=True, help="bundled name, GGUF path or HF folder")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8100)
    p.add_argument(
        "--kv-cache-mb",
        type=int,
        default=EngineSettings().kv_cache_mb,
        help="KV cache budget in MiB",
    )
    p.add_argument("--served-name", help="model name in the API (default: the model's)")
    p.add_argument(
        "--api-key",
        default=os.environ.get("TIERGATE_ENGINE_API_KEY"),
        help="bearer key every route but /health needs (default: $TIERGATE_ENGINE_API_KEY)",
    )
    p.add_argument(
        "--shutdown-grace-s",
        type=float,
        default=ServerSettings().shutdown_grace_s,  # the gateway's default too
        help="on SIGTERM, seconds in-flight requests get before they are aborted",
    )
    p.add_argument(
        "--max-body-bytes",
        type=int,
        default=DEFAULT_MAX_BODY_BYTES,
        help="larger request bodies are refused with 413",
    )
    _add_engine_tuning(p)
    p.set_defaults(func=engine)

    p = sub.add_parser("hash-key", help="print a key's SHA-256 for `key_sha256:` in a policy")
    p.add_argument("key", nargs="?", help="the key (default: read from stdin, kept out of history)")
    p.set_defaults(func=hash_key)
    p = sub.add_parser("stats", help="print a running gateway's admin stats as tables")
    p.add_argument("--url", default="http://127.0.0.1:8000", help="the gateway's base URL")
    p.add_argument("--key", default=os.environ.get("TIERGATE_ADMIN_KEY"), help="admin key")
    p.add_argument("--window", default="1h", choices=["1m", "1h", "all"])
    p.set_defaults(func=stats)
    p = sub.add_parser("train", help="a training step: router|cache STEP (python -m training)")
    p.add_argument("step", nargs=argparse.REMAINDER, help="e.g. cache verifier --l2 1")
    p.set_defaults(func=train)
    p = sub.add_parser("router", help="router learn: fit the router to your tiers from traffic")
    p.add_argument("action", choices=["learn"])
    p.add_argument("rest", nargs=argparse.REMAINDER, help="--policy P --samples F --out E ...")
    p.set_defaults(func=router)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    set_omp_defaults()  # before any subcommand imports torch: libgomp reads them at load
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    parser = build_parser()
    args, options = parser.parse_known_args(argv)
    if options and not getattr(args, "passes_options", False):
        parser.error(f"unrecognized arguments: {' '.join(options)}")
    args.options = options
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
