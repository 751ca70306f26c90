"""`validate` and `compare`: a bundle proved against eager PyTorch, two saved runs
judged against each other."""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import click

from ..errors import (
    ParityError,
    SavedRunError,
)
from ..options import (
    LaterChoice,
    Number,
    Progress,
    batch_sizes_option,
    openvino_option,
    progress_option,
    provider_option,
    report_options,
    runtimes_of,
    runtimes_option,
    seed_option,
    threads_option,
    trust_code_option,
)
from ..runtime import DEVICES
from .app import check_outputs, cli, examples, message, note, require_runtimes


def _profiles() -> tuple[str, ...]:
    """The tolerance profiles --profile chooses from (parity's)."""
    from ..parity import PROFILES

    return tuple(PROFILES)


@cli.command(epilog=examples(
    "vit-export validate out/digits --real-data models/digits/held_out.npz",
    "vit-export validate out/base --layers --images photos/",
    "vit-export validate out/base --require-provider cuda --junit parity.xml \\",
    "    --markdown parity.md",
    "vit-export validate out/base --provider cpu --save-outputs cpu.npz",
    "vit-export validate out/dinov2 --source checkpoints/dinov2-small"))
@click.argument("bundle", type=click.Path(path_type=Path))
@batch_sizes_option(None, "Batch sizes to compare at [default: 1, the export's batch size + "
                    "1, 7].")
@provider_option
@runtimes_option
@openvino_option
@threads_option("Intra-op threads for PyTorch and ONNX Runtime [default: each one's own].")
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
@click.option("--profile", type=LaterChoice(_profiles),
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
@click.option("--source", type=click.Path(path_type=Path), metavar="PATH",
              help="For a bundle imported from a checkpoint or the Hub: the checkpoint file "
              "or folder it was imported from (a Hub model's snapshot folder). The source "
              "framework's own model (transformers, timm, torchvision) is built from the "
              "files there that the bundle's import record lists, each checked against its "
              "sha256, and run against eager and model.onnx. Without it the source is not "
              "compared: no path a bundle records is ever opened.")
@trust_code_option
@report_options("junit", "markdown")
@click.option("--save-outputs", type=click.Path(dir_okay=False, path_type=Path),
              help="Also keep the run in FILE (.npz, data only): the inputs, every runner's "
              "outputs and where each ran, for `vit-export compare` on another machine "
              "(replaced if it exists).")
@progress_option
def validate(bundle: Path, runtimes, openvino, report_path, junit_path, markdown_path,
             progress, **options) -> None:
    """Compare eager PyTorch, TorchScript and ONNX Runtime on BUNDLE; exit 1 on any mismatch."""
    from .. import api, render

    chart = markdown_path.with_name(markdown_path.stem + ".layers.svg") \
        if markdown_path and options["layers"] else None
    check_outputs({"--report": report_path, "--junit": junit_path,
                   "--markdown": markdown_path, "--markdown's chart": chart,
                   "--save-outputs": options["save_outputs"]},
                  [bundle, *filter(None, [options["real_data"], options["source"]]),
                   *options["images"]])
    runtimes = runtimes_of(runtimes, openvino)
    require_runtimes(runtimes)
    report = api.validate(bundle, runtimes=runtimes, progress=Progress(progress), **options)
    _write_reports(report, report_path, junit_path, markdown_path)
    click.echo(render.text(report), nl=False)
    if not report.passed:
        raise ParityError(f"parity failed: {report.failures[0]}")


def _write_reports(report, report_path: Optional[Path], junit_path: Optional[Path],
                   markdown_path: Optional[Path]) -> None:
    """A ParityReport as JSON, JUnit and Markdown, to the files given."""
    from .. import bundle as B
    from .. import render


    if report_path:
        B.atomic_write_json(report_path, report.to_dict())
    chart = None
    if markdown_path and report.stages:  # the per-stage chart beside it, where it renders
        try:
            import matplotlib  # noqa: F401

            chart = markdown_path.with_name(markdown_path.stem + ".layers.svg")
            render.layers_chart(report, chart)
        except ImportError:
            click.echo(note("the per-stage chart is not drawn: it needs matplotlib "
                            "(pip install matplotlib)"))
    for path, text in ((junit_path, lambda: render.junit(report)),
                       (markdown_path, lambda: render.markdown(
                           report, chart.name if chart else None))):
        if path:
            B.atomic_write_text(path, text())


@cli.command(epilog=examples(
    "vit-export compare cpu.npz gpu.npz",
    "vit-export compare cpu.npz gpu.npz --junit compare.xml --markdown compare.md"))
@click.argument("first", metavar="A", type=click.Path(dir_okay=False, path_type=Path))
@click.argument("second", metavar="B", type=click.Path(dir_okay=False, path_type=Path))
@report_options("junit", "markdown")
def compare(first: Path, second: Path, report_path, junit_path, markdown_path) -> None:
    """Judge two runs `validate --save-outputs` kept, of one bundle on the same inputs: eager
    of run A against every runner of run B, each under the profile validate judged it by.
    Exit 1 on any mismatch, 2 when the files cannot be judged together."""
    from .. import parity, render


    check_outputs({"--report": report_path, "--junit": junit_path,
                    "--markdown": markdown_path}, [first, second])
    try:
        a, b = parity.load_run(first), parity.load_run(second)
        report = parity.judge_runs(a, b, (str(first), str(second)))
    except SavedRunError as exc:  # not a saved run, or not two runs that can be compared
        raise click.UsageError(message(exc)) from None
    _write_reports(report, report_path, junit_path, markdown_path)
    click.echo(render.text(report), nl=False)
    if not report.passed:
        raise ParityError(f"parity failed: {report.failures[0]}")
