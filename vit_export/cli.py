"""The `vit-export` command line: parse, call the library, print, map errors to exit codes.

Exit codes: 0 ok; 1 a check failed or an input was bad; 2 usage error.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, Optional

import click

from . import __version__
from .errors import ParityError, ProviderError, VitExportError

MODELS_DIR = Path(__file__).resolve().parent.parent / "models"


class _Group(click.Group):
    """Turns the library's errors into one line on stderr and exit code 1."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except VitExportError as exc:
            click.echo(f"Error: {exc}", err=True)
            ctx.exit(1)
        except OSError as exc:  # a file we could not read or write: permissions, disk, ...
            click.echo(f"Error: {exc.strerror or exc}: {exc.filename or ''}".rstrip(": "),
                       err=True)
            ctx.exit(1)


class _BatchSizes(click.ParamType):
    name = "N[,N...]"

    def convert(self, value, param, ctx):
        if isinstance(value, list):
            return value
        try:
            sizes = [int(v) for v in str(value).split(",") if v.strip()]
        except ValueError:
            self.fail(f"{value!r} is not a comma-separated list of integers", param, ctx)
        if not sizes or any(s < 1 for s in sizes):
            self.fail(f"batch sizes must be integers >= 1, got {value!r}", param, ctx)
        return sizes


def _overrides(ctx, param, values: tuple[str, ...]) -> dict[str, str]:
    result = {}
    for item in values:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise click.BadParameter(f"expected KEY=VALUE, got {item!r}", ctx, param)
        result[key.strip()] = value.strip()
    return result


BATCH_SIZES = _BatchSizes()
provider_option = click.option(
    "--provider", type=click.Choice(["auto", "cuda", "cpu"]), default="auto", show_default=True,
    help="ONNX Runtime provider. `cuda` that does not really run on CUDA is an error.")


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="vit-export")
def cli() -> None:
    """Export Vision Transformers to TorchScript and ONNX, run them, and prove parity."""


@cli.command()
def presets() -> None:
    """List the model presets (timm names) and their sizes."""
    from .model import PRESETS, preset_config

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

    from .model import VisionTransformer

    with torch.device("meta"):
        return sum(p.numel() for p in VisionTransformer(config).parameters())


@cli.command("quick-test")
@click.option("--preset", default="vit_seed_tiny", show_default=True)
@click.option("--batch", default=2, show_default=True, type=click.IntRange(min=1))
@click.option("--seed", default=0, show_default=True)
@click.option("--device", type=click.Choice(["auto", "cpu", "cuda"]), default="auto",
              show_default=True)
def quick_test(preset: str, batch: int, seed: int, device: str) -> None:
    """Forward, loss, backward and one optimizer step on random data; checks the shapes."""
    import torch

    from .model import preset_config, train_step_check

    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    elif device == "cuda" and not torch.cuda.is_available():
        raise click.ClickException("--device cuda: PyTorch sees no CUDA device")
    r = train_step_check(preset_config(preset), batch=batch, seed=seed, device=device)
    click.echo(f"device={device}, logits_shape={tuple(r['logits_shape'])}, "
               f"loss={r['loss']:.4f}, pred={r['pred']}")


