"""docs/benchmarks.md rows of the router benchmarks (bench/summary.py renders the page)."""

from typing import Any

from bench.summary_format import Row


def _num(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.3f}"


def _share(value: float | None) -> str:
    return "n/a" if value is None else f"{100 * value:.1f}%"


def router_learn_eval_rows(result: dict[str, Any]) -> list[Row]:
    """The refit against the prior on held-out traffic labelled by reference answers: the
    learn command's own held-out slice, then five folds pooled, then the general ranking."""
    part = result["learn_held_out_slice"]
    prior, fitted = part["prior"], part["fitted"]
    head = f"learn's held-out slice ({part['held_out']} samples, "
    head += f"{_share(part['needs_large_share'])} need large)"
    rows: list[Row] = [
        (f"{head}: AUC fitted (prior)", _num(fitted["auc"]), _num(prior["auc"]), ""),
        (f"{head}: CPT(50%)", _share(fitted["cpt50"]), _share(prior["cpt50"]), ""),
        (
            f"{head}: share to large, quality there (all-small {_num(part['all_small_quality'])},"
            f" all-large {_num(part['all_large_quality'])})",
            f"{_share(fitted['large_share'])}, {_num(fitted['quality'])}",
            f"{_share(prior['large_share'])}, {_num(prior['quality'])}",
            "",
        ),
    ]
    folds = result["five_folds"]
    tag = f"five folds ({folds['samples']} samples, {folds['needs_large']} need large)"
    for key, label, show in (("auc", "AUC", _num), ("cpt50", "CPT(50%)", _share),
                             ("apgr", "APGR", _num)):  # fmt: skip
        base = ", ".join(
            f"{n} {show(v)}" for n, v in folds[key].items() if n not in ("prior", "fitted")
        )
        value, old = show(folds[key]["fitted"]), show(folds[key]["prior"])
        rows.append((f"{tag}: {label} fitted (prior; {base})", value, old, ""))
    for source, fig in folds["by_source"].items():
        auc = fig["auc"]
        if auc.get("fitted") is not None:
            label = f"{tag}: within {source} ({fig['samples']}, {fig['needs_large']} need large)"
            rows.append((f"{label}: AUC", _num(auc["fitted"]), _num(auc["prior"]), ""))
    general = result["general_ranking"]
    matched = general["hard_vs_easy"]["matched_60_400"]["auc"]
    rows.append(
        (
            "router_eval's held-out hard vs everyday, length-matched AUC: fitted (prior)",
            _num(matched["fitted"]),
            _num(matched["prior"]),
            "",
        )
    )
    rows.append(("sanity pairs: fitted (prior)", _num(general["sanity_fitted"]),
                 _num(general["sanity_prior"]), ""))  # fmt: skip
    return rows
