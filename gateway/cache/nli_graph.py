"""The NLI package's graph, rewritten once to cost less without changing a score, and to
show the states our head reads.

Three changes, each leaving every logit bit for bit as the package's graph gives it for
the same word pieces (tests/test_nli_graph.py):
- the sequence width is left open: the package fixes it at 160 word pieces, padding
  included, so a short pair cost ~70 ms of one core instead of ~15;
- each attention layer reads only the relative-position rows the pair's positions reach.
  The model (DeBERTa-v3-style) scores every query and key against all 512 rows of its
  relative-position table, then gathers the few it needs: for a 30-piece pair, 59 of 512.
  The rewrite slices the rows to the gathered index's own range, [min, max], before the
  product and shifts the index by min, so the gather reads the same numbers. A pass then
  costs ~25% less (bench/nli_graph.py);
- two more outputs, what the nli verifier's own head reads (nli_verifier.py): the pooled
  state of the pair (POOLED, the 384 numbers the package's two-way classifier reads) and
  the mean over word pieces of the last layer's states (TOKENS_MEAN, 384 more).
"""

from pathlib import Path
from typing import Any

import numpy as np

from engine.cache_files import atomic_path
from gateway.cache.exact_int8 import exact_products
from gateway.cache.length_split import split_by_length

# Ops that repeat or broadcast the position rows without moving their row axis: the slice
# goes above them, so that they copy the kept rows only.
_ROW_PRESERVING = ("Tile", "Expand")
# The classifier's input: the pooler's dense layer after its GELU, [batch, 384].
POOLED = "/m/pooler/Mul_1_output_0"
# The last encoder layer's states, [batch, word pieces, 384], and their mean over pieces.
LAST_STATES = "/m/deberta/encoder/layer.11/output/LayerNorm/Add_1_output_0"
TOKENS_MEAN = "tiergate/tokens_mean"
# The mask is all ones (one pair a pass, no padding): it follows from the length.
LENGTH_ONLY = ("attention_mask",)
WORD_ROWS = "m.deberta.embeddings.word_embeddings.weight_quantized"


def fast_graph(source: Path, target: Path) -> None:
    """The package's graph at `source`, rewritten, written to `target`."""
    import onnx

    with atomic_path(target) as tmp:
        onnx.save(rewritten(source), tmp)


def rewritten(source: Path, exact: bool = False) -> Any:
    """The package's graph at `source` with its width open, position rows trimmed and the
    head's states shown; `exact`: its int8 products too (exact_int8.py)."""
    import onnx

    model = onnx.load(str(source))
    open_width(model.graph)
    trim_position_rows(model.graph)
    expose(model.graph, POOLED)
    expose_mean(model.graph, LAST_STATES, TOKENS_MEAN)
    if exact:
        exact_products(model.graph)
    return model


def open_width(graph: Any) -> None:
    """Each input's sequence axis left open (the package fixes it at 160)."""
    for tensor in graph.input:
        tensor.type.tensor_type.shape.dim[1].dim_param = "sequence"


def expose(graph: Any, name: str) -> None:
    """The tensor `name` made an output of `graph` too (after the existing ones)."""
    from onnx import TensorProto, helper

    _require(graph, name)
    graph.output.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, None))


def expose_mean(graph: Any, states: str, name: str) -> None:
    """The mean of `states` over its word-piece axis, an output of `graph` named `name`."""
    from onnx import TensorProto, helper

    _require(graph, states)
    mean = helper.make_node("ReduceMean", [states], [name], name=name, axes=[1], keepdims=0)
    graph.node.append(mean)
    graph.output.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, None))


def _require(graph: Any, name: str) -> None:
    if not any(name in node.output for node in graph.node):
        raise ValueError(f"the NLI graph has no tensor {name}: the package changed")


