"""`weights: auto`'s format choice as a decode step meets the weights: streamed from memory.

A model of 200-900 MiB is far past the last-level cache, so in a real decode step every
weight comes from memory and the bytes per weight set the speed at one row; a GEMM timed
alone, its weight hot in cache, cannot show that (a GGUF's compact blocks, 4.5-8.5 bits a
weight, time like w8a8's 9 bits hot, yet decode a stream ~1.8x faster). So each candidate
format costs, per row count auto considers, max(its hot time, its bytes / this machine's
streaming bandwidth) (a roofline), and the rows weigh alike in relative terms: the winner
has the least geometric mean over the row counts, so a 1.6x gain at one stream is not lost
in a decode batch's longer absolute time. The bandwidth is measured once per machine and
thread count (torch's sum over a buffer several times the LLC) and kept in the kernel
choice file (engine/quantization/kernel_choice.py) beside the decisions.
"""

import functools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from engine.quantization import kernel_choice
from engine.quantization.block_weights import BlockWeight
from engine.quantization.packing import plain_shape
from engine.quantization.quant import Int8Weight

BANDWIDTH_BUFFER_BYTES = 256 * 1024 * 1024  # several times any LLC we meet (32 MiB here)
Linear = Callable[[torch.Tensor, object], object]  # (x, packed weight) -> x @ weight.T


@dataclass
class KeptBlocks:
    """A GGUF weight's own blocks in both forms auto may take: w8a8's int8 values (where
    every part is Q8_0 / Q5_0 / Q4_0: engine/quantization/gguf_blocks.attach_blocks) and
    "blocks" weights' compact records (engine/quantization/block_weights.py)."""

    int8: Int8Weight | None
    records: BlockWeight


def with_blocks(names: list[str], blocks: object) -> list[str]:
    """auto's candidate formats: "blocks" joins where the file kept blocks of the weight."""
    return [*names, "blocks"] if isinstance(blocks, KeptBlocks) else names


def kept_form(fmt: str, blocks: object) -> object:
    """The form of the file's blocks format fmt packs from: the records for "blocks",
    else the int8 blocks (None where there are none)."""
    if isinstance(blocks, KeptBlocks):
        return blocks.records if fmt == "blocks" else blocks.int8
    return blocks


def choice_shape(shape: tuple[int, ...], blocks: object) -> tuple[int, ...]:
    """The decision's shape class; with blocks, their bytes too (a Q4_1 and a Q8_0 file of
    one architecture need not choose alike)."""
    return (*shape, blocks.records.nbytes) if isinstance(blocks, KeptBlocks) else shape


def roofline_seconds(hot: Sequence[float], nbytes: int, bandwidth: float) -> float:
    """A candidate's cost: the geometric mean over row counts of max(hot time, bytes
    streamed / bandwidth), in seconds."""
    floor = nbytes / bandwidth
    return math.exp(sum(math.log(max(t, floor, 1e-12)) for t in hot) / len(hot))


def stream_bandwidth() -> float:
    """Bytes per second this machine streams from memory with torch's threads now."""
    name = f"stream_bytes_per_s_t{torch.get_num_threads()}"
    return kernel_choice.machine_figure(name, measure_bandwidth)


def measure_bandwidth(nbytes: int = BANDWIDTH_BUFFER_BYTES) -> float:
    """Bytes per second of a sum over nbytes of fp32, the best of a few passes."""
    buf = torch.ones(nbytes // 4)  # written once: its pages are real memory
    seconds = kernel_choice.seconds_per_call(buf.sum)
    return buf.nbytes / seconds


def step_cost(rows: Sequence[int], linear: Linear) -> Callable[[object], float]:
    """cost for kernel_choice.choose: a packed candidate -> roofline_seconds of `linear`
    on it at each of `rows`, against the machine's bandwidth (read before choose locks)."""
    bandwidth = stream_bandwidth()

    def cost(packed: object) -> float:
        _, k = plain_shape(packed)
        xs = [torch.randn(m, k) for m in rows]
        hot = [kernel_choice.seconds_per_call(functools.partial(linear, x, packed)) for x in xs]
        return roofline_seconds(hot, packed.nbytes, bandwidth)  # every format has nbytes

    return cost
