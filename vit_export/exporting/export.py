"""A VisionTransformer into a bundle: the TorchScript trace made here, model.onnx
(onnx_model.py) and the ONNX models derived from it (variants.py), the preprocessing graph
in front of it (preprocessing/graph.py), the torch.export program and AOTInductor package
(pt2.py), all validated before the bundle is moved into place."""
from __future__ import annotations

import contextlib
import copy
import dataclasses
import errno
import io
import logging
import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Optional

import onnx
import torch

from .. import bundle as B
from .. import cpu, parity, pt2, runtime
from ..checkpoints.files import CheckpointFiles
from ..errors import ConfigError, ExportError, ParityError, first_line, param
from ..frameworks import with_any_size
from ..images import load_calibration, load_labelled_pixels
from ..model import VisionTransformer, random_input, with_dynamic_size, with_output
from ..onnxio import captured
from ..parity import labelled_inputs
from ..preprocessing.graph import check_e2e, make_e2e
from .budget import static_within_budget
from .onnx_model import example_size, export_onnx
from .options import ExportOptionError, ExportOptions, check_model_exporter, package_device
from .variants import VARIANTS, make_variant, static_int8_options

log = logging.getLogger(__name__)


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
    outputs = options.outputs.split(",") if options.outputs else c.output_names
    if options.normalize and "embedding" not in outputs:
        raise ExportOptionError(f"{param('normalize')} normalises the embedding, which this "
                                f"export does not give: add {param('outputs', 'embedding')}")
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


def _write_torch_files(staging: Path, model: VisionTransformer, text: str,
                       options: ExportOptions, big: bool, step: Callable[[str], None]) -> None:
    """The weights and the TorchScript trace into `staging`."""
    step("writing weights")
    B.write_weights(model, staging / B.WEIGHTS_FILE)
    step("tracing TorchScript")
    trace_torchscript(model, staging / B.TS_FILE, options.export_batch_size, text)
    if big:
        runtime.release_memory()  # the trace's copy, before the exporter makes its own


def _write_models(staging: Path, model: VisionTransformer, description: B.Description,
                  text: str, options: ExportOptions, calibration, labelled,
                  step: Callable[[str], None]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The model files made after the trace into `staging`, each recorded in
    `description.export` (`text`: it as JSON before): the ONNX models, the preprocessing
    graph, the programs. Returns the ONNX models' names and the other files made."""
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


# The weights from which the source framework's model is built and run by a second process
# while the export works on: that process costs 2-3 CPU seconds to start (Python, PyTorch
# and the framework imported again), more than a smaller model's source costs here.
SOURCE_BESIDE_FROM = 64 << 20


@contextlib.contextmanager
def _source_beside(description: B.Description, validation: parity.ValidateOptions,
                   weights: int, step: Callable[[str], None]
                   ) -> Iterator[parity.ValidateOptions]:
    """The validation's options, its source framework's model built and run by a second
    process while the export works on (`parity.SourceAhead`) where it compares one read
    from the checkpoint and the model's `weights` bytes are SOURCE_BESIDE_FROM or more; that
    process ended, whatever happens."""
    files = validation.source
    if not isinstance(files, CheckpointFiles) or weights < SOURCE_BESIDE_FROM or \
            not isinstance(description.extra.get("import"), dict):
        yield validation
        return
    ahead = parity.SourceAhead.start(description, files, validation.seed)
    if ahead is None:
        yield validation
        return
    try:
        step("building and running the source framework's model in a second process")
        yield dataclasses.replace(validation, source=ahead)
    finally:
        ahead.close()


def _validated(staging: Path, description: B.Description, files: tuple[str, ...],
               options: parity.ValidateOptions, release: bool,
               step: Callable[[str], None]) -> parity.ParityReport:
    """The staged bundle (config.json, B.MODEL_FILES and `files`) validated: each file
    hashed once, for config.json, and those bytes are what validation loads; the bytes held
    let go before the bundle is moved into place."""
    staged = B.staged_bundle(staging, description, files=B.MODEL_FILES + files)
    if release:
        runtime.release_memory()  # a released model's weights, before validation's copy
    step("validating against eager PyTorch")
    try:
        return parity.validate(staged, options, progress=step)
    finally:
        staged.close()


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
    big = (weights := weight_bytes(model)) > runtime.RELEASE_ABOVE
    if big:  # what loading the checkpoint freed (its state dict), before the copies below
        runtime.release_memory()
    with contextlib.ExitStack() as stack:
        staging = stack.enter_context(B.staged_folder(out_dir, force=options.force))
        _write_torch_files(staging, model, text := description.to_json(), options, big, step)
        # from here the export's steps are Python on one core (the trace used two)
        options_run = stack.enter_context(_source_beside(description, options_run, weights,
                                                         step))
        models, extra = _write_models(staging, model, description, text, options,
                                      calibration, labelled, step)
        if release_model:
            model.to("meta")
        report = _validated(staging, description, models + extra, options_run,
                            release_model and big, step)
        report.bundle = str(out_dir)
        if not report.passed:
            raise ParityError(f"export does not match eager PyTorch, nothing written: "
                              f"{report.failures[0]}", report=report)
        B.atomic_write_json(staging / B.PARITY_FILE, report.to_dict())
    return report
