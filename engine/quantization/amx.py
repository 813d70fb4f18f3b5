"""Whether w8a8 and bf16 run on our AMX tile kernels (engine/csrc/gemm_amx.c: path 3 of
gemm_w8a8_panels, path 2 of gemm_bf16_panels): only where engine/cpu_features.py found
AMX (int8 / bf16 tiles) and Linux granted the tile state (arch_prctl), the compiler built
the tile code (engine/native.py), and, once per process, the kernel agrees with the AVX-512
path on a small product (w8a8: the same bits; bf16: up to the order of fp32 additions): a
tile kernel must not be trusted blind on a CPU it never ran on. That check runs first in a
child process (`_survives_in_child`): a tile configuration this CPU model rejects faults
(SIGILL / SIGSEGV), and a fault must cost the tile path, not the engine. Their figures are to be
taken on an AMX CPU.
"""

import ctypes
import functools
import logging
import os
import subprocess
import sys
from pathlib import Path

import torch

from engine.cpu_features import cpu_features
from engine.quantization.packing import bf16_panels
from engine.quantization.quant import Int8Weight, quantize_w8a8

log = logging.getLogger(__name__)

PATH_CODES = {"vnni": 2, "amx": 3}  # gemm_w8a8_panels' path argument
BF16_CODES = {"avx512_bf16": 1, "amx": 2}  # gemm_bf16_panels'


def compiled(kernels: ctypes.CDLL | None) -> bool:
    return kernels is not None and bool(kernels.w8a8_amx_compiled())


@functools.cache
def tiles_usable(kernels: ctypes.CDLL) -> bool:
    """True where the tile path may run here (and it agreed with VNNI)."""
    features = cpu_features()
    if not (features["amx"] and features["avx512_vnni"] and compiled(kernels)):
        return False
    agrees = _survives_in_child("int8") and _agrees_with_vnni(kernels)
    if not agrees:
        log.warning("the AMX w8a8 kernel disagrees with the VNNI path here: not used")
    return agrees


@functools.cache
def bf16_tiles_usable(kernels: ctypes.CDLL) -> bool:
    """True where the bf16 tile path may run here (and it agreed with avx512_bf16)."""
    features = cpu_features()
    if not (features["amx_bf16"] and features["avx512_bf16"] and compiled(kernels)):
        return False
    if not _survives_in_child("bf16"):
        return False
    agrees = bf16_agrees(kernels)
    if not agrees:
        log.warning("the AMX bf16 kernel disagrees with the avx512_bf16 path here: not used")
    return agrees


def bf16_agrees(kernels: ctypes.CDLL) -> bool:
    gen = torch.Generator().manual_seed(0)
    w = bf16_panels(torch.randn(64, 128, generator=gen))
    x = torch.randn(19, 128, generator=gen)
    tiles, vector = bf16_gemm(kernels, x, w, "amx"), bf16_gemm(kernels, x, w, "avx512_bf16")
    return torch.allclose(tiles, vector, rtol=1e-4, atol=1e-4)


def bf16_gemm(kernels: ctypes.CDLL, x: torch.Tensor, w: torch.Tensor, path: str):
    """x [M, K] @ w.T on gemm_bf16_panels' `path` (w: bf16 panels)."""
    n, k, m = w.shape[0] * 16, x.shape[1], x.shape[0]
    out = x.new_empty(m, n)
    ptrs = (out.data_ptr(), x.data_ptr(), w.data_ptr(), None)
    if kernels.gemm_bf16_panels(*ptrs, m, n, k, BF16_CODES[path]):
        raise MemoryError(f"bf16 GEMM on {path}: no memory for its buffer (or not built)")
    return out


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


_ROOT = Path(__file__).resolve().parents[2]  # the folder holding the engine package
_CHILD_CHECK = """
import sys
from engine import native
from engine.cpu_features import cpu_features
from engine.quantization import amx
cpu_features()  # asks Linux for the tile state in this process too
kernels = native.kernels()
ok = amx.bf16_agrees(kernels) if sys.argv[1] == "bf16" else amx._agrees_with_vnni(kernels)
sys.exit(0 if ok else 3)
"""


@functools.cache
def _survives_in_child(kind: str) -> bool:
    """The agreement check for `kind` (int8 or bf16) in a child process: True if it ran
    and agreed; False if it faulted, disagreed or did not finish."""
    path = os.pathsep.join(p for p in (str(_ROOT), os.environ.get("PYTHONPATH")) if p)
    env = {**os.environ, "PYTHONPATH": path, "OMP_NUM_THREADS": "1"}
    try:
        done = subprocess.run(
            [sys.executable, "-c", _CHILD_CHECK, kind], env=env, capture_output=True, timeout=300
        )
    except subprocess.TimeoutExpired:
        log.warning("the AMX %s check did not finish in a child process: tiles not used", kind)
        return False
    if done.returncode != 0:
        log.warning(
            "the AMX %s check failed in a child process (exit %s): tiles not used\n%s",
            kind, done.returncode, done.stderr.decode(errors="replace")[-2000:],
        )  # fmt: skip
    return done.returncode == 0
