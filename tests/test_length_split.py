"""A graph cut by length (gateway/cache/length_split.py) gives the whole graph's outputs bit
for bit: on a small graph built here, and (tests/test_nli_graph.py) on the NLI model."""

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from gateway.cache import length_split
from gateway.cache.length_split import LengthSplitSession, split_by_length
from gateway.embedding.onnx_backend import one_core_session


def positions_graph() -> onnx.ModelProto:
    """y = x * scale + positions, where positions (0..n-1, from x's shape) and scale
    (sqrt of a constant) are what a transformer rebuilds from the length every pass, and
    a second output reads the mask through a Cast."""
    nodes = [
        helper.make_node("Shape", ["x"], ["shape"]),
        helper.make_node("Gather", ["shape", "one"], ["n"], axis=0),
        helper.make_node("Range", ["zero", "n", "one"], ["steps"]),
        helper.make_node("Cast", ["steps"], ["positions"], to=TensorProto.FLOAT),
        helper.make_node("Sqrt", ["four"], ["scale"]),
        helper.make_node("Mul", ["x", "scale"], ["scaled"]),
        helper.make_node("Add", ["scaled", "positions"], ["y"]),
        helper.make_node("Cast", ["mask"], ["mask_f"], to=TensorProto.FLOAT),
        helper.make_node("Mul", ["y", "mask_f"], ["masked"]),
    ]
    weights = [
        numpy_helper.from_array(np.array(0, dtype=np.int64), "zero"),
        numpy_helper.from_array(np.array(1, dtype=np.int64), "one"),
        numpy_helper.from_array(np.array(4.0, dtype=np.float32), "four"),
    ]
    inputs = [
        helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, "n"]),
        helper.make_tensor_value_info("mask", TensorProto.INT64, [1, "n"]),
    ]
    outputs = [
        helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, "n"]),
        helper.make_tensor_value_info("masked", TensorProto.FLOAT, [1, "n"]),
    ]
    graph = helper.make_graph(nodes, "positions", inputs, outputs, weights)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def split_files(tmp_path: Path) -> tuple[Path, Path, Path]:
    whole, prelude, data = (
        tmp_path / "whole.onnx",
        tmp_path / "prelude.onnx",
        tmp_path / "data.onnx",
    )
    model = positions_graph()
    onnx.save(model, str(whole))
    first, rest = split_by_length(model, ("mask",))
    onnx.save(first, str(prelude))
    onnx.save(rest, str(data))
    return whole, prelude, data


def test_the_cut_graph_gives_the_whole_graphs_outputs(tmp_path: Path) -> None:
    whole, prelude, data = split_files(tmp_path)
    reference = one_core_session(whole)
    split = LengthSplitSession(prelude, data, ("mask",))
    rng = np.random.default_rng(0)
    for length in (1, 5, 12, 41, 77, 160):
        feed = {
            "x": rng.standard_normal((1, length)).astype(np.float32),
            "mask": np.ones((1, length), dtype=np.int64),
        }
        for got, want in zip(split.run(feed), reference.run(None, feed), strict=True):
            assert np.array_equal(got, want)


def test_what_the_length_decides_leaves_the_data_graph(tmp_path: Path) -> None:
    _, _, data = split_files(tmp_path)
    graph = onnx.load(str(data)).graph
    ops = [n.op_type for n in graph.node]
    assert "Shape" not in ops and "Range" not in ops and "Sqrt" not in ops
    # positions and the mask (ones) change with the length: fed; the scale does not: a
    # constant; the mask itself is no longer read
    assert [i.name for i in graph.input] == ["x", "positions", "mask_f"]
    assert "scale" in {w.name for w in graph.initializer}


def test_recent_lengths_are_kept_and_no_more(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # positions (4 bytes a word piece) and the mask (4 more): 3 and 5 fit in 64 bytes, not 4
    monkeypatch.setattr(length_split, "BYTES_KEPT", 64)
    _, prelude, data = split_files(tmp_path)
    split = LengthSplitSession(prelude, data, ("mask",))
    for length in (3, 4, 3, 5):
        feed = {"x": np.zeros((1, length), np.float32), "mask": np.ones((1, length), np.int64)}
        split.run(feed)
    assert list(split._by_length) == [3, 5]


def test_a_prelude_output_that_is_no_window_runs_the_prelude_at_every_length(
    tmp_path: Path,
) -> None:
    """1/length (a mean's scale) is no window of a longer length's: the session reads no
    windows and runs the prelude, with the same outputs as the whole graph."""
    model = positions_graph()
    model.graph.node.extend(
        [
            helper.make_node("Cast", ["n"], ["n_f"], to=TensorProto.FLOAT),
            helper.make_node("Reciprocal", ["n_f"], ["inverse"]),
            helper.make_node("Mul", ["masked", "inverse"], ["mean_scaled"]),
        ]
    )
    model.graph.output.append(
        helper.make_tensor_value_info("mean_scaled", TensorProto.FLOAT, [1, "n"])
    )
    onnx.save(model, str(tmp_path / "whole.onnx"))
    first, rest = split_by_length(model, ("mask",))
    onnx.save(first, str(tmp_path / "prelude.onnx"))
    onnx.save(rest, str(tmp_path / "data.onnx"))
    split = LengthSplitSession(tmp_path / "prelude.onnx", tmp_path / "data.onnx", ("mask",))
    assert split._windows == {}
    reference = one_core_session(tmp_path / "whole.onnx")
    for length in (1, 7, 41):
        feed = {"x": np.ones((1, length), np.float32), "mask": np.ones((1, length), np.int64)}
        for got, want in zip(split.run(feed), reference.run(None, feed), strict=True):
            assert np.array_equal(got, want)


def test_a_prelude_of_windows_only_is_read_not_run(tmp_path: Path) -> None:
    _, prelude, data = split_files(tmp_path)
    split = LengthSplitSession(prelude, data, ("mask",))
    assert set(split._windows) == split._fed == {"positions", "mask_f"}
    ran = []
    whole = split._whole_prelude
    split._whole_prelude = lambda length: ran.append(length) or whole(length)  # type: ignore[method-assign]
    for length in (3, 128, 129):
        feed = {"x": np.zeros((1, length), np.float32), "mask": np.ones((1, length), np.int64)}
        split.run(feed)
    assert ran == [129]  # past the reference length only
