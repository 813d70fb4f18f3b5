"""The runner's matmuls: which weight format each projection is packed in, and the method
that multiplies by it (engine/quantization/method.py), on the C kernels' panels when
they loaded (NativeOps) or on torch (TorchOps, the fallback and the reference).

weights "auto" packs each shape in the format (fp32, int8, w8a8 panels, or a GGUF's kept
blocks) fastest on this CPU as a decode step streams it
(engine/quantization/memory_roofline.py); every panel weight also gets a choice per row
class (ROW_CLASSES): its panels, torch's GEMM on the rebuilt weight, or a oneDNN GEMM on a
copy of its own (engine/quantization/onednn.py: bf16 and int8, on AMX tiles where the CPU
has them); engine/quantization/kernel_choice.py keeps the decisions per CPU.
"""

import bisect
import ctypes
import functools
from collections import Counter
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from engine.config import WEIGHT_FORMATS
from engine.quantization import kernel_choice, onednn
from engine.quantization import memory_roofline as roofline
from engine.quantization.bf16 import Bf16
from engine.quantization.block_weights import BlockWeight
from engine.quantization.blocks import Blocks
from engine.quantization.fp32 import Fp32
from engine.quantization.int8 import Int8
from engine.quantization.method import LinearMethod
from engine.quantization.packing import PANEL, Weight, is_panels, plain_shape, weight_format
from engine.quantization.w8a8 import W8A8

METHODS: tuple[type[LinearMethod], ...] = (Fp32, Bf16, Int8, W8A8, Blocks)  # the registry
# "auto"'s candidates, and "blocks" where the file kept some; all are within the quality
# bound (bench/precision.py: SmolLM2 int8 +0.41%, w8a8 +0.31%, blocks +0.34% perplexity;
# bound +0.5%); bf16 never won where w8a8 runs (docs/engine.md)
AUTO_FORMATS = ("fp32", "int8", "w8a8")
# From this many rows a matmul is a prefill (the largest row class)
PREFILL_ROWS = 128
# Row counts each panel weight's paths are measured at: a call of M rows takes the decision
# of the largest class <= M (2-31 rows: one row's; 128 and more: PREFILL_ROWS')
ROW_CLASSES = (1, 32, PREFILL_ROWS)
GivenBlocks = Weight | roofline.KeptBlocks  # a GGUF's own blocks of a weight, as attached


