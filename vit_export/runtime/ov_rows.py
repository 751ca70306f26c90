"""Each image's tokens in whole row blocks for OpenVINO's int8 GEMMs.

OpenVINO's CPU plugin runs an int8 FullyConnected (oneDNN's brgemm on AVX-512 VNNI) in blocks
of 32 rows shared among its threads, and a block with a few rows takes as long as a full one.
At batch 1 a ViT-B/16's GEMMs have 197 rows: 7 blocks, 4 on one of 2 threads, where 192 rows
take 3 (`benchmarks/int8_gemm_rows.py`: 197 rows 1.26x the time of 192 on a Zen 4). Cut
each image's tokens into the most rows that fill the threads' blocks and the few left, and
give each part its own GEMM, and the tail costs a small GEMM rather than a block per thread.
That pays while a block is a large share of each thread's work: at batch 1.

`split_rows` does that in the ONNX graph of a static int8 model: each MatMul on a quantized
activation and int8 weights, with its bias Add, runs once on tokens [:cut] and once on
[cut:], and a Concat joins them. Static quantization scales every element alike, so each
row is computed by the same arithmetic as before: ONNX Runtime gives bitwise the same logits.
OpenVINO's differ as much as its own do between a static and a dynamic input shape (it
compiles each graph its own way), and the runner is validated like any other. Dynamic int8
quantizes a tensor by its own range, so its models are left as they are. `row_cut` says where to cut, and whether to.
"""
from __future__ import annotations

from typing import Optional

import numpy as np

ROW_BLOCK = 32  # rows in a block of OpenVINO's int8 brgemm FullyConnected (AVX-512 VNNI)
MAX_BLOCKS = 4  # per thread after the cut: past it, one block more costs less than cutting


def applies(flags: frozenset[str]) -> bool:
    """Where the block size above was measured: AVX-512 VNNI without AMX (AMX tiles hold 16
    rows, and AVX2 CPUs run another kernel)."""
    return "avx512_vnni" in flags and not flags & {"amx_int8", "amx_bf16"}


def row_cut(tokens: int, batch: int, threads: int) -> Optional[int]:
    """The token to cut each image's rows at, or None where cutting gains nothing. The rows
    before the cut fill whole blocks on every thread, all images' tails together stay under
    one block, and the block each thread is spared is a quarter of its work or more (at
    most MAX_BLOCKS left per thread). Measured on a Zen 4 with 2 threads: 1.16x for a
    ViT-B/16 at batch 1 (3 blocks a thread), slower at batch 2 and 4 (6 and 12), where the
    extra GEMM and the Concat cost more than the smaller step they spare."""
    threads = max(threads, 1)
    tail = tokens % (ROW_BLOCK * threads)
    cut = tokens - tail
    blocks = batch * cut // (ROW_BLOCK * threads)  # each thread's, after the cut
    return cut if 0 < blocks <= MAX_BLOCKS and 0 < batch * tail < ROW_BLOCK else None


def _static_int8_matmul(node, producer, int8_weights) -> Optional[tuple]:
    """(QuantizeLinear, DequantizeLinear) of the activation of a MatMul whose weight is an
    int8 initializer behind a DequantizeLinear, as static quantization writes it; or None."""
    if node.op_type != "MatMul" or len(node.input) != 2:
        return None
    act, weight = producer.get(node.input[0]), producer.get(node.input[1])
    if (weight is None or weight.op_type != "DequantizeLinear"
            or weight.input[0] not in int8_weights):
        return None
    if act is None or act.op_type != "DequantizeLinear" or act.input[0] not in producer:
        return None
    quantize = producer[act.input[0]]
    return (quantize, act) if quantize.op_type == "QuantizeLinear" else None


def has_static_int8(proto) -> bool:
    """Whether the graph has a MatMul that `split_rows` could cut."""
    import onnx

    graph = proto.graph
    producer = {name: node for node in graph.node for name in node.output}
    int8_weights = {t.name for t in graph.initializer if t.data_type == onnx.TensorProto.INT8}
    return any(_static_int8_matmul(n, producer, int8_weights) for n in graph.node)


def _shapes(proto, input_shape: tuple[int, ...]) -> dict[str, list[int]]:
    """Every tensor's static shape where ONNX shape inference finds it, with the graph's
    input fixed to `input_shape`."""
    import onnx
    from onnx import shape_inference

    probe = onnx.ModelProto()
    probe.CopyFrom(proto)
    dims = probe.graph.input[0].type.tensor_type.shape.dim
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
        if all(d.HasField("dim_value") for d in dims):
            shapes[value.name] = [d.dim_value for d in dims]
    return shapes


