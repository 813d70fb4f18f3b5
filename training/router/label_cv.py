"""Choose the difficulty classifier's training target and regularization by 5-fold CV on the
`train` split only (training/router/labels.py defines the targets). The held-out split is not
read here.

    python -m training router label-cv [--outcomes training/data/router_rates.jsonl]

Per (target, C), on each fold: ROC AUC against the `rate` label (large right-answer share
beats small's by >= 0.5: the label the eval reports; whole and length-matched as the eval
does) and against the `greedy` label, and
CPT(50%) on the right-answer rates (needs no label).

`--part neighbours`: for the shipped target and C, the neighbours term (the mean target of
the k most similar training examples, cosine) alone and blended with the classifier, per k
and blend weight, on out-of-fold scores of three fold seeds. Besides the per-fold means it
reports the length-matched AUC of the pooled out-of-fold scores (~500 tasks instead of ~50).
The same for the kernel term (kernel ridge regression of the target on the examples,
kernel exp((similarity - 1) / width), the similarity mixing the embeddings' cosine with the
prompts' word cosine by a lexical share), per width, ridge and lexical share. Chosen: the
best pooled matched AUC, ties (within 0.001) broken by the whole AUC. `--cs`, `--ks`,
`--widths`, `--ridges`, `--lexicals` and `--weights` narrow (or widen) the grid; several C
are compared on the same folds.

Writes training/reports/router_label_cv.json (`--part targets`) or
training/reports/router_neighbours_cv.json (`--part neighbours`; training/artifacts.py).
"""

import argparse
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from sklearn.model_selection import StratifiedKFold

from gateway.embedding.embedder import Embedder
from gateway.policy import load_policy
from gateway.routing.difficulty import embeddings_of, example_signals, train_classifier
from gateway.routing.lexical import LexicalIndex
from gateway.routing.nearest import Kernel, Neighbours, example_similarities
from training.artifacts import ROOT, cpu_model, write_report
from training.router.labels import SHIPPED_TARGET, TARGETS, quality, rate_label
from training.router.metrics import auc, cpt, length_matched
from training.router.outcomes import RATES

CS = (1.0, 3.0, 10.0, 30.0, 100.0)
FOLDS = 5
SEED = 10
NEIGHBOUR_SEEDS = (10, 11, 12)
KS = (3, 4, 5, 6, 7, 8, 10, 20, 40, 80)
NEIGHBOUR_WEIGHTS = (0.0, 0.25, 0.5, 0.75, 1.0)  # the neighbours' share of the blend
# width, ridge, lexical share
KERNELS = tuple(
    (w, r, x) for w in (0.2, 0.3, 0.5) for r in (0.3, 1.0) for x in (0.0, 0.3, 0.5, 0.7)
)


def probabilities(classifier, x: np.ndarray) -> np.ndarray:
    logits = x @ classifier.weights + classifier.bias
    return 1.0 / (1.0 + np.exp(-logits))


def cross_validate(x: np.ndarray, rows: list[dict], target: str, c: float) -> dict:
    y = np.array([TARGETS[target](r) for r in rows])
    rate = np.array([rate_label(r) for r in rows])
    greedy = np.array([TARGETS["greedy"](r) for r in rows])
    lengths = np.array([len(r["prompt"]) for r in rows], dtype=float)
    small = np.array([quality(r, "small") for r in rows])
    large = np.array([quality(r, "large") for r in rows])
    folds = StratifiedKFold(FOLDS, shuffle=True, random_state=SEED).split(x, rate)
    per_fold = []
    for fit, test in folds:
        clf = train_classifier(x[fit, :384], x[fit, 384:], y[fit], c)
        p = probabilities(clf, x[test])
        matched = length_matched(lengths[test], rate[test])
        per_fold.append(
            (
                auc(rate[test], p),
                auc(rate[test][matched], p[matched]),
                auc(greedy[test], p),
                cpt(p, small[test], large[test], 0.5),
            )
        )
    mean = np.array(per_fold).mean(axis=0)
    return {
        "target": target,
        "C": c,
        "auc_rate_label": round(float(mean[0]), 4),
        "auc_rate_label_length_matched": round(float(mean[1]), 4),
        "auc_greedy_label": round(float(mean[2]), 4),
        "cpt50": round(float(mean[3]), 4),
    }


