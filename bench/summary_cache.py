"""docs/benchmarks.md rows of the cache benchmarks (bench/summary.py renders the page)."""

from typing import Any

from bench.summary_format import Row, _pct, _ratio


def _served(table: dict[str, Any], key: str) -> str:
    part = table[key]
    return f"{_pct(part['share'])} ({part['served']}/{part['pairs']})"


def cache_eval_rows(result: dict[str, Any]) -> list[Row]:
    """The default policy's cache and the other verifier models' (the aligned model, the
    nli model, the pair model) through a real cache, against the old default (the logistic
    verifier at the 0.8 floor), same run, same held-out pairs."""
    rows: list[Row] = []
    base = result["baseline"]
    for name in ("default", "aligned", "nli", "nli_balanced", "pair_model"):
        if name in result:  # runs before a model was added have none
            rows += _cache_rows(name, result[name], base)
    return rows


def _cache_rows(name: str, ours: dict[str, Any], base: dict[str, Any]) -> list[Row]:
    new, old = ours["served"], base["served"]
    s = ours["settings"]
    tag = f"{name} ({s['verifier_model']} {s['verifier']}, floor {s['min_similarity']})"
    rows: list[Row] = []
    for key, label in (
        ("should_hit", "should-hit served (paraphrase + near repeat)"),
        ("paraphrase", "paraphrases served"),
        ("near_repeat", "near repeats served"),
        ("exact_repeat", "exact repeats served"),
        ("must_not", "must-not served"),
    ):
        ratio = _ratio(new[key]["share"], old[key]["share"]) if key != "must_not" else ""
        rows.append((f"{tag}: {label}", _served(new, key), _served(old, key), ratio))
    for cat in ("negation", "number", "entity", "scope", "antonym", "unrelated"):
        rows.append((f"{tag}: must-not {cat}", _served(new, cat), _served(old, cat), ""))
    rows.append(
        (
            f"{tag}: must-not served, upper 95% bound (Clopper-Pearson)",
            _pct(new["must_not"]["upper_95"], 2),
            _pct(old["must_not"]["upper_95"], 2),
            "",
        )
    )
    rows.append(
        (
            f"{tag}: lookup p50 with the verifier (wall; CPU)",
            f"{ours['lookup_ms_p50']:.1f} ms; {ours['lookup_cpu_ms_p50']:.1f} ms",
            f"{base['lookup_ms_p50']:.1f} ms; {base['lookup_cpu_ms_p50']:.1f} ms",
            _ratio(ours["lookup_ms_p50"], base["lookup_ms_p50"]),
        )
    )
    if "lookup_ms_p90" in ours:  # older runs have none
        p90 = ours["lookup_ms_p90"], base["lookup_ms_p90"]
        rows.append((f"{tag}: lookup p90 (wall)", f"{p90[0]:.1f} ms", f"{p90[1]:.1f} ms", ""))
    return rows + _later_set_rows(tag, ours, base)


# The later held-out sets (older runs have none), and what a row calls them.
LATER_SETS = (
    ("served_heldout2", "heldout2 (written after the models)"),
    ("served_combined", "held-out + heldout2"),
    ("served_heldout3", "heldout3 (written after 2026-12-03's models)"),
    ("served_heldout4", "heldout4 (written beside train2 on 2026-12-03)"),
    ("served_heldout5", "heldout5 (written beside train3 on 2026-12-04)"),
    ("served_heldout6", "heldout6 (written beside train4 on 2026-12-04)"),
    ("served_all", "all held-out sets"),
)
PER_CATEGORY = (
    "served_heldout2",
    "served_heldout3",
    "served_heldout4",
    "served_heldout5",
    "served_heldout6",
)


def _later_set_rows(tag: str, ours: dict[str, Any], base: dict[str, Any]) -> list[Row]:
    rows: list[Row] = []
    for key, name in LATER_SETS:
        if key not in ours:
            continue
        new, old = ours[key], base[key]
        hit_ratio = _ratio(new["should_hit"]["share"], old["should_hit"]["share"])
        rows.append(
            (f"{tag}: {name}, should-hit served", *_pair(new, old, "should_hit"), hit_ratio)
        )
        if key in PER_CATEGORY:
            for cat in ("paraphrase", "near_repeat"):
                label = f"{tag}: {name}, {cat.replace('_', ' ')}s served"
                rows.append((label, *_pair(new, old, cat), ""))
            for cat in ("negation", "number", "entity", "scope", "antonym"):
                label = f"{tag}: {name}, must-not {cat}"
                rows.append((label, *_pair(new, old, cat), ""))
        bound = f"{_pct(new['must_not']['upper_95'], 2)} upper 95%"
        old_bound = f"{_pct(old['must_not']['upper_95'], 2)} upper 95%"
        rows.append(
            (
                f"{tag}: {name}, must-not served (Clopper-Pearson bound)",
                f"{_served(new, 'must_not')}, {bound}",
                f"{_served(old, 'must_not')}, {old_bound}",
                "",
            )
        )
    return rows