def split_rows(proto, input_shape: tuple[int, ...], threads: int):
    """`proto` (an onnx.ModelProto, left as it is) with each static int8 MatMul's tokens cut
    where `row_cut` says, for an input of `input_shape`; returns (the new model, how many
    MatMuls were cut), or (None, 0) where none is."""
    import onnx
    from onnx import helper, numpy_helper

    out = onnx.ModelProto()
    out.CopyFrom(proto)
    graph = out.graph
    producer = {name: node for node in graph.node for name in node.output}
    users: dict[str, list] = {}
    for node in graph.node:
        for name in node.input:
            users.setdefault(name, []).append(node)
    int8_weights = {t.name for t in graph.initializer if t.data_type == onnx.TensorProto.INT8}
    widths = {t.name: tuple(t.dims) for t in graph.initializer}
    cuts = {}  # a MatMul's output -> (cut, its QuantizeLinear, DequantizeLinear, bias Add)
    shapes = None
    for node in graph.node:
        if not (qdq := _static_int8_matmul(node, producer, int8_weights)):
            continue
        shapes = _shapes(out, input_shape) if shapes is None else shapes
        shape = shapes.get(qdq[0].input[0])
        cut = row_cut(shape[1], shape[0], threads) if shape and len(shape) == 3 else None
        if cut is not None:
            cuts[node.output[0]] = (cut, *qdq, _bias(node, users, widths))
    if not cuts:
        return None, 0

    constants: dict[int, str] = {}

    def constant(value: int) -> str:
        if value not in constants:
            constants[value] = f"rows_split/{value}"
            graph.initializer.append(
                numpy_helper.from_array(np.array([value], np.int64), constants[value]))
        return constants[value]

    folded = {bias.output[0] for *_, bias in cuts.values() if bias is not None}
    nodes = []
    for node in graph.node:
        if node.output[0] in folded:
            continue  # a bias Add now inside both parts of its MatMul
        if node.output[0] not in cuts:
            nodes.append(node)
            continue
        cut, quantize, dequantize, bias = cuts[node.output[0]]
        parts = []
        for i, (start, end) in enumerate(((0, cut), (cut, 2 ** 62))):
            p = f"{node.name or node.output[0]}/rows{i}"
            nodes += [
                helper.make_node("Slice", [quantize.input[0], constant(start), constant(end),
                                           constant(1)], [p + "/x"], name=p + "/slice"),
                helper.make_node("QuantizeLinear", [p + "/x", *quantize.input[1:]], [p + "/q"],
                                 name=p + "/quantize"),
                helper.make_node("DequantizeLinear", [p + "/q", *dequantize.input[1:]],
                                 [p + "/dq"], name=p + "/dequantize"),
                helper.make_node("MatMul", [p + "/dq", node.input[1]], [p + "/y"],
                                 name=p + "/matmul")]
            if bias is not None:
                b = next(name for name in bias.input if name != node.output[0])
                nodes.append(helper.make_node("Add", [p + "/y", b], [p + "/yb"],
                                              name=p + "/bias"))
            parts.append(p + ("/yb" if bias is not None else "/y"))
        nodes.append(helper.make_node("Concat", parts, [(bias or node).output[0]],
                                      name=f"{node.name or node.output[0]}/rows", axis=1))
    del graph.node[:]
    graph.node.extend(_live(nodes, graph))
    return out, len(cuts)


def _bias(matmul, users, widths):
    """The Add of a [N] initializer that alone reads `matmul`'s output, or None."""
    readers = users.get(matmul.output[0], [])
    if len(readers) != 1 or readers[0].op_type != "Add":
        return None
    other = [n for n in readers[0].input if n != matmul.output[0]]
    return readers[0] if len(other) == 1 and len(widths.get(other[0], ())) == 1 else None


def _live(nodes: list, graph) -> list:
    """`nodes` less those whose outputs nothing reads (the replaced QuantizeLinear and
    DequantizeLinear pairs)."""
    while True:
        read = {name for n in nodes for name in n.input} | {o.name for o in graph.output}
        live = [n for n in nodes if any(name in read for name in n.output)]
        if len(live) == len(nodes):
            return nodes
        nodes = live
