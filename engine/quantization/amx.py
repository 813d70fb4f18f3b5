"""Whether w8a8 runs on our AMX tile kernel (engine/csrc/gemm_amx.c, gemm_w8a8_panels'
path 3): only where engine/cpu_features.py found AMX and Linux granted the tile state
(arch_prctl), the compiler built the tile code (engine/native.py), and, once per process,
the kernel gives the AVX512-VNNI path's bits on a small product (a tile kernel must not be
trusted blind on a CPU it never ran on). Its figures are to be taken on an AMX CPU.
"""

import ctypes
import functools
import logging

import torch

from engine.cpu_features import cpu_features
from engine.quantization.quant import Int8Weight, quantize_w8a8

log = logging.getLogger(__name__)

PATH_CODES = {"vnni": 2, "amx": 3}  # gemm_w8a8_panels' path argument


def compiled(kernels: ctypes.CDLL | None) -> bool:
    return kernels is not None and bool(kernels.w8a8_amx_compiled())


@functools.cache
def tiles_usable(kernels: ctypes.CDLL) -> bool:
    """True where the tile path may run here (and it agreed with VNNI)."""
    features = cpu_features()
    if not (features["amx"] and features["avx512_vnni"] and compiled(kernels)):
        return False
    agrees = _agrees_with_vnni(kernels)
    if not agrees:
        log.warning("the AMX w8a8 kernel disagrees with the VNNI path here: not used")
    return agrees


def gemm(kernels: ctypes.CDLL, x: torch.Tensor, w: Int8Weight, path: str) -> torch.Tensor:
    """x [M, K] @ w.T on gemm_w8a8_panels' `path` (w: w8a8 panels)."""
    (n, k), m = w.shape, x.shape[0]
    out = x.new_empty(m, n)
    ptrs = (out.data_ptr(), x.data_ptr(), w.q.data_ptr(), w.scale.data_ptr(), None)
    if kernels.gemm_w8a8_panels(*ptrs, m, n, k, PATH_CODES[path]):
        raise MemoryError(f"w8a8 GEMM on {path}: no memory for its buffers (or not built)")
    return out


def _agrees_with_vnni(kernels: ctypes.CDLL) -> bool:
    gen = torch.Generator().manual_seed(0)
    w = quantize_w8a8(torch.randn(64, 128, generator=gen), panels=True)
    x = torch.randn(19, 128, generator=gen)  # a whole tile of rows and a part of one
    return torch.equal(gemm(kernels, x, w, "amx"), gemm(kernels, x, w, "vnni"))
