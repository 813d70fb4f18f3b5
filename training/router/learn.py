"""`tiergate router learn` (also `python -m training router learn`): fit the difficulty
router to the deployer's own tiers from their own traffic.

    tiergate router learn --policy P (--samples FILE | --from-store) --out examples.jsonl

1. Read the route's traffic samples: a JSONL file (GET /admin/router/samples?format=jsonl,
   or a file this command recorded) or the store itself (`--from-store`, `--tenant`).
2. Give each both tiers' answers: the one served, the other fetched through the gateway's
   own backends (greedy, at most `router_learning.max_tokens`), within `--max-usd`.
3. Judge each pair with the policy's judge (training/router/learn_judge.py): label 1 when
   the small answer is not as good as the large one. A sample that carries a `reference`
   answer is labelled by checking both answers against it instead
   (training/router/learn_reference.py).
4. Keep a held-out slice (`--held-out`, by a hash of the sample id); refit on the rest on
   top of the prior (training/router/learn_fit.py), calibrate the threshold to the share the
   running policy sends to large, write the examples with their provenance sidecar, and
   report the prior and the fitted score on the held-out slice.

Every answer and verdict goes to `--record` (default `<out>.labelled.jsonl`) as it comes: a
rerun reads it back with `--samples` and pays for nothing twice.
"""

import argparse
import asyncio
import json
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

from gateway.backends.base import BackendError
from gateway.cache.sample_stores import open_sample_store
from gateway.cache.samples import Sample
from gateway.policy import Policy, PolicyError, load_policy
from gateway.routing.calibrate import score_rule_index, write_threshold
from training.artifacts import write_artifact
from training.router import learn_fit
from training.router.learn_judge import JUDGE_MAX_TOKENS, judge_messages, parse_verdict
from training.router.learn_prior import PriorChoice, choose_prior_keep
from training.router.learn_reference import reference_verdict
from training.router.learn_tiers import JUDGE_TIER, SpendCapReached, Tiers


@dataclass
class Row:
    """A sample as learning sees it: its tiers' answers and the judge's verdict."""

    sample: Sample
    answers: dict[str, str] = field(default_factory=dict)  # tier -> answer
    verdict: dict | None = None  # {judge, reply, needs_large}
    reference: str | None = None  # the known right answer, when the deployer has one

    @classmethod
    def from_json(cls, line: str) -> "Row":
        data = json.loads(line)
        answers, verdict = data.pop("answers", None) or {}, data.pop("verdict", None)
        reference = data.pop("reference", None)
        sample = Sample(**data)
        answers.setdefault(sample.tier, sample.answer)
        return cls(sample, answers, verdict, None if reference is None else str(reference))

    def to_json(self) -> str:
        body = asdict(self.sample) | {"answers": self.answers, "verdict": self.verdict}
        body |= {"reference": self.reference} if self.reference is not None else {}
        return json.dumps(body, ensure_ascii=False)


@dataclass
class Outcome:
    labelled: list[learn_fit.Labelled] = field(default_factory=list)
    skipped: dict[str, int] = field(default_factory=dict)  # why a sample has no label

    def skip(self, reason: str) -> None:
        self.skipped[reason] = self.skipped.get(reason, 0) + 1


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="tiergate router learn", description=__doc__.splitlines()[0])
    p.add_argument("--policy", required=True, help="the running policy YAML")
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--samples", help="JSONL of samples (the admin export, or a record)")
    source.add_argument("--from-store", action="store_true", help="read the policy's store")
    p.add_argument("--tenant", help="--from-store: only this tenant's samples")
    p.add_argument("--route", help="default: the policy's first route with a min_score rule")
    p.add_argument("--out", required=True, help="the examples JSONL to write")
    p.add_argument("--record", help="answers and verdicts (default <out>.labelled.jsonl)")
    p.add_argument("--max-usd", type=float, help="spend cap (default router_learning.max_usd)")
    p.add_argument("--held-out", type=float, default=0.3, help="share kept out of the refit")
    p.add_argument("--weight", type=int, default=3, help="copies of each traffic example")
    p.add_argument("--large-share", type=float, help="default: the running policy's share")
    p.add_argument("--write-policy", action="store_true", help="write min_score into the policy")
    p.add_argument("--concurrency", type=int, default=4, help="samples labelled at once")
    p.add_argument(
        "--prior",
        default="auto",
        help="prior examples kept: auto (chosen by five-fold CV on the training slice), all, or N",
    )
    args = p.parse_args(argv)
    if args.prior not in ("auto", "all") and not (args.prior.isdigit()):
        p.error("--prior must be auto, all or a count")
    if not 0 <= args.held_out < 1 or args.weight < 1 or args.concurrency < 1:
        p.error("--held-out must be in [0, 1), --weight and --concurrency at least 1")
    if args.large_share is not None and not 0 <= args.large_share <= 1:
        p.error("--large-share must be in [0, 1]")
    return args


