"""Each image's tokens in whole row blocks for OpenVINO's int8 GEMMs.

OpenVINO's CPU plugin runs an int8 FullyConnected (oneDNN's brgemm on AVX-512 VNNI) in blocks
of 32 rows shared among its threads, and a block with a few rows takes as long as a full one.
At batch 1 a ViT-B/16's GEMMs have 197 rows: 7 blocks, 4 on one of 2 threads, where 192 rows
take 3 (`benchmarks/int8_gemm_rows.py`: 197 rows 1.26x the time of 192 on a Zen 4). Cut
each image's tokens into the most rows that fill the threads' blocks and the few left, and
give each part its own GEMM, and the tail costs a small GEMM rather than a block per thread.
That pays while a block is a large share of each thread's work: at batch 1.

`split_rows` does that in the ONNX graph of a static int8 model: each MatMul on a quantized
activation and int8 weights runs once on tokens [:cut] and once on [cut:], and so does what
follows it row by row (bias, GELU, the residual Add, LayerNorm, the next MatMul) until the
tokens meet in attention, where a Concat joins the parts. Static quantization scales every
element alike, so each row is computed as before: ONNX Runtime gives the same logits (to
1e-6 on a ViT-B/16, where its fusions differ between the graphs). OpenVINO's differ as much
as its own do between a static and a dynamic input shape (it compiles each graph its own
way), and the runner is validated like any other. Dynamic int8 quantizes a tensor by its own
range, so its models are left as they are. `row_cut` says where to cut, and whether to.
"""
from __future__ import annotations

from typing import Optional

import numpy as np

ROW_BLOCK = 32  # rows in a block of OpenVINO's int8 brgemm FullyConnected (AVX-512 VNNI)
MAX_BLOCKS = 4  # per thread after the cut: past it, one block more costs less than cutting
MAX_TAIL = ROW_BLOCK // 4  # rows left after the cut: a small GEMM of its own


def applies(flags: frozenset[str]) -> bool:
    """Where the block size above was measured: AVX-512 VNNI without AMX (AMX tiles hold 16
    rows, and AVX2 CPUs run another kernel)."""
    return "avx512_vnni" in flags and not flags & {"amx_int8", "amx_bf16"}


def row_cut(tokens: int, batch: int, threads: int) -> Optional[int]:
    """The token to cut an image's rows at, or None where cutting gains nothing: at batch 1,
    the rows before the cut fill whole blocks on every thread, at most MAX_TAIL rows are
    left, and the block each thread is spared is a quarter of its work or more (at most
    MAX_BLOCKS left per thread). Measured on a Zen 4 with 2 threads, a ViT-B/16 (3 blocks a
    thread at batch 1), cut against whole in turns: 1.09x to 1.27x at batch 1 in four runs
    (one graph timed twice differs by up to 5% there); cut likewise, batch 2 (6 blocks a
    thread) ran 0.95x and batch 4 1.01x."""
    threads = max(threads, 1)
    tail = tokens % (ROW_BLOCK * threads)
    cut = tokens - tail
    blocks = cut // (ROW_BLOCK * threads)  # each thread's, after the cut
    return cut if batch == 1 and 0 < blocks <= MAX_BLOCKS and 0 < tail <= MAX_TAIL else None


def _static_int8_matmul(node, producer, int8_weights, scalars) -> Optional[tuple]:
    """(QuantizeLinear, DequantizeLinear) of the activation of a MatMul whose weight is an
    int8 initializer behind a DequantizeLinear, the activation quantized per tensor, as
    static quantization writes it; or None."""
    if node.op_type != "MatMul" or node.domain not in ("", "ai.onnx") or len(node.input) != 2:
        return None
    act, weight = producer.get(node.input[0]), producer.get(node.input[1])
    if (weight is None or weight.op_type != "DequantizeLinear"
            or weight.input[0] not in int8_weights):
        return None
    if act is None or act.op_type != "DequantizeLinear" or act.input[0] not in producer:
        return None
    quantize = producer[act.input[0]]
    if quantize.op_type != "QuantizeLinear":
        return None
    per_tensor = all(name in scalars for q in (quantize, act) for name in q.input[1:] if name)
    return (quantize, act) if per_tensor else None


def _index(graph):
    """producer of each tensor, the int8 initializers, and the names of scalar initializers."""
    import onnx

    producer = {name: node for node in graph.node for name in node.output}
    int8_weights = {t.name for t in graph.initializer if t.data_type == onnx.TensorProto.INT8}
    scalars = {t.name for t in graph.initializer if int(np.prod(t.dims)) == 1}
    return producer, int8_weights, scalars


def _seeds(graph) -> list[tuple]:
    producer, int8_weights, scalars = _index(graph)
    return [(n, qdq) for n in graph.node
            if (qdq := _static_int8_matmul(n, producer, int8_weights, scalars))]


