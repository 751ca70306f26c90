"""Static checks, from the artifacts themselves rather than their outputs: no batch or image
size baked into an ONNX graph or a torch.export program, the precision each file really
holds, and where a CUDA session placed its heavy ops."""
from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Optional

import numpy as np

from .. import bundle as B
from .. import runtime
from ..errors import ParityError, first_line, param
from ..model import size_values
from ..onnxio import node_scopes
from ..pt2 import read_program, symbolic_axes
from ..verified import Loaded
from .compare import PairResult
from .report import Check
from .tolerance import precision_of_profile


def _constant_values(graph, names: set[str]) -> dict[str, np.ndarray]:
    """The values of the constants among `names` (initializers or Constant nodes).

    Only the named ones are read: big weights may live in external data we did not load.
    """
    import onnx
    from onnx import numpy_helper

    values = {t.name: numpy_helper.to_array(t) for t in graph.initializer
              if t.name in names and t.data_location != onnx.TensorProto.EXTERNAL}
    for node in graph.node:
        if node.op_type == "Constant" and node.output[0] in names:
            for attr in node.attribute:
                if attr.name == "value":
                    values[node.output[0]] = numpy_helper.to_array(attr.t)
    return values


def _graph(source: "str | os.PathLike | B.OnnxModel"):
    """The graph of an ONNX model as already loaded (a bundle's, parsed once), or of a file
    the caller named; and the file's name."""
    if isinstance(source, B.OnnxModel):
        return source.proto.graph, source.path.name
    return B.read_onnx(source).graph, Path(source).name


def _static_values(graph) -> set[str]:
    """The values whose shape the exporter recorded as fully fixed (every dim a number):
    computed from constants alone, so no batch reaches them."""
    static = {i.name for i in graph.initializer}
    for value in graph.value_info:
        dims = value.type.tensor_type.shape.dim
        if value.type.HasField("tensor_type") and value.type.tensor_type.HasField("shape") \
                and all(d.HasField("dim_value") for d in dims):
            static.add(value.name)
    return static


def scan_graph(onnx_path: "str | os.PathLike | B.OnnxModel", export_batch: int, config=None,
               export_size: Optional[Sequence[int]] = None) -> list[Check]:
    """Static checks: symbolic batch on input and output; no shape constant = export batch.

    The "baked batch" bug: a Reshape/Expand/Tile whose shape (or repeats) is a constant with
    the export batch size in the batch position; the graph then only runs at that batch.
    For a dynamic-size model (`config.dynamic_img_size`, exported at `export_size`) the
    input's height and width must be symbolic too, and no Reshape/Expand/Tile constant may
    hold a number of the example's size (its sides, grid or token count, chosen by
    export.example_size to differ from every size of the model itself), nor a Resize take
    constant sizes.
    """

    graph, name = _graph(onnx_path)
    checks = []
    for value in list(graph.input) + list(graph.output):
        dims = value.type.tensor_type.shape.dim
        symbolic = bool(dims) and bool(dims[0].dim_param)
        shown = dims[0].dim_param or dims[0].dim_value if dims else "none"
        checks.append(Check(f"{name}: symbolic batch axis on {value.name}", symbolic,
                            f"dim 0 is {shown!r}"))
    shaping = [n for n in graph.node
               if n.op_type in ("Reshape", "Expand", "Tile") and len(n.input) > 1]
    constants = _constant_values(graph, {n.input[1] for n in shaping})
    # with a symbolic batch in, a fixed shape is one no batch reaches
    fixed = _static_values(graph) if all(c.passed for c in checks) else set()
    baked = []
    for node in shaping:
        shape = constants.get(node.input[1])
        if "rope" in node_scopes(node):  # the rotary table has no batch axis (mixed: depth)
            continue
        if node.input[0] in fixed:  # reshapes what no input size reaches (Swin's window mask)
            continue
        if shape is not None and shape.ndim == 1 and shape.size > 1 \
                and int(shape[0]) == export_batch:
            baked.append(f"{node.op_type} {node.name or node.output[0]} {shape.tolist()}")
    checks.append(Check(
        f"{name}: no baked batch in shape constants", not baked,
        f"{len(baked)} node(s) with batch {export_batch} baked in: {'; '.join(baked[:3])}"
        if baked else f"no Reshape/Expand/Tile constant starts with {export_batch}"))
    if config is not None and config.dynamic_img_size and export_size:
        checks += _scan_sizes(graph, name, config, export_size, shaping, constants)
    if config is not None and config.rope_type and config.dynamic_img_size and export_size:
        checks.append(_scan_rope(graph, name, config, export_size))
    return checks