def _load_source(source: Optional[str], preset: Optional[str], checkpoint: Optional[str],
                 fmt: Optional[str], overrides: dict[str, str], seed: int,
                 timm_name: Optional[str] = None, torchvision_weights: Optional[str] = None):
    """The model and its description from exactly one of --from, --preset, --checkpoint."""
    import torch

    from . import bundle as B
    from .model import create_model

    given = [name for name, v in (("--from", source), ("--preset", preset),
                                  ("--checkpoint", checkpoint)) if v]
    if len(given) != 1 and given != ["--preset", "--checkpoint"]:
        raise click.UsageError("give exactly one of --from, --preset, --checkpoint "
                               "(--preset may refine --checkpoint)")
    if fmt and not checkpoint:
        raise click.UsageError("--format applies to --checkpoint only")
    if source:
        if overrides or timm_name or torchvision_weights:
            raise click.UsageError("--set, --timm-name and --torchvision-weights apply to "
                                   "--preset and --checkpoint, not --from")
        found = B.read_bundle(source)
        return B.load_eager(found), found.description
    if checkpoint:
        from .checkpoints import load_checkpoint

        return load_checkpoint(checkpoint, fmt=fmt, preset=preset, overrides=overrides,
                               timm_name=timm_name, torchvision_weights=torchvision_weights)
    from .checkpoints import resolve_preprocessing, split_overrides

    model_overrides, prep_overrides = split_overrides(overrides)
    torch.manual_seed(seed)
    model = create_model(preset, **model_overrides)
    prep, _ = resolve_preprocessing(model.config, timm_name=timm_name,
                                    torchvision_weights=torchvision_weights, preset=preset,
                                    overrides=prep_overrides)
    return model.eval(), B.Description(model.config, prep, name=preset,
                                       extra={"weights": f"random init, seed {seed}"})


@cli.command()
@click.argument("output", type=click.Path(file_okay=False, path_type=Path))
@click.option("--from", "source", metavar="DIR",
              help="A model folder (config.json + weights.safetensors), e.g. models/digits.")
@click.option("--preset", help="Build a preset with random weights (see `presets`).")
@click.option("--checkpoint", type=click.Path(), help="A timm / Hugging Face / torchvision "
              "checkpoint file or folder.")
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
@click.option("--exporter", type=click.Choice(["dynamo", "torchscript"]), default="dynamo",
              show_default=True, help="torch's ONNX exporter.")
@click.option("--opset", default=18, show_default=True, type=click.IntRange(min=17))
@click.option("--export-batch", default=2, show_default=True, type=click.IntRange(min=2),
              help="Batch size of the example input (>= 2, so it is not specialised).")
@click.option("--external-data/--single-file", default=None,
              help="Force ONNX weights into model.onnx.data or into model.onnx "
                   "[default: external only above 2 GB].")
@click.option("--precision", type=click.Choice(["fp32", "fp16"]), default="fp32",
              show_default=True, help="fp16 adds model.fp16.onnx (LayerNorm and Softmax "
              "kept in fp32), validated with the fp16 profile.")
@click.option("--fp16-io", is_flag=True, help="With --precision fp16: fp16 input and output "
              "instead of fp32.")
@click.option("--optimize", is_flag=True, help="Add model.opt.onnx: ONNX Runtime's transformer "
              "optimizer (fused LayerNorm, GELU), validated with the fp32 profile.")
@click.option("--quantize", type=click.Choice(["int8"]), help="Add model.int8.onnx: dynamic "
              "int8 quantization, validated with the int8 profile.")
@click.option("--batch-sizes", type=BATCH_SIZES, default=None,
              help="Batch sizes for the export-time validation [default: 1, export batch + 1, 7].")
@provider_option
@click.option("--real-data", type=click.Path(dir_okay=False, path_type=Path),
              help="Labelled images (.npz, see `validate`) for the export-time validation.")
