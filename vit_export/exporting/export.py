"""A VisionTransformer into a bundle: the TorchScript trace and the ONNX export made here,
the ONNX models derived from it (variants.py), the preprocessing graph in front of it
(preprocessing/graph.py), the torch.export program and AOTInductor package (pt2.py), all
validated before the bundle is moved into place."""
from __future__ import annotations

import copy
import dataclasses
import errno
import io
import logging
import os
import re
import shutil
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any, Optional

import onnx
import torch

from .. import bundle as B
from .. import cpu, fusion, parity, pt2, runtime
from ..errors import ConfigError, ExportError, ParityError, first_line, param
from ..frameworks import with_any_size
from ..images import load_calibration, load_labelled_pixels
from ..model import (
    PATCHES_AXIS,
    VisionTransformer,
    model_constants,
    random_input,
    size_values,
    with_dynamic_size,
    with_output,
)
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
from ..parity import labelled_inputs
from ..preprocessing.graph import check_e2e, make_e2e
from .budget import static_within_budget
from .options import (
    DEFAULT_EXPORTER,
    EXPORTERS,
    ExportOptionError,
    ExportOptions,
    check_model_exporter,
    package_device,
)
from .variants import VARIANTS, make_variant, static_int8_options

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


def weight_bytes(model: VisionTransformer) -> int:
    return sum(t.nbytes for t in model.state_dict().values())


def trace_torchscript(model: VisionTransformer, path: Path, batch: int,
                      description_json: str) -> None:
    """torch.jit.trace at `batch`, then saved. The trace is not run here: validation runs
    the saved file against eager at every batch size (and, for a dynamic-size model, image
    size) it checks, so a trace that baked in its batch or size fails there, once.

    Traced with TF32 off: a trace bakes the convolution's `allow_tf32` in as a constant (the
    patch embedding's aten::_convolution), so a model traced under PyTorch's default
    (cuDNN TF32 on) computes its patch embedding in TF32 on any GPU, whatever the caller
    sets. Measured on an H100: max abs 3.3e-05 (rel 1.5e-04) against eager on the tiny ViT
    at batch 7, where cuDNN chose a TF32 algorithm; exact at batch 1 and 3."""
    x = random_input(model.config, batch, size=example_size(model.config))
    try:
        with captured("torch.jit.trace"), torch.no_grad(), runtime.tf32(False):
            traced = torch.jit.trace(model, x, check_trace=False)
    except Exception as exc:  # tracing raises many error types
        raise ExportError(f"torch.jit.trace failed: {first_line(exc)}") from None
    extra = {f"{B.METADATA_KEY}.json": description_json}
    size = weight_bytes(model)
    if size <= runtime.RELEASE_ABOVE:
        buffer = io.BytesIO()  # saved to memory, written by Python: a full disk is an
        with captured("torch.jit.save"):  # OSError, never an abort in torch's C++ writer
            torch.jit.save(traced, buffer, _extra_files=extra)
        B.atomic_write_bytes(path, buffer.getvalue())
        return
    # Big: torch's C++ writer straight to the file. Through memory, torch holds the file
    # twice (its buffer, then Python's bytes) beside the model: 15 GB for a ViT-g, measured.
    # That writer aborts the process on a full disk, so the space is made sure of first.
    if shutil.disk_usage(path.parent).free < size + 2**26:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
    with captured("torch.jit.save"):
        torch.jit.save(traced, str(path), _extra_files=extra)


def _raw_onnx_export(model: VisionTransformer, path: Path, exporter: str, opset: int,
                     batch: int) -> None:
    config = model.config
    x = random_input(config, batch, size=example_size(config))
    outputs = list(config.output_names)
    common = dict(input_names=[B.INPUT_NAME], output_names=outputs, opset_version=opset)
    with captured(f"{exporter} ONNX export"):
        if exporter == "dynamo":
            try:
                torch.onnx.export(model, (x,), str(path), dynamo=True, external_data=True,
                                  dynamic_shapes={"x": pt2.dynamic_shapes(config)},
                                  verbose=False, **common)
            finally:
                _forget_matched_graphs()
        else:
            sides = {2: B.HEIGHT_DIM, 3: B.WIDTH_DIM} if config.dynamic_img_size else {}
            patches = {1: PATCHES_AXIS} if config.dynamic_img_size else {}
            axes = {name: {0: B.BATCH_DIM, **(patches if name == "tokens" else {})}
                    for name in outputs}
            torch.onnx.export(model, (x,), str(path), dynamo=False,
                              dynamic_axes={B.INPUT_NAME: {0: B.BATCH_DIM, **sides}, **axes},
                              **common)


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
        try:
            proto = _exported(model, raw, exporter, opset, batch)
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
            proto = _exported(model, raw, exporter, opset, batch)
        proto = finish_onnx(proto, description_json, model.config)
        size = initializer_bytes(proto)
        if external_data is None:
            external_data = size > SINGLE_FILE_BUDGET
        shared = None
        if external_data and _move_external_data(proto, Path(tmp), path):
            check_onnx(path)  # weights moved, not loaded: a ViT-g never held twice
        elif spans is not None and not external_data:
            shared = _write_shared(proto, Path(tmp), path, spans)
        else:
            onnx.load_external_data_for_model(proto, tmp)
            size, external_data = save_onnx(proto, path, external_data)
            if keep is not None and not external_data:
                keep.append(proto)
    return {"exporter": exporter, "opset": opset, "export_batch": batch,
            "export_size": list(example_size(model.config)),
            "ir_version": proto.ir_version, "external_data": external_data,
            "weights_bytes": size, **({"fallback": fallback} if fallback else {}),
            **({"weights_in": shared} if shared else {})}


