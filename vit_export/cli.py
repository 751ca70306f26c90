"""The `vit-export` command line: parse, call the library, print, map errors to exit codes.

Exit codes: 0 ok; 1 a check failed or an input was bad; 2 usage error.
"""
from __future__ import annotations

import logging
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any, Optional

import click

from . import __version__, bench, parity, render
from . import bundle as B
from .bench import check_peers
from .bundle import MAX_EXPORT_BATCH
from .checkpoints import load_model
from .choosing import resolve_runner
from .deploy import ray_session, triton
from .deploy.classify import Classifier, Embedder, batched, open_model
from .deploy.raydata import infer_on_ray, refuse_existing
from .deploy.serve import DEFAULT_MAX_REQUEST_BYTES, ServeOptions, route, serve_bundle
from .deploy.triton import DEFAULT_QUEUE_DELAY_US as TRITON_QUEUE_DELAY_US
from .deploy.triton import DEVICES as TRITON_DEVICES
from .embeddings import FORMATS, check_format, write, written_files
from .errors import (
    BundleError,
    ConfigError,
    OptionError,
    ParityError,
    ProviderError,
    SavedRunError,
    VitExportError,
    raise_signalled,
    shown,
    signal_behind,
)
from .export import (
    export_bundle,
)
from .export_options import DEFAULT_EXPORTER, EXPORTERS, PATCH_EMBEDS, ExportOptions
from .hub import FAMILIES as HUB_FAMILIES
from .hub import load_named
from .images import (
    DEFAULT_CALIBRATION_IMAGES,
    MIN_CALIBRATION_IMAGES,
    expand_inputs,
)
from .jsonio import dumps
from .model import (
    PRESETS,
    VisionTransformer,
    preset_config,
    train_step_check,
)
from .onnxio import DEFAULT_OPSET
from .options import (
    BATCH_SIZES,
    BENCH_BATCH_SIZES,
    Number,
    Progress,
    batch_size_option,
    batch_sizes_option,
    choice_names,
    force_option,
    json_option,
    max_batch_size_option,
    openvino_option,
    progress_option,
    provider_option,
    provider_option_with,
    report_options,
    runner_names,
    runtime_option,
    seed_option,
    threads_option,
    trust_code_option,
)
from .parity import PROFILES, labelled_inputs
from .parity.budget import AccuracyBudget
from .preprocessing import PREPROCESSING_FIELDS
from .runtime import (
    AUTO,
    DEVICES,
    FILE_RUNNERS,
    OPENVINO_EXTRA,
    RUNNER_NAME,
    ort_log_level,
)
from .variants import PRECISIONS, QUANTIZATIONS, VARIANTS, batch_dependence

VARIANT_NAMES = tuple(v for v in VARIANTS if v != "static")  # static needs images
MODELS_DIR = Path(__file__).resolve().parent.parent / "models"


def _examples(*lines: str) -> str:
    """A command's --help epilog: example command lines, printed as written (click's \\b)."""
    return "\b\nExamples:\n" + "\n".join(f"  {line}" for line in lines)


def _signum(exc: BaseException) -> Optional[int]:
    """The number of the signal that stopped us, where `exc` is (or was caused by) one."""
    stop = signal_behind(exc)
    if stop is None:
        return None
    return signal.SIGINT if isinstance(stop, KeyboardInterrupt) else stop.signum


def _error(message: str) -> None:
    """One line on stderr, whatever the message holds (a file name with a newline, say)."""
    click.echo("Error: " + shown(message), err=True)


class _Group(click.Group):
    """Turns the library's errors, OS errors and signals into one line on stderr and an exit
    code: 1 for a failed check or bad input, 128 + the signal's number for a signal."""

    def invoke(self, ctx: click.Context) -> Any:
        main_thread = threading.current_thread() is threading.main_thread()
        previous = signal.signal(signal.SIGTERM, raise_signalled) if main_thread else None
        try:
            return super().invoke(ctx)
        except click.UsageError as exc:  # one line, like every other error; exit 2
            _error(exc.format_message())
            ctx.exit(2)
        except OptionError as exc:  # options that do not go together: a usage error
            _error(exc.cli_message())
            ctx.exit(2)
        except VitExportError as exc:
            _error(exc.cli_message())
            ctx.exit(1)
        except OSError as exc:  # a file we could not read or write: permissions, disk, ...
            where = f": {exc.filename}" if exc.filename else ""
            _error(f"{exc.strerror or exc}{where}")
            ctx.exit(1)
        except BaseException as exc:  # a signal, maybe wrapped by a C extension it stopped
            signum = _signum(exc)
            if signum is None:
                raise
            _error(f"{'interrupted' if signum == signal.SIGINT else 'stopped'} by "
                   f"{signal.Signals(signum).name}; nothing half-written was left")
            ctx.exit(128 + signum)
        finally:
            if main_thread:
                signal.signal(signal.SIGTERM, previous)


def _check_writable(path: Path) -> None:
    """`path` can take the output: a device or FIFO (written through) can be opened for
    writing, or else a file can be made in the folder of what it names, a symlink followed
    (tried for real: permission bits lie to root). A folder is refused."""
    import tempfile

    try:
        target, write_through = B.output_target(Path(os.path.abspath(path)))
    except VitExportError as exc:
        raise click.UsageError(str(exc)) from None
    if write_through:
        if not os.access(target, os.W_OK):
            raise click.UsageError(f"cannot write {path}: permission denied")
        return
    folder = target.parent
    if not folder.is_dir():
        raise click.UsageError(f"cannot write {path}: folder {folder} does not exist")
    try:
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".vx-probe-"):
            pass
    except OSError as exc:
        raise click.UsageError(f"cannot write {path}: {exc.strerror}") from None


def _resolved(path: Path, what: str) -> Path:
    """The absolute path with every symlink resolved; a loop is a usage error, one line."""
    try:
        return Path(os.path.abspath(path)).resolve()
    except (RuntimeError, OSError) as exc:  # RuntimeError: "Symlink loop" (Python < 3.13)
        raise click.UsageError(f"{what} {path}: {getattr(exc, 'strerror', None) or exc}") \
            from None


def _refuse_overwriting(outputs: dict[str, Optional[Path]], inputs: list[Path]) -> None:
    """Before any work: no output path may be, or lie inside, a path the command reads, nor
    contain one, and no two outputs may be the same file."""
    seen: dict[Path, str] = {}
    for option, out in outputs.items():
        if out is None:
            continue
        target = _resolved(out, option)
        if target in seen and not (target.exists() and not target.is_file()
                                   and not target.is_dir()):  # two reports to /dev/null: fine
            raise click.UsageError(f"{option} and {seen[target]} name the same file {out}")
        seen[target] = option
        for source in inputs:
            read = _resolved(source, "input")
            if target == read or read in target.parents or target in read.parents:
                raise click.UsageError(f"{option} {out} would overwrite {source}, which this "
                                       f"command reads")


# Triton's model_config.proto types: max_batch_size and an instance group's count are int32,
# max_queue_delay_microseconds uint64; a larger value is written, then Triton rejects it
INT32_MAX, UINT64_MAX = 2 ** 31 - 1, 2 ** 64 - 1