@click.option("--seed", default=0, show_default=True, help="Seed of random init weights.")
@click.option("--force", is_flag=True, help="Replace OUTPUT if it exists.")
def export(output: Path, source, preset, checkpoint, fmt, overrides, timm_name,
           torchvision_weights, exporter, opset, export_batch, external_data, precision, fp16_io,
           optimize, quantize, batch_sizes, provider, real_data, seed, force) -> None:
    """Export a model to a bundle folder OUTPUT, validated before it is written."""
    from . import parity
    from .export import export_bundle

    if output.exists() and not force:  # before loading a model for minutes; rechecked at write
        raise VitExportError(f"{output} already exists; use --force to replace it")
    if fp16_io and precision != "fp16":
        raise click.UsageError("--fp16-io needs --precision fp16")
    variants = [kind for kind, wanted in (("fp16", precision == "fp16"), ("optimized", optimize),
                                          ("int8", quantize == "int8")) if wanted]
    model, description = _load_source(source, preset, checkpoint, fmt, overrides, seed,
                                      timm_name, torchvision_weights)
    for note in description.extra.get("import", {}).get("notes", []):
        click.echo(f"note: {note}")
    real = _real_data(real_data, description)
    reports = []

    def check(staged: Path) -> dict:
        report = parity.validate(staged, batch_sizes, provider=provider, seed=seed,
                                 real_inputs=real)
        reports.append(report)
        if not report.passed:
            raise ParityError(f"export does not match eager PyTorch, nothing written: "
                              f"{report.failures[0]}")
        return report.to_dict()

    try:
        export_bundle(model, output, description, exporter=exporter, opset=opset,
                      batch=export_batch, external_data=external_data, force=force,
                      variants=variants, fp16_io=fp16_io, check=check)
    finally:
        if reports:
            _print_report(reports[-1])
    files = sorted(p.name for p in output.iterdir())
    click.echo(f"wrote {output}: {', '.join(files)}")


def _print_report(report) -> None:
    click.echo(f"provider: requested {report.provider_requested}, ran on "
               f"{report.provider_used}; torch device {report.torch_device}; "
               f"TF32 {'on' if report.tf32 else 'off'}; seed {report.seed}")
    for note in report.notes:
        click.echo(f"note: {note}")
    for name, t in report.profiles.items():
        click.echo(f"profile {name}: max abs <= {t.atol:g}, max rel <= {t.rtol:g}, "
                   f"cosine >= {t.min_cosine}, top-1 >= {t.min_top1}")
    width = max([12] + [len(r.candidate) for r in report.results])
    click.echo(f"{'eager vs':<{width}} {'profile':<7} {'batch':>5}  {'inputs':<16} "
               f"{'max abs':>9} {'max rel':>9} {'cosine':>10} {'top-1':>6}  result")
    for r in report.results:
        click.echo(f"{r.candidate:<{width}} {r.profile:<7} {r.batch:>5}  {r.inputs:<16} "
                   f"{r.max_abs:>9.2e} {r.max_rel:>9.2e} {r.cosine:>10.7f} {r.top1:>6.1%}  "
                   f"{'ok' if r.passed else 'FAIL: ' + '; '.join(r.failures)}")
    for r in report.results:
        if r.accuracy is not None:
            click.echo(f"accuracy on {r.inputs} ({r.batch} labelled): eager "
                       f"{r.reference_accuracy:.2%}, {r.candidate} {r.accuracy:.2%}")
    if report.stages:
        w = max(len(f"{s.model} {s.label}") for s in report.stages)
        click.echo(f"{'stage':<{w}} {'batch':>5} {'max abs':>9} {'rel L2':>9} {'cosine':>10}")
        for s in report.stages:
            click.echo(f"{s.model + ' ' + s.label:<{w}} {s.batch:>5} {s.max_abs:>9.2e} "
                       f"{s.rel_l2:>9.2e} {s.cosine:>10.7f}  {'ok' if s.passed else 'FAIL'}")
    for model, text in report.first_divergence.items():
        click.echo(f"divergence: {model}: {text}")
    for c in report.checks:
        click.echo(f"check: {c.name}: {'ok' if c.passed else 'FAIL'} ({c.detail})")
    failures = report.failures
    click.echo("PASS" if report.passed else f"FAIL: {len(failures)} check(s) failed")


@cli.command()
@click.argument("bundle", type=click.Path(path_type=Path))
@click.option("--batch-sizes", type=BATCH_SIZES, default=None,
              help="Comma-separated batch sizes [default: 1, export batch + 1, 7].")
@provider_option
@click.option("--require-provider", type=click.Choice(["cuda", "cpu"]),
              help="Fail unless this provider is the one that ran.")