def route_tiers(policy: Policy, route: str | None) -> tuple[str, str, str, int]:
    """The route, its small tier (the default), its large one (the first min_score rule's
    tier) and that rule's index."""
    names = [route] if route else list(policy.routes)
    for name in names:
        if name not in policy.routes:
            raise ValueError(f"no route {name!r} in the policy")
        rules = policy.routes[name].rules
        large = next((r.tier for r in rules if r.min_score is not None), None)
        if large is not None:
            return name, policy.routes[name].default, large, score_rule_index(policy, name, large)
    raise ValueError("no route with a min_score rule: nothing to calibrate")


async def read_rows(args: argparse.Namespace, policy: Policy, route: str) -> list[Row]:
    if args.samples:
        rows = []
        for number, line in enumerate(Path(args.samples).read_text().splitlines(), 1):
            try:
                rows += [Row.from_json(line)] if line.strip() else []
            except (ValueError, TypeError, AttributeError) as exc:
                raise ValueError(f"{args.samples}:{number}: not a sample: {exc}") from None
        return [r for r in rows if r.sample.route == route]
    store = open_sample_store(policy.cache)
    try:
        return [Row(s, {s.tier: s.answer}) for s in await store.list(args.tenant, route)]
    finally:
        await store.close()


async def label(row: Row, tiers: Tiers, small: str, large: str, out: Outcome) -> None:
    """Fill in the missing answers and the verdict; skip the row (counted) when it cannot."""
    try:
        for tier in (small, large):
            if tier not in row.answers:
                reply = await tiers.ask(tier, row.sample.messages, _max_tokens(row, tiers))
                row.answers[tier] = reply.text
                row.verdict = None  # a verdict on other answers says nothing of this one
        if row.reference is not None:
            row.verdict = reference_verdict(row.reference, row.answers[small], row.answers[large])
        elif (row.verdict or {}).get("judge") != tiers.judge_model():
            row.verdict = await judge(row, tiers, small, large)
    except SpendCapReached:
        return out.skip("spend_cap")
    except BackendError:
        return out.skip("tier_failed")
    verdict = row.verdict["needs_large"] if row.verdict else None
    if verdict is None:
        return out.skip("verdict_unreadable")
    out.labelled.append(learn_fit.Labelled.of(row.sample, row.verdict))


async def judge(row: Row, tiers: Tiers, small: str, large: str) -> dict:
    asked = judge_messages(row.sample.messages, row.answers[small], row.answers[large])
    reply = await tiers.ask(JUDGE_TIER, asked, JUDGE_MAX_TOKENS)
    verdict = parse_verdict(reply.text)
    return {"judge": tiers.judge_model(), "reply": reply.text, "needs_large": verdict}


def _max_tokens(row: Row, tiers: Tiers) -> int:
    most = tiers.policy.router_learning.max_tokens
    return min(row.sample.max_tokens or most, most)


async def label_all(
    rows: list[Row],
    policy: Policy,
    tiers_of_route: tuple[str, str],
    max_usd: float,
    record: Path,
    concurrency: int,
) -> tuple[Outcome, float]:
    """Label every row, `concurrency` at once (the engines batch them); each row goes to the
    record as soon as it is done. The labels keep the rows' order whatever the finish order."""
    small, large = tiers_of_route
    outcomes = [Outcome() for _ in rows]
    tiers = Tiers(policy, max_usd)
    gate = asyncio.Semaphore(concurrency)
    async with tiers.running():
        with record.open("w") as sink:

            async def one(row: Row, out: Outcome) -> None:
                async with gate:
                    await label(row, tiers, small, large, out)
                sink.write(row.to_json() + "\n")
                sink.flush()

            await asyncio.gather(*(one(r, o) for r, o in zip(rows, outcomes, strict=True)))
    merged = Outcome()
    for out in outcomes:
        merged.labelled += out.labelled
        for reason, count in out.skipped.items():
            merged.skipped[reason] = merged.skipped.get(reason, 0) + count
    return merged, tiers.spent_usd