@dataclass(frozen=True)
class Grid:
    """What `--part neighbours` compares: classifier Cs, neighbour counts, kernels (width,
    ridge, lexical share) and the term's blend weights."""

    cs: tuple[float, ...]
    ks: tuple[int, ...] = KS
    kernels: tuple[tuple[float, float, float], ...] = KERNELS
    weights: tuple[float, ...] = NEIGHBOUR_WEIGHTS

    def terms(self) -> list[tuple]:
        return [("neighbours", k) for k in self.ks] + [("kernel", *k) for k in self.kernels]

    @classmethod
    def from_args(cls, args: argparse.Namespace, policy_c: float) -> "Grid":
        """The defaults, narrowed (or widened) from the command line."""
        widths = args.widths or sorted({w for w, _, _ in KERNELS})
        ridges = args.ridges or sorted({r for _, r, _ in KERNELS})
        lexicals = args.lexicals or sorted({x for _, _, x in KERNELS})
        kernels = tuple((w, r, x) for w in widths for r in ridges for x in lexicals)
        cs = tuple(args.cs or [policy_c])
        return cls(cs, tuple(args.ks), kernels, tuple(args.weights))


def out_of_fold(x: np.ndarray, rows: list[dict], grid: Grid, seed: int) -> dict:
    """Out-of-fold classifier probabilities (per C), neighbour means (per k) and kernel
    ridge predictions (per width, ridge and lexical share) for one fold seed."""
    y = np.array([TARGETS[SHIPPED_TARGET](r) for r in rows])
    rate = np.array([rate_label(r) for r in rows])
    vectors = x[:, :384].astype(np.float32)
    names = [("classifier", c) for c in grid.cs] + grid.terms()
    scores = {t: np.zeros(len(rows)) for t in names}
    folds = list(StratifiedKFold(FOLDS, shuffle=True, random_state=seed).split(x, rate))
    for fit, test in folds:
        for c in grid.cs:
            clf = train_classifier(x[fit, :384], x[fit, 384:], y[fit], c)
            scores[("classifier", c)][test] = probabilities(clf, x[test])
        for k in grid.ks:
            neighbours = Neighbours(vectors[fit], y[fit], k)
            scores[("neighbours", k)][test] = neighbours.predict_many(vectors[test])
        prompts = [r["prompt"] for r in rows]
        kernel_predictions(grid.kernels, vectors, prompts, y, fit, test, scores)
    return {"folds": folds, "scores": scores}


def kernel_predictions(kernels, vectors, prompts, y, fit, test, scores) -> None:
    """Each kernel of the grid fitted on `fit`, its predictions for `test` into `scores`;
    the examples' similarities computed once per lexical share."""
    lexical = LexicalIndex.build([prompts[i] for i in fit])
    test_prompts = [prompts[i] for i in test]
    for share in sorted({x for _, _, x in kernels}):
        similarity = example_similarities(vectors[fit], lexical, share)
        for width, ridge, _ in [k for k in kernels if k[2] == share]:
            solved = similarity.copy()  # solve overwrites it
            kernel = Kernel.solve(vectors[fit], solved, y[fit], width, ridge, lexical, share)
            predicted = kernel.predict_many(vectors[test], test_prompts)
            scores[("kernel", width, ridge, share)][test] = predicted


def blend_figures(run: dict, c: float, term: tuple, w: float, rate, lengths, small, large):
    """AUC, pooled length-matched AUC, per-fold matched AUC and CPT(50%) of one blend."""
    p = (1 - w) * run["scores"][("classifier", c)] + w * run["scores"][term]
    matched = length_matched(lengths, rate)
    in_fold = [(t, length_matched(lengths[t], rate[t])) for _, t in run["folds"]]
    per_fold = [auc(rate[t][m], p[t][m]) for t, m in in_fold]
    return (
        auc(rate, p),
        auc(rate[matched], p[matched]),
        np.mean(per_fold),
        cpt(p, small, large, 0.5),
    )


