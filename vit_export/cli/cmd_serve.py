"""`triton` and `serve`: a bundle as a Triton model repository, or served over HTTP by
Ray Serve."""
from __future__ import annotations

import signal
import sys
from pathlib import Path

import click

from ..deploy import BATCH_WAIT_MS_RANGE, INT32_MAX, PORT_RANGE
from ..deploy.triton import DEFAULT_QUEUE_DELAY_US as TRITON_QUEUE_DELAY_US
from ..deploy.triton import DEVICES as TRITON_DEVICES
from ..errors import (
    ConfigError,
)
from ..options import (
    BATCH_SIZES,
    Number,
    force_option,
    max_batch_size_option,
    provider_option,
    runtime_option,
    threads_option,
    trust_code_option,
)
from .app import UINT64_MAX, cli, examples, message, note, signal_number
from .cmd_infer import check_runtime


@cli.command("triton", epilog=examples(
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
    from ..deploy import triton


    try:
        options = triton.TritonOptions(
            device=provider, max_batch_size=max_batch_size,
            preferred_batch_sizes=tuple(preferred_batch_sizes or ()),
            max_queue_delay_us=max_queue_delay_us, instances=instances, tf32=tf32,
            tensorrt=tensorrt, name=name, torchscript=torchscript or trust_code)
    except ConfigError as exc:  # an option, or a combination of them, that does not fit
        raise click.UsageError(message(exc)) from None
    written = triton.write_repository(bundle, repo, options, force=force)
    count = len(written.models)
    click.echo(f"wrote {repo}: {count} model{'' if count == 1 else 's'} "
               f"({', '.join(m.name for m in written.models)}), {options.kind}, max batch "
               f"{options.max_batch_size}{', labels' if written.labels else ''}")
    for text in written.notes:
        click.echo(note(text))
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


@cli.command("serve", epilog=examples(
    "vit-export serve out/digits",
    "vit-export serve out/digits --replicas 2 --max-batch-size 16 --batch-wait-ms 5",
    "curl --data-binary @models/digits/samples/true_2_006.png \\",
    "    'http://127.0.0.1:8000/predict?top_k=3'"))
@click.argument("bundle", type=click.Path(path_type=Path))
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Address to listen on; 0.0.0.0 exposes the server to the network.")
@click.option("--port", default=8000, show_default=True, type=click.IntRange(*PORT_RANGE),
              help="TCP port to listen on.")
@click.option("--replicas", default=1, show_default=True, type=click.IntRange(min=1),
              help="Replicas, each a runner of its own.")
@click.option("--autoscale", type=_Autoscale(), help="MIN,MAX replicas, scaled by Ray Serve "
              "on the requests in flight, instead of --replicas.")
@max_batch_size_option("Largest batch a replica forms from waiting requests, the most "
                       "inputs one /v2 infer request may hold (413 above), and which of "
                       "performance.json's batch sizes --runtime auto reads.")
@click.option("--batch-wait-ms", default=5.0, show_default=True,
              type=Number(*BATCH_WAIT_MS_RANGE),
              help="How long a request may wait for a batch.")
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
def serve_command(bundle: Path, runtime, **options) -> None:
    """Serve BUNDLE over HTTP on Ray Serve: POST an image to /predict (or to /embed, for a
    bundle that gives an embedding), GET /healthz. The same replicas speak the Open Inference
    Protocol (KServe v2 REST) under /v2, as Triton's and KServe's clients ask: GET
    /v2/health/ready, GET /v2/models/NAME, POST /v2/models/NAME/infer with a tensor or
    encoded images.

    Runs until Ctrl-C or SIGTERM, then drains (new requests 503; those taken finish, for up
    to 15 s) and shuts Ray Serve down.
    """
    from .. import api

    check_runtime(bundle, runtime)

    def started(url: str, count: int, serving) -> None:
        o, chosen = serving.options, f" ({serving.chosen_by})" if serving.chosen_by else ""
        click.echo(f"serving {bundle} on {url} (POST {serving.route}, GET /healthz) with "
                   f"{o.runtime}{chosen}: {count} replica(s), max batch {o.max_batch_size}, "
                   f"wait {o.batch_wait_ms:g} ms; Ctrl-C stops", err=True)

    try:
        api.serve(bundle, runtime=runtime, started=started,
                  notes=lambda text: click.echo(note(text), err=True), **options)
    except BaseException as exc:
        signum = signal_number(exc)
        if signum is None:
            raise
        click.echo(f"stopped by {signal.Signals(signum).name}; Ray Serve shut down", err=True)
        sys.exit(128 + signum)  # as every command stopped by a signal (130, 143)