def has_static_int8(proto) -> bool:
    """Whether the graph has a MatMul that `split_rows` could cut."""
    return bool(_seeds(proto.graph))


def _shapes(proto, input_shape: tuple[int, ...]) -> dict[str, list[int]]:
    """Every tensor's static shape where ONNX shape inference finds it, with the graph's
    input fixed to `input_shape`; inferred on the graph without its large initializers
    (given as inputs of their shape), so the weights are not copied."""
    from onnx import helper, shape_inference

    graph = proto.graph
    probe = helper.make_model(
        helper.make_graph([], graph.name, [], []), ir_version=proto.ir_version,
        opset_imports=list(proto.opset_import))
    probe.graph.node.extend(graph.node)
    probe.graph.input.extend(graph.input)
    probe.graph.output.extend(graph.output)
    for tensor in graph.initializer:
        if int(np.prod(tensor.dims)) <= 64:  # shapes and scalars: data propagation reads them
            probe.graph.initializer.append(tensor)
        else:
            probe.graph.input.append(helper.make_tensor_value_info(
                tensor.name, tensor.data_type, list(tensor.dims)))
    dims = probe.graph.input[0].type.tensor_type.shape.dim
    if len(dims) != len(input_shape):
        return {}
    for dim, size in zip(dims, input_shape):
        dim.ClearField("dim_param")
        dim.dim_value = size
    try:
        inferred = shape_inference.infer_shapes(probe, data_prop=True)
    except Exception:  # onnx's errors differ by version; a graph it cannot follow is not cut
        return {}
    shapes = {}
    graph = inferred.graph
    for value in [*graph.input, *graph.value_info, *graph.output]:
        dims = value.type.tensor_type.shape.dim
        if value.type.HasField("tensor_type") and all(d.HasField("dim_value") for d in dims):
            shapes[value.name] = [d.dim_value for d in dims]
    return shapes


# Ops that compute each token's row from that row alone (and from constants), when their
# tensors are [batch, tokens, features]: a cut may run through them.
ROW_WISE = {"Add", "Sub", "Mul", "Div", "Erf", "Relu", "Sigmoid", "Tanh", "Sqrt", "Pow",
            "Cast", "QuantizeLinear", "DequantizeLinear", "LayerNormalization", "MatMul"}


def split_rows(proto, input_shape: tuple[int, ...], threads: int):
    """`proto` (an onnx.ModelProto, left as it is) with its static int8 MatMuls' tokens cut
    where `row_cut` says, for an input of `input_shape`; returns (the new model, how many
    MatMuls were cut), or (None, 0) where none is.

    The cut starts at each such MatMul's quantizing and runs on through what follows row by
    row (its bias, GELU, the residual Add, LayerNorm, the next MatMul), so that the two
    parts are joined only where tokens meet (attention) or the graph ends: one Concat per
    block, not one per MatMul. The MatMuls on the most tokens are cut (an attention pool's
    on its one query are not)."""
    import onnx

    from .. import fusion

    seeds = _seeds(proto.graph)
    if not seeds or any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)
                        for n in proto.graph.node for a in n.attribute):
        return None, 0  # nothing to cut, or subgraphs (If, Loop) this pass does not follow
    shapes = _shapes(proto, input_shape)
    rows = {tuple(s[:2]) for _, (q, _) in seeds if len(s := shapes.get(q.input[0], ())) == 3}
    if not rows:
        return None, 0
    batch, tokens = max(rows, key=lambda r: r[1])
    cut = row_cut(tokens, batch, threads)
    if cut is None:
        return None, 0
    out = onnx.ModelProto()
    out.CopyFrom(proto)
    count = _RowCut(out.graph, shapes, (batch, tokens), cut, seeds).run()
    fusion.prune(out.graph)  # the replaced nodes, now read by nothing, and their constants
    return out, count


