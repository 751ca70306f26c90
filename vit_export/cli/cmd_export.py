"""`presets`, `quick-test` and `export`: the flags parsed, one `vit_export.export` call,
the report printed."""
from __future__ import annotations

from pathlib import Path

import click

from .. import bundle as B
from ..bundle import MAX_EXPORT_BATCH
from ..errors import (
    ParityError,
    ProviderError,
    VitExportError,
)
from ..exporting.options import DEFAULT_EXPORTER, EXPORTERS
from ..exporting.variants import PRECISIONS, QUANTIZATIONS
from ..frameworks import ROADS
from ..hub import FAMILIES as HUB_FAMILIES
from ..images import DEFAULT_CALIBRATION_IMAGES, MIN_CALIBRATION_IMAGES
from ..onnxio import DEFAULT_OPSET
from ..options import (
    Number,
    Progress,
    batch_size_option,
    batch_sizes_option,
    choice_names,
    force_option,
    openvino_option,
    progress_option,
    provider_option,
    provider_option_with,
    runtimes_of,
    runtimes_option,
    seed_option,
)
from .app import (
    OWN_PROCESS,
    cli,
    examples,
    note,
    parse_overrides,
    refuse_huge_batches,
    refuse_overwriting,
    renamed,
    require_runtimes,
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
    refuse_huge_batches(config, [batch_size], "batch_size")
    r = train_step_check(config, batch=batch_size, seed=seed, device=device)
    click.echo(f"device={device}, logits_shape={tuple(r['logits_shape'])}, "
               f"loss={r['loss']:.4f}, pred={r['pred']}")


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
@click.option("--model", "model", metavar="NAME[@REVISION]", help="Download from the "
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
@click.option("--road", type=click.Choice(ROADS), default="auto", show_default=True,
              help="How a checkpoint is built: native (vit-export's own rebuild, with any "
              "image size and every precision), framework (the framework's own timm or "
              "transformers module, traced as it is), auto (native where the architecture is "
              "rebuilt, else the framework's: BEiT, Swin, Hiera, SAM-ViT, LeViT, ...).")
@click.option("--exporter", type=click.Choice(EXPORTERS), default=DEFAULT_EXPORTER,
              show_default=True, help="torch's ONNX exporter.")
@click.option("--opset", default=DEFAULT_OPSET, show_default=True, type=click.IntRange(min=17),
              help="ONNX opset (17 or newer keeps LayerNorm one op).")
@click.option("--export-batch-size", default=2, show_default=True,
              type=click.IntRange(min=2, max=MAX_EXPORT_BATCH),
              help="Batch size of the example input the model is traced and exported with "
              "(>= 2, so the batch axis is not specialised; every batch size runs).")
@click.option("--batch-size", "renamed_batch_size", hidden=True, callback=renamed(
    "--export-batch-size", "the batch the graphs are traced at"), expose_value=False)
@click.option("--external-data/--single-file", default=None,
              help="ONNX weights in model.onnx.data, or inside model.onnx [default: "
                   "model.onnx reads them from weights.safetensors (external data at each "
                   "tensor's offset), in model.onnx.data above 2 GB].")
@click.option("--precision", type=click.Choice(PRECISIONS), default=PRECISIONS[0],
              show_default=True, help="fp16 adds model.fp16.onnx (LayerNorm and Softmax "
              "kept in fp32), validated with the fp16 profile.")
@click.option("--fp16-io", is_flag=True, help="With --precision fp16: fp16 input and output "
              "instead of fp32.")
@click.option("--optimize", is_flag=True, help="Add model.opt.onnx: ONNX Runtime's transformer "
              "optimizer (fused attention, LayerNorm, GELU), validated with the fp32 profile; "
              "with --precision fp16 also model.opt.fp16.onnx, that graph in fp16 (fp16 "
              "profile).")
@click.option("--quantize", type=choice_names(QUANTIZATIONS), metavar="int8|static",
              help="int8: add model.int8.onnx, dynamic int8 (int8 profile). static: add "
              "model.int8-static.onnx, int8 with activation ranges calibrated on --calibrate "
              "images (int8-static profile). int8,static: both.")
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
@click.option("--budget-min-cosine", type=Number(-1, 1), help="With --max-drop: also the "
              "lowest cosine of one image's logits against eager fp32 the budget allows.")
@click.option("--min-cosine", "renamed_min_cosine", hidden=True, callback=renamed(
    "--budget-min-cosine", "a static int8 budget's lowest cosine"), expose_value=False)
@batch_sizes_option(None, "Batch sizes for the export-time validation [default: 1, "
                    "--export-batch-size + 1, 7].")
@provider_option
@runtimes_option
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
@click.option("--pt2", is_flag=True, help="Add model.pt2: the torch.export "
              "program (TorchScript's successor), batch symbolic, loads with "
              "torch.export.load.")
@click.option("--aoti", is_flag=True, help="Add model.aoti.pt2: the program compiled "
              "by AOTInductor for this machine's device (CPU: needs a C++ compiler, a minute "
              "or more), for Python or C++ without ONNX.")
@click.option("--aoti-precision", type=click.Choice(B.AOTI_PRECISIONS),
              help="With --aoti: what model.aoti.pt2 computes in. fp16: the model's .half() "
              "copy, fed fp16 (outputs fp32), compiled for CUDA and validated with the fp16 "
              "profile; refused where the export does not run on CUDA [default: fp32].")
@click.option("--outputs", metavar="NAMES", help="What the bundle gives, "
              "comma-separated, in this order: logits (the classifier's), embedding (the "
              "pooled features before the head, timm's forward_head(pre_logits=True), Hugging "
              "Face's pooler_output; CLIP's projected image_embeds), tokens (the patch tokens "
              "[batch, N, D], for dense tasks); e.g. logits,embedding,tokens [default: logits "
              "where there is a classifier, else embedding].")
@click.option("--normalize", is_flag=True, help="L2-normalise the embedding in the graph "
              "(with --outputs embedding, or a model whose output is one).")
@force_option("OUTPUT")
@progress_option
def export(output: Path, source, preset, checkpoint, model, overrides, runtimes, openvino,
           progress, **options) -> None:
    """Export a model to a bundle folder OUTPUT, validated before it is written."""
    from .. import api, render
    from ..runtime.base import freeze_imports

    given = [name for name, v in (("--from", source), ("--preset", preset),
                                  ("--checkpoint", checkpoint), ("--model", model)) if v]
    if len(given) != 1 and given != ["--preset", "--checkpoint"]:
        raise click.UsageError("give exactly one of --from, --preset, --checkpoint, --model "
                               "(--preset may refine --checkpoint)")
    kind, named = next((k, v) for k, v in (("bundle", source), ("checkpoint", checkpoint),
                                           ("hub", model), ("preset", preset)) if v)
    refuse_overwriting({"OUTPUT": output}, [Path(p) for p in (
        source, checkpoint, options["real_data"], options["calibrate"]) if p])
    if (output.exists() or output.is_symlink()) and not options["force"]:
        raise VitExportError(f"{output} already exists; use --force to replace it")
    runtimes = runtimes_of(runtimes, openvino)
    require_runtimes(runtimes)
    step = Progress(progress)
    if OWN_PROCESS:  # `vit-export export`, not the command run inside another program
        freeze_imports()
    try:
        report = api.export(named, output, kind=kind, preset=preset if kind != "preset"
                            else None, overrides=overrides, runtimes=runtimes,
                            progress=step, progress_bars=step.shown,
                            notes=lambda text: click.echo(note(text)), **options)
    except ParityError as exc:
        if exc.report is not None:
            click.echo(render.text(exc.report), nl=False)
        raise
    click.echo(render.text(report), nl=False)
    files = sorted(p.name for p in output.iterdir())
    click.echo(f"wrote {output}: {', '.join(files)}")
    step("done")