def _check_outputs(outputs: dict[str, Optional[Path]], inputs: list[Path]) -> None:
    """The files a command will write, before minutes of work: none overwrites what it
    reads or another output (`_refuse_overwriting`), and each can be written."""
    _refuse_overwriting(outputs, inputs)
    for out in outputs.values():
        if out is not None:
            _check_writable(out)


def _available_memory() -> Optional[int]:
    """Bytes the kernel could hand out now without swapping (Linux's MemAvailable)."""
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def _refuse_huge_batches(config, batch_sizes, option: str = "--batch-sizes") -> None:
    """Before allocating: a batch whose forward pass would not fit in the memory available
    is a usage error, not an out-of-memory kill minutes later."""
    available = _available_memory()
    if not batch_sizes or available is None:
        return
    largest = max(batch_sizes)
    needed = config.forward_bytes(largest)
    if needed > available:
        raise click.UsageError(f"{option}: batch {largest} needs about {needed / 2**30:.1f} GiB "
                               f"for one forward pass, {available / 2**30:.1f} GiB is available")


def _overrides(ctx, param, values: tuple[str, ...]) -> dict[str, str]:
    result = {}
    for item in values:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise click.BadParameter(f"expected KEY=VALUE, got {item!r}", ctx, param)
        result[key.strip()] = value.strip()
    return result


def _require_openvino(wanted: bool) -> None:
    """--openvino without OpenVINO installed: one line before any work."""
    import importlib.util

    if wanted and importlib.util.find_spec("openvino") is None:
        raise VitExportError(f"--openvino: OpenVINO is not installed; {OPENVINO_EXTRA}")


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="vit-export")
@click.option("--verbose", is_flag=True, help="Log what the libraries underneath say "
              "(exporter and optimizer messages, warnings) on stderr.")
@click.pass_context
def cli(ctx: click.Context, verbose: bool) -> None:
    """Export Vision Transformers to TorchScript and ONNX, run them, and prove parity."""
    # The application decides what is logged: without --verbose nothing, so third-party
    # warnings never mix into our one-line errors; with it, everything at debug level.
    # Python warnings (Pillow's DecompressionBombWarning, numpy's ComplexWarning, torch's
    # UserWarnings) go through logging too, and ONNX Runtime's own C++ log (coloured lines on
    # stderr) keeps to errors unless --verbose.
    handler: logging.Handler = logging.NullHandler()
    root = logging.getLogger()
    saved = root.level
    if verbose:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(name)s: %(message)s"))
        root.setLevel(logging.DEBUG)
    root.addHandler(handler)
    logging.captureWarnings(True)
    if ctx.invoked_subcommand not in ("presets", "quick-test"):
        ort_log_level(0 if verbose else 3)

    def restore() -> None:
        logging.captureWarnings(False)
        root.removeHandler(handler)
        root.setLevel(saved)

    ctx.call_on_close(restore)


@cli.command(epilog=_examples("vit-export presets"))
def presets() -> None:
    """List the model presets (timm names) and their sizes."""

    click.echo(f"{'preset':<24} {'img':>4} {'patch':>5} {'dim':>5} {'depth':>5} {'heads':>5} "
               f"{'params':>9}")
    for name in PRESETS:
        c = preset_config(name)
        params = _count_params(c)
        click.echo(f"{name:<24} {c.img_size:>4} {c.patch_size:>5} {c.embed_dim:>5} "
                   f"{c.depth:>5} {c.num_heads:>5} {params / 1e6:>8.1f}M")


def _count_params(config) -> int:
    """Parameters of a config, counted on the meta device (no memory, no init)."""
    import torch

    with torch.device("meta"):
        return sum(p.numel() for p in VisionTransformer(config).parameters())


@cli.command("quick-test", epilog=_examples(
    "vit-export quick-test",
    "vit-export quick-test --preset vit_base_patch16_224 --batch-size 4 --provider cpu"))
@click.option("--preset", default="vit_seed_tiny", show_default=True,
              help="The model to build (see `presets`), with random weights.")
@batch_size_option(2, "Images in the random batch.")
@seed_option("the weights, the batch and its labels")
@provider_option_with("Where PyTorch runs it; auto: CUDA when PyTorch sees a GPU.")
def quick_test(preset: str, batch_size: int, seed: int, provider: str) -> None:
    """Forward, loss, backward and one optimizer step on random data; checks the shapes."""
    import torch

    if provider == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    elif provider == "cuda" and not torch.cuda.is_available():
        raise ProviderError("--provider cuda: PyTorch sees no CUDA device")
    else:
        device = provider
    config = preset_config(preset)
    _refuse_huge_batches(config, [batch_size], "--batch-size")
    r = train_step_check(config, batch=batch_size, seed=seed, device=device)
    click.echo(f"device={device}, logits_shape={tuple(r['logits_shape'])}, "
               f"loss={r['loss']:.4f}, pred={r['pred']}")


def _load_source(source: Optional[str], preset: Optional[str], checkpoint: Optional[str],
                 fmt: Optional[str], overrides: dict[str, str], seed: int,
                 timm_name: Optional[str] = None, torchvision_weights: Optional[str] = None,
                 model_name: Optional[str] = None, bars: bool = False):
    """The model and its description from exactly one of --from, --preset, --checkpoint,
    --model (`bars`: the download's progress bars)."""
    given = [name for name, v in (("--from", source), ("--preset", preset),
                                  ("--checkpoint", checkpoint), ("--model", model_name)) if v]
    if len(given) != 1 and given != ["--preset", "--checkpoint"]:
        raise click.UsageError("give exactly one of --from, --preset, --checkpoint, --model "
                               "(--preset may refine --checkpoint)")
    if model_name:
        if fmt or timm_name or torchvision_weights:
            raise click.UsageError("--format, --timm-name and --torchvision-weights apply to "
                                   "--checkpoint; --model reads them off the repo")

        return load_named(model_name, overrides, bars)
    if fmt and not checkpoint:
        raise click.UsageError("--format applies to --checkpoint only")
    if source and (overrides or timm_name or torchvision_weights):
        raise click.UsageError("--set, --timm-name and --torchvision-weights apply to "
                               "--preset and --checkpoint, not --from")

    return load_model(source, preset, checkpoint, fmt, overrides, seed, timm_name,
                      torchvision_weights)


@cli.command(epilog=_examples(
    "vit-export export out/digits --from models/digits",
    "vit-export export out/dinov2 --model facebook/dinov2-small",
    "vit-export export out/mine --checkpoint run/checkpoint.pth \\",
    "    --timm-name vit_base_patch16_224.augreg_in21k_ft_in1k",
    "vit-export export out/base --preset vit_base_patch16_224 --set num_classes=10 \\",
    "    --optimize --quantize int8",
    "vit-export export out/digits8 --from models/digits --quantize static \\",
    "    --calibrate train_digits.npz --real-data models/digits/held_out.npz --max-drop 0.5"))
@click.argument("output", type=click.Path(file_okay=False, path_type=Path))
@click.option("--from", "source", metavar="DIR",
              help="A model folder (config.json + weights.safetensors), e.g. models/digits.")
@click.option("--preset", help="Build a preset with random weights (see `presets`).")
@click.option("--checkpoint", type=click.Path(), help="A timm / Hugging Face / torchvision "
              "checkpoint file or folder.")
