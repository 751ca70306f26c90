"""model.onnx from a model: the exporter's graph (the dynamo exporter's, or TorchScript's
where dynamo cannot take a framework's module), made what we promise (named input and
outputs, a symbolic batch and size, the description as metadata, an IR ONNX Runtime reads),
its weights read from weights.safetensors where that file holds them, else in the graph or
beside it."""
from __future__ import annotations

import logging
import os
import re
import sys
import tempfile
from pathlib import Path
from typing import Any, Optional

import onnx
import torch

from .. import bundle as B
from .. import fusion, pt2
from ..errors import ExportError, first_line, param
from ..model import PATCHES_AXIS, VisionTransformer, model_constants, random_input, size_values
from ..onnxio import (
    DEFAULT_OPSET,
    MAX_IR_VERSION,
    SINGLE_FILE_BUDGET,
    captured,
    check_onnx,
    graph_only,
    initializer_bytes,
    save_onnx,
)
from .options import DEFAULT_EXPORTER, EXPORTERS

log = logging.getLogger(__name__)


def example_size(config) -> tuple[int, int]:
    """(H, W) of the example input that a model is traced and exported with.

    A fixed-size model takes its img_size. A dynamic-size one is exported at a non-square
    grid, one and two patches larger than the native one and moved further until none of
    its sides, grid sides or token counts equals a size the model itself has (heads, head
    width, D, ...): a Reshape constant that holds one of those numbers then cannot be
    anything but the example's size baked in, which is what parity.scan_graph looks for.
    """
    if not config.dynamic_img_size:
        return config.img_size, config.img_size
    gh = config.grid_size + 1
    while set(size_values(config, gh, gh + 1)) & set(model_constants(config)):
        gh += 1
    return gh * config.patch_size, (gh + 1) * config.patch_size



def _raw_onnx_export(model: VisionTransformer, path: Path, exporter: str, opset: int,
                     batch: int) -> Optional[Any]:
    """The exporter's model: the dynamo exporter's ONNXProgram, not saved; the TorchScript
    exporter's saved at `path` (None returned)."""
    config = model.config
    x = random_input(config, batch, size=example_size(config))
    outputs = list(config.output_names)
    common = dict(input_names=[B.INPUT_NAME], output_names=outputs, opset_version=opset)
    with captured(f"{exporter} ONNX export"):
        if exporter == "dynamo":
            try:
                return torch.onnx.export(model, (x,), None, dynamo=True,
                                         dynamic_shapes={"x": pt2.dynamic_shapes(config)},
                                         verbose=False, **common)
            finally:
                _forget_matched_graphs()
        sides = {2: B.HEIGHT_DIM, 3: B.WIDTH_DIM} if config.dynamic_img_size else {}
        patches = {1: PATCHES_AXIS} if config.dynamic_img_size else {}
        axes = {name: {0: B.BATCH_DIM, **(patches if name == "tokens" else {})}
                for name in outputs}
        torch.onnx.export(model, (x,), str(path), dynamo=False,
                          dynamic_axes={B.INPUT_NAME: {0: B.BATCH_DIM, **sides}, **axes},
                          **common)
    return None


def _unsaved(program) -> tuple[onnx.ModelProto, dict[str, Any]]:
    """The dynamo exporter's model as a ModelProto without its weights' bytes, and those
    bytes: each initializer of a kilobyte or more names a location of its own (as external
    data), and the mapping gives the exporter's tensor behind each. Nothing is written or
    copied whole: `share_weights` points each at the weights file or takes it into the
    graph, one at a time. `program` is spent (its initializers are those placeholders)."""
    import onnx_ir as ir

    tensors = {}
    for i, value in enumerate(program.model.graph.initializers.values()):
        tensor = value.const_value
        if tensor.nbytes < 1024:
            continue
        location = f"exported-{i}"
        tensors[location] = tensor
        value.const_value = ir.ExternalTensor(location, 0, tensor.nbytes, tensor.dtype,
                                              shape=tensor.shape, name=value.name)
    return ir.serde.serialize_model(program.model), tensors


def _forget_matched_graphs() -> None:
    """Let onnxscript's rewrite rules drop the graph they last matched.

    The dynamo exporter rewrites the graph with module-level rules whose matcher keeps the
    last graph it matched (SimplePatternMatcher._graph, onnxscript 1.1), and that graph
    holds every weight of the exported model: a ViT-L's 1.1 GiB stayed in memory after the
    model itself was released (measured). Each match sets these again."""
    from onnxscript.rewriter import _matcher

    for name, module in list(sys.modules.items()):
        if not name.startswith("onnxscript.rewriter"):
            continue
        for value in list(vars(module).values()):  # rules, tuples of rules, rule sets
            items = value if isinstance(value, (tuple, list)) else getattr(value, "rules", [value])
            for rule in items if isinstance(items, (tuple, list)) else ():
                matcher = getattr(rule, "_matcher", None)
                if isinstance(matcher, _matcher.SimplePatternMatcher):
                    matcher._graph = matcher._tracer = None
                    matcher._init_match(0)