class Matmuls:
    """A runner's matmuls, for `weights` (engine/config.py's WEIGHT_FORMATS)."""

    def __init__(
        self, weights: str, kernels: ctypes.CDLL | None, paths: dict[str, str | None]
    ) -> None:
        """paths: a format's C kernel path (missing or None: the best this CPU has)."""
        if weights not in WEIGHT_FORMATS:
            raise ValueError(f"weights must be one of {WEIGHT_FORMATS}, not {weights!r}")
        self.weights = weights
        self.kernels = kernels  # the C library (None: torch only), also for attention
        paths = {"blocks": paths.get("w8a8"), **paths}  # gemm_blocks: w8a8's instructions
        self.methods = {m.name: m(kernels, paths.get(m.name)) for m in METHODS}
        self.formats: Counter[str] = Counter()  # weights packed per format
        self.choices: dict[str, str] = {}  # measured decisions taken (kernel_choice key)
        # id(packed weight) -> the weight and its paths per row class, where not all panels
        self._plans: dict[int, tuple[Weight, RowPlan]] = {}

    @property
    def int8_path(self) -> str:
        return self.methods["int8"].path

    @property
    def w8a8_path(self) -> str:
        return self.methods["w8a8"].path

    @property
    def bf16_path(self) -> str:
        return self.methods["bf16"].path

    def choice_info(self) -> dict[str, str]:
        """For the start-up log and /metrics: each weight format's kernel path ("none":
        unused), formats packed, and what won each measured comparison, counted per kind
        ("gemm_fp32=panels:15": 5 shapes x 3 row classes)."""
        wins = Counter(f"{k.split(':')[0]}={w}" for k, w in self.choices.items())
        used = ("int8", "w8a8", "bf16", "blocks")
        paths = {f"{f}_path": self.methods[f].path if self.formats[f] else "none" for f in used}
        return paths | {"weight_formats": _counts(self.formats), "measured": _counts(wins)}

    def pack_weight(
        self, weight: torch.Tensor, batch_hint: int, blocks: GivenBlocks | None = None
    ) -> Weight:
        """weight [N, K] packed once in its format's layout: C panels when N is a whole
        number of panel pairs (and K fits the format), else the torch reference's. blocks:
        the file's own blocks of it (w8a8: plain int8 ones, used instead of requantizing;
        "blocks": the records, or w8a8 for a tensor the file holds in no kept type; auto:
        both, memory_roofline.KeptBlocks, where the file kept some)."""
        if self.weights == "blocks" and isinstance(blocks, BlockWeight):
            names = ("blocks",)
        elif self.weights == "blocks":
            names, blocks = ("w8a8",), None
        elif self.weights == "auto":
            names = tuple(roofline.with_blocks(list(AUTO_FORMATS), blocks))
        else:
            names = (self.weights,)
        packed = self._pack(weight, names, batch_hint, blocks)
        self.formats[weight_format(packed)] += 1
        return packed

    def _pack(
        self,
        weight: torch.Tensor,
        names: tuple[str, ...],
        batch_hint: int,
        blocks: GivenBlocks | None,
    ) -> Weight:
        n, k = weight.shape
        if names == ("blocks",):
            return blocks  # the C kernel's own layout; no prefill choice: torch dequantizes
        torch_int8 = self.weights != "fp32" and self.int8_path == "torch"
        fits = self.kernels is not None and n % (2 * PANEL) == 0 and not torch_int8
        wanted = [f for f in names if k % self.methods[f].k_multiple == 0] if fits else []
        if not wanted:  # "auto" is fp32 here: int8 on torch is only the reference, and slower
            kept = roofline.kept_form(names[0], blocks)
            return self.methods[names[0]].reference_pack(weight, kept, batch_hint)
        packed = self._pick_format(weight, wanted, batch_hint, blocks)
        if not isinstance(packed, BlockWeight):  # torch would dequantize blocks per call
            self._choose_rows(packed, weight, batch_hint)
        return packed

    def _pick_format(
        self, weight: torch.Tensor, names: list[str], batch_hint: int, blocks: GivenBlocks | None
    ) -> Weight:
        """The one format asked for; else the stored winner, or all packed and costed as a
        decode step streams them, at one stream and a decode batch (memory_roofline)."""
        rows = (1, min(batch_hint, 32))
        shape = roofline.choice_shape((*weight.shape, rows[-1]), blocks)
        fmt = names[0] if len(names) == 1 else kernel_choice.known("format", shape, names)
        if fmt is not None:
            if len(names) > 1:
                self.choices[kernel_choice.choice_key("format", shape)] = fmt
            return self._panels(fmt, weight, blocks)
        packed = {f: self._panels(f, weight, blocks) for f in names}
        cost = roofline.step_cost(rows, self._gemm_any)
        return packed[self._measure("format", shape, packed, cost)]

    def _panels(self, fmt: str, weight: torch.Tensor, blocks: GivenBlocks | None) -> Weight:
        """weight in fmt's panels, from the file's blocks in the form fmt takes, if any."""
        return self.methods[fmt].panels(weight, roofline.kept_form(fmt, blocks))

    def _choose_rows(self, packed: Weight, weight: torch.Tensor, batch_hint: int) -> None:
        """The path for each row class of this weight's shape (ROW_CLASSES), measured
        there: panels, oneDNN's candidates (built from weight's fp32 values, only when one
        is stored or must be measured) and, for prefills, torch on the rebuilt weight."""
        method, (n, k) = self.method_of(packed), plain_shape(packed)
        kind, extra = f"gemm_{method.name}", onednn.names(method.name)
        offered = {rows: ("panels", *extra, *_torch_at(rows)) for rows in ROW_CLASSES}
        stored = [kernel_choice.known(kind, (n, k, r), names) for r, names in offered.items()]
        built = {}
        if any(w not in ("panels", "torch") for w in stored):
            built = onednn.candidates(method.name, weight, batch_hint)
        paths = {
            "panels": onednn.Gemm("panels", packed, functools.partial(_gemm, method)),
            "torch": onednn.Gemm("torch", packed, functools.partial(_plain_linear, method)),
            **built,
        }
        winners = []
        for (rows, names), known in zip(offered.items(), stored, strict=True):
            if len(names) == 1:  # nothing competes: the panels, unmeasured
                winners.append("panels")
            elif known is not None:  # the paths that lost were not even built
                self.choices[kernel_choice.choice_key(kind, (n, k, rows))] = known
                winners.append(known)
            else:
                winners.append(self._measure(kind, (n, k, rows), _runs(paths, names, rows, k)))
        if any(w != "panels" for w in winners):
            kept = {w: paths[w] for w in set(winners)}  # losers' copies are dropped
            self._plans[id(packed)] = (packed, RowPlan(tuple(winners), kept))

    def _measure(
        self,
        kind: str,
        shape: tuple[int, ...],
        candidates: dict[str, Any],
        cost: Callable[[Any], float] | None = None,
    ) -> str:
        """cost: seconds a candidate takes (None: kernel_choice.seconds_per_call's, looked
        up per call so that a test can stand in for it)."""
        cost = cost or kernel_choice.seconds_per_call
        winner = kernel_choice.choose(kind, shape, candidates, cost)
        self.choices[kernel_choice.choice_key(kind, shape)] = winner
        return winner

    def _gemm_any(self, x: torch.Tensor, weight: Weight) -> torch.Tensor:
        return _gemm(self.method_of(weight), x, weight)

    def method_of(self, weight: Weight) -> LinearMethod:
        return self.methods[weight_format(weight)]

    def bound(self, weight: Weight) -> Callable[..., torch.Tensor]:
        """(x, bias=None) -> x [M, K] @ weight.T (+ bias), on the path chosen for this
        weight once: its format's C kernel (or, per row class, what won there: torch's
        GEMM, a oneDNN candidate), or its torch reference. weight as pack_weight returned
        it (or plain)."""
        method = self.method_of(weight)
        if self.kernels is None or not is_panels(weight):
            return functools.partial(_reference, method, weight)
        plan = self._plans.get(id(weight))
        return plan[1] if plan is not None else functools.partial(_gemm_of, method, weight)

    def linear(
        self, x: torch.Tensor, weight: Weight, bias: torch.Tensor | None = None
    ) -> torch.Tensor:
        """x [M, K] @ weight.T (+ bias): bound's path, chosen per call."""
        return self.bound(weight)(x, bias)