@click.option("--model", "model_name", metavar="NAME[@REVISION]", help="Download from the "
              f"Hugging Face Hub (safetensors only, into its cache, HF_HOME) and import: "
              f"{HUB_FAMILIES}; pinned to the commit REVISION (default main) resolves to.")
@click.option("--format", "fmt", type=click.Choice(["timm", "hf", "torchvision"]),
              help="Checkpoint format; detected from the keys when left out.")
@click.option("--set", "overrides", multiple=True, callback=_overrides, metavar="KEY=VALUE",
              help="Override a config field, e.g. --set num_classes=10, or a preprocessing "
                   "one, e.g. --set preprocessing.crop_pct=0.9 (repeatable).")
@click.option("--timm-name", metavar="NAME", help="Take the preprocessing from this timm "
              "model's pretrained_cfg, e.g. vit_base_patch16_224.augreg_in21k_ft_in1k "
              "[default: the preset's].")
@click.option("--torchvision-weights", metavar="NAME", help="Take the preprocessing from these "
              "torchvision weights' transforms, e.g. ViT_B_16_Weights.IMAGENET1K_V1.")
@click.option("--exporter", type=click.Choice(EXPORTERS), default=DEFAULT_EXPORTER,
              show_default=True, help="torch's ONNX exporter.")
@click.option("--opset", default=DEFAULT_OPSET, show_default=True, type=click.IntRange(min=17),
              help="ONNX opset (17 or newer keeps LayerNorm one op).")
@click.option("--patch-embed", type=click.Choice(PATCH_EMBEDS), default="conv",
              show_default=True, help="How the ONNX models embed patches: Conv, as the model is "
              "written, or gemm: the same arithmetic as reshapes and one MatMul (the patch "
              "convolution is a GEMM: kernel = stride = patch). Validation proves either.")
@click.option("--batch-size", "export_batch", default=2, show_default=True,
              type=click.IntRange(min=2, max=MAX_EXPORT_BATCH),
              help="Batch size of the example input the model is traced and exported with "
              "(>= 2, so the batch axis is not specialised; every batch size runs).")
@click.option("--external-data/--single-file", default=None,
              help="Force ONNX weights into model.onnx.data or into model.onnx "
                   "[default: external only above 2 GB].")
@click.option("--precision", type=click.Choice(PRECISIONS), default=PRECISIONS[0],
              show_default=True, help="fp16 adds model.fp16.onnx (LayerNorm and Softmax "
              "kept in fp32), validated with the fp16 profile.")
@click.option("--fp16-io", is_flag=True, help="With --precision fp16: fp16 input and output "
              "instead of fp32.")
@click.option("--optimize", is_flag=True, help="Add model.opt.onnx: ONNX Runtime's transformer "
              "optimizer (fused attention, LayerNorm, GELU), validated with the fp32 profile; "
              "with --precision fp16 also model.opt.fp16.onnx, that graph in fp16 (fp16 "
              "profile).")
@click.option("--quantize", type=click.Choice(QUANTIZATIONS), help="int8: add model.int8.onnx, "
              "dynamic int8 (int8 profile). static: add model.int8-static.onnx, int8 with "
              "activation ranges calibrated on --calibrate images (int8-static profile).")
@click.option("--calibrate", "calibrate", type=click.Path(path_type=Path),
              help="With --quantize static: a folder of images (or .npy arrays) or a .npz with "
                   f"`images`, at least {MIN_CALIBRATION_IMAGES}; a seeded sample is used.")
@click.option("--calibrate-count", default=DEFAULT_CALIBRATION_IMAGES, show_default=True,
              type=click.IntRange(min=MIN_CALIBRATION_IMAGES),
              help="How many calibration images to sample (all when the set holds fewer).")
@click.option("--max-drop", type=Number(0, 100), metavar="POINTS", help="With --quantize "
              "static and --real-data: the top-1 points model.int8-static.onnx may lose against "
              "eager fp32 on those labelled images. Over it, the blocks that diverge most are "
              "kept in fp32, one at a time, until it holds; where it cannot, nothing is written. "
              "config.json records the budget, the blocks kept and the drop measured; validate "
              "holds the model to it.")
@click.option("--min-cosine", type=Number(-1, 1), help="With --max-drop: also the lowest "
              "cosine of one image's logits against eager fp32 the budget allows.")
@batch_sizes_option(None, "Batch sizes for the export-time validation [default: 1, "
                    "--batch-size + 1, 7].")
@provider_option
@openvino_option
@click.option("--real-data", type=click.Path(dir_okay=False, path_type=Path),
              help="Labelled images (.npz, see `validate`) for the export-time validation.")
@seed_option("a preset's init weights, the validation inputs, the calibration sample")
@click.option("--dynamic-size", is_flag=True, help="Accept any height and width that are "
              "multiples of the patch (timm's dynamic_img_size): symbolic height and width in "
              "model.onnx, the position embedding resampled in the graph; validated at "
              "several sizes. Needs the dynamo exporter.")
@click.option("--embed-preprocessing", is_flag=True, help="Add model.e2e.onnx: uint8 images "
              "[batch, height, width, C] of any size in, resize, center crop and "
              "normalisation in the graph, logits out; validated against the Python pipeline.")
@click.option("--pt2", "program", is_flag=True, help="Add model.pt2: the torch.export "
              "program (TorchScript's successor), batch symbolic, loads with "
              "torch.export.load.")
@click.option("--aoti", "package", is_flag=True, help="Add model.aoti.pt2: the program compiled "
              "by AOTInductor for this machine's device (CPU: needs a C++ compiler, a minute "
              "or more), for Python or C++ without ONNX.")
@click.option("--aoti-precision", "package_precision", type=click.Choice(B.AOTI_PRECISIONS),
              help="With --aoti: what model.aoti.pt2 computes in. fp16: the model's .half() "
              "copy, fed fp16 (outputs fp32), compiled for CUDA and validated with the fp16 "
              "profile; refused where the export does not run on CUDA [default: fp32].")
@click.option("--outputs", "wanted_output", metavar="NAMES", help="What the bundle gives, "
              "comma-separated, in this order: logits (the classifier's), embedding (the "
              "pooled features before the head, timm's forward_head(pre_logits=True), Hugging "
              "Face's pooler_output; CLIP's projected image_embeds), tokens (the patch tokens "
              "[batch, N, D], for dense tasks); e.g. logits,embedding,tokens [default: logits "
              "where there is a classifier, else embedding].")
@click.option("--normalize", is_flag=True, help="L2-normalise the embedding in the graph "
              "(with --outputs embedding, or a model whose output is one).")
