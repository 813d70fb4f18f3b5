"""Int8 products made exact (gateway/cache/exact_int8.py): the same integers as numpy's on
any CPU, where onnxruntime's own saturate without VNNI."""

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from gateway.cache import exact_int8
from gateway.cache.exact_int8 import exact_products


def _graph(b: np.ndarray, a_zero: int | None, b_zero: int | None, b_as_input: bool = False):
    """A = uint8 input "A" times `b` (int8), with zero points when given; with
    `b_as_input` B is fed at run time, so the rewrite cannot know its values."""
    m, k = 3, b.shape[0]
    inputs = [helper.make_tensor_value_info("A", TensorProto.UINT8, [m, k])]
    weights = []
    if b_as_input:
        inputs.append(helper.make_tensor_value_info("B", TensorProto.INT8, list(b.shape)))
    else:
        weights.append(numpy_helper.from_array(b, "B"))
    names = ["A", "B"]
    if a_zero is not None:
        weights.append(numpy_helper.from_array(np.array(a_zero, np.uint8), "a_zero"))
        weights.append(numpy_helper.from_array(np.array(b_zero, np.int8), "b_zero"))
        names += ["a_zero", "b_zero"]
    node = helper.make_node("MatMulInteger", names, ["Y"], name="mm")
    out = [helper.make_tensor_value_info("Y", TensorProto.INT32, [m, b.shape[1]])]
    model = helper.make_model(
        helper.make_graph([node], "g", inputs, out, weights),
        opset_imports=[helper.make_opsetid("", 13)],
    )
    model.ir_version = 8
    return model


def _run(model, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    fed = {"A": a, "B": b} if "B" in {i.name for i in model.graph.input} else {"A": a}
    return session.run(None, fed)[0]


def _saturating(a_zero: int, b_zero: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """a, b and their exact product, with the sums that saturate in 16 bits."""
    rng = np.random.default_rng(abs(a_zero) + abs(b_zero))
    b = rng.integers(-128, 128, size=(64, 5)).astype(np.int8)
    b[:, 0], b[:, 1] = 127, -128
    a = rng.integers(0, 256, size=(3, 64)).astype(np.uint8)
    a[0] = 255
    return a, b, (a.astype(np.int64) - a_zero) @ (b.astype(np.int64) - b_zero)


@pytest.mark.parametrize(("a_zero", "b_zero"), [(None, None), (0, 0), (128, 3), (7, -128)])
def test_uint8_weights_give_numpys_integers(a_zero: int | None, b_zero: int | None) -> None:
    a, b, exact = _saturating(a_zero or 0, b_zero or 0)
    model = _graph(b, a_zero, b_zero)
    assert exact_products(model.graph) == 1
    (node,) = model.graph.node
    assert node.op_type == "MatMulInteger"
    weights = {w.name: numpy_helper.to_array(w) for w in model.graph.initializer}
    assert weights["mm/exact_b"].dtype == np.uint8
    # the int8 weight and its zero point, now unread, are gone (onnxruntime warns of each)
    assert "B" not in weights and "b_zero" not in weights
    assert np.array_equal(_run(model, a, b), exact)


@pytest.mark.parametrize(("a_zero", "b_zero"), [(0, 0), (128, 3)])
def test_unknown_weights_give_numpys_integers_in_float32(a_zero: int, b_zero: int) -> None:
    a, b, exact = _saturating(a_zero, b_zero)
    model = _graph(b, a_zero, b_zero, b_as_input=True)
    assert exact_products(model.graph) == 1
    assert {n.op_type for n in model.graph.node} == {"Cast", "Sub", "MatMul"}
    assert np.array_equal(_run(model, a, b), exact)


def test_a_product_already_unsigned_is_left_alone() -> None:
    model = _graph(np.zeros((4, 2), np.uint8), None, None)
    assert exact_products(model.graph) == 0
    assert [w.name for w in model.graph.initializer] == ["B"]


@pytest.mark.parametrize("b_as_input", [False, True])
def test_the_saturating_case_is_what_it_mends(b_as_input: bool) -> None:
    """255 x 127 over 64 terms: 2,072,640, not 1,048,544 as AVX2 without VNNI gives."""
    b, a = np.full((64, 1), 127, np.int8), np.full((3, 64), 255, np.uint8)
    model = _graph(b, 0, 0, b_as_input)
    exact_products(model.graph)
    assert _run(model, a, b)[0, 0] == 255 * 127 * 64


def test_only_a_cpu_without_vnni_saturates(monkeypatch: pytest.MonkeyPatch) -> None:
    none = {"avx512_vnni": False, "avx_vnni": False}
    monkeypatch.setattr(exact_int8, "cpu_features", lambda: none)
    assert exact_int8.products_saturate()
    monkeypatch.setattr(exact_int8, "cpu_features", lambda: {**none, "avx_vnni": True})
    assert not exact_int8.products_saturate()
