"""The `tiergate` command: serve | engine | check-policy | calibrate.

Heavy imports (uvicorn, the app, the engine and torch) happen inside each subcommand, so
`tiergate check-policy` answers in well under a second.
"""

import argparse
import logging
import sys
from collections.abc import Sequence
from pathlib import Path

from engine.config import EngineConfig
from gateway.policy import PolicyError, load_policy

_MB = 1024 * 1024


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
    from gateway.cache.embedder import Embedder
    from gateway.routing import calibrate as cal

    try:
        policy = load_policy(args.policy)
        route = args.route or next(iter(policy.routes), None)
        if route not in policy.routes:
            raise ValueError(f"no route {route!r} in {args.policy}")
        tier = args.tier or next((r.tier for r in policy.routes[route].rules if r.min_score), None)
        index = cal.score_rule_index(policy, route, tier)
        prompts = cal.read_prompts(Path(args.prompts))
        embedder = Embedder(policy.embedder.model)
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
    import uvicorn

    from gateway.app import create_app

    app = create_app(policy, policy_path=args.policy)
    host = args.host or policy.server.host
    port = args.port or policy.server.port
    uvicorn.run(app, host=host, port=port, log_level=args.log_level)
    return 0


def engine(args: argparse.Namespace) -> int:
    from engine.model_registry import ModelNotFoundError

    config = EngineConfig(
        model=args.model,
        kv_cache_bytes=args.kv_cache_mb * _MB,
        page_size=args.page_size,
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens,
        max_waiting=args.max_waiting,
        max_model_len=args.max_model_len,
        enable_prefix_caching=not args.no_prefix_caching,
        num_threads=args.threads,
    )
    try:
        from engine.server import run_engine_server

        run_engine_server(config, args.host, args.port, args.served_name)
    except ModelNotFoundError as exc:
        print(f"tiergate: {exc}", file=sys.stderr)
        return 1
    return 0


def _add_engine_tuning(p: argparse.ArgumentParser) -> None:
    # Defaults come from EngineConfig, the one source of the engine's settings.
    defaults = EngineConfig(model="")
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
    p.add_argument("--max-model-len", type=int, default=None, help="default: the model's")
    p.add_argument("--no-prefix-caching", action="store_true", help="never share KV pages")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")


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

    p = sub.add_parser("engine", help="serve one local model over an OpenAI-compatible API")
    p.add_argument("--model", required=True, help="bundled name, GGUF path or HF folder")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8100)
    p.add_argument(
        "--kv-cache-mb",
        type=int,
        default=EngineConfig.kv_cache_bytes // _MB,
        help="KV cache budget in MiB",
    )
    p.add_argument("--served-name", help="model name in the API (default: the model's)")
    _add_engine_tuning(p)
    p.set_defaults(func=engine)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