@force_option("OUTPUT")
@progress_option
def export(output: Path, source, preset, checkpoint, model_name, fmt, overrides, timm_name,
           torchvision_weights, exporter, opset, patch_embed, export_batch, external_data,
           precision, fp16_io, optimize, quantize, calibrate, calibrate_count, max_drop,
           min_cosine, batch_sizes, provider, openvino, real_data, seed, dynamic_size, embed_preprocessing, program, package,
           package_precision, wanted_output, normalize, force, progress) -> None:
    """Export a model to a bundle folder OUTPUT, validated before it is written."""
    _refuse_overwriting({"OUTPUT": output},
                        [Path(p) for p in (source, checkpoint, real_data, calibrate) if p])
    if (output.exists() or output.is_symlink()) and not force:  # before minutes of loading
        raise VitExportError(f"{output} already exists; use --force to replace it")
    _require_openvino(openvino)
    if min_cosine is not None and max_drop is None:
        raise click.UsageError("--min-cosine is part of an accuracy budget: give --max-drop")
    fp16 = precision == "fp16"
    variants = [kind for kind, wanted in (("fp16", fp16), ("optimized", optimize),
                                          ("optimized-fp16", optimize and fp16),
                                          (quantize, quantize is not None)) if wanted]
    options = ExportOptions(  # every other rule, checked before minutes of loading
        exporter=exporter, opset=opset, batch=export_batch, external_data=external_data,
        force=force, variants=variants, fp16_io=fp16_io, calibration=calibrate,
        calibrate_count=calibrate_count,
        budget=AccuracyBudget(max_drop, min_cosine) if max_drop is not None else None,
        validation=dict(batch_sizes=batch_sizes, provider=provider, seed=seed,
                        openvino=openvino),
        real_data=real_data, embed_preprocessing=embed_preprocessing, program=program,
        package=package, package_precision=package_precision, patch_embed=patch_embed,
        dynamic_size=dynamic_size, outputs=wanted_output, normalize=normalize)
    step = Progress(progress)
    step("loading the model")
    model, description = _load_source(source, preset, checkpoint, fmt, overrides, seed,
                                      timm_name, torchvision_weights, model_name, step.shown)
    for note in description.extra.get("import", {}).get("notes", []):
        click.echo(f"note: {note}")
    _refuse_huge_batches(model.config, batch_sizes)
    _refuse_huge_batches(model.config, [export_batch + 1], "--batch-size")  # its probe
    try:
        report = export_bundle(model, output, description, options, release_model=True,
                               progress=step)
    except ParityError as exc:
        if exc.report is not None:
            click.echo(render.text(exc.report), nl=False)
        raise
    click.echo(render.text(report), nl=False)
    files = sorted(p.name for p in output.iterdir())
    click.echo(f"wrote {output}: {', '.join(files)}")


@cli.command(epilog=_examples(
    "vit-export validate out/digits --real-data models/digits/held_out.npz",
    "vit-export validate out/base --layers --images photos/",
    "vit-export validate out/base --require-provider cuda --junit parity.xml \\",
    "    --markdown parity.md",
    "vit-export validate out/base --provider cpu --save-outputs cpu.npz"))
@click.argument("bundle", type=click.Path(path_type=Path))
@batch_sizes_option(None, "Batch sizes to compare at [default: 1, the export's batch size + "
                    "1, 7].")
@provider_option
@openvino_option
@click.option("--require-provider", type=click.Choice(DEVICES),
              help="Fail unless this provider is the one that ran (and, for cuda, every "
                   "heavy op of each model ran on CUDA).")
@seed_option("the random inputs and pictures")
@click.option("--real-data", type=click.Path(dir_okay=False, path_type=Path),
              help="A .npz of labelled images (`images` uint8 [N, H, W(, C)], `labels` [N]) "
                   "to compare on too; reports accuracy.")
@click.option("--images", multiple=True, type=click.Path(path_type=Path),
              help="Image files or folders to compare on too (repeatable).")
@click.option("--layers", is_flag=True, help="Also compare every stage (patch embedding, "
              "each block's attention, MLP and output, final norm) of each ONNX model and of "
              "model.pt2, and name the first that diverges.")
@click.option("--profile", type=click.Choice(list(PROFILES)),
              help="Judge the ONNX models of this profile's precision by it (tf32: the fp32 "
              "models, with ONNX Runtime's CUDA provider computing in TF32 against eager in "
              "full fp32) [default: each model's own].")
@click.option("--atol", type=Number(0, 1e6),
              help="Override the max abs error allowed on logits.")
@click.option("--rtol", type=Number(0, 1e6), help="Override the max relative error "
              "allowed: the max abs error over the largest reference magnitude (one number "
              "per comparison, not numpy's elementwise rtol).")
@click.option("--min-cosine", type=Number(-1, 1),
              help="Override the lowest cosine allowed.")
@click.option("--min-neighbours", type=Number(0, 1), help="Override the lowest mean "
              "overlap of each image's 10 nearest neighbours allowed (an embedding, on "
              "--images or --real-data).")
@click.option("--source/--no-source", default=True, show_default=True,
              help="For a bundle imported from a checkpoint or the Hub: also run the source "
              "framework's own model (transformers, timm, torchvision), rebuilt from the "
              "recorded files, against eager and model.onnx; skipped, with the reason, where "
              "the files or the framework are not here.")
@trust_code_option
@report_options("junit", "markdown")
@click.option("--save-outputs", type=click.Path(dir_okay=False, path_type=Path),
              help="Also keep the run in FILE (.npz, data only): the inputs, every runner's "
              "outputs and where each ran, for `vit-export compare` on another machine "
              "(replaced if it exists).")
@progress_option
def validate(bundle: Path, batch_sizes, provider, openvino, require_provider, seed, real_data,
             images, layers, profile, atol, rtol, min_cosine, min_neighbours, source,
             trust_code, report_path, junit_path, markdown_path, save_outputs,
             progress) -> None:
    """Compare eager PyTorch, TorchScript and ONNX Runtime on BUNDLE; exit 1 on any mismatch."""

    _check_outputs({"--report": report_path, "--junit": junit_path,
                    "--markdown": markdown_path, "--save-outputs": save_outputs},
                   [bundle] + ([real_data] if real_data else []) + list(images))
    _require_openvino(openvino)
    found = B.read_bundle(bundle)  # read and verified once, handed down
    description = found.description
    _refuse_huge_batches(description.config, batch_sizes)
    given = parity.inputs_from_files(found, images, real_data)
    options = parity.ValidateOptions(
        batch_sizes=batch_sizes, provider=provider, seed=seed,
        overrides=dict(atol=atol, rtol=rtol, min_cosine=min_cosine,
                       min_neighbours=min_neighbours),
        real_inputs=given.real_inputs, layers=layers, require_provider=require_provider,
        profile=profile, raw_images=given.raw_images, image_files=given.image_files,
        openvino=openvino, trust_code=trust_code, save_outputs=save_outputs, source=source)
    report = parity.validate(found, options, progress=Progress(progress))
    _write_reports(report, report_path, junit_path, markdown_path)
    click.echo(render.text(report), nl=False)
    if not report.passed:
        raise ParityError(f"parity failed: {report.failures[0]}")


def _write_reports(report, report_path: Optional[Path], junit_path: Optional[Path],
                   markdown_path: Optional[Path]) -> None:
    """A ParityReport as JSON, JUnit and Markdown, to the files given."""

    if report_path:
        B.atomic_write_json(report_path, report.to_dict())
    for path, text in ((junit_path, lambda: render.junit(report)),
                       (markdown_path, lambda: render.markdown(report))):
        if path:
            B.atomic_write_text(path, text())


@cli.command(epilog=_examples(
    "vit-export compare cpu.npz gpu.npz",
    "vit-export compare cpu.npz gpu.npz --junit compare.xml --markdown compare.md"))