def _write_shared(proto: onnx.ModelProto, raw_dir: Path, path: Path, spans: dict) -> str:
    """`proto` saved as `path`, its weights read from the weights file beside it where that
    file holds them (the rest taken into the graph from the exporter's files in `raw_dir`);
    the file its weights are in, as config.json's export records it."""
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


def _exported(model: VisionTransformer, raw: Path, exporter: str, opset: int,
              batch: int) -> onnx.ModelProto:
    """The exporter's graph at `raw`, loaded without its weights."""
    try:
        _raw_onnx_export(model, raw, exporter, opset, batch)
        return onnx.load(str(raw), load_external_data=False)  # the graph, not weights
    except ExportError:
        raise
    except Exception as exc:  # the exporters raise many error types
        raise ExportError(f"{exporter} ONNX export failed: {first_line(exc)}") from exc


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


def _check_model(model: VisionTransformer, description: B.Description,
                 options: ExportOptions) -> None:
    """What this model, with these options, cannot be exported as: refused before any work."""
    if options.embed_preprocessing:
        check_e2e(description.preprocessing, options.opset)
    c, exporter = model.config, options.exporter
    check_model_exporter(c, exporter)
    if c.table_grid != c.grid_size and c.pos_embed_antialias and exporter != "dynamo":
        raise ExportError(f"this model resamples its {c.table_grid}x{c.table_grid} position "
                          f"table to the {c.grid_size}x{c.grid_size} grid in forward, "
                          f"antialiased, as its source does; the {exporter} exporter cannot "
                          f"export that resize: use the dynamo exporter")
    if description.module is not None:
        asked = [name for name, value in (("outputs", options.outputs),
                                          ("normalize", options.normalize)) if value]
        if asked:
            raise ExportOptionError(f"{param(asked[0], getattr(options, asked[0]))}: a model "
                                    f"exported as its framework builds it gives what the "
                                    f"framework's model gives, at its own size")
    imported = description.extra.get("import") or {}
    if (c.dynamic_img_size or options.dynamic_size) and imported.get("format") == "torchvision":
        raise ExportError("torchvision's VisionTransformer runs at its image_size only: a "
                          "dynamic size would give answers its source cannot; export at "
                          "one size (img_size)")
    if options.aoti:
        pt2.check_compiler()  # before minutes of work, not after them


def _shaped(model: VisionTransformer, description: B.Description, options: ExportOptions
            ) -> tuple[VisionTransformer, B.Description]:
    """The model as the options shape it (any size, its outputs), its description to match
    and saying how it is exported; the caller's description stays as it was."""
    if options.dynamic_size and description.module is not None:
        try:
            model = with_any_size(model)
        except ConfigError as exc:
            raise ExportOptionError(f"{param('dynamic_size', True)}: {exc}") from None
    elif options.dynamic_size:
        model = with_dynamic_size(model)
    if options.outputs or options.normalize:
        model = with_output(model, options.outputs, options.normalize)
    description = dataclasses.replace(
        description, config=model.config, versions=B.package_versions(),
        export={"exporter": options.exporter, "opset": options.opset,
                "export_batch": options.export_batch_size})
    return model.eval(), description


