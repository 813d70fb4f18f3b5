"""Logit adjustments before sampling: logit_bias, min_tokens, and the repetition, frequency
and presence penalties, in vLLM's order and with vLLM's (OpenAI's, HF's) definitions.

Only the rows that ask for one are touched, in place, and each adjustment is a few batched
tensor operations: each row's token history becomes one padded index tensor, penalties read
and write only those columns, and token counts come from a single scatter_add (no Python
loop over the vocabulary).
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
    """Only the columns of tokens a row has seen are read and written ([rows, history]),
    never a [rows, vocab] copy: at 49k tokens a full-width pass costs more than all this."""
    rows = [
        i
        for i, p in enumerate(params)
        if histories[i] is not None
        and (p.presence_penalty or p.frequency_penalty or p.repetition_penalty != 1)
    ]
    if not rows:
        return
    hist: list[History] = [histories[i] for i in rows]  # type: ignore[misc]
    row = torch.tensor(rows)[:, None]
    rep = torch.tensor([params[i].repetition_penalty for i in rows], dtype=logits.dtype)[:, None]
    if bool((rep != 1).any()):
        # HF / vLLM: every token seen in prompt or output is made less likely by the factor
        ids, _ = _padded([h.token_ids for h in hist])
        seen = logits[row, ids]
        logits[row, ids] = torch.where(seen > 0, seen / rep, seen * rep)
    freq = torch.tensor([params[i].frequency_penalty for i in rows], dtype=logits.dtype)[:, None]
    pres = torch.tensor([params[i].presence_penalty for i in rows], dtype=logits.dtype)[:, None]
    if bool((freq != 0).any() or (pres != 0).any()):
        # OpenAI: output tokens only, by count (frequency) and by having appeared (presence)
        ids, counted = _padded([h.token_ids[h.num_prompt_tokens :] for h in hist])
        vocab = logits.shape[-1]
        counted = torch.where(counted < 0, vocab, counted)  # padding lands in a spare column
        counts = torch.zeros(len(rows), vocab + 1, dtype=logits.dtype)
        counts.scatter_add_(1, counted, torch.ones_like(counted, dtype=logits.dtype))
        n = counts.gather(1, ids)  # a padding column of an empty row counts 0: unchanged
        logits[row, ids] = logits[row, ids] - freq * n - pres * (n > 0).to(logits.dtype)


def _padded(token_lists: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    """[rows, longest] ids padded with the row's first id (a repeat writes the same value
    twice; an empty row pads with 0), and the same padded with -1, for counting."""
    width = max(1, max(len(t) for t in token_lists))
    ids = torch.zeros(len(token_lists), width, dtype=torch.long)
    counted = torch.full((len(token_lists), width), -1, dtype=torch.long)
    for r, tokens in enumerate(token_lists):
        if tokens:
            row = torch.tensor(tokens, dtype=torch.long)
            ids[r] = row[0]
            ids[r, : len(tokens)] = row
            counted[r, : len(tokens)] = row
    return ids, counted