@click.argument("first", metavar="A", type=click.Path(dir_okay=False, path_type=Path))
@click.argument("second", metavar="B", type=click.Path(dir_okay=False, path_type=Path))
@report_options("junit", "markdown")
def compare(first: Path, second: Path, report_path, junit_path, markdown_path) -> None:
    """Judge two runs `validate --save-outputs` kept, of one bundle on the same inputs: eager
    of run A against every runner of run B, each under the profile validate judged it by.
    Exit 1 on any mismatch, 2 when the files cannot be judged together."""

    _check_outputs({"--report": report_path, "--junit": junit_path,
                    "--markdown": markdown_path}, [first, second])
    try:
        a, b = parity.load_run(first), parity.load_run(second)
        report = parity.judge_runs(a, b, (str(first), str(second)))
    except SavedRunError as exc:  # not a saved run, or not two runs that can be compared
        raise click.UsageError(str(exc)) from None
    _write_reports(report, report_path, junit_path, markdown_path)
    click.echo(render.text(report), nl=False)
    if not report.passed:
        raise ParityError(f"parity failed: {report.failures[0]}")


def _real_data(path: Optional[Path], description) -> Optional[dict]:
    """--real-data FILE.npz, preprocessed as the model's images are."""

    return labelled_inputs(path, description)


@cli.command(epilog=_examples(
    "vit-export infer out/digits models/digits/samples --top-k 1",
    "vit-export infer out/digits photo.png more_photos/ --json",
    "vit-export infer out/dino photos/ --embed --output embeddings.parquet",
    "vit-export infer out/digits photos/ --ray --workers 2 --output results.jsonl --resume"))
@click.argument("model", type=click.Path(path_type=Path))
@click.argument("inputs", nargs=-1, required=True)
@click.option("--top-k", default=5, show_default=True, type=click.IntRange(min=1),
              help="Classes to print per input, most probable first (more than the model "
              "has: all of them).")
@batch_size_option(8, "Inputs run together in one forward pass (and which of "
                   "performance.json's batch sizes --runtime auto reads).")
@runtime_option
@provider_option
@json_option
@click.option("--ray", "on_ray", is_flag=True, help="Read, preprocess and classify on Ray Data "
              "(an actor pool of --workers runners), writing the records to --output.")
@click.option("--embed", is_flag=True, help="Give each input's embedding instead of classes "
              "(a bundle whose output is an embedding: export --outputs embedding, or a "
              "headless or vision-tower model).")
@click.option("--output", type=click.Path(dir_okay=False, path_type=Path),
              help="With --ray: the JSON-lines file to write (complete or absent, never half). "
              "With --embed: FILE.npy (an [N, D] array, the input order in FILE.inputs.json) "
              "or FILE.parquet (columns input, embedding). An existing one is kept unless "
              "--force.")
@force_option("--output (with --ray: and an earlier run's progress)")
@click.option("--workers", default=1, show_default=True, type=click.IntRange(min=1),
              help="With --ray: how many runners classify at once.")
@click.option("--resume", is_flag=True, help="With --ray: keep what an earlier run of the same "
              "--output finished and classify only the rest.")
@click.option("--address", metavar="ADDRESS", help="With --ray: join this Ray cluster (e.g. "
              "ray://head:10001 or auto) instead of starting one here.")
def infer(model: Path, inputs, top_k, batch_size, runtime_name, provider, as_json, on_ray,
          embed, output, force, workers, resume, address) -> None:
    """Classify (or --embed) images (PNG, JPEG, ...) or .npy arrays with a bundle, .onnx,
    .ts or .pt2 MODEL.

    INPUTS may be files or folders.
    """

    _check_infer_options(model, inputs, runtime_name=runtime_name, on_ray=on_ray, embed=embed,
                         as_json=as_json, output=output, force=force, workers=workers,
                         resume=resume, address=address)
    if on_ray:
        return _infer_on_ray(model, expand_inputs(inputs), output, top_k=top_k,
                             batch_size=batch_size, workers=workers, provider=provider,
                             runtime_name=runtime_name, resume=resume, force=force,
                             address=address, embed=embed)
    classify = (Embedder if embed else Classifier)(model, provider, runtime_name,
                                                   batch_size=batch_size)
    files = expand_inputs(inputs)
    items = classify.inputs(files)
    results: list = []
    with click.progressbar(length=len(files), label="inferring", file=sys.stderr,
                           hidden=len(files) < 32 or as_json) as bar:
        chunks = (tuple(zip(*chunk)) for chunk in batched(items, batch_size))
        for records in classify.stream_records(chunks, top_k):  # the next read while one runs
            results += records
            bar.update(len(records))
    runner = classify.runner
    note = batch_dependence(runner.name)
    if note and batch_size > 1 and len(files) > 1:
        click.echo(f"note: {note}; --batch-size 1 answers each image alone", err=True)
    ran = f"{runner.name} ({runner.device})" + (f"; {classify.chosen_by}"
                                                if classify.chosen_by else "")
    if embed:
        return _embeddings_out(model, results, runner, ran, classify.chosen_by, as_json,
                               output)
    if as_json:
        click.echo(dumps({"model": str(model), "runtime": runner.name,
                          "chosen_by": classify.chosen_by, "provider": runner.device,
                          "results": results}))
        return
    for r in results:
        best = ", ".join(f"{t['label']} {t['prob']:.3f}" for t in r["top"])
        click.echo(f"{r['input']}: {best}")
    click.echo(f"{len(results)} input(s) on {ran}")


def _check_infer_options(model: Path, inputs: tuple[str, ...], *, runtime_name: str,
                         on_ray: bool, embed: bool, as_json: bool, output: Optional[Path],
                         force: bool, workers: int, resume: bool,
                         address: Optional[str]) -> None:
    """infer's flags, before any work: that they fit together and the MODEL (usage errors),
    and that --output, for --ray or for --embed's file, can be written (an --embed file
    there already, without --force: exit 1)."""
    _check_runtime(model, runtime_name)
    ray_only = [name for name, given in (("--output", output and not embed),
                                         ("--resume", resume),
                                         ("--workers", workers != 1), ("--address", address))
                if given]
    if ray_only and not on_ray:
        raise click.UsageError(f"{ray_only[0]} applies to --ray only")
    if force and output is None:
        raise click.UsageError("--force replaces --output; there is none")
    if force and resume:
        raise click.UsageError("--force starts over and --resume continues: give one")
    if on_ray:
        if output is None:
            raise click.UsageError("--ray needs --output FILE.jsonl for its records")
        if as_json:
            raise click.UsageError("--json prints to stdout; with --ray the records go to "
                                   "--output as JSON lines")
        _refuse_overwriting({"--output": output}, [model, *map(Path, inputs)])
        _check_writable(output)

        if B.output_target(output)[1]:  # a device or FIFO: nothing to resume, or to rename onto
            raise click.UsageError(f"--output {output} is a device or FIFO; --ray writes a "
                                   f"resumable file: give a regular file")
        if embed and output.suffix.lower() not in (".parquet", ".jsonl"):
            raise click.UsageError(f"--output {output}: --ray --embed writes FILE.parquet "
                                   f"(or JSON lines to FILE.jsonl)")
        if not embed and output.suffix.lower() in (".parquet", ".npy"):
            raise click.UsageError(f"--output {output}: --ray writes classes as JSON lines "
                                   f"(FILE.jsonl); Parquet is for --embed")
        if embed and output.suffix.lower() == ".parquet":
            check_format(output)  # pyarrow, before Ray starts
    elif output is not None:  # --embed's file

        if output.suffix.lower() not in FORMATS:
            raise click.UsageError(f"--output {output}: embeddings are written as FILE.npy "
                                   f"or FILE.parquet")
        check_format(output)  # pyarrow, for Parquet
        _refuse_overwriting({"--output": output}, [model, *map(Path, inputs)])
        there = next((f for f in written_files(output) if f.exists()), None)
        if there is not None and not force:
            raise VitExportError(f"{there} exists; use --force to replace it")
        _check_writable(output)