@click.option("--seed", default=0, show_default=True, help="Seed of the random inputs.")
@click.option("--real-data", type=click.Path(dir_okay=False, path_type=Path),
              help="A .npz of labelled images (`images` uint8 [N, H, W(, C)], `labels` [N]) "
                   "to compare on too; reports accuracy.")
@click.option("--images", multiple=True, type=click.Path(path_type=Path),
              help="Image files or folders to compare on too (repeatable).")
@click.option("--layers", is_flag=True, help="Also compare every stage (patch embedding, "
              "each block's attention, MLP and output, final norm) and name the first that "
              "diverges.")
@click.option("--profile", type=click.Choice(["fp32", "tf32", "fp16", "int8"]),
              help="Judge every ONNX model by this profile [default: each model's own].")
@click.option("--atol", type=float, help="Override the max abs error allowed on logits.")
@click.option("--rtol", type=float, help="Override the max relative error allowed.")
@click.option("--min-cosine", type=float, help="Override the lowest cosine allowed.")
@click.option("--report", "report_path", type=click.Path(dir_okay=False, path_type=Path),
              help="Write the report as JSON to this file.")
@click.option("--junit", "junit_path", type=click.Path(dir_okay=False, path_type=Path),
              help="Write JUnit XML (one test case per pair, batch, check and stage).")
@click.option("--markdown", "markdown_path", type=click.Path(dir_okay=False, path_type=Path),
              help="Write a Markdown summary for a pull-request comment.")
def validate(bundle: Path, batch_sizes, provider, require_provider, seed, real_data, images,
             layers, profile, atol, rtol, min_cosine, report_path, junit_path,
             markdown_path) -> None:
    """Compare eager PyTorch, TorchScript and ONNX Runtime on BUNDLE; exit 1 on any mismatch."""
    import numpy as np

    from . import bundle as B
    from . import parity

    description = B.read_bundle(bundle, verify=False).description
    real = _real_data(real_data, description) or {}
    if images:
        from .images import expand_inputs, iter_inputs

        arrays = [a for _, a in iter_inputs(expand_inputs(images), description.preprocessing)]
        real["images"] = (np.stack(arrays), None)
    report = parity.validate(bundle, batch_sizes, provider=provider, seed=seed,
                             overrides=dict(atol=atol, rtol=rtol, min_cosine=min_cosine),
                             real_inputs=real or None, layers=layers,
                             require_provider=require_provider, profile=profile)
    for path, text in ((report_path, lambda: json.dumps(report.to_dict(), indent=2)),
                       (junit_path, lambda: parity.to_junit(report)),
                       (markdown_path, lambda: parity.to_markdown(report))):
        if path:
            B.atomic_write_text(path, text())
    _print_report(report)
    if not report.passed:
        raise ParityError(f"parity failed: {report.failures[0]}")


def _real_data(path: Optional[Path], description) -> Optional[dict]:
    """--real-data FILE.npz, preprocessed as the model's images are."""
    if path is None:
        return None
    from .images import load_labelled_npz

    return {path.stem: load_labelled_npz(path, description.preprocessing)}


def _open_runner(model: Path, provider: str, runtime_name: str):
    from . import bundle as B
    from . import runtime

    if model.is_dir():
        found = B.read_bundle(model)
        model = found.onnx_path if runtime_name == "onnx" else found.ts_path
    if model.suffix == ".onnx":
        return runtime.create_session(model, provider)
    device = runtime.torch_device(provider if provider != "auto" else "cuda")
    if provider == "cuda" and device != "cuda":
        raise ProviderError("requested CUDA for TorchScript but PyTorch sees no CUDA device")
    return runtime.load_torchscript(model, device)


@cli.command()
@click.argument("model", type=click.Path(path_type=Path))
@click.argument("inputs", nargs=-1, required=True)
@click.option("--top-k", default=5, show_default=True, type=click.IntRange(min=1))
@click.option("--batch-size", default=8, show_default=True, type=click.IntRange(min=1))
@click.option("--runtime", "runtime_name", type=click.Choice(["onnx", "torchscript"]),
              default="onnx", show_default=True, help="Which file of a bundle to run.")
