"""Logit adjustments before sampling: logit_bias, min_tokens, and the repetition, frequency
and presence penalties, in vLLM's order and with vLLM's (OpenAI's, HF's) definitions.

Only the rows that ask for one are touched, in place, and every adjustment is one batched
tensor operation over [rows, vocab]: each row's token history becomes one padded index
tensor, and token counts come from a single scatter_add (no Python loop over the vocabulary).
"""

from collections.abc import Collection
from dataclasses import dataclass

import torch

from engine.sampling_params import SamplingParams


@dataclass
class History:
    """The tokens a row's next token follows: prompt then output so far."""

    token_ids: list[int]
    num_prompt_tokens: int

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens


def adjust_logits(
    logits: torch.Tensor,
    params: list[SamplingParams],
    histories: list[History | None],
    eos_ids: Collection[int],
) -> torch.Tensor:
    """logits [N, V], changed in place for the rows whose params ask for it; returned."""
    _add_bias(logits, params)
    _ban_stops(logits, params, histories, eos_ids)
    _penalise(logits, params, histories)
    return logits


def _add_bias(logits: torch.Tensor, params: list[SamplingParams]) -> None:
    rows, cols, values = [], [], []
    vocab = logits.shape[-1]
    for i, p in enumerate(params):
        for token, bias in p.logit_bias.items():
            if token < vocab:  # the engine refuses others; a padded vocab may be smaller
                rows.append(i)
                cols.append(token)
                values.append(bias)
    if rows:
        index = (torch.tensor(rows), torch.tensor(cols))
        logits.index_put_(index, torch.tensor(values, dtype=logits.dtype), accumulate=True)


def _ban_stops(
    logits: torch.Tensor,
    params: list[SamplingParams],
    histories: list[History | None],
    eos_ids: Collection[int],
) -> None:
    rows, cols = [], []
    vocab = logits.shape[-1]
    for i, (p, h) in enumerate(zip(params, histories, strict=True)):
        if p.min_tokens == 0 or h is None or h.num_output_tokens >= p.min_tokens:
            continue
        banned = set(p.stop_token_ids) | (set() if p.ignore_eos else set(eos_ids))
        for token in banned:
            if token < vocab:
                rows.append(i)
                cols.append(token)
    if rows:
        logits[torch.tensor(rows), torch.tensor(cols)] = float("-inf")


def _penalise(
    logits: torch.Tensor, params: list[SamplingParams], histories: list[History | None]
) -> None:
    rows = [
        i
        for i, p in enumerate(params)
        if histories[i] is not None
        and (p.presence_penalty or p.frequency_penalty or p.repetition_penalty != 1)
    ]
    if not rows:
        return
    vocab = logits.shape[-1]
    hist = [histories[i] for i in rows]
    sub = logits[rows]
    rep = torch.tensor([params[i].repetition_penalty for i in rows], dtype=logits.dtype)[:, None]
    if bool((rep != 1).any()):
        # HF / vLLM: every token seen in prompt or output is made less likely by the factor
        seen = _counts([h.token_ids for h in hist], vocab, logits.dtype) > 0  # type: ignore[union-attr]
        scaled = torch.where(sub > 0, sub / rep, sub * rep)
        sub = torch.where(seen, scaled, sub)
    freq = torch.tensor([params[i].frequency_penalty for i in rows], dtype=logits.dtype)[:, None]
    pres = torch.tensor([params[i].presence_penalty for i in rows], dtype=logits.dtype)[:, None]
    if bool((freq != 0).any() or (pres != 0).any()):
        # OpenAI: output tokens only, by count (frequency) and by having appeared (presence)
        outputs = [h.token_ids[h.num_prompt_tokens :] for h in hist]  # type: ignore[union-attr]
        counts = _counts(outputs, vocab, logits.dtype)
        sub = sub - freq * counts - pres * (counts > 0).to(logits.dtype)
    logits[rows] = sub


def _counts(token_lists: list[list[int]], vocab: int, dtype: torch.dtype) -> torch.Tensor:
    """[rows, vocab] occurrence counts, from one scatter_add over padded ids (pad = vocab)."""
    width = max(1, max(len(t) for t in token_lists))
    ids = torch.full((len(token_lists), width), vocab, dtype=torch.long)
    for r, tokens in enumerate(token_lists):
        if tokens:
            ids[r, : len(tokens)] = torch.tensor(tokens, dtype=torch.long).clamp_(max=vocab)
    counts = torch.zeros(len(token_lists), vocab + 1, dtype=dtype)
    counts.scatter_add_(1, ids, torch.ones_like(ids, dtype=dtype))
    return counts[:, :vocab]
