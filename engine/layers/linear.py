"""Linear, a projection whose matmul is bound once to its weight format's kernel, and
DeclaresProjections, what quantization needs to know of a model.

A fused projection (q|k|v, gate|up: one matmul instead of several) names its parts, as the
model files hold them, in `parts`: loading fuses them, and a GGUF's own blocks of each part
are stacked in that order (engine/quantization/gguf_blocks.py).
"""

from collections.abc import Callable
from typing import Protocol

import torch
from torch import nn

from engine.layers.direct import Direct
from engine.ops import TorchOps
from engine.quantization.block_weights import BlockWeight
from engine.quantization.packing import Weight, is_panels
from engine.quantization.quant import Int8Weight

Parts = tuple[tuple[str, int], ...]  # (sibling name in the model files, output rows), stacked


class Linear(Direct, nn.Linear):
    packed: Weight | None = None  # the weight in ops.pack_weight's layout (and format)
    matmul: Callable[..., torch.Tensor] | None = None  # (x, bias) -> x @ packed.T (+ bias)
    # the GGUF's own blocks of it (w8a8's int8 ones, or "blocks" weights'), until packed
    blocks: Int8Weight | BlockWeight | None = None

    def __init__(
        self, ops: TorchOps, in_features: int, out_features: int, bias: bool, parts: Parts = ()
    ) -> None:
        """parts: a fused projection's parts (their rows add up to out_features); () for one
        the files hold under its own name."""
        super().__init__(in_features, out_features, bias=bias)
        assert not parts or sum(rows for _, rows in parts) == out_features
        self.ops, self.parts = ops, parts

    def sources(self, name: str) -> list[tuple[str, int]]:
        """The model files' names of this projection's weights (name: its own module name),
        each with its rows, in the order they are stacked."""
        if not self.parts:
            return [(name, self.out_features)]
        parent = name.rpartition(".")[0]
        return [(f"{parent}.{part}" if parent else part, rows) for part, rows in self.parts]

    def pack(self, batch_hint: int) -> None:
        """Pack the weight once (same results); forward uses only the packed copy."""
        if self.packed is None:
            self.packed = self.ops.pack_weight(self.weight, batch_hint, self.blocks)
            self.matmul = self.ops.bound(self.packed)  # its kernel, chosen once
            self.blocks = None

    def drop_plain_weight(self) -> None:
        """Forget .weight when the packed copy is what forward uses and can give it back:
        C GEMM panels (a re-layout) or int8 weights (the format asked for); oneDNN's
        blocked layout is opaque, so that weight stays."""
        if is_panels(self.packed) or isinstance(self.packed, Int8Weight):
            self.weight = None

    def plain_weight(self) -> torch.Tensor:
        """The [out, in] weight forward multiplies by, rebuilt from the packed copy when it
        was dropped (int8: the dequantized weight)."""
        if self.weight is not None:
            return self.weight
        assert self.packed is not None
        return self.ops.method_of(self.packed).plain(self.packed)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.matmul is None:
            return self.ops.linear(x, self.weight, self.bias)
        return self.matmul(x, self.bias)


class DeclaresProjections(Protocol):
    """A model as weight loading and the GGUF block formats see it."""

    embed_tokens: nn.Embedding
    lm_head: Linear | None  # None: the head is the embedding (tied)
    head_blocks: Int8Weight | BlockWeight | None  # a tied head's file blocks, until packed

    def projections(self) -> dict[str, Linear]:
        """Every layer's projections by module name ("layers.0.self_attn.qkv_proj"), the
        names the model's state dict uses; not the LM head."""
        ...
