"""Our exported attention, rewritten into the layout ONNX Runtime's transformer optimizer fuses.

The optimizer's FusionAttention (onnxruntime/transformers/fusion_attention.py) knows attention
as Hugging Face's BERT exports it: three MatMul + Add on the normalized input, each followed
by Reshape [0, 0, H, d] and Transpose, then softmax(q @ k^T / sqrt(d)) @ v. Our Attention
(model.py) projects q, k and v with one Linear [D, 3D] and takes them apart with Reshape
[B, N, 3, H, d], Transpose and Slice/Squeeze (dynamo) or Split/Squeeze (torchscript), and
scales q before q @ k^T, so the optimizer fuses nothing. `split_qkv` replaces each block's
attention, from the qkv MatMul to the input of the projection's MatMul, by that layout with the
same math (scale head_dim ** -0.5, which is also the fused op's default). The fused Attention
op stacks the three weights back into the original [D, 3D] one.
"""
from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import onnx
from onnx import helper, numpy_helper

from .errors import ExportError

FUSED_ATTENTION = ("Attention", "MultiHeadAttention")  # com.microsoft ops the optimizer makes
# What may lie between the qkv MatMul and the projection: the two exporters' ways of taking
# q, k, v apart, the scale, q @ k^T, softmax, @ v and the merge of the heads.
_CORE_OPS = {"Reshape", "Transpose", "Slice", "Squeeze", "Split", "Gather", "Mul", "Div",
             "MatMul", "Softmax"}


def fused_attention_count(proto: onnx.ModelProto) -> int:
    """Fused attention nodes (Attention or MultiHeadAttention, domain com.microsoft)."""
    return sum(n.op_type in FUSED_ATTENTION and n.domain == "com.microsoft"
               for n in proto.graph.node)


def _weights(graph: onnx.GraphProto) -> dict[str, tuple[int, ...]]:
    return {t.name: tuple(t.dims) for t in graph.initializer}


def _consumers(graph: onnx.GraphProto) -> dict[str, list[onnx.NodeProto]]:
    uses: dict[str, list[onnx.NodeProto]] = {}
    for node in graph.node:
        for name in node.input:
            uses.setdefault(name, []).append(node)
    return uses


def _is_weight_matmul(node: onnx.NodeProto, weights: dict[str, tuple[int, ...]]) -> bool:
    return node.op_type == "MatMul" and len(node.input) == 2 and node.input[1] in weights


def _bias_add(matmul: onnx.NodeProto, uses, weights, width: int):
    """The Add of a bias [width] that is the only user of `matmul`'s output, or None."""
    users = uses.get(matmul.output[0], [])
    if len(users) != 1 or users[0].op_type != "Add":
        return None
    other = [n for n in users[0].input if n != matmul.output[0]]
    return users[0] if len(other) == 1 and weights.get(other[0]) == (width,) else None


def _core(start: str, uses, weights) -> tuple[list[onnx.NodeProto], list[onnx.NodeProto]]:
    """Nodes reachable from tensor `start` without passing a weight MatMul, and the weight
    MatMuls where the walk stopped. Nodes are told apart by their first output's name."""
    seen: dict[str, onnx.NodeProto] = {}
    stops: dict[str, onnx.NodeProto] = {}
    todo = [start]
    while todo:
        for node in uses.get(todo.pop(), []):
            if _is_weight_matmul(node, weights):
                stops[node.output[0]] = node
            elif node.output[0] not in seen:
                seen[node.output[0]] = node
                todo.extend(node.output)
    return list(seen.values()), list(stops.values())


def _attention_blocks(graph: onnx.GraphProto, dim: int) -> Iterator[tuple]:
    """(qkv MatMul, its bias Add or None, the nodes up to the projection, the projection
    MatMul) for each attention, in graph order. A MatMul with a [D, 3D] weight is the qkv one
    when the walk from it reaches exactly one weight MatMul, a [D, D] one, through a Softmax
    (an MLP with mlp_ratio 3 has the same first weight, and no Softmax)."""
    weights, uses = _weights(graph), _consumers(graph)
    for node in list(graph.node):
        if not _is_weight_matmul(node, weights) or weights[node.input[1]] != (dim, 3 * dim):
            continue
        add = _bias_add(node, uses, weights, 3 * dim)
        core, stops = _core((add or node).output[0], uses, weights)
        if len(stops) != 1 or weights[stops[0].input[1]] != (dim, dim):
            continue
        if not any(n.op_type == "Softmax" for n in core):
            continue
        yield node, add, core, stops[0]