def _pair(new: dict[str, Any], old: dict[str, Any], key: str) -> tuple[str, str]:
    return _served(new, key), _served(old, key)


def embedder_compare_rows(result: dict[str, Any]) -> list[Row]:
    """Each embedder's separation of the people's pairs and its CPU, against the gateway's."""
    runs = result["results"]
    base_key = "minilm" if "minilm" in runs else next(iter(runs))
    base = runs[base_key]
    rows: list[Row] = []
    for key, run in runs.items():
        human, cpu = run["human"], run["cpu"]
        label = f"{run['name']} ({run['backend']})"
        rows.append(
            (
                f"{label}: cosine ROC AUC, should-hit vs must-not ({result['split']} split)",
                f"{human['roc_auc']:.3f}",
                "" if key == base_key else f"{base['name']}: {base['human']['roc_auc']:.3f}",
                "" if key == base_key else _ratio(human["roc_auc"], base["human"]["roc_auc"]),
            )
        )
        rows.append(
            (
                f"{label}: should-hit served by a threshold at <= 1% must-not",
                _pct(human["should_hit_served"]),
                "" if key == base_key else _pct(base["human"]["should_hit_served"]),
                "",
            )
        )
        rows.append(
            (
                f"{label}: CPU ms per query, batch 1",
                f"{cpu['batch1_cpu_ms_p50']:.1f}",
                "" if key == base_key else f"{base['cpu']['batch1_cpu_ms_p50']:.1f}",
                ""
                if key == base_key
                else _ratio(cpu["batch1_cpu_ms_p50"], base["cpu"]["batch1_cpu_ms_p50"]),
            )
        )
    rows.append(("best within the lookup budget", result["best_within_budget"], "", ""))
    return rows


def nli_graph_rows(result: dict[str, Any]) -> list[Row]:
    """The rewritten NLI graph's CPU per pass, whole and cut in two, against the
    package's with its width opened."""
    rows = []
    for name, label in (("rewritten", "rewritten"), ("split", "rewritten, cut in two")):
        rows.append(
            (
                f"CPU ms per NLI pass, {label}, median of {result['passes']} "
                f"({result['word_pieces_median']:.0f} word pieces median)",
                f"{result[f'{name}_cpu_ms_p50']:.2f}",
                f"{result['baseline_cpu_ms_p50']:.2f}",
                f"{result[f'{name}_ratio_paired_median']:.3f} (paired)",
            )
        )
        rows.append(
            (f"{label}: every logit bit for bit", str(result[f"{name}_logits_bit_for_bit"]), "", "")
        )
    return rows


def cache_populated_rows(result: dict[str, Any]) -> list[Row]:
    """Held-out lookups in one populated scope: nli as recommended, its variant against it
    (same run: every candidate read since 2026-12-07, one read before), and the default."""
    rows: list[Row] = []
    for name, base_name in (
        ("nli_balanced", None),
        ("nli_balanced_one_read", "nli_balanced"),
        ("nli_balanced_every_read", "nli_balanced"),
        ("default", None),
    ):
        if name not in result:
            continue
        run, base = result[name], result[base_name] if base_name else None
        for label, figure in (
            ("should-hit served right (own or joined)", _served_right),
            ("wrong hits known, of all lookups (upper 95%)", _wrong_known),
            ("hits not judged", lambda r: str(r["wrong"]["unjudged"])),
        ):
            rows.append((f"{name}: {label}", figure(run), figure(base) if base else "", ""))
    return rows


def _served_right(run: dict[str, Any]) -> str:
    hit = run["should_hit"]
    return f"{hit['served_own'] + hit['served_joined']}/{hit['pairs']}"


def _wrong_known(run: dict[str, Any]) -> str:
    wrong = run["wrong"]
    return f"{wrong['known']}/{wrong['lookups']} ({wrong['upper_95']})"


def cache_followups_rows(result: dict[str, Any]) -> list[Row]:
    """Follow-ups served another conversation's answer, against a last-message-only key."""
    phases = result["phases"]
    base = phases["baseline_last_message_only"]
    rows: list[Row] = []
    for name in ("replay", "transplant"):
        t = phases[name]
        rows.append(
            (
                f"{name}: cross-conversation hits, of {t['requests']} requests",
                str(t["cross_conversation_hits"]),
                f"keyed on the last message: {base['cross_conversation_hits']} "
                f"of {base['requests']}",
                "",
            )
        )
    repeat = phases["repeat"]
    rows.append(("the same conversations again: served", _pct(repeat["served_rate"]), "", ""))
    return rows