def _check_runtime(model: Path, name: str) -> None:
    """--runtime names a runner this MODEL can have: any runner name (a bundle says which it
    has once it is read), one a model file's suffix runs on, or auto; and the openvino extra
    for OpenVINO's."""
    import re

    if name != AUTO and not re.fullmatch(RUNNER_NAME, name):
        raise click.UsageError(f"--runtime {name}: not a runner name; see --help")
    fits = FILE_RUNNERS.get(model.suffix)
    if not model.is_dir() and fits and name not in (AUTO, *fits):
        raise click.UsageError(f"--runtime {name} cannot run {model}: a {model.suffix} file "
                               f"runs with --runtime {' or '.join(fits)} (or give the bundle "
                               f"folder)")
    _require_openvino(name.startswith("openvino"))


def _embeddings_out(model: Path, records: list, runner, ran: str, chosen_by: Optional[str],
                    as_json: bool, output: Optional[Path]) -> None:
    """infer --embed's answer: the file (--output), JSON records, or a line per input."""
    import numpy as np

    names = [r["input"] for r in records]
    embeddings = np.array([r["embedding"] for r in records], dtype=np.float32)
    if output is not None:
        written = write(output, names, embeddings)
        click.echo(f"{len(names)} embedding(s), {embeddings.shape[1]} wide, on {ran}: "
                   f"{', '.join(map(str, written))}", err=as_json)
    if as_json:
        click.echo(dumps({"model": str(model), "runtime": runner.name,
                          "chosen_by": chosen_by, "provider": runner.device,
                          "results": records}))
    elif output is None:
        for name, row in zip(names, embeddings):
            click.echo(f"{name}: embedding [{len(row)}], norm {np.linalg.norm(row):.4f}")
        click.echo(f"{len(names)} input(s) on {ran}")


def _infer_on_ray(model: Path, files, output: Path, **options) -> None:
    refuse_existing(output, options["resume"], options["force"])
    with click.progressbar(length=len(files), label="inferring on Ray Data", file=sys.stderr,
                           hidden=len(files) < 32) as bar:
        def progress(done: int, total: int) -> None:
            bar.update(done - bar.pos)

        start = time.perf_counter()
        counts = infer_on_ray(model, files, output, progress=progress, **options)
        seconds = time.perf_counter() - start
    rate = f", {counts['now'] / seconds:.1f} files/s" if counts["now"] else ""
    did = "embedded" if options["embed"] else "classified"
    why = f"; {counts['chosen_by']}" if counts["chosen_by"] else ""
    click.echo(f"{counts['now']} file(s) {did} on Ray Data with {options['workers']} "
               f"worker(s) in {seconds:.1f} s{rate}; {counts['before']} done before; "
               f"{counts['records']} record(s) in {output}; runtime {counts['runtime']}{why}")


@cli.command(epilog=_examples(
    "vit-export info out/digits",
    "vit-export info out/digits/model.onnx --json"))
@click.argument("path", type=click.Path(path_type=Path))
@json_option
def info(path: Path, as_json: bool) -> None:
    """Print what a bundle, model.onnx or model.ts says about itself."""

    d = B.read_description(path)
    if as_json:
        click.echo(d.to_json())
        return
    c, p = d.config, d.preprocessing
    click.echo(f"name: {shown(d.name)}")
    any_size = " (any multiple of the patch)" if c.dynamic_img_size else ""
    click.echo(f"model: img {c.img_size}{any_size}, patch {c.patch_size}, chans {c.in_chans}, "
               f"dim {c.embed_dim}, depth {c.depth}, heads {c.num_heads}, "
               f"classes {c.num_classes}, params {_count_params(c):,}")
    options = c.family_options()
    if options:
        click.echo("architecture: " + ", ".join(f"{k} {v}" for k, v in options.items()))
    for name in c.output_names:
        what = ("" if name == "logits" else
                " (the patch tokens, the prefix left out)" if name == "tokens" else
                " (the head's projection)" if c.projection_head else
                " (no classifier: the pooled embedding)" if not c.num_classes else
                " (the pooled features before the head)")
        norm = ", L2-normalised" if c.normalize and name == "embedding" else ""
        click.echo(f"output: {name} [batch, {', '.join(map(str, c.output_shape(name)))}]"
                   f"{what}{norm}")
    click.echo(f"preprocessing: resize {p.resize_size} ({p.crop_mode}, {p.interpolation}), "
               f"crop {p.img_size} ({p.crop_offset}), rescale {p.rescale_factor:.6g}, "
               f"mean {list(p.mean)}, std {list(p.std)}, alpha {p.alpha}")
    by_source: dict[str, list[str]] = {}
    for name in PREPROCESSING_FIELDS:
        by_source.setdefault(p.source_of(name), []).append(name)
    click.echo("preprocessing from: " + "; ".join(f"{shown(source)} ({', '.join(names)})"
                                                  for source, names in by_source.items()))
    labels = d.labels
    click.echo(f"labels: {', '.join(labels[:10]) + (' ...' if len(labels) > 10 else '')}"
               if labels else "labels: none")
    if d.export:
        click.echo("export: " + ", ".join(shown(f"{k} {v}") for k, v in d.export.items()))
    if d.versions:
        click.echo("versions: " + ", ".join(shown(f"{k} {v}") for k, v in d.versions.items()))
    hub = d.extra.get("hub")
    if isinstance(hub, dict):
        repo, commit = shown(hub.get("repo")), shown(hub.get("commit"))
        click.echo(f"hub: {repo}, revision {shown(hub.get('revision'))}, commit {commit} "
                   f"(export --model {repo}@{commit})")
        files = hub.get("files")
        for name, sha in (files.items() if isinstance(files, dict) else ()):
            click.echo(f"hub file: {shown(name)} sha256 {shown(sha)}")
    if path.is_dir() and (path / B.PARITY_FILE).is_file():
        try:  # the verdict holds for the files config.json lists now, or is not shown
            report, why = parity.read_proof(B.read_bundle(path, verify=False))
        except BundleError as exc:
            report, why = None, str(exc)
        if report is None:
            click.echo(f"parity at export: none for these files: {shown(why)}")
        else:
            click.echo(f"parity at export: {'PASS' if report.get('passed') else 'FAIL'} "
                       f"on {shown(report.get('provider_used'))}, batches "
                       f"{shown(report.get('batch_sizes'))} (of the files config.json lists; "
                       f"validate checks their bytes)")


