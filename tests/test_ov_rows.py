"""Cutting each image's tokens into whole row blocks for OpenVINO's int8 GEMMs (ov_rows): where
it cuts, that the cut graph answers as the whole one, and that OpenVINO's runner cuts."""
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from vit_export import cpu
from vit_export.runtime import ov_rows


@pytest.mark.parametrize("tokens,batch,threads,cut", [
    (197, 1, 2, 192),   # ViT-B/16 at 224 px on 2 threads: 7 blocks (4 on a thread) -> 6 + 5 rows
    (257, 1, 2, 256),   # /14 at 224 px: 5 blocks a thread -> 4 + 1 row
    (197, 2, 2, None),  # batch 2: measured slower cut
    (577, 1, 2, None),  # 384 px: 9 blocks a thread left, a small share spared
    (192, 1, 2, None),  # whole blocks already
    (50, 1, 2, None),   # fewer rows than the threads' blocks
    (50, 1, 1, None),   # 18 rows left: not a small GEMM
    (197, 1, 16, None),
    (65, 1, 1, 64),
])
def test_row_cut(tokens, batch, threads, cut):
    assert ov_rows.row_cut(tokens, batch, threads) == cut


def test_where_the_block_size_was_measured():
    assert ov_rows.applies(frozenset({"avx2", "avx512f", "avx512_vnni"}))
    assert not ov_rows.applies(frozenset({"avx2", "avx512_vnni", "amx_int8"}))
    assert not ov_rows.applies(frozenset({"avx2", "avx_vnni"}))


class Graph:
    """A graph of static int8 Linear layers (QDQ, as static quantization writes them) on
    x [batch, tokens, width]."""

    def __init__(self, tokens: int = 65, width: int = 16):
        self.tokens, self.width = tokens, width
        self.rng = np.random.default_rng(0)
        self.nodes, self.inits = [], []

    def linear(self, x: str, i: int) -> str:
        w, rng = self.width, self.rng
        self.inits.extend([
            numpy_helper.from_array(np.float32(0.05), f"s{i}"),
            numpy_helper.from_array(np.uint8(128), f"z{i}"),
            numpy_helper.from_array(rng.integers(-127, 128, (w, w), np.int8), f"w{i}"),
            numpy_helper.from_array(np.full(w, 0.01, np.float32), f"ws{i}"),
            numpy_helper.from_array(np.zeros(w, np.int8), f"wz{i}"),
            numpy_helper.from_array(rng.standard_normal(w).astype(np.float32), f"b{i}")])
        self.nodes.extend([
            helper.make_node("QuantizeLinear", [x, f"s{i}", f"z{i}"], [f"q{i}"]),
            helper.make_node("DequantizeLinear", [f"q{i}", f"s{i}", f"z{i}"], [f"d{i}"]),
            helper.make_node("DequantizeLinear", [f"w{i}", f"ws{i}", f"wz{i}"], [f"wd{i}"],
                             axis=1),
            helper.make_node("MatMul", [f"d{i}", f"wd{i}"], [f"m{i}"], name=f"matmul{i}"),
            helper.make_node("Add", [f"m{i}", f"b{i}"], [f"y{i}"])])
        return f"y{i}"

    def node(self, op: str, inputs: list[str], output: str, **attributes) -> str:
        self.nodes.append(helper.make_node(op, inputs, [output], **attributes))
        return output

    def model(self, *outputs: str) -> onnx.ModelProto:
        shape = ["batch", self.tokens, self.width]
        graph = helper.make_graph(
            self.nodes, "graph", [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
            [helper.make_tensor_value_info(y, TensorProto.FLOAT, None) for y in outputs],
            self.inits)
        return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)],
                                 ir_version=9)


def qdq_mlp(tokens: int = 65, width: int = 16) -> onnx.ModelProto:
    """Two static int8 Linear layers with Erf between; the second reads its input through a
    Transpose pair, where tokens meet, so its shape comes from shape inference."""
    g = Graph(tokens, width)
    e = g.node("Erf", [g.linear("x", 0)], "e")
    u = g.node("Transpose", [g.node("Transpose", [e], "t", perm=[0, 2, 1])], "u", perm=[0, 2, 1])
    return g.model(g.linear(u, 1))


def residual_block(tokens: int = 65, width: int = 16) -> onnx.ModelProto:
    """x -> Linear -> + x -> LayerNorm -> Linear -> + a position table [1, tokens, width]:
    rows alone up to the table, which has a token axis. The residual sum is an output too."""
    g = Graph(tokens, width)
    g.inits += [numpy_helper.from_array(np.ones(width, np.float32), "gamma"),
                numpy_helper.from_array(np.zeros(width, np.float32), "beta"),
                numpy_helper.from_array(
                    g.rng.standard_normal((1, tokens, width)).astype(np.float32), "table")]
    r = g.node("Add", [g.linear("x", 0), "x"], "r")
    n = g.node("LayerNormalization", [r, "gamma", "beta"], "n", axis=-1)
    return g.model(g.node("Add", [g.linear(n, 1), "table"], "out"), r)


def run_ort(model: onnx.ModelProto, x: np.ndarray, every: bool = False):
    import onnxruntime as ort

    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    outs = session.run(None, {"x": x})
    return outs if every else outs[0]