def _read_data(options: ExportOptions, description: B.Description,
               step: Callable[[str], None]) -> tuple[ExportOptions, Any, Any]:
    """The images the options name, read with the model's preprocessing: the calibration
    set, the labelled set (validated on, raw for model.e2e.onnx). Returns the validation's
    options (every file is the one made here: trust_code), the calibration set and the
    first labelled set (name, pixels, labels) or None."""
    calibration = options.calibrate
    where = options.calibration_path()
    validation = dataclasses.replace(options.validation, trust_code=True)
    if where is not None:
        step(f"reading calibration images from {where}")
        calibration = load_calibration(where, description.preprocessing,
                                       count=options.calibrate_count, seed=validation.seed)
    if options.real_data is not None:
        real = labelled_inputs(options.real_data, description)
        raw = ({Path(options.real_data).stem: load_labelled_pixels(
            options.real_data, description.preprocessing, description.config.num_classes)}
            if options.embed_preprocessing else validation.raw_images)
        validation = dataclasses.replace(validation, real_inputs=real, raw_images=raw)
    labelled = next(((name, x, labels) for name, (x, labels)
                     in (validation.real_inputs or {}).items() if labels is not None), None)
    if options.budget is not None and labelled is None:
        raise ExportError(f"an accuracy budget is measured on labelled images: "
                          f"{options.real_data or 'the real inputs'} has no labels")
    return validation, calibration, labelled


def share_weights(proto: onnx.ModelProto, model: VisionTransformer, staging: Path) -> str:
    """model.onnx rewritten to read the weights weights.safetensors holds from that file
    (`bundle.share_weights`), so a bundle keeps them once for both; what config.json's
    export records as `weights_in`: the file model.onnx's weights are in."""
    if not B.share_weights(proto, B.WEIGHTS_FILE, B.weight_spans(model)):
        return B.ONNX_FILE
    B.atomic_write_bytes(staging / B.ONNX_FILE, proto.SerializeToString())
    return B.WEIGHTS_FILE


def _write_onnx_models(staging: Path, model: VisionTransformer, text: str,
                       options: ExportOptions, calibration, labelled,
                       step: Callable[[str], None]) -> dict[str, Any]:
    """model.onnx and its variants into `staging`; what config.json's export records."""
    step(f"exporting ONNX ({options.exporter}, opset {options.opset})")
    # the weights once: model.onnx reads those weights.safetensors holds from it, pointed
    # there as it is written, or, where variants are made from the graph with its weights
    # inside, once they are made
    whole: list = []
    share = options.external_data is None
    info = export_onnx(model, staging / B.ONNX_FILE, text, exporter=options.exporter,
                       opset=options.opset, batch=options.export_batch_size,
                       external_data=options.external_data,
                       keep=whole if share and options.variants else None,
                       spans=B.weight_spans(model) if share and not options.variants
                       else None)
    models = {B.ONNX_FILE: "fp32"}
    static = static_int8_options(cpu.isa()) if "static" in options.variants else None
    kept = None
    for kind in options.variants:
        step(f"making the {kind} model" + (f" (calibrating on {len(calibration.x)} "
                                           f"images)" if kind == "static" else ""))
        if kind == "static" and options.budget is not None:
            name, kept = static_within_budget(options.budget, model, staging / B.ONNX_FILE,
                                              staging, text, calibration, static,
                                              labelled, step)
        else:
            name = make_variant(kind, staging / B.ONNX_FILE, staging, model.config, text,
                                fp16_io=options.fp16_io, calibration=calibration,
                                static_options=static)
        models[name] = VARIANTS[kind][1]
    if whole:  # after the variants, which are made from the graph with its weights inside
        step(f"pointing {B.ONNX_FILE}'s weights into {B.WEIGHTS_FILE}")
        info["weights_in"] = share_weights(whole.pop(), model, staging)
    export = {**info, "onnx_models": models, "fp16_io": options.fp16_io}
    if static is not None:
        export["static_int8"] = {**static, "calibration": calibration.record,
                                 **({"budget": kept} if kept else {})}
    return export


def _write_programs(staging: Path, model: VisionTransformer, description: B.Description,
                    options: ExportOptions, text: str, step: Callable[[str], None]
                    ) -> tuple[str, ...]:
    """model.pt2 and model.aoti.pt2 as the options ask, recorded in `description.export`;
    the files written."""
    precision = options.package_precision
    x = random_input(model.config, options.export_batch_size, size=example_size(model.config))
    exported, extra = None, ()
    if options.pt2 or options.aoti and precision == "fp32":
        step("exporting the torch.export program")
        with captured("torch.export"):
            exported = pt2.export_program(model, x)
    if options.pt2:
        pt2.save_program(exported, staging / B.PT2_FILE, text)
        extra += (B.PT2_FILE,)
        description.export["pt2"] = {"symbolic_axes": {
            str(axis): list(bound)
            for axis, bound in pt2.symbolic_axes(exported).items() if bound}}
    if options.aoti:
        device = package_device(options.validation.provider)
        # the package's own description says what it is fed (runtime's aoti runner reads it)
        package_text = dataclasses.replace(description, export={
            **description.export, "aoti": {"precision": precision}}).to_json()
        if precision == "fp16":  # a copy: eager stays fp32, the reference
            step("exporting the fp16 torch.export program (the model's .half() copy)")
            with captured("torch.export"):
                exported = pt2.export_program(copy.deepcopy(model).half(), x.half())
        step(f"compiling model.aoti.pt2 ({precision}) with AOTInductor for "
             f"{device} (a minute or more)")
        with captured("AOTInductor"):
            description.export["aoti"] = pt2.compile_package(
                exported, staging / B.AOTI_FILE, package_text, device)
        extra += (B.AOTI_FILE,)
    return extra


