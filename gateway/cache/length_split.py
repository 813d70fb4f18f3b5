"""A graph cut in two: what it computes from its inputs' length alone, run once per length,
and the rest, run every pass.

An exported transformer recomputes shapes, masks and position tables from the input's
length at every pass: in the NLI graph ~3,000 of its ~5,300 nodes, each a kernel call of a
few microseconds on a few numbers (and, with relative positions, a projection of the
position rows in every layer). `split_by_length` finds those nodes (a node is length-only
when it reads only initializers, length-only inputs, a tensor's shape, or what such nodes
make), keeps the tensors where they meet the rest, and writes two graphs:
- the prelude: the whole graph with those tensors as outputs, run for a new length;
- the data graph: the rest, reading them as inputs. A value the same at every probed
  length is written into it as a constant instead, so ONNX Runtime fuses around it as it
  does in the whole graph.
`LengthSplitSession` runs the pair and keeps the prelude's outputs of recent lengths
(BYTES_KEPT); where every output of the prelude is a window of a longer length's, a
shorter length's are read out of those (length_windows.py) and the prelude does not run.
The same kernels see the same numbers, so the outputs are bit for bit the whole graph's
(tests/test_length_split.py); where ONNX Runtime would fuse differently (a scale it can
now see), that fusion is disabled on the data graph.
"""

import threading
from collections import OrderedDict
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np

from gateway.cache.length_windows import REFERENCE_LENGTH, find_windows, value_key

# Fusions the data graph must not get that the whole graph does not: with the attention's
# scale now a constant, ONNX Runtime would fold it into the product (another rounding).
DISABLED_FUSIONS = ("MatMulScaleFusion",)
# Layout ops at the cut that stay in the data graph, so that ONNX Runtime fuses them into
# the product they feed (transposed GEMM) as it does in the whole graph.
LAYOUT_OPS = ("Transpose",)
PROBE_LENGTHS = (12, 41, 160)  # a value equal at all of them is taken as a constant
# Prelude outputs kept, most recent lengths first, up to this many bytes (the NLI graph's:
# ~1.9 MB at 26 word pieces, ~13 MB at 160: every length up to ~65 fits); the latest
# length is always kept. A length not kept is read out of the reference length's windows
# (about a millisecond) or, past it, costs a prelude run (~45 ms of CPU at 120).
BYTES_KEPT = 160 * 2**20
_DTYPES = {"tensor(int64)": np.int64, "tensor(int32)": np.int32, "tensor(float)": np.float32}


def split_by_length(
    model: Any, length_only: Iterable[str], probe_lengths: Iterable[int] = PROBE_LENGTHS
) -> tuple[Any, Any]:
    """(prelude, data graph) of `model`, whose inputs are [1, length]; `length_only` names
    inputs whose values follow from the length (an attention mask of ones)."""

    graph = model.graph
    known = {t.name for t in graph.initializer} | set(length_only)
    length_nodes, known = _length_only_nodes(graph, known)
    renamed = _merge_repeats(graph, length_nodes)
    rest = [n for i, n in enumerate(graph.node) if i not in length_nodes]
    for node in rest:
        node.input[:] = [renamed.get(x, x) for x in node.input]
    weights = {t.name for t in graph.initializer}
    cut = _cut(rest, known - weights)
    producer = {out: n for n in graph.node for out in n.output}
    constants = [producer[x] for x in cut if x in producer and producer[x].op_type == "Constant"]
    fed, layout = _pull_back_layout([x for x in cut if producer.get(x) not in constants], producer)
    types = _types(model)
    prelude = _prelude(model, fed, types)
    fixed = _same_at_every_length(prelude, fed, set(length_only), probe_lengths)
    return prelude, _data_graph(model, [*constants, *layout, *rest], fed, fixed, types)


def _length_only_nodes(graph: Any, known: set[str]) -> tuple[set[int], set[str]]:
    """Indices of the length-only nodes, and every length-only tensor."""
    nodes: set[int] = set()
    changed = True
    while changed:  # an If reads its branches' outer names: order alone does not settle it
        changed = False
        for i, node in enumerate(graph.node):
            if i in nodes:
                continue
            reads = [x for x in node.input if x] + sorted(_outer_names(node))
            if node.op_type == "Shape" or all(x in known for x in reads):
                known |= set(node.output)
                nodes.add(i)
                changed = True
    return nodes, known