def trim_position_rows(graph: Any) -> int:
    """Every GatherElements(MatMul(x, Transpose(rows)), index) in `graph` reads rows
    [min(index), max(index)] only; returns how many were rewritten. A gather of another
    shape raises ValueError: a package update would then need reading, not guessing."""
    from onnx import helper, numpy_helper

    producer = {out: node for node in graph.node for out in node.output}
    graph.initializer.append(numpy_helper.from_array(np.array([1], dtype=np.int64), "trim/one"))
    inserted: dict[str, list] = {}
    for gather in [n for n in graph.node if n.op_type == "GatherElements"]:
        product = producer.get(gather.input[0])
        transpose = producer.get(product.input[1]) if product is not None else None
        if product is None or product.op_type != "MatMul" or transpose is None:
            raise ValueError(f"{gather.name}: not a gather of a product with position rows")
        if transpose.op_type != "Transpose" or _attribute(gather, "axis") not in (-1, 2):
            raise ValueError(f"{gather.name}: gathers another axis than the rows'")
        row_axis = list(_attribute(transpose, "perm"))[-1]
        feeder = transpose
        while (above := producer.get(feeder.input[0])) and above.op_type in _ROW_PRESERVING:
            feeder = above
        if feeder.name in inserted:
            raise ValueError(f"{gather.name}: its position rows feed another gather too")
        name = f"{gather.name}/trim"
        index = gather.input[1]
        inserted[feeder.name] = _named(
            [
                helper.make_node("ReduceMin", [index], [f"{name}/low3"], keepdims=1),
                helper.make_node("ReduceMax", [index], [f"{name}/high3"], keepdims=1),
                helper.make_node("Reshape", [f"{name}/low3", "trim/one"], [f"{name}/low"]),
                helper.make_node("Reshape", [f"{name}/high3", "trim/one"], [f"{name}/high"]),
                helper.make_node("Add", [f"{name}/high", "trim/one"], [f"{name}/end"]),
                helper.make_node(
                    "Constant",
                    [],
                    [f"{name}/axis"],
                    value=numpy_helper.from_array(np.array([row_axis], dtype=np.int64)),
                ),
                helper.make_node(
                    "Slice",
                    [feeder.input[0], f"{name}/low", f"{name}/end", f"{name}/axis"],
                    [f"{name}/rows"],
                ),
                helper.make_node("Sub", [index, f"{name}/low3"], [f"{name}/index"]),
            ],
        )
        feeder.input[0] = f"{name}/rows"
        gather.input[1] = f"{name}/index"
    nodes = []
    for node in graph.node:  # each slice just above the op it feeds: still in order
        nodes.extend(inserted.get(node.name, []))
        nodes.append(node)
    del graph.node[:]
    graph.node.extend(nodes)
    return len(inserted)


def _named(nodes: list) -> list:
    for node in nodes:  # named after what each makes: unique, and readable in a profile
        node.name = node.output[0]
    return nodes


def _attribute(node: Any, name: str) -> Any:
    from onnx import helper

    for attribute in node.attribute:
        if attribute.name == name:
            return helper.get_attribute_value(attribute)
    return None


def split_graph(source: Path, prelude: Path, data: Path, exact: bool = False) -> None:
    """The package's graph at `source`, rewritten as fast_graph does, then cut in two
    (length_split.py): what a pass computes from its length alone, and the rest."""
    import onnx

    first, rest = split_by_length(rewritten(source, exact), LENGTH_ONLY)
    _first_row_only(first.graph, WORD_ROWS)
    for part, target in ((first, prelude), (rest, data)):
        with atomic_path(target) as tmp:
            onnx.save(part, tmp)


def _first_row_only(graph: Any, name: str) -> None:
    """The word-piece table cut to its first row: the prelude reads word piece 0 only, and
    what it gives does not depend on which (49 MB less to hold)."""
    from onnx import numpy_helper

    for i, weight in enumerate(graph.initializer):
        if weight.name == name:
            graph.initializer[i].CopyFrom(
                numpy_helper.from_array(numpy_helper.to_array(weight)[:1], name)
            )
            return
    raise ValueError(f"the NLI graph has no weight {name}: the package changed")