class _RowCut:
    """One graph's tokens cut at `cut`, in place: each node that computes rows alone from a
    cut tensor runs twice, once on each part; a whole tensor read by a cut node is sliced,
    and a cut tensor read whole (or given by the graph) is joined, each once."""

    def __init__(self, graph, shapes: dict[str, list[int]], rows: tuple[int, int], cut: int,
                 seeds: list[tuple]):
        self.graph, self.shapes, self.rows, self.cut = graph, shapes, rows, cut
        # each seed with its quantizing: cut, its input sliced
        self.forced = {x.output[0] for n, qdq in seeds if self.rowed(qdq[0].input[0])
                       for x in (n, *qdq)}
        self.inits = {t.name: tuple(t.dims) for t in graph.initializer}
        # constants: initializers, Constant nodes, and weights dequantized from initializers
        self.constant = set(self.inits) | {n.output[0] for n in graph.node
                                           if n.op_type == "Constant"}
        for node in graph.node:
            if node.op_type == "DequantizeLinear" and node.input[0] in self.constant:
                self.constant.add(node.output[0])
        self.taken = {name for node in graph.node for name in (*node.input, *node.output)}
        self.parts: dict[str, tuple[str, str]] = {}  # a cut tensor -> its two parts
        self.joined: set[str] = set()
        self.nodes: list = []  # the graph's nodes, as cut

    def rowed(self, name: str) -> bool:
        """Whether `name` is a [batch, tokens, features] tensor."""
        s = self.shapes.get(name, ())
        return len(s) == 3 and (s[0], s[1]) == self.rows

    def row_wise(self, node) -> bool:
        """Whether `node` computes each token's row from that row alone (and constants)."""
        if (node.op_type not in ROW_WISE or node.domain not in ("", "ai.onnx")
                or len(node.output) != 1 or not self.rowed(node.output[0])):
            return False
        if node.op_type == "LayerNormalization" and any(
                a.name == "axis" and a.i not in (-1, 2) for a in node.attribute):
            return False
        if node.op_type == "MatMul":  # rows times one constant matrix
            return (node.input[0] not in self.constant and self.rowed(node.input[0])
                    and len(self.inits.get(node.input[1],
                                           self.shapes.get(node.input[1], ()))) == 2
                    and node.input[1] in self.constant)
        if node.op_type in ("QuantizeLinear", "DequantizeLinear") and any(
                int(np.prod(self.inits.get(name, (2,)))) != 1 for name in node.input[1:] if name):
            return False  # scales other than one per tensor
        return all(self.row_input(name) for name in node.input if name != "")

    def row_input(self, name: str) -> bool:
        """Whether a row-wise node may read `name` row by row: a row of its own, or a
        constant without a token axis."""
        if name not in self.constant:
            return self.rowed(name)
        dims = self.inits.get(name, self.shapes.get(name))
        # unknown, or a constant with a token axis (a position table)
        return dims is not None and not (len(dims) >= 2 and dims[-2] != 1)

    def run(self) -> int:
        """Cut the graph; returns how many of its static int8 MatMuls were cut."""
        count = 0
        for node in self.graph.node:
            dynamic = [n for n in node.input if n and n not in self.constant]
            forced = node.output[0] in self.forced
            if forced or (self.row_wise(node) and any(n in self.parts for n in dynamic)):
                count += forced and node.op_type == "MatMul"
                self.split(node)
            else:
                node.input[:] = [self.whole(n) for n in node.input]
                self.nodes.append(node)
        for output in self.graph.output:
            self.whole(output.name)
        del self.graph.node[:]
        self.graph.node.extend(self.nodes)
        return count

    def split(self, node) -> None:
        """`node` twice, once on each part of its inputs."""
        import onnx

        cut_names = self.names(node.output[0])
        for i in range(2):
            clone = onnx.NodeProto()
            clone.CopyFrom(node)
            clone.name = f"{node.name or node.output[0]}/rows{i}"
            clone.input[:] = [self.part(n, i) for n in node.input]
            clone.output[:] = [cut_names[i]]
            self.nodes.append(clone)
        self.parts[node.output[0]] = cut_names

    def names(self, name: str) -> tuple[str, str]:
        """The names of the two parts of `name`; ValueError where the graph has one."""
        found = tuple(f"{name}/rows{i}" for i in range(2))
        if any(n in self.taken for n in found):
            raise ValueError(f"{found} already in the graph")
        return found

    def part(self, name: str, i: int) -> str:
        """Part `i` of `name` (a constant is read whole by both)."""
        from onnx import helper

        if name in self.constant or name == "":
            return name
        if name not in self.parts:  # a whole tensor read by a cut node: slice it, once
            self.parts[name] = self.names(name)
            self.joined.add(name)
            for j, (start, end) in enumerate(((0, self.cut), (self.cut, 2 ** 62))):
                self.nodes.append(helper.make_node(
                    "Slice", [name, self.int64(start), self.int64(end), self.int64(1)],
                    [self.parts[name][j]]))
        return self.parts[name][i]

    def whole(self, name: str) -> str:
        """`name` whole: a cut tensor's parts joined, once."""
        from onnx import helper

        if name in self.parts and name not in self.joined:
            self.joined.add(name)
            self.nodes.append(helper.make_node("Concat", list(self.parts[name]), [name],
                                               axis=1))
        return name

    def int64(self, value: int) -> str:
        """An int64 [1] initializer holding `value`, added once."""
        from onnx import numpy_helper

        name = f"rows_split/{value}"
        if name not in self.inits:
            self.inits[name] = (1,)
            self.graph.initializer.append(
                numpy_helper.from_array(np.array([value], np.int64), name))
        return name