def _check_core(core: list[onnx.NodeProto], proj: onnx.NodeProto, uses, block: int) -> None:
    """The nodes that are replaced are attention and nothing else: known ops, one softmax,
    and no value of theirs used outside them but the projection's input."""
    ops = [n.op_type for n in core]
    unknown = sorted(set(ops) - _CORE_OPS)
    if unknown or ops.count("Softmax") != 1 or ops.count("MatMul") != 2:
        raise ExportError(f"attention of block {block} is not the one our model exports "
                          f"(ops {sorted(set(ops))}); cannot lay it out for fusion")
    inside = {n.output[0] for n in core} | {proj.output[0]}
    for node in core:
        for name in node.output:
            if any(user.output[0] not in inside for user in uses.get(name, [])):
                raise ExportError(f"attention of block {block}: {name!r} is used outside "
                                  f"it; cannot lay it out for fusion")


def _split_layout(block: int, x: str, weight: np.ndarray, bias: np.ndarray, heads: int,
                  out: str) -> tuple[list[onnx.NodeProto], list[onnx.TensorProto]]:
    """Nodes and initializers of attention in the layout FusionAttention matches, from `x`
    [B, N, D] to `out` [B, N, D]: q, k, v each MatMul + Add + Reshape [0, 0, H, d] + Transpose
    (k straight to [B, H, d, N]), then softmax(q @ k / sqrt(d)) @ v and the heads merged."""
    dim = weight.shape[0]
    d = dim // heads
    p = f"split_qkv/blocks.{block}/"
    inits = [numpy_helper.from_array(np.array([0, 0, heads, d], dtype=np.int64), p + "heads"),
             numpy_helper.from_array(np.array([0, 0, dim], dtype=np.int64), p + "merged"),
             numpy_helper.from_array(np.array(np.sqrt(d), dtype=weight.dtype), p + "sqrt_d")]
    nodes = []

    def node(op: str, inputs: list[str], name: str, **attrs) -> str:
        nodes.append(helper.make_node(op, inputs, [p + name], name=p + name, **attrs))
        return p + name

    heads_of = {}
    for i, (part, perm) in enumerate((("q", [0, 2, 1, 3]), ("k", [0, 2, 3, 1]),
                                      ("v", [0, 2, 1, 3]))):
        inits += [numpy_helper.from_array(weight[:, i * dim:(i + 1) * dim].copy(),
                                          f"{p}{part}.weight"),
                  numpy_helper.from_array(bias[i * dim:(i + 1) * dim].copy(), f"{p}{part}.bias")]
        y = node("MatMul", [x, f"{p}{part}.weight"], f"{part}/MatMul")  # [B, N, D]
        y = node("Add", [y, f"{p}{part}.bias"], f"{part}/Add")  # [B, N, D]
        y = node("Reshape", [y, p + "heads"], f"{part}/Reshape")  # [B, N, H, d]
        heads_of[part] = node("Transpose", [y], f"{part}/Transpose", perm=perm)
    attn = node("MatMul", [heads_of["q"], heads_of["k"]], "qk/MatMul")  # [B, H, N, N]
    attn = node("Div", [attn, p + "sqrt_d"], "qk/Div")
    attn = node("Softmax", [attn], "Softmax", axis=-1)
    y = node("MatMul", [attn, heads_of["v"]], "av/MatMul")  # [B, H, N, d]
    y = node("Transpose", [y], "av/Transpose", perm=[0, 2, 1, 3])  # [B, N, H, d]
    nodes.append(helper.make_node("Reshape", [y, p + "merged"], [out], name=p + "av/Reshape"))
    return nodes, inits


def _attention_first(proj: onnx.NodeProto, uses) -> None:
    """Put the attention branch first in the residual Add after `proj` (x + attn(x) is
    exported as Add(x, attn)). FusionAttention finds the projection's bias Add as the first
    Add among the inputs of the SkipLayerNormalization it starts from; in block 0 x is itself
    an Add (tokens + position embedding), which it takes instead, and the match fails."""
    bias = [n for n in uses.get(proj.output[0], []) if n.op_type == "Add"]
    for residual in uses.get(bias[0].output[0], []) if len(bias) == 1 else []:
        if residual.op_type == "Add" and list(residual.input[1:]) == [bias[0].output[0]]:
            residual.input[0], residual.input[1] = residual.input[1], residual.input[0]


