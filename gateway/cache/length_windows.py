"""A shorter length's prelude outputs read out of one long length's, where they are windows.

With relative positions, a length's costliest prelude outputs are each layer's projection
of the position rows (2L-1 rows centred on the diagonal's) and the index that gathers from
them: for a shorter length, the centre rows of a longer length's projection, and the
top-left corner of its index less a shift. Read so, a new length costs copies instead of
the prelude run (the NLI graph's: 13 ms at 41 word pieces, 45 ms at 120, on an AMX Xeon).

Which outputs are windows, and how, is found by probing lengths against the reference
length: per axis a size affine in the length, its rows from the start or centred, and for
integers a shift affine in the length, each checked bit for bit at every probe (the NLI
graph at every length up to the reference: tests/test_nli_graph.py). Lengths past the
reference run the whole prelude.
"""

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from itertools import product

import numpy as np

REFERENCE_LENGTH = 128  # below the NLI graph's capped position span (149 rows each side)
PROBE_LENGTHS = (12, 41, 100)


@dataclass(frozen=True)
class Axis:
    """An axis whose size is `base + per_piece * length`, its rows taken from the start
    of the reference's or from their centre."""

    base: int
    per_piece: int
    centred: bool

    def rows(self, reference_size: int, length: int) -> slice:
        size = self.base + self.per_piece * length
        start = (reference_size - size) // 2 if self.centred else 0
        return slice(start, start + size)


@dataclass(frozen=True)
class Window:
    """A prelude output as a window of the reference length's, less `shift_base +
    shift_per_piece * length` where its values are integers that index rows."""

    axes: tuple[Axis, ...]
    shift_base: int = 0
    shift_per_piece: int = 0

    def read(self, reference: np.ndarray, length: int) -> np.ndarray:
        rows = tuple(a.rows(n, length) for a, n in zip(self.axes, reference.shape, strict=True))
        window = np.ascontiguousarray(reference[rows])
        shift = self.shift_base + self.shift_per_piece * length
        return window - np.asarray(shift, window.dtype) if shift else window


@dataclass(frozen=True)
class ShapeValues:
    """A short integer vector (a shape to reshape to) whose entries are each
    `base + per_piece * length`: read without the reference."""

    base: tuple[int, ...]
    per_piece: tuple[int, ...]

    def read(self, reference: np.ndarray, length: int) -> np.ndarray:
        values = np.array(self.base) + np.array(self.per_piece) * length
        return values.astype(reference.dtype)


def find_windows(
    run: Callable[[int], dict[str, np.ndarray]],
    names: Iterable[str],
    reference_length: int = REFERENCE_LENGTH,
    probe_lengths: Iterable[int] = PROBE_LENGTHS,
) -> tuple[dict[str, "Window | ShapeValues"], dict[str, np.ndarray]]:
    """The outputs (of `run(length)`) read without a run at another length (windows of the
    reference length's, or shapes), and the reference's values of those outputs."""
    reference = run(reference_length)
    probes = {n: run(n) for n in probe_lengths}
    windows: dict[str, Window | ShapeValues] = {}
    for name in names:
        at_probes = {n: out[name] for n, out in probes.items()}
        at_all = {**at_probes, reference_length: reference[name]}
        window = _shape_values(at_all) or _window(reference[name], at_probes)
        if window is not None:
            windows[name] = window
    equal: dict[tuple, np.ndarray] = {}  # one array for names of equal values
    kept = {name: equal.setdefault(value_key(reference[name]), reference[name]) for name in windows}
    return windows, kept


def value_key(array: np.ndarray) -> tuple:
    """Equal for arrays of equal type, shape and values."""
    return array.dtype.str, array.shape, array.tobytes()


def _shape_values(at: dict[int, np.ndarray]) -> ShapeValues | None:
    """The ShapeValues that give the output at every length in `at`, if it is one."""
    (n1, a1), (n2, a2) = list(at.items())[:2]
    if a1.ndim != 1 or a1.dtype.kind != "i" or a1.size > 8:
        return None
    if any(a.shape != a1.shape or a.dtype != a1.dtype for a in at.values()):
        return None
    per_piece, rest = np.divmod(a2.astype(np.int64) - a1, n2 - n1)
    values = ShapeValues(tuple((a1 - per_piece * n1).tolist()), tuple(per_piece.tolist()))
    if rest.any() or not all(np.array_equal(values.read(a, n), a) for n, a in at.items()):
        return None
    return values


def _window(reference: np.ndarray, probes: dict[int, np.ndarray]) -> Window | None:
    """The one Window that reads every probe out of the reference, if any."""
    if any(p.ndim != reference.ndim or p.dtype != reference.dtype for p in probes.values()):
        return None
    sizes = _axis_sizes(reference.shape, probes)
    if sizes is None:
        return None
    grows = [per_piece != 0 for _, per_piece in sizes]
    for centred in product((False, True), repeat=sum(grows)):
        flags = iter(centred)
        axes = tuple(
            Axis(base, per_piece, next(flags) if grow else False)
            for (base, per_piece), grow in zip(sizes, grows, strict=True)
        )
        window = _with_shift(Window(axes), reference, probes)
        if window is not None:
            return window
    return None


def _axis_sizes(
    shape: tuple[int, ...], probes: dict[int, np.ndarray]
) -> list[tuple[int, int]] | None:
    """Each axis's (base, per_piece), fitted on two probes and held at every probe."""
    (n1, a1), (n2, a2) = list(probes.items())[:2]
    sizes = []
    for axis in range(len(shape)):
        per_piece, rest = divmod(a2.shape[axis] - a1.shape[axis], n2 - n1)
        base = a1.shape[axis] - per_piece * n1
        fits = all(base + per_piece * n == p.shape[axis] for n, p in probes.items())
        if rest or not fits or not 0 < a1.shape[axis] <= shape[axis]:
            return None
        sizes.append((base, per_piece))
    return sizes


def _with_shift(
    window: Window, reference: np.ndarray, probes: dict[int, np.ndarray]
) -> Window | None:
    """`window` with the shift (zero for floats) that reads every probe, if one does."""
    shifts = {}
    for n, probe in probes.items():
        unshifted = window.read(reference, n)
        if unshifted.shape != probe.shape:
            return None
        if reference.dtype.kind != "i":
            shifts[n] = 0
            continue
        difference = np.unique(unshifted - probe)
        if difference.size != 1:
            return None
        shifts[n] = int(difference[0])
    (n1, s1), (n2, s2) = list(shifts.items())[:2]
    per_piece, rest = divmod(s2 - s1, n2 - n1)
    shifted = Window(window.axes, s1 - per_piece * n1, per_piece)
    if rest or not all(np.array_equal(shifted.read(reference, n), p) for n, p in probes.items()):
        return None
    return shifted
