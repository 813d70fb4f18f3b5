"""One decode step run by hand on a ModelRunner: the fused C path against layer by layer."""

import torch

from engine.attention import build_context
from engine.batch import SeqChunk
from engine.runner import ModelRunner
from engine.sampling_params import SamplingParams

GREEDY = SamplingParams(temperature=0)


def decode_logits(r: ModelRunner, text: str, fused: bool) -> torch.Tensor:
    """Prefill all of `text` but its last token, then decode that token: its logits, from
    the fused decode step or from the model layer by layer."""
    ids = r.tokenizer.encode(text)
    pages = [0, 1, 2]
    with torch.inference_mode():
        prefill = SeqChunk(0, ids[:-1], 0, pages, True, GREEDY)
        ctx = build_context([prefill], 16, kernels=r.ops.kernels)
        r.model(torch.tensor(ids[:-1]), torch.arange(len(ids) - 1), ctx, r.kv_caches)
        decode = SeqChunk(0, ids[-1:], len(ids) - 1, pages, True, GREEDY)
        ctx = build_context([decode], 16, kernels=r.ops.kernels)
        ids_t, pos = torch.tensor(ids[-1:]), torch.tensor([len(ids) - 1])
        if fused:
            scratch = torch.empty(r.fused.workspace_floats(1))
            return r.fused.logits(ids_t, r.model.rotary(pos), ctx, scratch)[0]
        return r.model.compute_logits(r.model(ids_t, pos, ctx, r.kv_caches))[0]