def _dim_param(value: onnx.ValueInfoProto, axis: int = 0) -> str:
    dims = value.type.tensor_type.shape.dim
    return dims[axis].dim_param if len(dims) > axis else ""


def _rename_dim_param(proto: onnx.ModelProto, old: str, new: str) -> None:
    graph = proto.graph
    for value in list(graph.input) + list(graph.output) + list(graph.value_info):
        for dim in value.type.tensor_type.shape.dim:
            if dim.dim_param == old:
                dim.dim_param = new


def _free_output_name(proto: onnx.ModelProto, name: str) -> None:
    """An initializer the exporter left under an output's name (AIMv2's, measured) renamed,
    with its uses, all before the output is made: the graph holds each name once
    (onnx.checker's SSA rule)."""
    graph = proto.graph
    clashing = [t for t in graph.initializer if t.name == name]
    if not clashing:
        return
    nodes = list(graph.node)
    made = next((i for i, n in enumerate(nodes) if name in n.output), len(nodes))
    if any(name in n.input for n in nodes[made + 1:]):
        raise ExportError(f"the exported graph holds a weight and an output both named {name!r}")
    taken = {t.name for t in graph.initializer} | {o for n in nodes for o in n.output}
    new = next(f"{name}_weight{i or ''}" for i in range(len(taken) + 1)
               if f"{name}_weight{i or ''}" not in taken)
    clashing[0].name = new
    for node in nodes[:made]:
        node.input[:] = [new if i == name else i for i in node.input]
    for value in graph.value_info:
        if value.name == name:
            value.name = new


def finish_onnx(proto: onnx.ModelProto, description_json: str, config) -> onnx.ModelProto:
    """Make the exported graph what we promise: named I/O, symbolic `batch` (and `height`,
    `width` for a dynamic size), metadata, IR."""
    inputs, outputs = list(proto.graph.input), list(proto.graph.output)
    dynamic_size, names = config.dynamic_img_size, list(config.output_names)
    if [i.name for i in inputs] != [B.INPUT_NAME] or [o.name for o in outputs] != names:
        raise ExportError(f"exported graph has inputs {[i.name for i in inputs]} and outputs "
                          f"{[o.name for o in outputs]}, expected [{B.INPUT_NAME!r}] and "
                          f"{names}")
    for value in inputs + outputs:
        param = _dim_param(value)
        if not param:
            raise ExportError(f"the batch axis of {value.name!r} was exported as a fixed size")
        if param != B.BATCH_DIM:
            _rename_dim_param(proto, param, B.BATCH_DIM)
    for axis, name in ((2, B.HEIGHT_DIM), (3, B.WIDTH_DIM)) if dynamic_size else ():
        param = _dim_param(inputs[0], axis)  # the dynamo exporter names them "16*grid_h"
        if not param:
            raise ExportError(f"the {name} axis of {inputs[0].name!r} was exported as a "
                              f"fixed size")
        if param != name:
            _rename_dim_param(proto, param, name)
    for value in outputs if dynamic_size else ():
        param = _dim_param(value, 1)  # the tokens' patch count: "16*grid_h*grid_w" or so
        if value.name == "tokens" and param and param != PATCHES_AXIS:
            _rename_dim_param(proto, param, PATCHES_AXIS)
    for name in names:
        _free_output_name(proto, name)
    fusion.gelu_for_fusion(proto)  # GELU in the order ONNX Runtime's fusions recognise
    proto.ir_version = min(proto.ir_version, MAX_IR_VERSION)
    del proto.metadata_props[:]
    onnx.helper.set_model_props(proto, {B.METADATA_KEY: description_json})
    proto.producer_name = "vit-export"
    proto.graph.name = "vit"
    return proto


