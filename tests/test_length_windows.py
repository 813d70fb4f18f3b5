"""A shorter length's prelude outputs read as windows of a longer one's
(gateway/cache/length_windows.py), on outputs made here from the length; the NLI graph's own
outputs at every length: tests/test_nli_graph.py."""

from collections.abc import Callable

import numpy as np

from gateway.cache.length_windows import ShapeValues, Window, find_windows

TABLE = np.random.default_rng(3).standard_normal((2, 301, 4)).astype(np.float32)


def relative_positions(length: int) -> dict[str, np.ndarray]:
    """What relative attention builds from a length: the position rows -L+1..L-1 (the
    centre of a fixed table), the index from each piece to each row, a reshape target, a
    mask, and a figure that is no window (1/L)."""
    steps = np.arange(length)
    return {
        "rows": TABLE[:, 150 - length + 1 : 150 + length],
        "index": (steps[None, :] - steps[:, None] + length - 1)[None].repeat(3, 0),
        "shape": np.array([-1, 6, length, 2 * length - 1], dtype=np.int64),
        "mask": np.ones((1, 1, length, length), dtype=np.float32),
        "mean": np.full((1, length), 1 / length, dtype=np.float32),
    }


def counting(run: Callable[[int], dict[str, np.ndarray]], lengths: list[int]) -> Callable:
    def counted(length: int) -> dict[str, np.ndarray]:
        lengths.append(length)
        return run(length)

    return counted


def test_windows_shapes_and_shifts_are_found_and_read_bit_for_bit() -> None:
    ran: list[int] = []
    windows, reference = find_windows(counting(relative_positions, ran), relative_positions(1))
    assert sorted(windows) == ["index", "mask", "rows", "shape"]  # "mean" is no window
    assert isinstance(windows["shape"], ShapeValues) and isinstance(windows["rows"], Window)
    assert windows["rows"].axes[1].centred and not windows["index"].axes[1].centred
    assert windows["index"].shift_per_piece == -1  # the index counts from its own L-1
    assert len(ran) == 4  # the reference and three probes, once
    for length in range(1, 129):
        want = relative_positions(length)
        for name, window in windows.items():
            got = window.read(reference[name], length)
            assert got.dtype == want[name].dtype and np.array_equal(got, want[name])


def test_an_output_that_only_looks_like_a_window_at_two_probes_is_refused() -> None:
    def bent(length: int) -> dict[str, np.ndarray]:
        # a window at lengths up to 50, past it the rows move
        start = 0 if length <= 50 else 1
        return {"rows": TABLE[0, start : start + length]}

    windows, _ = find_windows(bent, ["rows"], probe_lengths=(12, 41, 100))
    assert windows == {}


def test_equal_reference_values_are_one_array() -> None:
    def twice(length: int) -> dict[str, np.ndarray]:
        index = relative_positions(length)["index"]
        return {"a": index, "b": index.copy()}

    _, reference = find_windows(twice, ["a", "b"])
    assert reference["a"] is reference["b"]


def test_an_output_that_shrinks_as_the_length_grows_is_refused() -> None:
    def shrinking(length: int) -> dict[str, np.ndarray]:
        return {"rows": TABLE[0, : 200 - length]}

    windows, _ = find_windows(shrinking, ["rows"])
    assert windows == {}
