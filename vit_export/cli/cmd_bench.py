"""`bench`: every runtime of a bundle (or a preset's fresh bundle) timed."""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import click

from ..options import (
    BENCH_BATCH_SIZES,
    Number,
    Progress,
    batch_sizes_option,
    choice_names,
    json_option,
    openvino_option,
    progress_option,
    provider_option,
    report_options,
    runner_names,
    runtimes_of,
    runtimes_option,
    seed_option,
    threads_option,
    trust_code_option,
)
from .app import (
    VARIANT_NAMES,
    check_outputs,
    check_writable,
    cli,
    examples,
    require_runtimes,
)


@cli.command("bench", epilog=examples(
    "vit-export bench out/digits --batch-sizes 1,8",
    "vit-export bench out/base --report bench.json --plot bench.png",
    "vit-export bench out/base --record",
    "vit-export bench vit_base_patch16_224 --variants optimized,int8"))
@click.argument("target")
@batch_sizes_option(BENCH_BATCH_SIZES, "Batch sizes to time each runtime at.")
@threads_option("Intra-op threads for PyTorch and ONNX Runtime [default: all cores].")
@provider_option
@click.option("--runners", type=runner_names(), help="Comma-separated runners to time "
              "besides eager, by the names `infer --runtime` takes, e.g. "
              "onnxruntime,onnxruntime[model.int8.onnx] [default: all in the bundle].")
@runtimes_option
@openvino_option
@trust_code_option
@click.option("--variants", type=choice_names(VARIANT_NAMES), default="optimized,int8",
              show_default=True, help="For a preset TARGET: the ONNX variants to export first "
              "(what export's --precision fp16, --optimize, both together (optimized-fp16) and "
              "--quantize int8 add).")
@seed_option("a preset TARGET's init weights and the timed inputs")
@click.option("--min-seconds", default=2.0, show_default=True, type=Number(0, 3600),
              help="Time each runtime and batch for at least this long, in all: every one is "
              "timed in turns with the others, in five rounds (fewer if --min-runs is lower).")
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
def bench_command(ctx, target, runtimes, openvino, variants, as_json, report_path, plot_path,
                  peers, record, progress, **options) -> None:
    """Time eager PyTorch, TorchScript and each ONNX model of a bundle (or of a preset,
    exported first as `export --preset` does, with random weights, and validated); all on
    the device ONNX Runtime really runs on; every figure is also a ratio to eager."""
    from .. import api
    from .. import bundle as B
    from ..config import PRESETS

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
        check_writable(path / B.PERFORMANCE_FILE)
    check_outputs({"--report": report_path, "--plot": plot_path},
                  [path] if path.exists() else [])
    runtimes = runtimes_of(runtimes, openvino)
    require_runtimes(runtimes)
    result = api.bench(target, runtimes=runtimes, variants=variants,
                       peers=[p for p in peers.split(",") if p], progress=Progress(progress),
                       **options)
    _show(result, target, path, as_json, record, report_path, plot_path)


def _show(result, target: str, path: Path, as_json: bool, record: bool,
          report_path: Optional[Path], plot_path: Optional[Path]) -> None:
    """What bench says: the table (or JSON), then what it records and writes."""
    from .. import benchmarking as bench
    from .. import bundle as B
    from .. import render
    from ..jsonio import dumps

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
        render.bench_plot(result, plot_path)
