"""LinearMethod: one weight format, as vLLM's quantization methods are (create_weights /
apply): how a weight [N, K] is packed and how x is multiplied by it, on the C kernels'
panels (engine/csrc/gemm*.c) or on the torch reference the kernels are tested against.
engine/quantization/matmuls.py picks the method of each weight once, when it is packed."""

import ctypes
from typing import ClassVar

import torch

from engine.quantization.packing import Weight


class LinearMethod:
    name: ClassVar[str]
    k_multiple: ClassVar[int] = 1  # panels need K a multiple of this
    paths: ClassVar[dict[str, int]] = {}  # the C kernel's paths -> its path argument

    def __init__(self, kernels: ctypes.CDLL | None, path: str | None = None) -> None:
        """path: the C kernel's path (None: the best this CPU has); "torch" without kernels."""
        self.kernels = kernels
        self.path = "torch" if kernels is None else path or self.best_path()

    @property
    def code(self) -> int:
        """The C kernel's path argument."""
        return self.paths[self.path]

    def best_path(self) -> str:
        return "native"

    def reference_pack(
        self, weight: torch.Tensor, blocks: Weight | None, batch_hint: int
    ) -> Weight:
        """weight as the torch reference multiplies by it; blocks: the file's own (GGUF)."""
        raise NotImplementedError

    def reference(self, x: torch.Tensor, w: Weight, bias: torch.Tensor | None) -> torch.Tensor:
        """x [M, K] @ w.T (+ bias) in torch, w as reference_pack (or panels) gave it."""
        raise NotImplementedError

    def panels(self, weight: torch.Tensor, blocks: Weight | None) -> Weight:
        """weight in the C kernel's panels (N a whole number of panel pairs)."""
        raise NotImplementedError

    def gemm(self, out: torch.Tensor, x: torch.Tensor, w: Weight, bias_ptr: int | None) -> int:
        """The C kernel: out [M, N] = x [M, K] @ w.T (+ bias); nonzero when out of memory."""
        raise NotImplementedError

    def plain(self, w: Weight) -> torch.Tensor:
        """The fp32 [N, K] weight panels stand for (torch's GEMM for prefills)."""
        raise NotImplementedError

    def decode_view(self, w: Weight) -> tuple[int, int, int]:
        """w as decode_step.c reads a projection: its values' address, its scales' (0:
        none), and the kernel flag (0 fp32 or int8, the group for w8a8, -1 bf16, -2 blocks)."""
        raise NotImplementedError