def test_the_cut_graph_answers_bitwise_as_the_whole():
    model = qdq_mlp()
    before = model.SerializeToString()
    cut, count = ov_rows.split_rows(model, (1, 65, 16), threads=1)
    assert count == 2 and model.SerializeToString() == before  # the input is left as it is
    ops = [n.op_type for n in cut.graph.node]
    assert ops.count("MatMul") == 4 and ops.count("Concat") == 2 and ops.count("Add") == 4
    x = np.random.default_rng(1).standard_normal((1, 65, 16)).astype(np.float32)
    np.testing.assert_array_equal(run_ort(cut, x), run_ort(model, x))


def test_the_cut_runs_on_row_by_row_and_stops_where_tokens_meet():
    model = residual_block()
    cut, count = ov_rows.split_rows(model, (1, 65, 16), threads=1)
    ops = [n.op_type for n in cut.graph.node]
    assert count == 2 and ops.count("LayerNormalization") == 2 and ops.count("MatMul") == 4
    # x is sliced once (for the first Linear and the residual alike); the parts are joined
    # once before the position table, and the residual sum, an output, at the end
    assert ops.count("Slice") == 2 and ops.count("Concat") == 2
    concat = next(n for n in cut.graph.node if n.op_type == "Concat")
    assert next(n for n in cut.graph.node if concat.output[0] in n.input).input[1] == "table"
    assert [o.name for o in cut.graph.output] == ["out", "r"]
    x = np.random.default_rng(1).standard_normal((1, 65, 16)).astype(np.float32)
    for got, want in zip(run_ort(cut, x, every=True), run_ort(model, x, every=True)):
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-5)


def test_a_matmul_of_two_activations_is_where_tokens_meet():
    """y @ y^T and then p @ y, the two MatMuls of attention on [batch, tokens, width]: the
    cut Linear before them is joined, and neither is cut."""
    g = Graph()
    y = g.linear("x", 0)
    p = g.node("MatMul", [y, g.node("Transpose", [y], "yt", perm=[0, 2, 1])], "p")
    model = g.model(g.node("MatMul", [p, y], "out"))
    cut, count = ov_rows.split_rows(model, (1, 65, 16), threads=1)
    ops = [n.op_type for n in cut.graph.node]
    assert count == 1 and ops.count("MatMul") == 4 and ops.count("Concat") == 1
    x = np.random.default_rng(1).standard_normal((1, 65, 16)).astype(np.float32)
    np.testing.assert_allclose(run_ort(cut, x), run_ort(model, x), rtol=1e-6, atol=1e-4)


def with_a_taken_name() -> onnx.ModelProto:
    """qdq_mlp with a tensor already named as the cut would name one of its parts."""
    model = qdq_mlp()
    model.graph.node.append(helper.make_node("Identity", ["x"], ["y0/rows0"]))
    return model


def test_a_graph_the_cut_cannot_name_is_refused_and_the_runner_runs_it_whole(tmp_path,
                                                                               caplog):
    with pytest.raises(ValueError, match="already in the graph"):
        ov_rows.split_rows(with_a_taken_name(), (1, 65, 16), threads=1)
    pytest.importorskip("openvino")
    from vit_export.runtime.ov import OpenVinoRunner

    path = tmp_path / "taken.onnx"
    onnx.save(with_a_taken_name(), path)
    runner = OpenVinoRunner(path, "openvino", threads=1)
    x = np.random.default_rng(2).standard_normal((1, 65, 16)).astype(np.float32)
    want = run_ort(qdq_mlp(), x)
    np.testing.assert_allclose(runner(x), want, atol=0.05 * np.abs(want).max())
    assert runner.rows_split == {}
    if ov_rows.applies(cpu.isa().flags):
        assert "taken.onnx: its rows not cut for an input of shape [1, 65, 16]" in caplog.text


def test_nothing_is_cut_where_it_gains_nothing():
    model = qdq_mlp(tokens=64)
    assert ov_rows.split_rows(model, (1, 64, 16), threads=1) == (None, 0)  # whole blocks
    assert ov_rows.split_rows(qdq_mlp(), (2, 65, 16), threads=1) == (None, 0)  # batch 2
    dynamic = helper.make_graph(
        [helper.make_node("DynamicQuantizeLinear", ["x"], ["q", "s", "z"]),
         helper.make_node("MatMulInteger", ["q", "w", "z"], ["y"])], "dynamic",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 65, 16])],
        [helper.make_tensor_value_info("y", TensorProto.INT32, [1, 65, 16])],
        [numpy_helper.from_array(np.ones((16, 16), np.int8), "w")])
    assert not ov_rows.has_static_int8(helper.make_model(dynamic))
    assert ov_rows.has_static_int8(qdq_mlp())


def test_openvino_runner_cuts_rows_where_its_kernel_was_measured(tmp_path):
    pytest.importorskip("openvino")
    from vit_export.runtime.ov import OpenVinoRunner

    path = tmp_path / "mlp.onnx"
    onnx.save(qdq_mlp(), path)
    runner = OpenVinoRunner(path, "openvino", threads=1)
    x = np.random.default_rng(2).standard_normal((1, 65, 16)).astype(np.float32)
    got, want = runner(x), run_ort(qdq_mlp(), x)
    cuts = ov_rows.applies(cpu.isa().flags)
    assert runner.rows_split == ({(1, 65, 16): 2} if cuts else {})
    np.testing.assert_allclose(got, want, atol=0.05 * np.abs(want).max())
    runner(np.concatenate([x] * 3))  # 6 blocks: kept whole
    assert (3, 65, 16) not in runner.rows_split
