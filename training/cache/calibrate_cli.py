"""`python -m training cache calibrate` (and `tiergate calibrate-cache`): read the pairs and
the policy, run calibrate.py, print the figures, write the report and, with --write, the
chosen values into the policy's `cache` section (comments and layout kept)."""

import argparse
import sys
from pathlib import Path
from typing import Any

import yaml

from training.artifacts import REAL_PAIRS, write_report
from training.cache.calibrate import calibrate, read_pairs
from training.cache.calibrate_lookups import calibrate_lookups, print_lookup_report
from training.cache.pair_scores import strictness_threshold

REPORT_NAME = "cache_calibration"


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="tiergate calibrate-cache",
        description="the cache's floor and verifier threshold for a wrong-hit bound",
    )
    p.add_argument(
        "--pairs",
        type=Path,
        action="append",
        help="labelled pairs (JSONL), repeatable: e.g. the shipped set and exported reports "
        f"(default: {REAL_PAIRS.relative_to(REAL_PAIRS.parents[3])})",
    )
    p.add_argument("--target-wrong", type=float, default=0.01, help="bound on wrong hits")
    p.add_argument("--confidence", type=float, default=0.95, help="of the upper bound")
    p.add_argument("--split", default="train", choices=["train", "heldout", "all"])
    p.add_argument("--policy", type=Path, help="its embedder, and its current point to compare")
    p.add_argument("--write", action="store_true", help="write the values into --policy")
    p.add_argument("--with-rule-edits", action="store_true", help="score source `rules` too")
    p.add_argument(
        "--per-lookup",
        action="store_true",
        help="rows sharing `a` are one lookup's stored questions: bound lookups served wrong",
    )
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.write and args.policy is None:
        print("calibrate-cache: --write needs --policy", file=sys.stderr)
        return 2
    try:
        if not 0 < args.target_wrong < 1 or not 0 < args.confidence < 1:
            raise ValueError("--target-wrong and --confidence must be between 0 and 1")
        files = args.pairs or [REAL_PAIRS]
        rows = [row for path in files for row in read_pairs(path)]
        policy = _load(args.policy) if args.policy else None
        embed, current = _embedder(policy), _current(policy, args.per_lookup)
        model = policy.cache.verifier_model if policy is not None else "logistic"
        if args.per_lookup:
            cache = _cache(policy)
            report = calibrate_lookups(
                rows, embed, cache.candidates, args.target_wrong, args.confidence, args.split,
                current, model, args.with_rule_edits, cache.model_reads,
            )  # fmt: skip
        else:
            report = calibrate(
                rows, embed, args.target_wrong, args.confidence, args.split, current,
                args.with_rule_edits, model,
            )  # fmt: skip
    except (ValueError, OSError) as exc:
        print(f"calibrate-cache: {exc}", file=sys.stderr)
        return 1
    report["pairs_files"] = [str(path) for path in files]
    (print_lookup_report if args.per_lookup else print_report)(report)
    print(f"report: {write_report(REPORT_NAME, report, files)}")
    chosen = report["chosen"]
    if chosen is None:
        return 1
    values = {k: chosen[k] for k in ("min_similarity", "verifier_threshold")}
    if policy is not None and policy.cache.verifier == "off":
        values["verifier"] = "strict"  # the threshold is the verifier's: it must run
    print("\n" + snippet(values))
    if args.write:
        try:
            write_cache_keys(args.policy, values)
        except ValueError as exc:
            print(f"calibrate-cache: not written: {exc}; paste the snippet above", file=sys.stderr)
            return 1
        print(f"written to {args.policy}")
    return 0


def _load(path: Path):
    from gateway.policy import PolicyError, load_policy

    try:
        return load_policy(path)
    except PolicyError as exc:
        raise ValueError(f"{path}: {exc.issues[0]} (tiergate check-policy lists all)") from None


def _cache(policy):
    """The policy's cache settings (its candidates and model reads), else the defaults."""
    from gateway.policy import CacheSettings

    return policy.cache if policy is not None else CacheSettings()


def _embedder(policy):
    from gateway.embedding.embedder import Embedder

    settings = policy.embedder if policy is not None else None
    embedder = Embedder(settings.model, backend=settings.backend) if settings else Embedder()
    return embedder.embed_many