@provider_option
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of text.")
def infer(model: Path, inputs, top_k, batch_size, runtime_name, provider, as_json) -> None:
    """Classify images (PNG, JPEG, ...) or .npy arrays with a bundle, .onnx or .ts MODEL.

    INPUTS may be files or folders.
    """
    import numpy as np

    from . import bundle as B
    from .images import expand_inputs, iter_inputs

    description = B.read_description(model)
    runner = _open_runner(model, provider, runtime_name)
    files = expand_inputs(inputs)
    labels = description.labels
    items = iter_inputs(files, description.preprocessing)
    results = []

    def flush(batch):
        names, arrays = zip(*batch)
        logits = runner(np.stack(arrays))
        z = logits - logits.max(axis=1, keepdims=True)
        probs = np.exp(z) / np.exp(z).sum(axis=1, keepdims=True)
        for name, p in zip(names, probs):
            top = np.argsort(-p)[:top_k]
            results.append({"input": name, "top": [
                {"class": int(i), "label": labels[i] if labels else str(int(i)),
                 "prob": float(p[i])} for i in top]})

    batch = []
    with click.progressbar(length=len(files), label="inferring", file=sys.stderr,
                           hidden=len(files) < 32 or as_json) as bar:
        for name, array in items:
            batch.append((name, array))
            if len(batch) == batch_size:
                flush(batch)
                bar.update(len(batch))
                batch = []
        if batch:
            flush(batch)
            bar.update(len(batch))
    provider_used = getattr(runner, "provider", runner.device)
    if as_json:
        click.echo(json.dumps({"model": str(model), "provider": provider_used,
                               "results": results}, indent=2))
        return
    for r in results:
        best = ", ".join(f"{t['label']} {t['prob']:.3f}" for t in r["top"])
        click.echo(f"{r['input']}: {best}")
    click.echo(f"{len(results)} input(s) on {runner.name} ({provider_used})")


@cli.command()
@click.argument("path", type=click.Path(path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Print the full description as JSON.")
def info(path: Path, as_json: bool) -> None:
    """Print what a bundle, model.onnx or model.ts says about itself."""
    from . import bundle as B

    d = B.read_description(path)
    if as_json:
        click.echo(d.to_json())
        return
    c, p = d.config, d.preprocessing
    click.echo(f"name: {d.name}")
    click.echo(f"model: img {c.img_size}, patch {c.patch_size}, chans {c.in_chans}, "
               f"dim {c.embed_dim}, depth {c.depth}, heads {c.num_heads}, "
               f"classes {c.num_classes}, params {_count_params(c):,}")
    click.echo(f"preprocessing: resize {p.resize_size} ({p.crop_mode}, {p.interpolation}), "
               f"crop {p.img_size} ({p.crop_offset}), rescale {p.rescale_factor:.6g}, "
               f"mean {list(p.mean)}, std {list(p.std)}, alpha {p.alpha}")
    by_source: dict[str, list[str]] = {}
    for name in B.PREPROCESSING_FIELDS:
        by_source.setdefault(p.source_of(name), []).append(name)
    click.echo("preprocessing from: " + "; ".join(f"{source} ({', '.join(names)})"
                                                  for source, names in by_source.items()))
    labels = d.labels
    click.echo(f"labels: {', '.join(labels[:10]) + (' ...' if len(labels) > 10 else '')}"
               if labels else "labels: none")
    if d.export:
        click.echo("export: " + ", ".join(f"{k} {v}" for k, v in d.export.items()))
    if d.versions:
        click.echo("versions: " + ", ".join(f"{k} {v}" for k, v in d.versions.items()))
    if path.is_dir():
        parity_file = path / B.PARITY_FILE
        if parity_file.is_file():
            report = json.loads(parity_file.read_text())
            click.echo(f"parity at export: {'PASS' if report.get('passed') else 'FAIL'} "
                       f"on {report.get('provider_used')}, batches {report.get('batch_sizes')}")


@cli.command("bench")
@click.argument("target")
@click.option("--batch-sizes", type=BATCH_SIZES, default="1,8,32", show_default=True)
@click.option("--threads", type=click.IntRange(min=1), help="Intra-op threads for PyTorch and "
              "ONNX Runtime [default: all cores].")
@provider_option
@click.option("--backends", "include", help="Comma-separated backends to time besides eager, "
              "e.g. onnxruntime,onnxruntime[model.int8.onnx] [default: all in the bundle].")
@click.option("--variants", default="optimized,int8", show_default=True,
              help="For a preset TARGET: the ONNX variants to export first.")
@click.option("--min-seconds", default=2.0, show_default=True, type=click.FloatRange(min=0),
              help="Time each backend and batch for at least this long.")
@click.option("--min-runs", default=5, show_default=True, type=click.IntRange(min=1))
@click.option("--warmup", default=2, show_default=True, type=click.IntRange(min=0))
@click.option("--json", "json_path", type=click.Path(dir_okay=False, path_type=Path),
              help="Write the result as JSON.")
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False, path_type=Path),
              help="Write a PNG of throughput against batch size (needs matplotlib).")
