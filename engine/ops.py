"""The model's per-layer steps: the matmuls and the fused steps around them. Two
implementations, chosen once when the runner is built (select_ops): NativeOps through the
C kernels (engine/csrc), TorchOps through torch ops when they cannot be built (no
compiler, or TIERGATE_NATIVE=0). Both are tested equal.

Matmuls: the weights are packed once (pack_weight). With the C kernels they become
panels [N / 16, K, 16] for gemm.c, which streams them ~20% faster than oneDNN at decode
batch sizes (8-64 rows) and keeps up with it on 2,000-row prefills. Without them,
oneDNN's blocked layout: on this AMD (AVX-512) CPU, MKL's sgemm behind F.linear reaches
~65 GFLOP/s per core at batch 64 where oneDNN reaches ~120-160, and a plain weight makes
oneDNN reorder it on every call. Panels are a lossless re-layout, so the model then
drops its plain weights (LlamaForCausalLM.drop_plain_weights); oneDNN's layout is opaque,
so on that path both copies stay (~520 MB more for SmolLM2-135M with its LM head).

With `weights="int8"` the projections and the LM head are requantized at load
(engine/quant.py): int8 panels for the C kernel (gemm_int8.c, on the path
engine/cpu_features.py picked), or plain int8 with its scales for the torch reference.
"""

import ctypes
import functools
from collections import Counter

import torch
import torch.nn.functional as F

from engine import kernel_choice, native
from engine.attention import AttentionContext, write_kv
from engine.block_weights import BlockWeight, blocks_reference
from engine.config import WEIGHT_FORMATS
from engine.cpu_features import bf16_path, cpu_features, int8_path, w8a8_path
from engine.packing import (
    AUTO_FORMATS,
    K_MULTIPLE,
    PACKERS,
    PANEL,
    Weight,
    is_bf16,
    is_panels,
    plain_shape,
    unpack_panels,
    weight_format,
)
from engine.quant import (
    Int8Weight,
    quantize_int8,
    quantize_w8a8,
    w8a8_panels,
    w8a8_reference,
)

Rope = tuple[torch.Tensor, torch.Tensor]  # (cos, sin) [T, 1, D/2] for the step's positions

_ONEDNN = torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")
_INT8_PATHS = {"generic": 0, "avx2": 1, "avx512": 2}  # gemm_int8_panels' path argument
_W8A8_PATHS = {"generic": 0, "avx2": 1, "vnni": 2}  # gemm_w8a8_panels' path argument
_BF16_PATHS = {"widen": 0, "avx512_bf16": 1}  # gemm_bf16_panels' path argument
# From this many rows a matmul is a prefill, where panels compete with torch's GEMM
PREFILL_ROWS = 128


def apply_rope(x: torch.Tensor, rope: Rope) -> torch.Tensor:
    """x [T, heads, D] rotated by position (half-split / NEOX layout)."""
    cos, sin = rope
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)


