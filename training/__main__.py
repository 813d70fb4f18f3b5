"""One entry point for every training step (also `tiergate train ...`):

    python -m training router outcomes [--samples 10 --weights w8a8]
    python -m training router label-cv [--part targets|neighbours]
    python -m training router learning-curve
    python -m training router real-prompts --bigbench PATH
    python -m training router prior-cv
    python -m training router learn --policy P --samples F --out E   (tiergate router learn)
    python -m training router record-traffic
    python -m training router reference-traffic [--limit N]
    python -m training cache pairs
    python -m training cache verifier [--l2 1]
    python -m training cache aligned [--l2 30]
    python -m training cache pair-model
    python -m training cache sharegpt-candidates [--limit N]
    python -m training cache real-pairs
    python -m training cache neighbours --out FILE
    python -m training cache later-set --set train2|train3|heldout2|heldout3|heldout4|heldout5
    python -m training cache calibrate [--pairs FILE --target-wrong 0.01 --write ...]

`python -m training GROUP STEP --help` shows a step's options.
"""

import importlib
import sys

# group -> step -> (module with main(argv), what it does)
STEPS: dict[str, dict[str, tuple[str, str]]] = {
    "router": {
        "outcomes": (
            "training.router.outcomes",
            "answer the tasks on both tiers, label them, write the examples",
        ),
        "label-cv": ("training.router.label_cv", "cross-validate the target, C and terms"),
        "learning-curve": ("training.router.learning_curve", "AUC against training size"),
        "real-prompts": (
            "training.router.real_prompts",
            "the prior's real prompts, graded, split; writes the examples",
        ),
        "prior-cv": ("training.router.prior_cv", "cross-validate the prior's settings"),
        "learn": ("training.router.learn", "fit the router to the policy's tiers from traffic"),
        "record-traffic": (
            "training.router.record_traffic",
            "the recorded traffic tests/test_router_learn.py replays",
        ),
        "reference-traffic": (
            "training.router.reference_traffic",
            "traffic with known answers, labelled by them (bench/router_learn_eval.py)",
        ),
    },
    "cache": {
        "pairs": ("training.cache.build_pairs", "build the verifier's labelled pair set"),
        "verifier": (
            "training.cache.train_verifier",
            "fit the logistic verifier (the default: lexical features)",
        ),
        "aligned": (
            "training.cache.train_aligned",
            "fit the aligned verifier (lexical + word-piece alignment features)",
        ),
        "neighbours": (
            "training.cache.neighbours",
            "the train questions' crowded-scope neighbours, to judge",
        ),
        "nli": (
            "training.cache.train_nli",
            "fit the nli verifier (aligned's features + an NLI model's, both directions)",
        ),
        "pair-model": (
            "training.cache.train_pair_model",
            "fine-tune the cross-encoder pair model on the people's pairs",
        ),
        "sharegpt-candidates": (
            "training.cache.sharegpt_repeats",
            "ShareGPT turns the embedder puts close, for a person to label",
        ),
        "real-pairs": (
            "training.cache.real_pairs",
            "the pairs written by people, with a fixed held-out split",
        ),
        "later-set": (
            "training.cache.later_sets",
            "a pair set written after the first models (--set: train2, train3 or a held-out "
            "set), checked against every seen pair",
        ),
        "one-candidate": (
            "training.cache.one_candidate",
            "an artifact fitted before 2026-12-07 gets its fit's one-candidate thresholds",
        ),
        "calibrate": (
            "training.cache.calibrate_cli",
            "the cache's floor and verifier threshold for a wrong-hit bound",
        ),
    },
}


def usage() -> str:
    lines = ["usage: python -m training GROUP STEP [options]  (or: tiergate train ...)", ""]
    for group, steps in STEPS.items():
        lines += [f"  {f'{group} {step}':<22} {what}" for step, (_, what) in steps.items()]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) < 2 or args[0] not in STEPS or args[1] not in STEPS[args[0]]:
        wants_help = bool(args) and args[0] in ("-h", "--help")
        print(usage(), file=sys.stdout if wants_help else sys.stderr)
        return 0 if wants_help else 2
    group, step, rest = args[0], args[1], args[2:]
    module, _ = STEPS[group][step]
    sys.argv = [f"python -m training {group} {step}", *rest]  # the step's usage line
    return importlib.import_module(module).main(rest) or 0  # a step's exit status, if any


if __name__ == "__main__":
    sys.exit(main())
