"""bench/greedy_agreement.py's measures (answers cut at a stop id, identical answers, first
differing token, token and teacher-forced agreement, flips at near ties, factual answers
lost or gained) and bench/act_quant_sites.py's rounding of chosen projections' inputs,
undone by the next configuration."""

import pytest
import torch

from bench import act_quant_sites as sites
from bench import greedy_agreement as ga


def test_until_stop_keeps_the_stop_id_and_drops_what_follows() -> None:
    assert ga.until_stop([5, 6, 2, 9, 9], {2}) == [5, 6, 2]
    assert ga.until_stop([5, 6], {2}) == [5, 6]


def test_agreement_counts_identical_answers_and_where_the_others_part() -> None:
    ref = [[1, 2, 3, 4], [1, 2, 3], [7, 8]]
    got = [[1, 2, 3, 4], [1, 9, 3, 5], [7]]
    a = ga.agreement(got, ref)
    assert a["identical"] == "1/3"
    assert a["median_first_diff_token"] == 1.0  # parts at 1 and at 1 (a shorter answer)
    # same tokens 4 + 2 + 1 over the longer answer's lengths 4 + 4 + 2
    assert a["token_agreement"] == round(7 / 10, 3)
    assert ga.agreement(ref, ref)["median_first_diff_token"] is None


def test_forced_agreement_counts_answer_positions_only() -> None:
    ref = [[9, 9, 1, 2, 3]]
    got = [[0, 0, 1, 5, 3]]  # the prompt's positions differ: not counted
    assert ga.forced_agreement(got, ref, [2]) == round(2 / 3, 4)


def test_margins_at_flips_reads_the_reference_gap_where_the_argmaxes_differ() -> None:
    ref, got = [[4, 4, 1, 2, 3]], [[0, 4, 1, 7, 8]]
    margins = [[9.0, 9.0, 5.0, 0.1, 0.3]]
    m = ga.margins_at_flips(got, ref, margins, [2])
    assert m == {"flips": 2, "fp32_margin_at_flips_median": 0.2, "fp32_margin_at_flips_max": 0.3}
    assert ga.margins_at_flips(ref, ref, margins, [2]) == {"flips": 0}


def test_fact_scores_name_answers_that_lost_or_gained_the_right_words() -> None:
    france, tokyo = "What is the capital of France?", "What is the capital of Japan?"
    texts = [
        {"prompt": france, "fp32": "It is Paris.", "x": "L'Etoile, la Cite"},
        {"prompt": tokyo, "fp32": "Kyoto.", "x": "Tokyo."},
        {"prompt": "Write a haiku about the sea.", "fp32": "a", "x": "b"},  # not a fact
    ]
    s = ga.fact_scores(texts, ["fp32", "x"])
    assert s["x"]["changed_vs_fp32"] == 2
    assert s["x"]["lost_right_answer"] == [france]
    assert s["x"]["gained_right_answer"] == [tokyo]
    assert s["fp32"]["right"] == f"1/{len(ga.FACTS)}"


def test_prompt_set_is_fixed_and_large_enough() -> None:
    assert len(ga.PROMPTS) >= 32 and len(set(ga.PROMPTS)) == len(ga.PROMPTS)
    assert set(ga.FACTS) <= set(ga.PROMPTS)
    assert "What is the capital of France?" in ga.FACTS


@pytest.mark.usefixtures("one_torch_thread")
def test_act_quant_sites_rounds_chosen_inputs_and_undoes_it() -> None:
    engine = ga.build("smollm2-135m", "fp32")
    model = engine.runner.model
    seq = ga.chat_ids(engine.tokenizer, "What is the capital of France?")
    logits = lambda: ga.precision.prefill_logits(engine.runner, seq)  # noqa: E731
    plain = logits()
    every = list(range(len(model.layers)))
    sites.configure(model, dict.fromkeys(sites.SITES, every))
    rounded = logits()
    assert not torch.equal(rounded, plain)
    assert (rounded - plain).abs().max() < 0.1 * plain.abs().max()  # a rounding, not noise
    sites.configure(model, {"down": [3]})  # replaces the configuration above
    one = logits()
    assert not torch.equal(one, plain) and not torch.equal(one, rounded)
    sites.configure(model, {})
    assert torch.equal(logits(), plain)
