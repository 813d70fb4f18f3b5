"""Next-token sampling: greedy, temperature, top-k, top-p, per-request generators.

Filtering is vectorised over the batch (one sort for all rows that need top-k/top-p).
The random draw uses the exponential-race trick (argmax of p / Exp(1) noise), so each
row can take its noise from its own torch.Generator, which makes seeded requests
reproducible whatever else shares the batch.
"""

import torch

from engine.sampling_params import SamplingParams


def make_generator(params: SamplingParams) -> torch.Generator | None:
    """The per-request generator a SeqChunk carries: seeded when params.seed is set."""
    if params.seed is None:
        return None
    return torch.Generator().manual_seed(params.seed)


def sample(
    logits: torch.Tensor,
    params: list[SamplingParams],
    generators: list[torch.Generator | None],
) -> list[int]:
    """logits [N, V] (fp32) -> one token id per row."""
    out = logits.argmax(dim=-1)
    rows = [i for i, p in enumerate(params) if not p.greedy]
    if rows:
        idx = torch.tensor(rows)
        probs = _filtered_probs(logits[idx], [params[i] for i in rows])
        out[idx] = _draw(probs, [generators[i] for i in rows])
    return out.tolist()


def _filtered_probs(logits: torch.Tensor, params: list[SamplingParams]) -> torch.Tensor:
    temps = torch.tensor([p.temperature for p in params], dtype=logits.dtype)
    logits = logits / temps[:, None]
    if any(p.top_k > 0 or p.top_p < 1.0 for p in params):
        logits = _top_k_top_p(logits, params)
    return torch.softmax(logits, dim=-1)


def _top_k_top_p(logits: torch.Tensor, params: list[SamplingParams]) -> torch.Tensor:
    vocab = logits.shape[-1]
    top_k = torch.tensor([p.top_k if p.top_k > 0 else vocab for p in params])
    top_p = torch.tensor([p.top_p for p in params], dtype=logits.dtype)
    sorted_logits, order = logits.sort(dim=-1, descending=True)
    ranks = torch.arange(vocab)[None, :]
    drop = ranks >= top_k[:, None]
    probs = torch.softmax(sorted_logits.masked_fill(drop, float("-inf")), dim=-1)
    # keep the smallest prefix whose mass reaches top_p: drop a token when the mass
    # before it already does (the top token is always kept)
    before = probs.cumsum(dim=-1) - probs
    drop |= before >= top_p[:, None]
    drop[:, 0] = False
    sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
    return torch.empty_like(logits).scatter_(-1, order, sorted_logits)


def _draw(probs: torch.Tensor, generators: list[torch.Generator | None]) -> torch.Tensor:
    noise = torch.empty_like(probs)
    shared = [i for i, g in enumerate(generators) if g is None]
    if shared:  # rows without a generator draw from the global one in a single call
        noise[shared] = torch.empty(len(shared), probs.shape[1]).exponential_()
    for i, g in enumerate(generators):
        if g is not None:
            noise[i].exponential_(generator=g)
    return (probs / noise).argmax(dim=-1)