def bench_command(target, batch_sizes, threads, provider, include, variants, min_seconds,
                  min_runs, warmup, json_path, plot_path) -> None:
    """Time eager PyTorch, TorchScript and each ONNX model of a bundle (or of a preset,
    exported first with random weights); every figure is also a ratio to eager."""
    import tempfile

    from . import bench
    from . import bundle as B
    from .model import PRESETS

    if plot_path:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            raise click.UsageError("--plot needs matplotlib: pip install matplotlib") from None
    with tempfile.TemporaryDirectory(prefix="vit-export-bench-") as tmp:
        path = Path(target)
        if not path.exists() and target in PRESETS:
            import torch

            from .export import export_bundle
            from .model import create_model

            torch.manual_seed(0)
            model = create_model(target).eval()
            description = B.Description(model.config, B.Preprocessing.default_for(model.config),
                                        name=target)
            kinds = [v for v in variants.split(",") if v]
            click.echo(f"exporting {target} with {', '.join(kinds) or 'no variants'} ...",
                       err=True)
            path = export_bundle(model, Path(tmp) / target, description, variants=kinds)
        result = bench.bench(path, batch_sizes, threads=threads, provider=provider,
                             warmup=warmup, min_runs=min_runs, min_seconds=min_seconds,
                             include=include.split(",") if include else None)
    if json_path:
        B.atomic_write_text(json_path, json.dumps(result.to_dict(), indent=2))
    if plot_path:
        bench.plot(result, plot_path)
    click.echo(f"{target}: {result.gflop_per_image:.3g} GFLOP/image; {result.threads} threads; "
               f"{result.provider}; fp32 matmul peak {result.matmul_peak_gflops:.0f} GFLOP/s "
               f"(measured now)")
    width = max(len(r.backend) for r in result.rows)
    click.echo(f"{'backend':<{width}} {'batch':>5} {'p50 ms':>9} {'p90 ms':>9} {'p99 ms':>9} "
               f"{'img/s':>8} {'GFLOP/s':>8} {'peak':>5} {'vs eager':>8} {'RSS MB':>7}")
    for r in result.rows:
        click.echo(f"{r.backend:<{width}} {r.batch:>5} {r.p50_ms:>9.1f} {r.p90_ms:>9.1f} "
                   f"{r.p99_ms:>9.1f} {r.images_per_s:>8.2f} {r.gflops:>8.1f} "
                   f"{r.peak_fraction:>5.2f} {r.speedup:>7.2f}x {r.peak_rss_mb:>7.0f}")


def main() -> None:
    cli(prog_name="vit-export")
