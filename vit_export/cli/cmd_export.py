"""`presets`, `quick-test` and `export`: a model loaded from its source, then
`ExportOptions`, then one `export_bundle` call."""
from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Optional

import click

from .. import bundle as B
from ..bundle import MAX_EXPORT_BATCH
from ..errors import (
    ParityError,
    ProviderError,
    VitExportError,
)
from ..export_options import DEFAULT_EXPORTER, EXPORTERS
from ..hub import FAMILIES as HUB_FAMILIES
from ..images import DEFAULT_CALIBRATION_IMAGES, MIN_CALIBRATION_IMAGES
from ..onnxio import DEFAULT_OPSET
from ..options import (
    Number,
    Progress,
    batch_size_option,
    batch_sizes_option,
    force_option,
    openvino_option,
    progress_option,
    provider_option,
    provider_option_with,
    seed_option,
)
from ..variants import PRECISIONS, QUANTIZATIONS
from .app import (
    cli,
    examples,
    parse_overrides,
    refuse_huge_batches,
    refuse_overwriting,
    require_openvino,
)


@cli.command(epilog=examples("vit-export presets"))
def presets() -> None:
    """List the model presets (timm names) and their sizes."""
    from ..model import PRESETS, preset_config


    click.echo(f"{'preset':<24} {'img':>4} {'patch':>5} {'dim':>5} {'depth':>5} {'heads':>5} "
               f"{'params':>9}")
    for name in PRESETS:
        c = preset_config(name)
        params = count_params(c)
        click.echo(f"{name:<24} {c.img_size:>4} {c.patch_size:>5} {c.embed_dim:>5} "
                   f"{c.depth:>5} {c.num_heads:>5} {params / 1e6:>8.1f}M")


def count_params(config) -> int:
    """Parameters of a config, counted on the meta device (no memory, no init)."""
    import torch

    from ..model import VisionTransformer

    with torch.device("meta"):
        return sum(p.numel() for p in VisionTransformer(config).parameters())


@cli.command("quick-test", epilog=examples(
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

    from ..model import preset_config, train_step_check

    if provider == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    elif provider == "cuda" and not torch.cuda.is_available():
        raise ProviderError("--provider cuda: PyTorch sees no CUDA device")
    else:
        device = provider
    config = preset_config(preset)
    refuse_huge_batches(config, [batch_size], "--batch-size")
    r = train_step_check(config, batch=batch_size, seed=seed, device=device)
    click.echo(f"device={device}, logits_shape={tuple(r['logits_shape'])}, "
               f"loss={r['loss']:.4f}, pred={r['pred']}")


def load_source(source: Optional[str], preset: Optional[str], checkpoint: Optional[str],
                 fmt: Optional[str], overrides: dict[str, str], seed: int,
                 timm_name: Optional[str] = None, torchvision_weights: Optional[str] = None,
                 model_name: Optional[str] = None, bars: bool = False):
    """The model, its description and the files it was imported from (read once: what
    the source framework's model is built from; None for --from and a lone --preset) from
    exactly one of --from, --preset, --checkpoint, --model (`bars`: the download's progress
    bars)."""
    from ..checkpoints import load_model, read_checkpoint
    from ..hub import load_named

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

    files = read_checkpoint(checkpoint) if checkpoint else None
    return (*load_model(source, preset, files, fmt, overrides, seed, timm_name,
                        torchvision_weights), files)


@cli.command(epilog=examples(
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
@click.option("--set", "overrides", multiple=True, callback=parse_overrides, metavar="KEY=VALUE",
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
           torchvision_weights, exporter, opset, export_batch, external_data,
           precision, fp16_io, optimize, quantize, calibrate, calibrate_count, max_drop,
           min_cosine, batch_sizes, provider, openvino, real_data, seed, dynamic_size, embed_preprocessing, program, package,
           package_precision, wanted_output, normalize, force, progress) -> None:
    """Export a model to a bundle folder OUTPUT, validated before it is written."""
    from .. import render
    from ..export import export_bundle
    from ..export_options import ExportOptions, check_package_precision
    from ..parity.budget import AccuracyBudget

    refuse_overwriting({"OUTPUT": output},
                        [Path(p) for p in (source, checkpoint, real_data, calibrate) if p])
    if (output.exists() or output.is_symlink()) and not force:  # before minutes of loading
        raise VitExportError(f"{output} already exists; use --force to replace it")
    require_openvino(openvino)
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
        package=package, package_precision=package_precision,
        dynamic_size=dynamic_size, outputs=wanted_output, normalize=normalize)
    check_package_precision(options.aoti_precision, options.validation.provider)
    step = Progress(progress)
    step("loading the model")
    model, description, files = load_source(source, preset, checkpoint, fmt, overrides, seed,
                                             timm_name, torchvision_weights, model_name,
                                             step.shown)
    options = dataclasses.replace(options, validation=dataclasses.replace(
        options.validation, source=files))  # the source model from the bytes read
    for note in description.extra.get("import", {}).get("notes", []):
        click.echo(f"note: {note}")
    refuse_huge_batches(model.config, batch_sizes)
    refuse_huge_batches(model.config, [export_batch + 1], "--batch-size")  # its probe
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
