"""Int8 products made exact (gateway/cache/exact_int8.py): the same integers as numpy's on
any CPU, where onnxruntime's own saturate without VNNI."""

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from gateway.cache import exact_int8
from gateway.cache.exact_int8 import exact_products


def _graph(b: np.ndarray, a_zero: int, b_zero: int):
    m, k = 3, b.shape[0]
    inputs = [helper.make_tensor_value_info("A", TensorProto.UINT8, [m, k])]
    weights = [
        numpy_helper.from_array(b, "B"),
        numpy_helper.from_array(np.array(a_zero, np.uint8), "a_zero"),
        numpy_helper.from_array(np.array(b_zero, np.int8), "b_zero"),
    ]
    node = helper.make_node("MatMulInteger", ["A", "B", "a_zero", "b_zero"], ["Y"], name="mm")
    out = [helper.make_tensor_value_info("Y", TensorProto.INT32, [m, b.shape[1]])]
    model = helper.make_model(
        helper.make_graph([node], "g", inputs, out, weights),
        opset_imports=[helper.make_opsetid("", 13)],
    )
    model.ir_version = 8
    return model


def _run(model, a: np.ndarray) -> np.ndarray:
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, {"A": a})[0]


@pytest.mark.parametrize(("a_zero", "b_zero"), [(0, 0), (128, 3)])
def test_the_products_are_numpys_integers(a_zero: int, b_zero: int) -> None:
    rng = np.random.default_rng(a_zero + b_zero)
    b = rng.integers(-127, 128, size=(64, 5)).astype(np.int8)
    b[:, 0] = 127
    a = rng.integers(0, 256, size=(3, 64)).astype(np.uint8)
    a[0] = 255  # with b's first column, the sums that saturate in 16 bits
    exact = (a.astype(np.int64) - a_zero) @ (b.astype(np.int64) - b_zero)
    model = _graph(b, a_zero, b_zero)
    assert exact_products(model.graph) == 1
    assert {n.op_type for n in model.graph.node} == {"Cast", "Sub", "MatMul"}
    # the int8 weight and its zero point, now unread, are gone (onnxruntime warns of each)
    assert {w.name for w in model.graph.initializer} == {"a_zero", "mm/exact_b"}
    assert np.array_equal(_run(model, a), exact)


def test_the_saturating_case_is_what_it_mends() -> None:
    """255 x 127 over 64 terms: 2,072,640, not 1,048,544 as AVX2 without VNNI gives."""
    b, a = np.full((64, 1), 127, np.int8), np.full((3, 64), 255, np.uint8)
    model = _graph(b, 0, 0)
    exact_products(model.graph)
    assert _run(model, a)[0, 0] == 255 * 127 * 64


def test_only_a_cpu_without_vnni_saturates(monkeypatch: pytest.MonkeyPatch) -> None:
    none = {"avx512_vnni": False, "avx_vnni": False}
    monkeypatch.setattr(exact_int8, "cpu_features", lambda: none)
    assert exact_int8.products_saturate()
    monkeypatch.setattr(exact_int8, "cpu_features", lambda: {**none, "avx_vnni": True})
    assert not exact_int8.products_saturate()