def _outer_names(node: Any) -> set[str]:
    """Names a node's subgraphs (If branches) read from the graph around them."""
    import onnx

    names: set[str] = set()
    for attribute in node.attribute:
        if attribute.type != onnx.AttributeProto.GRAPH:
            continue
        defined = {t.name for t in attribute.g.initializer} | {t.name for t in attribute.g.input}
        for inner in attribute.g.node:
            names |= {x for x in inner.input if x and x not in defined}
            defined |= set(inner.output)
    return names


def _merge_repeats(graph: Any, length_nodes: set[int]) -> dict[str, str]:
    """Outputs of length-only nodes that repeat an earlier one (same op, attributes and
    inputs), mapped to the earlier: each layer rebuilds the same masks and shapes."""
    first: dict[tuple, str] = {}
    renamed: dict[str, str] = {}
    for i in sorted(length_nodes):
        node = graph.node[i]
        if len(node.output) != 1 or _outer_names(node):
            continue
        inputs = tuple(renamed.get(x, x) for x in node.input)
        attributes = tuple(a.SerializeToString() for a in node.attribute)
        key = (node.op_type, node.domain, attributes, inputs)
        if key in first:
            renamed[node.output[0]] = first[key]
        else:
            first[key] = node.output[0]
    return renamed


def _cut(rest: list, length_tensors: set[str]) -> list[str]:
    """Length-only tensors (not weights) the other nodes read, in first-read order."""
    cut: list[str] = []
    for node in rest:
        for name in [*node.input, *sorted(_outer_names(node))]:
            if name in length_tensors and name not in cut:
                cut.append(name)
    return cut


def _pull_back_layout(fed: list[str], producer: dict) -> tuple[list[str], list]:
    """The fed tensors with each layout op at the cut moved to the data graph (its input
    fed instead), and the ops moved."""
    moved = []
    out = []
    for name in fed:
        node = producer.get(name)
        if node is not None and node.op_type in LAYOUT_OPS:
            moved.append(node)
            name = node.input[0]
        if name not in out:
            out.append(name)
    return out, moved


def _types(model: Any) -> dict[str, Any]:
    """Every tensor's type as shape inference (shape values followed) gives it. The
    model's own value_info (an export's may keep the width it was fixed at) is read only
    for what inference without it cannot type; those get no shape."""
    import onnx
    from onnx import helper

    bare = onnx.ModelProto()
    bare.CopyFrom(model)
    del bare.graph.value_info[:]
    types = {}
    for source, keep_shape in ((model, False), (bare, True)):
        g = onnx.shape_inference.infer_shapes(source, data_prop=True).graph
        for v in [*g.value_info, *g.input, *g.output]:
            elem = v.type.tensor_type.elem_type
            types[v.name] = v if keep_shape else helper.make_tensor_value_info(v.name, elem, None)
    return types


def _prelude(model: Any, fed: list[str], types: dict[str, Any]) -> Any:
    """The whole graph, with the fed tensors as its outputs."""
    import onnx

    prelude = onnx.ModelProto()
    prelude.CopyFrom(model)
    del prelude.graph.output[:]
    prelude.graph.output.extend(_value_info(name, types) for name in fed)
    return prelude


def _value_info(name: str, types: dict[str, Any]) -> Any:
    from onnx import helper

    return helper.make_tensor_value_info(name, types[name].type.tensor_type.elem_type, None)


def _same_at_every_length(
    prelude: Any, fed: list[str], length_only: set[str], lengths: Iterable[int]
) -> dict[str, np.ndarray]:
    """The fed tensors whose value is the same at every probed length, with the value."""
    session = _session(prelude.SerializeToString())
    runs = [
        dict(zip(fed, session.run(fed, prelude_feed(session, n, length_only)), strict=True))
        for n in lengths
    ]
    first = runs[0]
    return {
        name: first[name]
        for name in fed
        if all(
            r[name].shape == first[name].shape and np.array_equal(r[name], first[name])
            for r in runs
        )
    }


def prelude_feed(session: Any, length: int, length_only: set[str]) -> dict[str, np.ndarray]:
    """Inputs of one length: ones for length-only inputs, zeros for the rest (a length-only
    value cannot depend on them)."""
    feed = {}
    for arg in session.get_inputs():
        fill = np.ones if arg.name in length_only else np.zeros
        feed[arg.name] = fill((1, length), dtype=_DTYPES[arg.type])
    return feed