def _scan_sizes(graph, name: str, config, export_size: Sequence[int], shaping,
                constants: dict[str, np.ndarray]) -> list[Check]:
    """The dynamic-size half of scan_graph."""
    dims = graph.input[0].type.tensor_type.shape.dim
    sides = [d.dim_param or d.dim_value for d in dims[2:4]]
    checks = [Check(f"{name}: symbolic height and width on {graph.input[0].name}",
                    len(sides) == 2 and all(isinstance(s, str) and s for s in sides),
                    f"dims 2 and 3 are {sides}")]
    h, w = export_size
    telling = size_values(config, h // config.patch_size, w // config.patch_size)
    baked = []
    for node in shaping:
        shape = constants.get(node.input[1])
        if shape is None:
            continue
        hits = sorted({telling[int(v)] for v in shape.reshape(-1) if int(v) in telling})
        if hits:
            baked.append(f"{node.op_type} {node.name or node.output[0]} {shape.tolist()} "
                         f"({', '.join(hits)})")
    resizes = [n for n in graph.node if n.op_type == "Resize" and len(n.input) > 3]
    fixed = _constant_values(graph, {n.input[3] for n in resizes})
    baked += [f"Resize {n.name or n.output[0]} to constant sizes {fixed[n.input[3]].tolist()}"
              for n in resizes if n.input[3] in fixed]
    checks.append(Check(
        f"{name}: no baked image size in shape constants", not baked,
        f"{len(baked)} node(s) with the {h}x{w} example's size baked in: "
        f"{'; '.join(baked[:3])}" if baked else
        f"no Reshape/Expand/Tile constant holds {sorted(telling)} (the {h}x{w} example's "
        f"sides, grid and tokens), no Resize to constant sizes"))
    return checks


def _scan_rope(graph, name: str, config, export_size: Sequence[int]) -> Check:
    """Under a dynamic size, a rotary model's tables must follow the input's grid: the graph
    computes them (Sin and Cos nodes), and no constant holds the example's patch count N
    among its dims (a table folded for the example's grid, in whatever layout the exporter
    folded it: [N, 2d], [N, d/2, 2], [depth, heads, N, 2d]). export.example_size chose N to
    differ from every size of the model itself.

    At a fixed size there is no such check: there is one grid, the exporters rightly fold
    its tables into constants of their own layout, and what matters, that those are timm's
    tables, is what parity proves (eager against the ONNX model, and eager against timm in
    tests/test_families.py), not their form."""
    h, w = export_size
    n = (h // config.patch_size) * (w // config.patch_size)
    shapes = [(i.name, list(i.dims)) for i in graph.initializer]
    shapes += [(node.output[0], list(a.t.dims)) for node in graph.node
               if node.op_type == "Constant" for a in node.attribute if a.name == "value"]
    tables = [f"{k} {dims}" for k, dims in shapes if n in dims]
    trig = sum(node.op_type in ("Sin", "Cos") for node in graph.node)
    return Check(f"{name}: rotary tables computed from the input's grid",
                 trig >= 2 and not tables,
                 f"{trig} Sin/Cos node(s); constant(s) holding the {h}x{w} example's {n} "
                 f"patches: {', '.join(tables[:3]) or 'none'}")


def scan_program(path: str | os.PathLike | Loaded, config) -> list[Check]:
    """The "baked batch" question for a torch.export program, from the program itself: the
    input's batch axis (and, for a dynamic-size model, its height and width) is a symbol in
    its range constraints, not a number."""
    name = path.name if isinstance(path, Loaded) else Path(path).name
    program = read_program(path)  # refused in one line where it could run code
    try:
        axes = symbolic_axes(program)
    except Exception as exc:  # deserialization raises many error types
        raise ParityError(f"cannot read the program in {name}: {first_line(exc)}") from None
    wanted = [(0, "batch")] + ([(2, "height"), (3, "width")] if config.dynamic_img_size else [])
    checks = []
    for axis, what in wanted:
        bound = axes.get(axis)
        detail = (f"dim {axis} ranges over [{bound[0]}, {bound[1]}] in the range constraints"
                  if bound else f"dim {axis} is a fixed size")
        checks.append(Check(f"{name}: symbolic {what} axis on {B.INPUT_NAME}",
                            bound is not None and bound[0] < bound[1], detail))
    return checks


def unseen_batch_check(name: str, results: Sequence[PairResult], export_batch: int
                       ) -> Check:
    """A compiled artifact that keeps no graph to scan (an AOTInductor package) shows its
    batch is not baked in by running, and agreeing, at batch sizes it was not made at."""
    ran = sorted({r.batch for r in results if r.candidate == name and r.batch != export_batch})
    failed = {r.batch for r in results if r.candidate == name and not r.passed}
    agreed = [batch for batch in ran if batch not in failed]  # every output agreed
    return Check(f"{name}: runs at batch sizes it was not compiled at", bool(ran) and
                 agreed == ran, f"compiled at batch {export_batch}; agreed with eager at "
                 f"{', '.join(map(str, agreed)) or 'none'} of {', '.join(map(str, ran)) or 'none'}")


# Ops that only a quantized graph holds: ONNX Runtime's dynamic (MatMulInteger, ...) and
# static (QDQ or QOperator) formats.
QUANTIZED_OPS = {"DynamicQuantizeLinear", "MatMulInteger", "MatMulIntegerToFloat",
                 "DynamicQuantizeMatMul", "QuantizeLinear", "DequantizeLinear", "QLinearMatMul",
                 "QLinearConv", "ConvInteger", "QGemm", "QAttention", "QLinearAdd"}


def graph_precision(onnx_path: "str | os.PathLike | B.OnnxModel") -> str:
    """What the file is, whatever config.json says: "int8" if it holds quantized ops,
    "fp16" or "bf16" if most weight elements are stored so, else "fp32"."""
    import onnx

    graph, _ = _graph(onnx_path)
    if any(node.op_type in QUANTIZED_OPS for node in graph.node):
        return "int8"
    elements: dict[int, int] = {}
    for tensor in graph.initializer:
        count = int(np.prod(tensor.dims)) if tensor.dims else 1
        elements[tensor.data_type] = elements.get(tensor.data_type, 0) + count
    if not elements:
        return "fp32"
    most = max(elements, key=elements.get)
    return {onnx.TensorProto.FLOAT16: "fp16", onnx.TensorProto.BFLOAT16: "bf16"}.get(most, "fp32")


def judged_profiles(bundle: B.Bundle, profile: Optional[str] = None
                    ) -> tuple[dict[str, str], list[Check]]:
    """The profile each ONNX model is judged by, and a check per model that the precision
    config.json declares is the one its graph holds: a looser profile cannot be claimed for
    an fp32 file. A mismatch fails and the model is judged by what it is. `profile` replaces
    the profile of the models it is for (tf32: the fp32 ones; an fp16 model beside them keeps
    fp16)."""
    models, checks = {}, []
    for name, declared in bundle.onnx_models.items():
        found = graph_precision(bundle.onnx_model(name))  # parsed once, shared
        agrees = precision_of_profile(declared) == found
        checks.append(Check(f"{name}: precision is the declared {declared}", agrees,
                            f"the graph holds {found} weights and ops"))
        own = declared if agrees else found
        models[name] = profile if profile and precision_of_profile(profile) == \
            precision_of_profile(own) else own
    if profile and profile not in models.values():
        raise ParityError(f"{param('profile', profile)} is for {precision_of_profile(profile)} models, "
                          f"and this bundle has none ({', '.join(sorted(models))})")
    return models, checks


def placement_check(model: str, placement: dict[str, dict[str, int]],
                    require_provider: Optional[str]) -> Check:
    """Heavy ops on the CPU provider of a CUDA session: named always, failed under
    `require_provider == "cuda"`."""
    on_cpu = runtime.heavy_ops_on_cpu(placement)
    light = sorted(op for op, by in placement.items()
                   if by.get(runtime.PROVIDERS["cpu"]) and op not in on_cpu)
    detail = (f"heavy ops on CPU: {', '.join(f'{op} x{n}' for op, n in on_cpu.items())}"
              if on_cpu else "every heavy op on CUDA")
    if light:
        detail += f"; shape ops on CPU: {', '.join(light)}"
    return Check(f"{model}: computed on CUDA", not (on_cpu and require_provider == "cuda"),
                 detail)