def _current(policy, per_lookup: bool = False) -> tuple[float, float] | None:
    """The policy's floor and threshold; pair by pair each pair is a lookup that meets one
    stored question, so its one-candidate threshold where the policy uses them."""
    if policy is None:
        return None
    cache = policy.cache
    threshold = cache.verifier_threshold
    if threshold is None or cache.verifier == "off":
        one = cache.one_candidate_thresholds and not per_lookup
        threshold = strictness_threshold(cache.verifier, cache.verifier_model, one)
    return cache.min_similarity, threshold


def snippet(values: dict[str, Any]) -> str:
    return "cache:\n" + "".join(f"  {k}: {v}\n" for k, v in values.items())


def write_cache_keys(path: Path, values: dict[str, Any]) -> None:
    """Set `cache.<key>` for each value in the file's text, in place when the key is there,
    else as a new line at the top of the section; the result must load as a policy."""
    from gateway.policy import PolicyError, policy_from_text

    text = path.read_text()
    root = yaml.compose(text, Loader=yaml.SafeLoader)
    section = _child(root, "cache") if isinstance(root, yaml.MappingNode) else None
    edits: list[tuple[int, int, str]] = []  # (start, end, replacement), applied last first
    if section is None:
        lines = "".join(f"  {k}: {v}\n" for k, v in values.items())
        edits.append(
            (len(text), len(text), ("" if text.endswith("\n") else "\n") + "cache:\n" + lines)
        )
    elif not isinstance(section, yaml.MappingNode) or section.flow_style:
        raise ValueError("the cache section is not a block mapping")
    else:
        first = section.value[0][0].start_mark if section.value else None
        for key, value in values.items():
            node = _child(section, key)
            if node is not None:
                edits.append((node.start_mark.index, node.end_mark.index, str(value)))
            elif first is not None:
                at = first.index - first.column
                edits.append((at, at, f"{' ' * first.column}{key}: {value}\n"))
            else:
                raise ValueError("the cache section is empty")
    for start, end, new in sorted(edits, key=lambda e: e[0], reverse=True):
        text = text[:start] + new + text[end:]
    try:
        policy_from_text(text, path, None)
    except PolicyError as exc:
        raise ValueError(f"the edited policy would not load ({exc.issues[0]})") from None
    path.write_text(text)


def _child(mapping: yaml.MappingNode, key: str) -> yaml.Node | None:
    return next((v for k, v in mapping.value if k.value == key), None)


def print_report(report: dict[str, Any]) -> None:
    skipped = ", ".join(f"{k} {v}" for k, v in report["not_scored"].items()) or "none"
    files = ", ".join(report["pairs_files"])
    print(f"pairs: {files} (split {report['split']}); not scored: {skipped}")
    print(f"verifier_model: {report['verifier_model']}")
    target, conf = report["target_wrong"], report["confidence"]
    if report["chosen"] is None:  # the reason first
        print(
            f"no (floor, threshold) keeps the {conf:.0%} upper bound of wrong hits at or below "
            f"{target:.2%}: showing that takes at least {report['must_not_needed']} must-not "
            "pairs, and few enough served"
        )
    for name, title in (("chosen", "chosen"), ("current", "the policy now")):
        if point := report.get(name):
            floor, threshold = point["min_similarity"], point["verifier_threshold"]
            print(f"{title}: min_similarity {floor}, verifier threshold {threshold}")
            _print_point(point, conf)
    if check := report.get("heldout_check"):
        print("held-out check (never tuned on), chosen point:")
        _print_point(check, conf)
        if check["wrong_rate_upper"] > target:
            print(f"  (its {check['must_not']} must-not pairs cannot vouch for {target:.2%})")


def _print_point(point: dict[str, Any], confidence: float) -> None:
    print(
        f"  should hit served {point['served_rate']:.1%} ({point['should_hit_served']}/"
        f"{point['should_hit']}); wrong {point['wrong_rate']:.2%} ({point['wrong_hits']}/"
        f"{point['must_not']}), upper {confidence:.0%} bound {point['wrong_rate_upper']:.2%}"
    )
    for category, row in point["by_category"].items():
        upper = f"  upper {row['upper']:.2%}" if "upper" in row else ""
        print(f"    {category:<14} {row['served']:>4}/{row['pairs']:<4} {row['rate']:>7.1%}{upper}")