def fit_and_report(args, policy: Policy, outcome: Outcome, rule: tuple[str, int]) -> tuple:
    from gateway.embedding.embedder import Embedder

    embed = Embedder(policy.embedder.model, backend=policy.embedder.backend).embed_many
    out = [learn_fit.is_held_out(r.sample.id, args.held_out) for r in outcome.labelled]
    held = [r for r, o in zip(outcome.labelled, out, strict=True) if o]
    train = [r for r, o in zip(outcome.labelled, out, strict=True) if not o]
    choice = prior_choice(args.prior, policy, train, args.weight, embed)
    examples, kept_prior = learn_fit.fitted_examples(policy, train, args.weight, choice.keep)
    fitted = learn_fit.with_examples(policy, examples)
    route, index = rule
    old = policy.routes[route].rules[index].min_score
    train_samples = [r.sample for r in train]
    prior_train = learn_fit.score_samples(policy, train_samples, embed)
    share = args.large_share
    if share is None:
        share = float((prior_train >= old).mean()) if len(prior_train) else 0.3
    fitted_train = choice.scores
    if fitted_train is None:  # no cross-validation ran: the refit's own scores
        fitted_train = learn_fit.score_samples(fitted, train_samples, embed)
    new = learn_fit.calibrated_threshold(fitted_train, share)
    held_samples = [r.sample for r in held]
    report = learn_fit.before_after(
        held,
        learn_fit.score_samples(policy, held_samples, embed),
        learn_fit.score_samples(fitted, held_samples, embed),
        (old, new),
    )
    counts = {"train": len(train), "prior_examples": kept_prior, "examples": len(examples)}
    calibration = {"large_share": round(share, 4), "min_score_before": old, "min_score": new}
    extra = {"calibration": calibration, "prior_choice": choice.report()}
    return report | counts | extra, examples, new


def prior_choice(setting: str, policy: Policy, train: list, weight: int, embed) -> PriorChoice:
    """`--prior`: auto (cross-validated on the training slice), all, or a count."""
    if setting == "auto":
        return choose_prior_keep(policy, train, weight, embed)
    if setting == "all":
        return PriorChoice(None, {}, "--prior all")
    return PriorChoice(int(setting), {}, f"--prior {setting}")


async def run(args: argparse.Namespace) -> dict:
    policy = load_policy(args.policy)
    route, small, large, index = route_tiers(policy, args.route)
    rows = await read_rows(args, policy, route)
    if not rows:
        raise ValueError(f"no samples of route {route!r}")
    out = Path(args.out)
    record = Path(args.record) if args.record else out.with_name(f"{out.stem}.labelled.jsonl")
    max_usd = args.max_usd if args.max_usd is not None else policy.router_learning.max_usd
    outcome, spent = await label_all(
        rows, policy, (small, large), max_usd, record, args.concurrency
    )
    if not outcome.labelled:
        raise ValueError(f"no sample could be labelled: {outcome.skipped}")
    report, examples, threshold = fit_and_report(args, policy, outcome, (route, index))
    report |= {"route": route, "tiers": {"small": small, "large": large}, "samples": len(rows)}
    report |= {"skipped": outcome.skipped, "spent_usd": round(spent, 6), "max_usd": max_usd}
    text = "".join(e.model_dump_json(exclude_none=True) + "\n" for e in examples)
    priors = [Path(e) for e in policy.difficulty.examples if isinstance(e, str)]
    data = [record, *[p for p in priors if p.resolve() != out.resolve()]]
    write_artifact(out, text, data, report)
    if args.write_policy:
        write_threshold(Path(args.policy), route, index, threshold)
    return report


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        report = asyncio.run(run(args))
    except PolicyError as exc:
        print(f"tiergate router learn: {exc}", file=sys.stderr)
        return 1
    except (ValueError, OSError, KeyError) as exc:
        print(f"tiergate router learn: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