def _skip_identities(graph: onnx.GraphProto) -> None:
    """Read initializers directly where the torchscript exporter passes them through Identity
    nodes (it shares equal weights, e.g. zero biases, that way); prune drops the Identities."""
    inits = {t.name for t in graph.initializer}
    source = {n.output[0]: n.input[0] for n in graph.node
              if n.op_type == "Identity" and n.input[0] in inits}
    for node in graph.node:
        for i, name in enumerate(node.input):
            if name in source:
                node.input[i] = source[name]


def prune(graph: onnx.GraphProto) -> None:
    """Drop nodes whose outputs nothing uses (the torchscript exporter's Shape/Gather/Concat
    that built the replaced Reshapes' shapes), then initializers nothing uses."""
    while True:
        used = {name for n in graph.node for name in n.input} | {o.name for o in graph.output}
        dead = [n for n in graph.node if not any(name in used for name in n.output)]
        if not dead:
            break
        for node in dead:
            graph.node.remove(node)
    used = {name for n in graph.node for name in n.input}
    keep = [t for t in graph.initializer if t.name in used]
    del graph.initializer[:]
    graph.initializer.extend(keep)


def split_qkv(proto: onnx.ModelProto, dim: int, heads: int) -> int:
    """Rewrite every block's attention of `proto` in place into the layout the transformer
    optimizer fuses (see the module's docstring); returns how many were rewritten."""
    graph = proto.graph
    _skip_identities(graph)
    inits = {t.name: t for t in graph.initializer}
    uses = _consumers(graph)
    replaced: dict[str, list[onnx.NodeProto]] = {}  # qkv MatMul's output -> nodes in its place
    removed: set[str] = set()  # first outputs of the nodes replaced
    for block, (qkv, add, core, proj) in enumerate(_attention_blocks(graph, dim)):
        _check_core(core, proj, uses, block)
        weight = numpy_helper.to_array(inits[qkv.input[1]])
        bias_name = add and next(n for n in add.input if n in inits)
        bias = (numpy_helper.to_array(inits[bias_name]) if bias_name  # qkv_bias=False: zeros,
                else np.zeros(3 * dim, dtype=weight.dtype))  # the fusion wants the Adds
        nodes, new_inits = _split_layout(block, qkv.input[0], weight, bias, heads,
                                         proj.input[0])
        _attention_first(proj, uses)
        replaced[qkv.output[0]] = nodes
        removed |= {n.output[0] for n in [qkv, *([add] if add else []), *core]}
        graph.initializer.extend(new_inits)
    order = []
    for node in graph.node:
        first = node.output[0]
        order += replaced.get(first, []) if first in removed else [node]
    del graph.node[:]
    graph.node.extend(order)
    prune(graph)
    return len(replaced)


def _scalar(graph_values: dict[str, np.ndarray], name: str) -> "float | None":
    value = graph_values.get(name)
    return float(value.reshape(-1)[0]) if value is not None and value.size == 1 else None


def _only_user(uses, name: str, op: str) -> "onnx.NodeProto | None":
    users = uses.get(name, [])
    return users[0] if len(users) == 1 and users[0].op_type == op else None


def _other(node: onnx.NodeProto, name: str) -> "str | None":
    rest = [i for i in node.input if i != name]
    return rest[0] if len(node.input) == 2 and len(rest) == 1 else None