@cli.command("bench", epilog=_examples(
    "vit-export bench out/digits --batch-sizes 1,8",
    "vit-export bench out/base --report bench.json --plot bench.png",
    "vit-export bench out/base --record",
    "vit-export bench vit_base_patch16_224 --variants optimized,int8"))
@click.argument("target")
@batch_sizes_option(BENCH_BATCH_SIZES, "Batch sizes to time each runtime at.")
@threads_option("Intra-op threads for PyTorch and ONNX Runtime [default: all cores].")
@provider_option
@click.option("--runtimes", "include", type=runner_names(), help="Comma-separated runtimes to time "
              "besides eager, by the names `infer --runtime` takes, e.g. "
              "onnxruntime,onnxruntime[model.int8.onnx] [default: all in the bundle].")
@openvino_option
@trust_code_option
@click.option("--variants", type=choice_names(VARIANT_NAMES), default="optimized,int8",
              show_default=True, help="For a preset TARGET: the ONNX variants to export first "
              "(what export's --precision fp16, --optimize, both together (optimized-fp16) and "
              "--quantize int8 add).")
@seed_option("a preset TARGET's init weights and the timed inputs")
@click.option("--min-seconds", default=2.0, show_default=True, type=Number(0, 3600),
              help="Time each runtime and batch for at least this long.")
@click.option("--min-runs", default=5, show_default=True, type=click.IntRange(min=1),
              help="Time each runtime and batch at least this many times.")
@click.option("--warmup", default=2, show_default=True, type=click.IntRange(min=0),
              help="Untimed runs before the timed ones.")
@json_option
@report_options("plot")
@click.option("--peers", default="", metavar="NAMES", help="Also time ways to run the model "
              "that are not files of the bundle, each checked against eager first: eager-amp "
              "(torch.autocast fp16), torch-compile and torch-compile-amp (torch.compile, mode "
              "max-autotune: minutes of compiling), cuda-graph (each ONNX model with ONNX "
              "Runtime's CUDA graphs); timm's own VisionTransformer with the bundle's weights: "
              "timm and timm-compile (fp32, torch.compile mode default), timm-fp16, "
              "timm-compile-fp16 and timm-compile-ro-fp16 (.half(); reduce-overhead: CUDA "
              "graphs). eager-amp, torch-compile-amp, cuda-graph and the fp16 ones need CUDA.")
@click.option("--record", is_flag=True, help="Write the fastest validated runtime at each "
              "batch size, with the CPU, ISA and peaks, to the bundle's performance.json "
              "(replaced), which `infer` and `serve --runtime auto` run.")
@progress_option
@click.pass_context
def bench_command(ctx, target, batch_sizes, threads, provider, include, openvino, trust_code,
                  variants, seed, min_seconds, min_runs, warmup, as_json, report_path,
                  plot_path, peers, record, progress) -> None:
    """Time eager PyTorch, TorchScript and each ONNX model of a bundle (or of a preset,
    exported first as `export --preset` does, with random weights, and validated); all on
    the device ONNX Runtime really runs on; every figure is also a ratio to eager."""
    import tempfile

    if plot_path:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            raise click.UsageError("--plot needs matplotlib: pip install matplotlib") from None
    path = Path(target)
    is_preset = not path.exists() and target in PRESETS
    if not is_preset and ctx.get_parameter_source("variants") is not \
            click.core.ParameterSource.DEFAULT:
        raise click.UsageError("--variants applies to a preset TARGET; a bundle is timed "
                               "with the models it has")
    if record and is_preset:
        raise click.UsageError("--record writes into a bundle; a preset TARGET is exported "
                               "to a temporary folder")
    if record:  # before minutes of timing
        _check_writable(path / B.PERFORMANCE_FILE)
    _check_outputs({"--report": report_path, "--plot": plot_path},
                   [path] if path.exists() else [])
    _require_openvino(openvino)
    peers = [p for p in peers.split(",") if p]
    try:
        check_peers(peers)
    except ConfigError as exc:
        raise click.UsageError(str(exc)) from None

    found = None if is_preset else B.read_bundle(path)  # read once, handed to bench
    _refuse_huge_batches(preset_config(target) if is_preset else found.config, batch_sizes)
    step = Progress(progress)
    with tempfile.TemporaryDirectory(prefix="vit-export-bench-") as tmp:
        if is_preset:
            model, description = _load_source(None, target, None, None, {}, seed)
            path = Path(tmp) / target
            export_bundle(model, path, description, variants=variants,
                          validation=dict(provider=provider, openvino=openvino, seed=seed),
                          progress=step)
        result = bench.bench(found or path, batch_sizes, threads=threads, provider=provider,
                             warmup=warmup, min_runs=min_runs, min_seconds=min_seconds,
                             seed=seed, include=include, openvino=openvino, peers=peers,
                             trust_code=trust_code or is_preset, progress=step)
    if as_json:
        click.echo(dumps(result.to_dict()))
    else:
        click.echo(render.bench_table(result, target), nl=False)  # shown even if a write fails
    if record:
        click.echo(f"recorded in {bench.record(result, path)}", err=as_json)
        for batch, best in result.recommendation.items():
            if "note" in best:  # what infer and serve --runtime auto will run at this batch
                click.echo(f"note: recommended at batch {batch}: {best['note']}", err=as_json)
    if report_path:
        B.atomic_write_json(report_path, result.to_dict())
    if plot_path:
        bench.plot(result, plot_path)


@cli.command("triton", epilog=_examples(
    "vit-export triton out/digits triton-repo",
    "vit-export triton out/digits triton-repo --provider cuda --max-batch-size 32 --force"))
@click.argument("bundle", type=click.Path(path_type=Path))
@click.argument("repo", type=click.Path(file_okay=False, path_type=Path))
@click.option("--provider", type=click.Choice(TRITON_DEVICES), default="cpu",
              show_default=True, help="Where Triton runs the models: instance_group "
              "KIND_CPU, or KIND_GPU with ONNX Runtime's CUDA provider (the machine Triton "
              "runs on decides, not this one: no auto).")
@max_batch_size_option("Largest batch Triton's dynamic batcher forms.", INT32_MAX)
@click.option("--preferred-batch-sizes", type=BATCH_SIZES, default=None,
              help="Batch sizes the batcher aims for, e.g. the fastest in `vit-export bench` "
                   "[default: the max batch size, as Triton itself fills in].")
@click.option("--max-queue-delay-us", default=TRITON_QUEUE_DELAY_US, show_default=True,
              type=click.IntRange(0, UINT64_MAX),
              help="How long a request may wait for a batch.")
@click.option("--instances", default=1, show_default=True, type=click.IntRange(1, INT32_MAX),
              help="Model instances per device.")
@click.option("--name", help="Prefix of the model names [default: the bundle's name].")
@click.option("--tf32", is_flag=True, help="With --provider cuda: let ONNX Runtime's CUDA EP use "
              "TF32 (parity was proven without it).")
@click.option("--tensorrt", is_flag=True, help="With --provider cuda: ONNX Runtime's TensorRT EP "
              "first (FP16 for the fp16 model); not what parity validated.")
@click.option("--torchscript", is_flag=True, help="Also serve model.ts with Triton's libtorch "
              "backend, which runs the TorchScript program it holds [default: ONNX models only].")
