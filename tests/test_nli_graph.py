"""The NLI graph's rewrite (nli_graph.py) changes no score: every logit bit for bit as the
package's graph with its width opened gives it, from the shortest pair to the widest the
scores ever pass, beside the states our head reads as two more outputs; cut by length
(length_split.py), every output bit for bit as the whole rewritten graph's; a graph it does
not know is refused, not guessed at."""

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from bench.nli_graph import open_width_graph
from gateway.cache.length_split import LengthSplitSession
from gateway.cache.length_windows import REFERENCE_LENGTH
from gateway.cache.nli_graph import (
    LENGTH_ONLY,
    POOLED,
    expose,
    fast_graph,
    split_graph,
    trim_position_rows,
)
from gateway.cache.nli_scores import ASKED, MAX_TOKENS, NliScores, package_dir
from gateway.embedding.onnx_backend import one_core_session

PAIRS = [
    ("Why?", "How?"),
    ("How do I center a div in CSS?", "How can I center a div using CSS?"),
    (
        "What are the main differences between PostgreSQL and MySQL for a write-heavy app?",
        "For an application with many writes, how do PostgreSQL and MySQL compare?",
    ),
    ("a much longer question " * 40, "and another one, also long " * 30),  # cut to the width
]


def test_the_rewritten_graph_gives_every_logit_bit_for_bit(tmp_path: Path) -> None:
    source = package_dir() / "policy_nli_int8.onnx"
    open_width_graph(source, tmp_path / "open.onnx")
    fast_graph(source, tmp_path / "fast.onnx")
    reference = one_core_session(tmp_path / "open.onnx")
    fast = one_core_session(tmp_path / "fast.onnx")
    tokenizer = NliScores()._tokenizer
    widths = []
    for premise, hypothesis in PAIRS + [(b, a) for a, b in PAIRS]:
        ids = np.array([tokenizer.encode(ASKED.format(premise), ASKED.format(hypothesis)).ids])
        feed = {"input_ids": ids, "attention_mask": np.ones_like(ids)}
        widths.append(ids.shape[1])
        logits, pooled, tokens_mean = fast.run(None, feed)
        assert np.array_equal(logits, reference.run(None, feed)[0])
        assert pooled.shape == tokens_mean.shape == (1, 384)
        assert np.isfinite(pooled).all() and np.isfinite(tokens_mean).all()
    assert min(widths) < 16 and max(widths) == MAX_TOKENS


def test_the_graph_cut_by_length_gives_every_output_bit_for_bit(tmp_path: Path) -> None:
    """What the verifier runs (length_split.py) against the rewritten whole graph: the
    three outputs at lengths from 3 to the width, word pieces drawn at random. A value the
    cut took as a constant from three lengths would show here at any other."""
    source = package_dir() / "policy_nli_int8.onnx"
    fast_graph(source, tmp_path / "fast.onnx")
    split_graph(source, tmp_path / "prelude.onnx", tmp_path / "data.onnx")
    whole = one_core_session(tmp_path / "fast.onnx")
    split = LengthSplitSession(tmp_path / "prelude.onnx", tmp_path / "data.onnx", LENGTH_ONLY)
    rng = np.random.default_rng(7)
    for length in [*range(3, MAX_TOKENS, 9), MAX_TOKENS]:
        ids = rng.integers(3, 120_000, size=(1, length), dtype=np.int64)
        ids[0, 0], ids[0, -1] = 1, 2  # [CLS] ... [SEP], as the tokenizer frames a pair
        feed = {"input_ids": ids, "attention_mask": np.ones_like(ids)}
        for got, want in zip(split.run(feed), whole.run(None, feed), strict=True):
            assert np.array_equal(got, want), length


def test_every_shorter_length_is_read_out_of_the_reference_lengths_outputs() -> None:
    """Each prelude output of every length up to the reference is its window (or shape),
    bit for bit: no part of the prelude runs for a new length there."""
    split = NliScores()._session
    assert set(split._windows) == split._fed
    for length in range(1, REFERENCE_LENGTH + 1):
        read, whole = split._read_windows(length), split._whole_prelude(length)
        for name, want in whole.items():
            got = read[name]
            assert got.dtype == want.dtype and np.array_equal(got, want), (length, name)


def test_each_attention_layer_reads_only_the_rows_it_gathers() -> None:
    model = onnx.load(str(package_dir() / "policy_nli_int8.onnx"))
    # two gathers a layer (content to position, position to content), twelve layers
    assert trim_position_rows(model.graph) == 24
    slices = [n for n in model.graph.node if n.op_type == "Slice" and "/trim" in n.name]
    assert len(slices) == 24


def test_a_missing_pooled_state_is_refused() -> None:
    graph = helper.make_graph([], "empty", [], [])
    with pytest.raises(ValueError, match="no tensor"):
        expose(graph, POOLED)


def test_a_gather_of_another_shape_is_refused() -> None:
    data = helper.make_tensor_value_info("data", TensorProto.FLOAT, [2, 3])
    index = helper.make_tensor_value_info("index", TensorProto.INT64, [2, 3])
    out = helper.make_tensor_value_info("out", TensorProto.FLOAT, [2, 3])
    gather = helper.make_node("GatherElements", ["data", "index"], ["out"], axis=1)
    graph = helper.make_graph([gather], "plain", [data, index], [out])
    with pytest.raises(ValueError, match="not a gather of a product"):
        trim_position_rows(graph)