def gelu_for_fusion(proto: onnx.ModelProto) -> int:
    """Reorder each exact GELU the dynamo exporter writes, x * (0.5 * (1 + erf(x / sqrt 2))),
    into (x * (1 + erf(x / sqrt 2))) * 0.5, the order ONNX Runtime's GeluFusion (its session
    optimizer, C++) and the transformer optimizer's FusionGelu both recognise; the first
    leaves the other form as four kernels (Div, Erf, Add, Mul, Mul). The value is the same
    bit for bit: a product scaled by 0.5 is exact, whichever multiplication comes last.
    Returns how many GELUs were reordered."""
    graph = proto.graph
    values = {t.name: numpy_helper.to_array(t) for t in graph.initializer
              if int(np.prod(t.dims)) == 1 and t.data_location != onnx.TensorProto.EXTERNAL}
    producer = {out: n for n in graph.node for out in n.output}
    uses = _consumers(graph)
    done = 0
    for erf in [n for n in graph.node if n.op_type == "Erf"]:
        scale = producer.get(erf.input[0])
        if scale is None or scale.op_type != "Div" or \
                not np.isclose(_scalar(values, scale.input[1]) or 0, np.sqrt(2)):
            continue
        root = scale.input[0]
        add = _only_user(uses, erf.output[0], "Add")
        half = add and _only_user(uses, add.output[0], "Mul")
        last = half and _only_user(uses, half.output[0], "Mul")
        if not last or _scalar(values, _other(add, erf.output[0]) or "") != 1.0 or \
                _scalar(values, _other(half, add.output[0]) or "") != 0.5 or \
                _other(last, half.output[0]) != root:
            continue
        constant = _other(half, add.output[0])
        half.input[:] = [add.output[0], root]  # x * (1 + erf(x / sqrt 2)) ...
        last.input[:] = [half.output[0], constant]  # ... * 0.5
        done += 1
    return done


def _layer_scale(mul: onnx.NodeProto, inits, weights, uses, producer, outputs):
    """(weight MatMul, bias Add, gamma's name) where `mul` scales that Add's output by a
    vector initializer and is its only user; else None."""
    gamma = next((i for i in mul.input if i in inits and len(weights[i]) == 1), None)
    add = producer.get(_other(mul, gamma) or "") if gamma else None
    if add is None or add.op_type != "Add" or mul.output[0] in outputs:
        return None
    matmul = next((producer[i] for i in add.input if i in producer
                   and _is_weight_matmul(producer[i], weights)), None)
    if matmul is None or _bias_add(matmul, uses, weights, weights[gamma][0]) is not add \
            or len(uses.get(add.output[0], [])) != 1:
        return None
    return matmul, add, gamma


def fold_layer_scale(proto: onnx.ModelProto) -> int:
    """Fold each LayerScale (a Mul by a per-channel vector `gamma` right after a weight MatMul
    and its bias Add: attention's projection, the MLP's fc2) into that MatMul's weight and
    bias: gamma * (x @ W + b) = x @ (W * gamma) + b * gamma. The transformer optimizer finds
    attention from the residual Add back to the projection; a Mul between them hid every
    block of DINOv2, DeiT III and their kin from it. The fold rounds once where the graph
    rounded twice, so values move within fp32's last bits (the optimized model is proved
    against eager like every other). Returns how many were folded."""
    graph = proto.graph
    inits = {t.name: t for t in graph.initializer}
    weights, uses = _weights(graph), _consumers(graph)
    producer = {out: n for n in graph.node for out in n.output}
    outputs = {o.name for o in graph.output}
    dropped: set[str] = set()
    for mul in [n for n in graph.node if n.op_type == "Mul" and len(n.input) == 2]:
        found = _layer_scale(mul, inits, weights, uses, producer, outputs)
        if found is None:
            continue
        matmul, add, gamma_name = found
        gamma = numpy_helper.to_array(inits[gamma_name])
        weight, bias = matmul.input[1], _other(add, matmul.output[0])
        for name, scale in ((weight, gamma[None, :]), (bias, gamma)):
            scaled = (numpy_helper.to_array(inits[name]) * scale).astype(gamma.dtype)
            inits[name].CopyFrom(numpy_helper.from_array(scaled, name))
        for user in uses.get(mul.output[0], []):  # the Mul's users read the Add instead
            user.input[:] = [add.output[0] if i == mul.output[0] else i for i in user.input]
        dropped.add(mul.output[0])
    kept = [n for n in graph.node if n.output[0] not in dropped]
    del graph.node[:]
    graph.node.extend(kept)
    prune(graph)
    return len(dropped)


def after_projection(proto: onnx.ModelProto, dim: int) -> list[str]:
    """For each block's attention, the op its projection (MatMul, bias Add) feeds: the
    residual Add where the transformer optimizer can find the attention, anything else
    (a LayerScale's Mul, a norm) where it cannot. Says why a block was not fused."""
    graph = proto.graph
    weights, uses = _weights(graph), _consumers(graph)
    found = []
    for _, _, _, proj in _attention_blocks(graph, dim):
        out = (_bias_add(proj, uses, weights, dim) or proj).output[0]
        found.append("/".join(sorted({n.op_type for n in uses.get(out, [])})) or "nothing")
    return found