@trust_code_option
@force_option("REPO")
def triton_command(bundle: Path, repo: Path, provider, max_batch_size, preferred_batch_sizes,
                   max_queue_delay_us, instances, name, tf32, tensorrt, torchscript, trust_code,
                   force) -> None:
    """Write a Triton Inference Server model repository REPO serving BUNDLE's ONNX models
    (onnxruntime), and with --torchscript or --trust-code its TorchScript model
    (pytorch_libtorch)."""

    try:
        options = triton.TritonOptions(
            device=provider, max_batch_size=max_batch_size,
            preferred_batch_sizes=tuple(preferred_batch_sizes or ()),
            max_queue_delay_us=max_queue_delay_us, instances=instances, tf32=tf32,
            tensorrt=tensorrt, name=name, torchscript=torchscript or trust_code)
    except ConfigError as exc:  # an option, or a combination of them, that does not fit
        raise click.UsageError(str(exc)) from None
    written = triton.write_repository(bundle, repo, options, force=force)
    count = len(written.models)
    click.echo(f"wrote {repo}: {count} model{'' if count == 1 else 's'} "
               f"({', '.join(m.name for m in written.models)}), {options.kind}, max batch "
               f"{options.max_batch_size}{', labels' if written.labels else ''}")
    for note in written.notes:
        click.echo(f"note: {note}")
    if written.left_out:
        click.echo(f"note: {', '.join(written.left_out)} not written: Triton's libtorch backend "
                   f"runs the TorchScript program it holds; --torchscript or --trust-code "
                   f"writes it")


class _Autoscale(click.ParamType):
    name = "MIN,MAX"

    def convert(self, value, param, ctx):
        if isinstance(value, tuple):
            return value
        parts = value.split(",")
        if len(parts) != 2 or not all(p.strip().isdigit() for p in parts):
            self.fail(f"expected MIN,MAX replicas, e.g. 1,4; got {value!r}", param, ctx)
        low, high = (int(p) for p in parts)
        if not 1 <= low <= high:
            self.fail(f"needs 1 <= MIN <= MAX, got {value!r}", param, ctx)
        return low, high


def _check_port_free(host: str, port: int) -> None:
    """The address can be listened on (Ray Serve's proxy would fail later and less clearly)."""
    import socket

    try:
        with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as probe:
            probe.bind((host, port))
    except OSError as exc:
        raise click.UsageError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") \
            from None


@cli.command("serve", epilog=_examples(
    "vit-export serve out/digits",
    "vit-export serve out/digits --replicas 2 --max-batch-size 16 --batch-wait-ms 5",
    "curl --data-binary @models/digits/samples/true_2_006.png \\",
    "    'http://127.0.0.1:8000/predict?top_k=3'"))
@click.argument("bundle", type=click.Path(path_type=Path))
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Address to listen on; 0.0.0.0 exposes the server to the network.")
@click.option("--port", default=8000, show_default=True, type=click.IntRange(1, 65535),
              help="TCP port to listen on.")
@click.option("--replicas", default=1, show_default=True, type=click.IntRange(min=1),
              help="Replicas, each a runner of its own.")
@click.option("--autoscale", type=_Autoscale(), help="MIN,MAX replicas, scaled by Ray Serve "
              "on the requests in flight, instead of --replicas.")
@max_batch_size_option("Largest batch a replica forms from waiting requests (and which of "
                       "performance.json's batch sizes --runtime auto reads).")
@click.option("--batch-wait-ms", default=5.0, show_default=True,
              type=Number(0, 10_000), help="How long a request may wait for a batch.")
@click.option("--max-request-bytes", default=None, type=click.IntRange(min=1),
              help="Largest request body accepted (413 above)  [default: 16 MiB]")
@click.option("--top-k", default=5, show_default=True, type=click.IntRange(min=1),
              help="Labels per answer unless the request asks ?top_k=K.")
@runtime_option
@provider_option
@threads_option("ONNX Runtime threads per replica [default: the cores shared out].")
@click.option("--address", metavar="ADDRESS", help="Join this Ray cluster (e.g. auto, or "
              "ray://head:10001) instead of starting one here; the bundle's path must be "
              "readable on every node (each replica checks its sha256s).")
def serve_command(bundle: Path, host, port, replicas, autoscale, max_batch_size, batch_wait_ms,
                  max_request_bytes, top_k, runtime_name, provider, threads, address) -> None:
    """Serve BUNDLE over HTTP on Ray Serve: POST an image to /predict (or to /embed, for a
    bundle that gives an embedding), GET /healthz. The same replicas speak the Open Inference
    Protocol (KServe v2 REST) under /v2, as Triton's and KServe's clients ask: GET
    /v2/health/ready, GET /v2/models/NAME, POST /v2/models/NAME/infer with a tensor or
    encoded images.

    Runs until Ctrl-C or SIGTERM, then drains (new requests 503; those taken finish, for up
    to 15 s) and shuts Ray Serve down.
    """

    if autoscale and replicas != 1:
        raise click.UsageError("--replicas and --autoscale exclude each other")
    _check_runtime(bundle, runtime_name)
    # read once here, where the replicas run; a bundle on a cluster we join may not be here
    model = B.read_model(bundle) if address is None else bundle
    runtime_name, chosen_by = resolve_runner(model, runtime_name, provider, max_batch_size)
    note = batch_dependence(runtime_name)
    if note and max_batch_size > 1:  # requests from different clients share a batch
        click.echo(f"note: {note}; --max-batch-size 1 answers each request alone",
                   err=True)
    where = "/predict or /embed"
    if address is None:  # the replicas run here: prove the bundle, runtime and provider
        opened = open_model(model, provider, runtime_name)
        where = route(opened.description.config)
        runtime_name = opened.runner.name
        _check_port_free(host, port)
    most = autoscale[1] if autoscale else replicas
    options = ServeOptions(
        host=host, port=port, replicas=replicas, autoscale=autoscale,
        max_batch_size=max_batch_size, batch_wait_ms=batch_wait_ms,
        max_request_bytes=max_request_bytes or DEFAULT_MAX_REQUEST_BYTES, top_k=top_k,
        provider=provider, runtime_name=runtime_name,
        threads=threads or max(1, (os.cpu_count() or 1) // most))

    def started(url: str, count: int) -> None:
        chosen = f" ({chosen_by})" if chosen_by else ""
        click.echo(f"serving {bundle} on {url} (POST {where}, GET /healthz) with "
                   f"{runtime_name}{chosen}: {count} replica(s), max batch {max_batch_size}, "
                   f"wait {batch_wait_ms:g} ms; Ctrl-C stops", err=True)

    try:
        serve_bundle(str(bundle), options, address, started)
    except BaseException as exc:
        signum = _signum(exc)
        if signum is None:
            raise
        click.echo(f"stopped by {signal.Signals(signum).name}; Ray Serve shut down", err=True)
        sys.exit(128 + signum)  # as every command stopped by a signal (130, 143)


def main() -> None:
    try:
        cli(prog_name="vit-export")
    except SystemExit as exc:
        if ray_session.driver_ran():  # Ray's C++ exit handler can crash: leave without it
            ray_session.exit_process(exc.code)
        raise