def _write_models(staging: Path, model: VisionTransformer, description: B.Description,
                  options: ExportOptions, calibration, labelled, big: bool,
                  step: Callable[[str], None]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """Every model file into `staging`, each recorded in `description.export`: the weights,
    the TorchScript trace, the ONNX models, the preprocessing graph, the programs. Returns
    the ONNX models' names and the other files made."""
    text = description.to_json()
    step("writing weights")
    B.write_weights(model, staging / B.WEIGHTS_FILE)
    step("tracing TorchScript")
    trace_torchscript(model, staging / B.TS_FILE, options.export_batch_size, text)
    if big:
        runtime.release_memory()  # the trace's copy, before the exporter makes its own
    description.export = _write_onnx_models(staging, model, text, options, calibration,
                                            labelled, step)
    extra: tuple[str, ...] = ()
    if options.embed_preprocessing:  # its own input (uint8 images): not in onnx_models
        step("adding the preprocessing graph (model.e2e.onnx)")
        extra = (make_e2e(staging / B.ONNX_FILE, staging, description.preprocessing,
                          model.config.in_chans, text),)
        description.export["e2e_model"] = extra[0]
    extra += _write_programs(staging, model, description, options, text, step)
    return tuple(description.export["onnx_models"]), extra


def export_bundle(model: VisionTransformer, out_dir: str | os.PathLike,
                  description: B.Description, options: Optional[ExportOptions] = None, *,
                  release_model: bool = False,
                  progress: Optional[Callable[[str], None]] = None) -> parity.ParityReport:
    """Write a complete, validated bundle to `out_dir`, atomically; return its parity report.

    The bundle is built in a hidden folder beside `out_dir`, validated against eager PyTorch,
    and only then moved into place: a failed export leaves nothing behind, and an existing
    bundle stays as it was.

    Args:
        model: The model to export, in eval mode.
        out_dir: The bundle folder to write.
        description: What the bundle says about itself (config, preprocessing, labels).
        options: What to make and how to validate it (`ExportOptions`; None: its
            defaults, `vit-export export`'s).
        release_model: The caller hands `model` over: once every file is written its weights
            are freed (moved to the meta device), so validation does not hold a second copy.
        progress: Told each step as it starts.

    Returns:
        The validation report, also written to the bundle as parity.json.

    Raises:
        ParityError: An artifact does not match eager PyTorch; the report is attached as
            `.report`, and nothing is written.
        ExportError: An argument no export can honour (`ExportOptionError`: options that do
            not go together), or an exporter that failed.
        BundleError: `out_dir` exists (without `force`) or cannot be created.
    """
    options = options or ExportOptions()
    step = progress or (lambda _: None)
    _check_model(model, description, options)
    model, description = _shaped(model, description, options)
    options_run, calibration, labelled = _read_data(options, description, step)
    big = weight_bytes(model) > runtime.RELEASE_ABOVE
    if big:  # what loading the checkpoint freed (its state dict), before the copies below
        runtime.release_memory()
    with B.staged_folder(out_dir, force=options.force) as staging:
        models, extra = _write_models(staging, model, description, options, calibration,
                                      labelled, big, step)
        # each file hashed once: for config.json, and those bytes are what validation loads
        staged = B.staged_bundle(staging, description, files=B.MODEL_FILES + models + extra)
        if release_model:
            model.to("meta")
            if big:
                runtime.release_memory()
        step("validating against eager PyTorch")
        try:
            report = parity.validate(staged, options_run, progress=progress)
        finally:
            staged.close()
        del staged  # the bytes it holds, before the bundle is moved into place
        report.bundle = str(out_dir)
        if not report.passed:
            raise ParityError(f"export does not match eager PyTorch, nothing written: "
                              f"{report.failures[0]}", report=report)
        B.atomic_write_json(staging / B.PARITY_FILE, report.to_dict())
    return report
