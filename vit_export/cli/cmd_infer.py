"""`infer` and `info`: a bundle run on inputs, and what a bundle or model file says about
itself."""
from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Optional

import click

from ..errors import (
    BundleError,
    VitExportError,
    shown,
)
from ..jsonio import dumps
from ..options import (
    batch_size_option,
    force_option,
    json_option,
    provider_option,
    runtime_option,
)
from .app import check_writable, cli, examples, message, note, refuse_overwriting
from .cmd_export import count_params


@cli.command(epilog=examples(
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
@click.option("--ray", is_flag=True, help="Read, preprocess and classify on Ray Data "
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
def infer(model: Path, inputs, runtime, as_json, ray, embed, output, force, **options) -> None:
    """Classify (or --embed) images (PNG, JPEG, ...) or .npy arrays with a bundle, .onnx,
    .ts or .pt2 MODEL.

    INPUTS may be files or folders.
    """
    from .. import api

    check_runtime(model, runtime)
    _check_outputs(model, inputs, ray=ray, embed=embed, as_json=as_json, output=output,
                   force=force)
    bars: list = []  # made once the inputs are counted: hidden for a few, or with --json

    def progress(done: int, total: int) -> None:
        if not bars:
            bars.append(click.progressbar(
                length=total, label="inferring on Ray Data" if ray else "inferring",
                file=sys.stderr, hidden=as_json or total < 32).__enter__())
        bars[0].update(done - bars[0].pos)

    start = time.perf_counter()
    try:
        answered = api.infer(model, inputs, runtime=runtime, ray=ray, embed=embed,
                             output=output, force=force, progress=progress, **options)
    finally:
        if bars:
            bars[0].__exit__(None, None, None)
    seconds = time.perf_counter() - start
    for text in answered.notes:
        click.echo(note(text), err=True)
    if ray:
        return _ray_line(answered, options["workers"], embed, output, seconds)
    ran = f"{answered.runtime} ({answered.device})" + (
        f"; {answered.chosen_by}" if answered.chosen_by else "")
    if embed:
        return _embeddings_out(model, answered, ran, as_json, output)
    if as_json:
        click.echo(dumps({"model": str(model), "runtime": answered.runtime,
                          "chosen_by": answered.chosen_by, "provider": answered.device,
                          "results": answered.records}))
        return
    for r in answered.records:
        best = ", ".join(f"{t['label']} {t['prob']:.3f}" for t in r["top"])
        click.echo(f"{r['input']}: {best}")
    click.echo(f"{len(answered.records)} input(s) on {ran}")


def _check_outputs(model: Path, inputs: tuple[str, ...], *, ray: bool, embed: bool,
                   as_json: bool, output: Optional[Path], force: bool) -> None:
    """infer's output files, before any work: --output, for --ray or for --embed's file,
    can be written and overwrites nothing read (an --embed file there already, without
    --force: exit 1); the rules of which flags go together are the front door's
    (`InferOptions`)."""
    from .. import bundle as B
    from ..embeddings import check_format

    if ray:
        if as_json:
            raise click.UsageError("--json prints to stdout; with --ray the records go to "
                                   "--output as JSON lines")
        if output is None:
            return  # the front door says what --ray needs
        refuse_overwriting({"--output": output}, [model, *map(Path, inputs)])
        check_writable(output)
        if B.output_target(output)[1]:  # a device or FIFO: nothing to resume, or to rename onto
            raise click.UsageError(f"--output {output} is a device or FIFO; --ray writes a "
                                   f"resumable file: give a regular file")
        if embed and output.suffix.lower() == ".parquet":
            check_format(output)  # pyarrow, before Ray starts
    elif output is not None and embed:  # --embed's file (the front door refuses one there)
        if output.suffix.lower() == ".parquet":
            check_format(output)  # pyarrow; the kinds of file are the front door's rule
        refuse_overwriting({"--output": output}, [model, *map(Path, inputs)])
        check_writable(output)


def check_runtime(model: Path, name: str) -> None:
    """--runtime names a runner this MODEL can have: any runner name (a bundle says which it
    has once it is read), one a model file's suffix runs on, or auto; and its runtime's
    extra is installed."""
    import re

    from ..runtime import AUTO, FILE_RUNNERS, RUNNER_NAME
    from ..runtime.registry import missing_extra

    if name != AUTO and not re.fullmatch(RUNNER_NAME, name):
        raise click.UsageError(f"--runtime {name}: not a runner name; see --help")
    fits = FILE_RUNNERS.get(model.suffix)
    if not model.is_dir() and fits and name not in (AUTO, *fits):
        raise click.UsageError(f"--runtime {name} cannot run {model}: a {model.suffix} file "
                               f"runs with --runtime {' or '.join(fits)} (or give the bundle "
                               f"folder)")
    how = missing_extra(name) if name != AUTO else None
    if how:
        raise VitExportError(f"--runtime {name}: its runtime is not installed; {how}")


def _embeddings_out(model: Path, answered, ran: str, as_json: bool,
                    output: Optional[Path]) -> None:
    """infer --embed's answer: the file (--output), JSON records, or a line per input."""
    import numpy as np


    records = answered.records
    names = [r["input"] for r in records]
    embeddings = np.array([r["embedding"] for r in records], dtype=np.float32)
    if output is not None:
        click.echo(f"{len(names)} embedding(s), {embeddings.shape[1]} wide, on {ran}: "
                   f"{', '.join(map(str, answered.written))}", err=as_json)
    if as_json:
        click.echo(dumps({"model": str(model), "runtime": answered.runtime,
                          "chosen_by": answered.chosen_by, "provider": answered.device,
                          "results": records}))
    elif output is None:
        for name, row in zip(names, embeddings):
            click.echo(f"{name}: embedding [{len(row)}], norm {np.linalg.norm(row):.4f}")
        click.echo(f"{len(names)} input(s) on {ran}")


def _ray_line(answered, workers: int, embed: bool, output: Path, seconds: float) -> None:
    """What a run on Ray Data did, in one line."""
    counts = answered.counts
    rate = f", {counts['now'] / seconds:.1f} files/s" if counts["now"] else ""
    did = "embedded" if embed else "classified"
    why = f"; {counts['chosen_by']}" if counts["chosen_by"] else ""
    nodes = len(counts.get("nodes") or ())
    on = f" on {nodes} node(s)" if nodes else ""
    click.echo(f"{counts['now']} file(s) {did} on Ray Data with {workers} "
               f"worker(s){on} in {seconds:.1f} s{rate}; {counts['before']} done before; "
               f"{counts['records']} record(s) in {output}; runtime {counts['runtime']}{why}")


def _params(path: Path, config) -> int:
    """A bundle's parameter count from its weights' header (no torch); a model file's from
    its config, on the meta device."""
    from ..bundle import WEIGHTS_FILE, parameter_count

    weights = path / WEIGHTS_FILE
    return parameter_count(weights) if path.is_dir() and weights.is_file() else \
        count_params(config)


@cli.command(epilog=examples(
    "vit-export info out/digits",
    "vit-export info out/digits/model.onnx --json"))
@click.argument("path", type=click.Path(path_type=Path))
@json_option
def info(path: Path, as_json: bool) -> None:
    """Print what a bundle, model.onnx or model.ts says about itself."""
    from .. import bundle as B
    from ..frameworks import module_name
    from ..preprocessing import PREPROCESSING_FIELDS

    d = B.read_description(path)
    if as_json:
        click.echo(d.to_json())
        return
    c, p = d.config, d.preprocessing
    click.echo(f"name: {shown(d.name)}")
    any_size = " (any multiple of the patch)" if c.dynamic_img_size else ""
    if d.module is not None:  # the framework road: the framework's own module
        built = module_name(d.module)
        weights = path / B.WEIGHTS_FILE
        params = (f", params {B.parameter_count(weights):,}"
                  if path.is_dir() and weights.is_file() else "")
        click.echo(f"model: {shown(d.module['framework'])}'s own {shown(built)}, img "
                   f"{c.img_size}, chans {c.in_chans}, classes {c.num_classes}{params}")
        settings = d.module.get("kwargs") or {}
        if settings:
            click.echo("built with: " + ", ".join(shown(f"{k} {v}") for k, v in settings.items()))
    else:
        click.echo(f"model: img {c.img_size}{any_size}, patch {c.patch_size}, chans "
                   f"{c.in_chans}, dim {c.embed_dim}, depth {c.depth}, heads {c.num_heads}, "
                   f"classes {c.num_classes}, params {_params(path, c):,}")
    options = c.family_options() if d.module is None else {}
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
    _hub_lines(d.extra.get("hub"))
    if path.is_dir() and (path / B.PARITY_FILE).is_file():
        _parity_line(path)


def _hub_lines(hub) -> None:
    """info's lines for a model fetched from the Hub: the repo, its commit and the files."""
    if isinstance(hub, dict):
        repo, commit = shown(hub.get("repo")), shown(hub.get("commit"))
        click.echo(f"hub: {repo}, revision {shown(hub.get('revision'))}, commit {commit} "
                   f"(export --model {repo}@{commit})")
        files = hub.get("files")
        for name, sha in (files.items() if isinstance(files, dict) else ()):
            click.echo(f"hub file: {shown(name)} sha256 {shown(sha)}")


def _parity_line(path: Path) -> None:
    """info's verdict line: the bundle's parity.json where it judged the files config.json
    lists now, or why it is not shown."""
    from .. import bundle as B
    from .. import parity

    try:
        report, why = parity.read_proof(B.read_bundle(path, verify=False))
    except BundleError as exc:
        report, why = None, message(exc)
    if report is None:
        click.echo(f"parity at export: none for these files: {shown(why)}")
    else:
        click.echo(f"parity at export: {'PASS' if report.get('passed') else 'FAIL'} "
                   f"on {shown(report.get('provider_used'))}, batches "
                   f"{shown(report.get('batch_sizes'))} (of the files config.json lists; "
                   f"validate checks their bytes)")