class TorchOps:
    """torch ops only: the fallback and the reference the C kernels are tested against."""

    kernels: ctypes.CDLL | None = None  # the C library, for attention and fused decode
    # where int8, w8a8 and bf16 weights are multiplied
    int8_path = w8a8_path = bf16_path = blocks_path = "torch"

    def __init__(self, weights: str = "fp32") -> None:
        if weights not in WEIGHT_FORMATS:
            raise ValueError(f"weights must be one of {WEIGHT_FORMATS}, not {weights!r}")
        self.weights = weights
        self.formats: Counter[str] = Counter()  # weights packed per format
        self.choices: dict[str, str] = {}  # measured decisions taken (kernel_choice key)

    def choice_info(self) -> dict[str, str]:
        """For the start-up log and /metrics: each weight format's kernel path ("none":
        unused), formats packed, and what won each measured comparison, counted per kind
        ("prefill_fp32=panels:5")."""
        wins = Counter(f"{k.split(':')[0]}={w}" for k, w in self.choices.items())
        used = ("int8", "w8a8", "bf16", "blocks")
        paths = {
            f"{f}_path": getattr(self, f"{f}_path") if self.formats[f] else "none" for f in used
        }
        return paths | {
            "weight_formats": _counts(self.formats),
            "measured": _counts(wins),
        }

    def pack_weight(
        self, weight: torch.Tensor, batch_hint: int, blocks: Int8Weight | BlockWeight | None = None
    ) -> Weight:
        """weight [N, K] in the layout `linear` runs fastest on: oneDNN's blocked layout
        where torch has it, else the weight itself; int8 weights: plain int8 + scales.
        "auto" is fp32 here: int8 on this path is only the reference, and slower.
        blocks: the same weight as the GGUF's own int8 blocks (plain w8a8, exactly
        `weight`), which w8a8 then uses instead of requantizing; "blocks" weights: the
        file's compact blocks (engine/block_weights.py), or w8a8 for a tensor with none."""
        if self.weights == "blocks":
            kept = isinstance(blocks, BlockWeight)
            packed = blocks if kept else quantize_w8a8(weight, panels=False)
            self.formats[weight_format(packed)] += 1
            return packed
        self.formats["fp32" if self.weights == "auto" else self.weights] += 1
        if self.weights == "int8":
            return quantize_int8(weight)
        if self.weights == "w8a8":
            return blocks if blocks is not None else quantize_w8a8(weight, panels=False)
        if self.weights == "bf16":
            return weight.detach().to(torch.bfloat16)
        if _ONEDNN:
            return torch.ops.mkldnn._reorder_linear_weight(weight, batch_hint)
        return weight

    def linear(
        self, x: torch.Tensor, weight: Weight, bias: torch.Tensor | None = None
    ) -> torch.Tensor:
        """x [M, K] @ weight.T (+ bias); weight as pack_weight returned it (or plain)."""
        if isinstance(weight, BlockWeight):
            return blocks_reference(x, weight, bias)
        if isinstance(weight, Int8Weight) and weight.group:
            return w8a8_reference(x, weight, bias)
        if isinstance(weight, Int8Weight):  # the reference: fp32 on the dequantized weight
            return F.linear(x, weight.dequantize(), bias)
        if is_bf16(weight):  # plain bf16 [N, K]: fp32 maths on the widened weight
            return F.linear(x, weight.float(), bias)
        if _ONEDNN:
            return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")
        return F.linear(x, weight, bias)

    def add_rms_norm(
        self, residual: torch.Tensor, x: torch.Tensor | None, weight: torch.Tensor, eps: float
    ) -> torch.Tensor:
        """residual += x in place (unless x is None), then RMSNorm(residual) * weight."""
        if x is not None:
            residual.add_(x)
        return F.rms_norm(residual, weight.shape, weight, eps)

    def silu_mul(self, gate_up: torch.Tensor) -> torch.Tensor:
        """[T, 2I] (gate | up) -> silu(gate) * up [T, I]."""
        gate, up = gate_up.split(gate_up.shape[1] // 2, dim=-1)
        return F.silu(gate) * up

    def rope_store_kv(
        self,
        qkv: torch.Tensor,
        rope: Rope,
        kv: tuple[torch.Tensor, torch.Tensor],
        ctx: AttentionContext,
        heads: int,
        kv_heads: int,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """qkv [T, (heads + 2 kv_heads) * D] -> rotated q [T, heads, D], k and v [T,
        kv_heads, D], with k and v stored in their KV pages."""
        t = qkv.shape[0]
        d = qkv.shape[1] // (heads + 2 * kv_heads)
        qk, v = qkv.split([(heads + kv_heads) * d, kv_heads * d], dim=-1)
        qk = apply_rope(qk.view(t, heads + kv_heads, d), rope)
        q, k, v = qk[:, :heads], qk[:, heads:], v.view(t, kv_heads, d)
        write_kv(kv[0], kv[1], k, v, ctx)
        return q, k, v


class NativeOps(TorchOps):
    """The C kernels; torch's oneDNN matmul for weights whose width does not fit panels."""

    def __init__(
        self,
        kernels: ctypes.CDLL,
        weights: str = "fp32",
        int8_path: str | None = None,
        w8a8_path: str | None = None,
        bf16_path: str | None = None,
    ) -> None:
        """int8_path: "avx512", "avx2", "generic" (portable C) or "torch" (the reference);
        w8a8_path: "vnni", "avx2" or "generic"; bf16_path: "avx512_bf16" or "widen";
        None: the best this CPU has (engine/cpu_features.py)."""
        super().__init__(weights)
        self.kernels = kernels
        self.int8_path = int8_path or _best_int8_path()
        self.w8a8_path = w8a8_path or _best_w8a8_path()
        self.bf16_path = bf16_path or _best_bf16_path()
        self.blocks_path = self.w8a8_path  # gemm_blocks.c: the same instruction sets
        self._prefill_torch: set[tuple[str, int, int]] = set()  # (format, N, K) torch won

    def pack_weight(
        self, weight: torch.Tensor, batch_hint: int, blocks: Int8Weight | BlockWeight | None = None
    ) -> Weight:
        """C GEMM panels [N / 16, K, 16] (3-D) when N is a whole number of panel pairs.
        weights "auto": the format (fp32, int8 or w8a8 panels) measured fastest at this
        shape, one stream and a decode batch together; all are within the quality bound
        (bench/precision.py: SmolLM2 int8 +0.41%, w8a8 +0.31% perplexity; bound +0.5%).
        blocks: as TorchOps.pack_weight's, re-laid into w8a8 panels."""
        n, k = weight.shape
        if self.weights == "blocks" and isinstance(blocks, BlockWeight):
            self.formats["blocks"] += 1
            return blocks  # no prefill choice: torch would dequantize it per call
        if n % (2 * PANEL) != 0 or (self.weights != "fp32" and self.int8_path == "torch"):
            return super().pack_weight(weight, batch_hint, blocks)
        # blocks: a tensor the file holds in no kept type is w8a8
        wanted = {"auto": AUTO_FORMATS, "blocks": ("w8a8",)}.get(self.weights, (self.weights,))
        names = [f for f in wanted if k % K_MULTIPLE.get(f, 1) == 0]
        if not names:  # w8a8 (bf16) with no whole groups (pairs) of k: the torch reference
            return super().pack_weight(weight, batch_hint, blocks)
        packed = self._pick_format(weight, names, batch_hint, blocks)
        self.formats[weight_format(packed)] += 1
        self._choose_prefill(packed)
        return packed

    def _pick_format(
        self, weight: torch.Tensor, names: list[str], batch_hint: int, blocks: Int8Weight | None
    ) -> Weight:
        """The one format asked for; else the stored winner, or all packed and timed."""
        rows = (1, min(batch_hint, 32))
        shape = (*weight.shape, rows[-1])
        fmt = names[0] if len(names) == 1 else kernel_choice.known("format", shape, names)
        if fmt is not None:
            if len(names) > 1:
                self.choices[kernel_choice.choice_key("format", shape)] = fmt
            return _packed(fmt, weight, blocks)
        packed = {f: _packed(f, weight, blocks) for f in names}
        xs = [torch.randn(m, weight.shape[1]) for m in rows]
        runs = {f: functools.partial(self._each, xs, w) for f, w in packed.items()}
        return packed[self._measure("format", shape, runs)]

    def _choose_prefill(self, weight: Weight) -> None:
        """Panels or torch (on the unpacked or dequantized weight) for prefill-sized row
        counts of this weight's shape, measured at PREFILL_ROWS."""
        fmt, (n, k) = weight_format(weight), plain_shape(weight)
        x = torch.randn(PREFILL_ROWS, k)
        runs = {
            "panels": functools.partial(self._panels_linear, x, weight),
            "torch": functools.partial(_torch_linear, x, weight),
        }
        if self._measure(f"prefill_{fmt}", (n, k), runs) == "torch":
            self._prefill_torch.add((fmt, n, k))

    def _measure(self, kind: str, shape: tuple[int, ...], runs: dict) -> str:
        winner = kernel_choice.choose(kind, shape, runs)
        self.choices[kernel_choice.choice_key(kind, shape)] = winner
        return winner

    def _each(self, xs: list[torch.Tensor], weight: Weight) -> None:
        for x in xs:
            self._panels_linear(x, weight)

    def linear(
        self, x: torch.Tensor, weight: Weight, bias: torch.Tensor | None = None
    ) -> torch.Tensor:
        if not is_panels(weight):
            return super().linear(x, weight, bias)
        prefill = x.shape[0] >= PREFILL_ROWS and bool(self._prefill_torch)
        if prefill and (weight_format(weight), *plain_shape(weight)) in self._prefill_torch:
            return _torch_linear(x, weight, bias)
        return self._panels_linear(x, weight, bias)

    def _panels_linear(
        self, x: torch.Tensor, weight: Weight, bias: torch.Tensor | None = None
    ) -> torch.Tensor:
        n, k = plain_shape(weight)
        x = x.contiguous()
        out = x.new_empty(x.shape[0], n)
        bias_ptr = None if bias is None else bias.data_ptr()
        if isinstance(weight, BlockWeight):
            args = (out.data_ptr(), x.data_ptr(), weight.data.data_ptr(), weight.panels.data_ptr())
            if self.kernels.gemm_blocks(*args, bias_ptr, x.shape[0], n, k, self.w8a8_code):
                raise MemoryError("blocks GEMM: no memory for its buffer")
            return out
        if is_bf16(weight):
            args = (out.data_ptr(), x.data_ptr(), weight.data_ptr(), bias_ptr)
            if self.kernels.gemm_bf16_panels(*args, x.shape[0], n, k, self.bf16_code):
                raise MemoryError("bf16 GEMM: no memory for its buffer")
            return out
        if not isinstance(weight, Int8Weight):
            args = (out.data_ptr(), x.data_ptr(), weight.data_ptr(), bias_ptr)
            self.kernels.gemm_panels(*args, x.shape[0], n, k)
            return out
        args = (out.data_ptr(), x.data_ptr(), weight.q.data_ptr(), weight.scale.data_ptr())
        gemm, path = (
            (self.kernels.gemm_w8a8_panels, self.w8a8_code)
            if weight.group
            else (self.kernels.gemm_int8_panels, self.int8_code)
        )
        failed = gemm(*args, bias_ptr, x.shape[0], n, k, path)
        if failed:
            raise MemoryError("int8 GEMM: no memory for its buffer")
        return out

    @property
    def int8_code(self) -> int:
        return _INT8_PATHS[self.int8_path]

    @property
    def w8a8_code(self) -> int:
        return _W8A8_PATHS[self.w8a8_path]

    @property
    def bf16_code(self) -> int:
        return _BF16_PATHS[self.bf16_path]

    def add_rms_norm(
        self, residual: torch.Tensor, x: torch.Tensor | None, weight: torch.Tensor, eps: float
    ) -> torch.Tensor:
        assert residual.is_contiguous() and (x is None or x.is_contiguous())
        out = torch.empty_like(residual)
        rows, dim = residual.shape
        x_ptr = None if x is None else x.data_ptr()
        self.kernels.add_rms_norm(
            out.data_ptr(), residual.data_ptr(), x_ptr, weight.data_ptr(), rows, dim, float(eps)
        )
        return out

    def silu_mul(self, gate_up: torch.Tensor) -> torch.Tensor:
        assert gate_up.is_contiguous()
        rows, width = gate_up.shape
        out = gate_up.new_empty(rows, width // 2)
        self.kernels.silu_mul(out.data_ptr(), gate_up.data_ptr(), rows, width // 2)
        return out

    def rope_store_kv(
        self,
        qkv: torch.Tensor,
        rope: Rope,
        kv: tuple[torch.Tensor, torch.Tensor],
        ctx: AttentionContext,
        heads: int,
        kv_heads: int,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """As TorchOps.rope_store_kv, rotating qkv in place."""
        t = qkv.shape[0]
        d = qkv.shape[1] // (heads + 2 * kv_heads)
        (k_pool, v_pool), (cos, sin) = kv, rope
        assert qkv.is_contiguous() and cos.is_contiguous() and sin.is_contiguous()
        assert k_pool.stride(0) == v_pool.stride(0)
        self.kernels.rope_store_kv(
            qkv.data_ptr(),
            cos.data_ptr(),
            sin.data_ptr(),
            t,
            heads,
            kv_heads,
            d,
            k_pool.data_ptr(),
            v_pool.data_ptr(),
            k_pool.stride(0),
            v_pool.shape[2],
            ctx.slot_pages.data_ptr(),
            ctx.slot_offsets.data_ptr(),
            int(k_pool.dtype == torch.bfloat16),
        )
        qkv = qkv.view(t, heads + 2 * kv_heads, d)
        return qkv[:, :heads], qkv[:, heads : heads + kv_heads], qkv[:, heads + kv_heads :]


def _packed(fmt: str, weight: torch.Tensor, blocks: Int8Weight | None) -> Weight:
    """weight in fmt's panels; w8a8 from the file's own blocks when there are some."""
    if fmt == "w8a8" and blocks is not None:
        return w8a8_panels(blocks)
    return PACKERS[fmt](weight)


def _torch_linear(x: torch.Tensor, panels: Weight, bias: torch.Tensor | None = None):
    """torch's GEMM on the plain weight rebuilt from panels, per call: at prefill sizes
    the re-layout (or dequantizing) costs a few % of the GEMM, and the choice measured it."""
    plain = panels.dequantize() if isinstance(panels, Int8Weight) else unpack_panels(panels)
    return F.linear(x, plain, bias)


def _counts(counter: Counter[str]) -> str:
    """ "a:3,b:1" (sorted; "none" when empty): one label value for the kernel-info gauge."""
    return ",".join(f"{name}:{n}" for name, n in sorted(counter.items())) or "none"


def _best_bf16_path() -> str:
    return bf16_path(cpu_features())


def _best_w8a8_path() -> str:
    return w8a8_path(cpu_features())


def _best_int8_path() -> str:
    path = int8_path(cpu_features())
    return "generic" if path == "torch" else path  # the C kernels' portable path beats torch


def select_ops(weights: str = "fp32") -> TorchOps:
    """The C kernels when they build and load here, else torch: decided once per runner."""
    kernels = native.kernels()
    return TorchOps(weights) if kernels is None else NativeOps(kernels, weights)