def export_onnx(model: VisionTransformer, path: Path, description_json: str, *,
                exporter: str = DEFAULT_EXPORTER, opset: int = DEFAULT_OPSET, batch: int = 2,
                external_data: Optional[bool] = None, keep: Optional[list] = None,
                spans: Optional[dict] = None) -> dict[str, Any]:
    """Export to `path`; weights go to `<path>.data` when too big for one file or when
    asked. `keep`, a list, is given the ModelProto written when it was written whole (its
    weights inside). With `spans` (`bundle.weight_spans` of the weights file beside `path`),
    a model that would hold its weights inside reads those that file holds from it instead
    (`bundle.share_weights`), taken straight from the exporter's output: the weights are
    never written into the graph only to be moved out again."""
    if exporter not in EXPORTERS:
        raise ExportError(f"unknown exporter {exporter!r}; choose one of {EXPORTERS}")
    if opset < 17:
        raise ExportError(f"opset {opset} splits LayerNorm into many ops; use 17 or newer")
    with tempfile.TemporaryDirectory(dir=path.parent, prefix=".onnx-export-") as tmp:
        raw = Path(tmp) / "raw.onnx"
        fallback = None
        in_memory = spans is not None and not external_data
        try:
            proto, source = _exported(model, raw, exporter, opset, batch, in_memory)
        except ExportError as exc:
            # a framework's own module the dynamo exporter cannot take with a symbolic batch
            # (timm's BEiT: a view of its relative position bias): the TorchScript exporter,
            # whose graph the validation then proves at three batch sizes
            if exporter != "dynamo" or getattr(model, "record", None) is None:
                raise
            if model.config.dynamic_img_size:  # TorchScript's trace fixes the image size
                raise ExportError(f"{param('dynamic_size', True)}: the dynamo exporter cannot "
                                  f"export this model at any size ({_cause(exc)}), and the "
                                  f"TorchScript exporter's trace fixes the size; export it "
                                  f"at one size") from None
            fallback = {"exporter": "torchscript", "dynamo_failed": _cause(exc)}
            log.warning("the dynamo exporter failed (%s); exporting with the TorchScript "
                        "exporter", fallback["dynamo_failed"])
            exporter = "torchscript"
            proto, source = _exported(model, raw, exporter, opset, batch, in_memory)
        proto = finish_onnx(proto, description_json, model.config)
        size = initializer_bytes(proto)
        if external_data is None:
            external_data = size > SINGLE_FILE_BUDGET
        shared = None
        # the exporter's tensors (`in_memory`, all in one file) take the second road only
        if external_data and _move_external_data(proto, source, path):
            check_onnx(path)  # weights moved, not loaded: a ViT-g never held twice
        elif spans is not None and not external_data:
            shared = _write_shared(proto, source, path, spans)
        else:
            onnx.load_external_data_for_model(proto, str(source))
            size, external_data = save_onnx(proto, path, external_data)
            if keep is not None and not external_data:
                keep.append(proto)
    return {"exporter": exporter, "opset": opset, "export_batch": batch,
            "export_size": list(example_size(model.config)),
            "ir_version": proto.ir_version, "external_data": external_data,
            "weights_bytes": size, **({"fallback": fallback} if fallback else {}),
            **({"weights_in": shared} if shared else {})}


def _write_shared(proto: onnx.ModelProto, raw_dir: Path | dict[str, Any], path: Path,
                  spans: dict) -> str:
    """`proto` saved as `path`, its weights read from the weights file beside it where that
    file holds them (the rest taken into the graph from `raw_dir`: the exporter's files or
    tensors, as `share_weights` takes them); the file its weights are in, as config.json's
    export records it."""
    if not B.share_weights(proto, B.WEIGHTS_FILE, spans, data_dir=raw_dir):
        save_onnx(proto, path, external_data=False)
        return B.ONNX_FILE
    check_onnx(path, graph_only(proto))  # in memory: the file is read once, to be hashed
    B.atomic_write_bytes(path, proto.SerializeToString())
    return B.WEIGHTS_FILE


def _cause(exc: BaseException) -> str:
    """The first line of the innermost error `exc` was raised from (the exporter's own
    wrapping says only which of its steps failed), without terminal colours."""
    while exc.__cause__ is not None or exc.__context__ is not None:
        exc = exc.__cause__ or exc.__context__
    return re.sub(r"\x1b\[[0-9;]*m", "", first_line(exc))[:300]


def _exported(model: VisionTransformer, raw: Path, exporter: str, opset: int, batch: int,
              in_memory: bool) -> tuple[onnx.ModelProto, Path | dict[str, Any]]:
    """The exporter's graph without its weights, and where their bytes are (`share_weights`'s
    `data_dir`): in the files beside `raw`, where the graph was saved, or, `in_memory` (the
    weights to be pointed into the weights file, all in one file), the dynamo exporter's
    own tensors, never written."""
    try:
        program = _raw_onnx_export(model, raw, exporter, opset, batch)
    except ExportError:
        raise
    except Exception as exc:  # the exporters raise many error types
        raise ExportError(f"{exporter} ONNX export failed: {first_line(exc)}") from exc
    if program is not None:
        values = program.model.graph.initializers.values()
        empty = [v.name for v in values if v.const_value is None]
        if empty:  # as saving it would refuse
            raise ExportError(f"{exporter} ONNX export left {len(empty)} initializer(s) "
                              f"without a value ({empty[0]!r})")
        if in_memory and sum(v.const_value.nbytes for v in values) <= SINGLE_FILE_BUDGET:
            return _unsaved(program)
        with captured(f"{exporter} ONNX export"):
            program.save(str(raw), external_data=True)
    return onnx.load(str(raw), load_external_data=False), raw.parent  # the graph only


def _move_external_data(proto: onnx.ModelProto, source: Path, path: Path) -> bool:
    """Save `proto` as `path` with its weights in `<path>.data` by moving the exporter's one
    external data file there (offsets stay valid), never reading the weights; False when the
    exporter did not write exactly one such file."""
    tensors = [t for t in proto.graph.initializer
               if t.data_location == onnx.TensorProto.EXTERNAL]
    where = {e.value for t in tensors for e in t.external_data if e.key == "location"}
    if len(where) != 1:
        return False
    data = path.name + ".data"
    for tensor in tensors:
        for entry in tensor.external_data:
            if entry.key == "location":
                entry.value = data
    os.replace(source / where.pop(), path.parent / data)
    onnx.save_model(proto, str(path))
    return True
