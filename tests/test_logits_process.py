"""Logit adjustments (bias, min_tokens, penalties) and logprobs, against plain-loop references."""

import math

import pytest
import torch

from engine.logits_process import History, adjust_logits
from engine.sampler import logprobs_of
from engine.sampling_params import SamplingParams

V = 50
EOS = (49,)


def reference(logits: torch.Tensor, p: SamplingParams, h: History | None) -> torch.Tensor:
    """vLLM's definitions, one token at a time."""
    row = logits.clone()
    for token, bias in p.logit_bias.items():
        row[token] += bias
    if h is not None and h.num_output_tokens < p.min_tokens:
        for token in set(p.stop_token_ids) | set(EOS):
            row[token] = -math.inf
    if h is None:
        return row
    output = h.token_ids[h.num_prompt_tokens :]
    for token in set(h.token_ids):
        if p.repetition_penalty != 1:
            value = row[token]
            row[token] = value / p.repetition_penalty if value > 0 else value * p.repetition_penalty
    for token in set(output):
        row[token] -= p.frequency_penalty * output.count(token) + p.presence_penalty
    return row


def test_mixed_batch_matches_the_reference_and_leaves_plain_rows_alone() -> None:
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(5, V, generator=gen) * 3
    params = [
        SamplingParams(),
        SamplingParams(presence_penalty=0.7, frequency_penalty=0.4),
        SamplingParams(repetition_penalty=1.5, logit_bias={3: 5.0, 7: -100.0}),
        SamplingParams(min_tokens=3, stop_token_ids=[4], frequency_penalty=-1.0),
        SamplingParams(logit_bias={0: 1.5}),
    ]
    histories = [
        None,
        History([1, 2, 3, 5, 5, 5, 9], 3),
        History([8, 8, 8, 3, 1], 4),
        History([10, 11, 12, 12], 2),
        None,
    ]
    expected = torch.stack([reference(logits[i], params[i], histories[i]) for i in range(5)])
    got = adjust_logits(logits.clone(), params, histories, EOS)
    torch.testing.assert_close(got, expected)
    assert torch.equal(got[0], logits[0])  # a row that asked for nothing is untouched


def test_min_tokens_lifts_the_ban_once_enough_tokens_are_out() -> None:
    params = [SamplingParams(min_tokens=2, stop_token_ids=[4])]
    before = adjust_logits(torch.zeros(1, V), params, [History([1, 2, 3], 2)], EOS)
    assert before[0, 4] == -math.inf and before[0, 49] == -math.inf and before[0, 5] == 0
    after = adjust_logits(torch.zeros(1, V), params, [History([1, 2, 3, 6], 2)], EOS)
    assert torch.equal(after, torch.zeros(1, V))
    ignoring = [SamplingParams(min_tokens=2, ignore_eos=True)]
    kept = adjust_logits(torch.zeros(1, V), ignoring, [History([1], 1)], EOS)
    assert kept[0, 49] == 0  # with ignore_eos EOS is no stop, so nothing to ban


def test_logprobs_are_the_log_softmax_at_the_chosen_and_top_tokens() -> None:
    logits = torch.randn(3, V, generator=torch.Generator().manual_seed(1))
    logits[2, 6] = -math.inf  # a banned token reports the floor, which JSON can carry
    params = [SamplingParams(logprobs=3), SamplingParams(), SamplingParams(logprobs=0)]
    out = logprobs_of(logits, [5, 6, 6], params)
    full = torch.log_softmax(logits, dim=-1)
    first = out[0]
    assert first is not None and out[1] is None
    assert first.token_id == 5 and first.logprob == pytest.approx(full[0, 5].item(), abs=1e-5)
    values, ids = full[0].topk(3)
    assert first.top_ids == ids.tolist()
    assert first.top_logprobs == pytest.approx(values.tolist(), abs=1e-5)
    last = out[2]
    assert last is not None and last.top_ids == [] and last.logprob == -9999.0


def test_penalties_need_no_loop_over_the_vocabulary() -> None:
    # A full-size vocabulary and long histories: a per-entry Python loop would take seconds.
    vocab, rows = 49152, 16
    logits = torch.randn(rows, vocab)
    params = [SamplingParams(frequency_penalty=0.5, repetition_penalty=1.2)] * rows
    histories = [History(list(range(r, 4000 + r)), 2000) for r in range(rows)]
    got = adjust_logits(logits.clone(), params, histories, EOS)
    value = logits[0, 2500].item()
    assert got[0, 2500].item() == pytest.approx(
        (value / 1.2 if value > 0 else value * 1.2) - 0.5, abs=1e-5
    )
    assert torch.equal(got[:, 5000:], logits[:, 5000:])  # unseen tokens keep their logits