def neighbours_study(x: np.ndarray, rows: list[dict], grid: Grid) -> list[dict]:
    rate = np.array([rate_label(r) for r in rows])
    lengths = np.array([len(r["prompt"]) for r in rows], dtype=float)
    small = np.array([quality(r, "small") for r in rows])
    large = np.array([quality(r, "large") for r in rows])
    matched = length_matched(lengths, rate)
    seeds = [out_of_fold(x, rows, grid, seed) for seed in NEIGHBOUR_SEEDS]
    runs = []
    terms = grid.terms()
    for c, term, w in [(c, t, w) for c in grid.cs for t in terms for w in grid.weights]:
        if w == 0 and term != terms[0]:
            continue  # the classifier alone: the term plays no part
        if w == 1 and c != grid.cs[0]:
            continue  # the term alone: C plays no part
        figures = [blend_figures(run, c, term, w, rate, lengths, small, large) for run in seeds]
        mean = np.array(figures).mean(axis=0)
        names = ("k",) if len(term) == 2 else ("width", "ridge", "lexical_share")
        runs.append(
            {
                "term": "classifier" if w == 0 else term[0],
                "C": c,
                **({} if w == 0 else dict(zip(names, term[1:], strict=True))),
                "term_weight": w,
                "auc_rate_label": round(float(mean[0]), 4),
                "auc_length_matched_pooled": round(float(mean[1]), 4),
                "auc_length_matched_per_fold": round(float(mean[2]), 4),
                "cpt50": round(float(mean[3]), 4),
                "matched_pooled_tasks": len(matched),
            }
        )
        print(json.dumps(runs[-1]), flush=True)
    return runs


def neighbours_report(x: np.ndarray, train: list[dict], grid: Grid, data: list[Path]) -> None:
    """Run the study, choose (best pooled matched AUC, ties by the whole AUC), write JSON."""
    runs = neighbours_study(x, train, grid)
    matched_auc = lambda r: r["auc_length_matched_pooled"]  # noqa: E731
    report = {"cpu": cpu_model(), "train": len(train), "folds": FOLDS, "Cs": grid.cs}
    report |= {"ks": grid.ks, "kernels": grid.kernels, "term_weights": grid.weights}
    report |= {"target": SHIPPED_TARGET, "seeds": NEIGHBOUR_SEEDS, "runs": runs}
    for term in ("neighbours", "kernel"):
        best = max((r for r in runs if r["term"] == term), key=matched_auc)
        report[f"best_{term}"] = best
        print(f"best {term}:", json.dumps(best))
    top = max(map(matched_auc, runs))
    tied = [r for r in runs if matched_auc(r) >= top - 0.001]
    best = report["chosen"] = max(tied, key=lambda r: r["auc_rate_label"])
    print("chosen:", json.dumps(best), "->", write_report("router_neighbours_cv", report, data))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Cross-validate the router's target and C.")
    parser.add_argument("--outcomes", type=Path, default=RATES)
    parser.add_argument("--policy", default=str(ROOT / "router_policies" / "default.yaml"))
    parser.add_argument("--part", choices=["targets", "neighbours"], default="targets")
    parser.add_argument("--cs", type=float, nargs="+", help="neighbours: C values (policy's)")
    parser.add_argument("--ks", type=int, nargs="+", default=list(KS))
    parser.add_argument("--widths", type=float, nargs="+", help="kernel widths (0.2 .. 0.5)")
    parser.add_argument("--ridges", type=float, nargs="+", help="kernel ridges (0.3, 1)")
    parser.add_argument("--lexicals", type=float, nargs="+", help="kernel lexical shares")
    parser.add_argument("--weights", type=float, nargs="+", default=list(NEIGHBOUR_WEIGHTS))
    args = parser.parse_args(argv)
    rows = [json.loads(line) for line in args.outcomes.read_text().splitlines()]
    train = [r for r in rows if r["split"] == "train"]
    policy = load_policy(args.policy)
    model = policy.embedder.model
    prompts = [r["prompt"] for r in train]
    vectors = embeddings_of(prompts, model, Embedder(model).embed_many)
    signals = np.stack([example_signals(p).vector() for p in prompts])
    x = np.hstack((vectors, signals)).astype(np.float64)
    if args.part == "neighbours":
        grid = Grid.from_args(args, policy.difficulty.regularization)
        neighbours_report(x, train, grid, [args.outcomes, Path(args.policy)])
        return
    runs = [cross_validate(x, train, t, c) for t in ("rate", "gap", "greedy") for c in CS]
    for run in runs:
        print(json.dumps(run))
    best = max((r for r in runs if r["target"] != "greedy"), key=lambda r: r["auc_rate_label"])
    report = {"cpu": cpu_model(), "train": len(train), "folds": FOLDS, "runs": runs}
    report["chosen"] = best
    report["rate_label_positive_share"] = round(float(np.mean([rate_label(r) for r in train])), 4)
    path = write_report("router_label_cv", report, [args.outcomes, Path(args.policy)])
    print("chosen:", json.dumps(best), "->", path)
