"""Int8 matrix products made exact on CPUs without VNNI.

The cache's int8 graphs (the NLI model's, the pair model's) multiply uint8 activations by
int8 weights with `MatMulInteger`. On a CPU with AVX2 but neither AVX-512 VNNI nor
AVX-VNNI, onnxruntime sums pairs of those products in 16 bits with saturation
(vpmaddubsw): a 64-term product of 255 and 127 gives 1,048,544 instead of 2,072,640. The
readings then differ from a VNNI CPU's, where the verifiers were fitted.

Here each such product gets uint8 weights: the weight and its zero point both shifted by
128, so their differences, and the products, are the same. onnxruntime's u8 x u8 kernel
widens both sides to 16 bits before it multiplies (vpmaddwd), so it cannot saturate; on an
AVX2 EPYC it took 1.3 ms where the saturating u8 x s8 one took 1.0 and a float32 product
2.1 (128x384 by 384x1536, one thread). A product whose activations are not known to be
uint8, or whose weights are not initializers, becomes a float32 one on the same integers
instead (zero points subtracted first), cast back to int32: exact while a sum stays under
2^24, which these layers' sums do by far.
"""

from pathlib import Path
from typing import Any

import numpy as np

from engine.cache_files import atomic_path, cache_path
from engine.cpu_features import cpu_features

EXACT_KIND = "exact3"  # in the cache folders of the rewritten graphs: bump when the rewrite changes


def products_saturate() -> bool:
    """True where onnxruntime's u8s8 products saturate: no VNNI of either kind."""
    found = cpu_features()
    return not (found["avx512_vnni"] or found["avx_vnni"])


def exact_products(graph: Any) -> int:
    """Each u8 x s8 MatMulInteger of `graph` made exact (u8 x u8, else float32); returns
    how many."""
    weights = {w.name: w for w in graph.initializer}
    uint8_activations = _uint8_tensors(graph)
    nodes, count = [], 0
    for node in graph.node:
        if node.op_type != "MatMulInteger" or _weight_type(weights, node) == "uint8":
            nodes.append(node)
            continue
        count += 1
        if node.input[0] in uint8_activations and _unsigned_weight(graph, weights, node):
            nodes.append(node)
        else:
            nodes.extend(_float_product(graph, weights, node))
    del graph.node[:]
    graph.node.extend(nodes)
    _drop_unused_weights(graph)
    return count


def _uint8_tensors(graph: Any) -> set[str]:
    """Tensors known to be uint8: such graph inputs and DynamicQuantizeLinear's outputs."""
    from onnx import TensorProto

    names = {i.name for i in graph.input if i.type.tensor_type.elem_type == TensorProto.UINT8}
    names |= {n.output[0] for n in graph.node if n.op_type == "DynamicQuantizeLinear"}
    return names


def _weight_type(weights: dict, node: Any) -> str:
    """B's numpy type name when B is an initializer, else ""."""
    from onnx import helper

    b = weights.get(node.input[1])
    return "" if b is None else helper.tensor_dtype_to_np_dtype(b.data_type).name


def _unsigned_weight(graph: Any, weights: dict, node: Any) -> bool:
    """B and its zero point as uint8, both 128 up, in `node`'s inputs, when both are int8
    initializers; False (and `node` untouched) otherwise."""
    from onnx import numpy_helper

    known = _known_weight(weights, node)
    if known is None or known[0].dtype != np.int8:
        return False
    b, b_zero = known
    name = f"{node.name or node.output[0]}/exact_b"
    graph.initializer.append(numpy_helper.from_array(_shifted(b), name))
    graph.initializer.append(numpy_helper.from_array(_shifted(b_zero), f"{name}_zero"))
    inputs = list(node.input) + [""] * (4 - len(node.input))  # "": an absent zero point
    inputs[1], inputs[3] = name, f"{name}_zero"
    del node.input[:]
    node.input.extend(inputs)
    return True


def _shifted(values: np.ndarray) -> np.ndarray:
    return (values.astype(np.int16) + 128).astype(np.uint8)


def _float_product(graph: Any, weights: dict, node: Any) -> list:
    """The nodes of `node`'s product in float32, cast back to int32."""
    from onnx import TensorProto, helper

    name = node.name or node.output[0]
    nodes: list = []
    a = _centred(nodes, node, 0, f"{name}/exact_a")
    b = _float_weight(graph, weights, node, f"{name}/exact_b")
    b = b or _centred(nodes, node, 1, f"{name}/exact_b")
    product = f"{name}/exact_product"
    nodes.append(helper.make_node("MatMul", [a, b], [product], name=product))
    nodes.append(helper.make_node("Cast", [product], list(node.output), to=TensorProto.INT32))
    return nodes


def _drop_unused_weights(graph: Any) -> None:
    """The int8 weights and zero points no node reads now (onnxruntime warns of each)."""
    read = {name for node in graph.node for name in node.input}
    read |= {out.name for out in graph.output}
    kept = [w for w in graph.initializer if w.name in read]
    del graph.initializer[:]
    graph.initializer.extend(kept)


def _centred(nodes: list, node: Any, side: int, base: str) -> str:
    """Input `side` (0: A, 1: B) of a MatMulInteger as float32 nodes, its zero point off."""
    from onnx import TensorProto, helper

    nodes.append(helper.make_node("Cast", [node.input[side]], [base], to=TensorProto.FLOAT))
    zero = _zero_point(node, side)
    if not zero:
        return base
    nodes.append(helper.make_node("Cast", [zero], [f"{base}_zero"], to=TensorProto.FLOAT))
    nodes.append(helper.make_node("Sub", [base, f"{base}_zero"], [f"{base}_centred"]))
    return f"{base}_centred"


def _zero_point(node: Any, side: int) -> str:
    """The name of input `side`'s zero point (MatMulInteger's inputs 2 and 3), "" if none."""
    return node.input[side + 2] if len(node.input) > side + 2 else ""


def _float_weight(graph: Any, weights: dict, node: Any, name: str) -> str | None:
    """B as a float32 initializer, its zero point off, when B and its zero point are
    initializers (a constant node would run on every pass, or in the length prelude)."""
    from onnx import numpy_helper

    known = _known_weight(weights, node)
    if known is None:
        return None
    b, b_zero = known
    graph.initializer.append(numpy_helper.from_array(b.astype("float32") - b_zero, name))
    return name


def _known_weight(weights: dict, node: Any) -> tuple[np.ndarray, np.ndarray] | None:
    """B and its zero point (0 of B's type if absent) when both are initializers."""
    from onnx import numpy_helper

    zero = _zero_point(node, 1)
    if node.input[1] not in weights or (zero and zero not in weights):
        return None
    b = numpy_helper.to_array(weights[node.input[1]])
    b_zero = numpy_helper.to_array(weights[zero]) if zero else np.zeros((), b.dtype)
    return b, b_zero


def exact_model_file(path: Path, kind: str) -> Path:
    """The ONNX graph at `path` with exact_products applied, kept in the cache folder under
    `kind`: rewritten once per source file (~1.4 s for the pair model), not at every start."""
    import onnx

    target = cache_path(path, kind, ".onnx")
    if not target.is_file():
        model = onnx.load(str(path))
        exact_products(model.graph)
        with atomic_path(target) as tmp:
            onnx.save(model, tmp)
    return target