def _data_graph(
    model: Any, nodes: list, fed: list[str], fixed: dict[str, np.ndarray], types: dict
) -> Any:
    """The nodes that read data, with the fed tensors as inputs or, when fixed, constants."""
    from onnx import helper, numpy_helper

    graph = model.graph
    read = {x for n in nodes for x in [*n.input, *_outer_names(n)]}
    inputs = [t for t in graph.input if t.name in read and t.name not in fed]
    inputs += [_value_info(name, types) for name in fed if name not in fixed]
    weights = [t for t in graph.initializer if t.name in read]
    weights += [numpy_helper.from_array(value, name) for name, value in fixed.items()]
    data = helper.make_graph(nodes, f"{graph.name}-data", inputs, list(graph.output), weights)
    made = {out for n in nodes for out in n.output}
    data.value_info.extend(v for name, v in types.items() if name in made and _shaped(v))
    out = helper.make_model(data, opset_imports=model.opset_import)
    out.ir_version = model.ir_version
    return out


def _shaped(value_info: Any) -> bool:
    return value_info.type.tensor_type.HasField("shape")


def _session(model: Any, disabled: Iterable[str] = ()) -> Any:
    """One-core session of a path or serialized model."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.log_severity_level = 3  # the prelude leaves weights unread: not worth a warning
    source = str(model) if isinstance(model, Path) else model
    return ort.InferenceSession(
        source, options, providers=["CPUExecutionProvider"], disabled_optimizers=list(disabled)
    )


class LengthSplitSession:
    """The prelude and data graphs of `split_by_length`, run as the whole graph; thread-safe."""

    def __init__(self, prelude: Path, data: Path, length_only: Iterable[str]) -> None:
        self._prelude = _session(prelude)
        self._data = _session(data, DISABLED_FUSIONS)
        self._length_only = set(length_only)
        self._fed = {arg.name for arg in self._data.get_inputs()} - {
            arg.name for arg in self._prelude.get_inputs()
        }
        self._by_length: OrderedDict[int, tuple[dict[str, Any], int]] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()
        windows, self._reference = find_windows(self._whole_prelude, self._fed)
        # all read, or none: a prelude run for the rest would make them all anyway
        self._windows = windows if set(windows) == self._fed else {}

    def run(self, inputs: dict[str, np.ndarray]) -> list[np.ndarray]:
        """The whole graph's outputs for `inputs` ([1, length] each)."""
        import onnxruntime as ort

        length = next(iter(inputs.values())).shape[1]
        feed = dict(self._length_values(length))
        for arg in self._data.get_inputs():
            if arg.name in inputs:
                feed[arg.name] = ort.OrtValue.ortvalue_from_numpy(inputs[arg.name])
        return [v.numpy() for v in self._data.run_with_ort_values(None, feed)]

    def _length_values(self, length: int) -> dict[str, Any]:
        with self._lock:
            if length in self._by_length:
                self._by_length.move_to_end(length)
                return self._by_length[length][0]
        values, size = self._run_prelude(length)
        with self._lock:
            if length not in self._by_length:
                self._by_length[length] = (values, size)
                self._bytes += size
            while self._bytes > BYTES_KEPT and len(self._by_length) > 1:
                self._bytes -= self._by_length.popitem(last=False)[1][1]
        return values

    def _run_prelude(self, length: int) -> tuple[dict[str, Any], int]:
        """The fed values of one length, and their bytes; equal arrays share one copy
        (each layer's gather index is the same)."""
        import onnxruntime as ort

        read = self._windows and length <= REFERENCE_LENGTH
        arrays = self._read_windows(length) if read else self._whole_prelude(length)
        shared: dict[tuple, Any] = {}
        by_identity: dict[int, Any] = {}  # windows read once for several names
        values = {}
        size = 0
        for name, array in arrays.items():
            if id(array) not in by_identity:
                key = value_key(array)
                if key not in shared:
                    shared[key] = ort.OrtValue.ortvalue_from_numpy(array)
                    size += array.nbytes
                by_identity[id(array)] = shared[key]
            values[name] = by_identity[id(array)]
        return values, size

    def _whole_prelude(self, length: int) -> dict[str, np.ndarray]:
        return _outputs(self._prelude, self._fed, length, self._length_only)

    def _read_windows(self, length: int) -> dict[str, np.ndarray]:
        """The fed values of a length up to the reference, read out of its windows."""
        read: dict[tuple[int, Any], np.ndarray] = {}
        arrays = {}
        for name, window in self._windows.items():
            reference = self._reference[name]  # one array for names of equal values
            key = (id(reference), window)
            if key not in read:
                read[key] = window.read(reference, length)
            arrays[name] = read[key]
        return arrays


def _outputs(
    session: Any, names: Iterable[str], length: int, length_only: set[str]
) -> dict[str, np.ndarray]:
    """`names` of a prelude session run at `length`."""
    names = sorted(names)
    feed = prelude_feed(session, length, length_only)
    return dict(zip(names, session.run(names, feed), strict=True))