Bias = torch.Tensor | None


def _reference(method: LinearMethod, w: Weight, x: torch.Tensor, bias: Bias = None):
    return method.reference(x, w, bias)


def _gemm_of(method: LinearMethod, w: Weight, x: torch.Tensor, bias: Bias = None):
    return _gemm(method, x, w, bias)


class RowPlan:
    """(x, bias=None) -> x @ w.T (+ bias) on the path that won x's row class."""

    def __init__(self, winners: tuple[str, ...], paths: dict[str, onednn.Gemm]) -> None:
        self.winners = winners  # per ROW_CLASSES entry
        self._paths = [paths[w] for w in winners]

    def __call__(self, x: torch.Tensor, bias: Bias = None) -> torch.Tensor:
        row_class = max(bisect.bisect_right(ROW_CLASSES, x.shape[0]) - 1, 0)
        return self._paths[row_class](x, bias)


def _torch_at(rows: int) -> tuple[str, ...]:
    """torch on the rebuilt weight competes for prefills only: below them rebuilding the
    weight per call costs more than the GEMM (and its fp32 sums are not the kernel's)."""
    return ("torch",) if rows >= PREFILL_ROWS else ()


def _runs(paths: dict[str, onednn.Gemm], names: tuple[str, ...], rows: int, k: int) -> dict:
    """Those paths as measurable calls on `rows` random rows (the Gemm is their .func)."""
    x = torch.randn(rows, k)
    return {name: functools.partial(paths[name], x) for name in names}


def _gemm(method: LinearMethod, x: torch.Tensor, w: Weight, bias: Bias = None) -> torch.Tensor:
    """The format's C kernel on w's panels."""
    x = x.contiguous()
    out = x.new_empty(x.shape[0], plain_shape(w)[0])
    if method.gemm(out, x, w, None if bias is None else bias.data_ptr()):
        raise MemoryError(f"{method.name} GEMM: no memory for its buffer")
    return out


def _plain_linear(method: LinearMethod, x: torch.Tensor, w: Weight, bias: Bias = None):
    """torch's GEMM on the plain weight rebuilt from panels, per call: at prefill sizes
    the re-layout (or dequantizing) costs a few % of the GEMM, and the choice measured it."""
    return F.linear(x, method.plain(w), bias)


def _counts(counter: Counter[str]) -> str:
    """ "a:3,b:1" (sorted; "none" when empty): one label value for the kernel-info gauge."""
    return ",".join(f"{name}:{n}" for name, n in sorted(counter.items())) or "none"
