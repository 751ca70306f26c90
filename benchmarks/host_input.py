"""Host input against input already on the device, for one ONNX model of a bundle, in one run.

    python benchmarks/host_input.py BUNDLE [--file model.opt.fp16.onnx] [--provider cpu|cuda]
        [--batch-sizes 1,64] [--batches 16] [--min-seconds 1]

Where users' images are (host memory) against where the fastest figures are taken (GPU
memory), each as images/s at each batch size, with its ratio to device input (the
goal: 0.85x or more). The rows:
  device      a torch tensor already on the GPU, read through IO binding (CUDA only)
  host-ort    numpy through ONNX Runtime's own run: pageable copies in, outputs allocated
              and copied out (a plain `session.run`)
  host        numpy through the runner's staging buffers, one batch at a time (what
              serve and a Ray Data actor do with each batch)
  stream      --batches different numpy batches through `runtime.stream`: the next batch's
              copy overlapped with the current run (what infer does)
  e2e-stream  where the bundle has model.e2e.onnx: the same stream of uint8 images of the
              model's size, preprocessed in the graph (a quarter of fp32's bytes to copy);
              its ratio is to model.onnx's device input, the model inside it
Every row's outputs are compared with ONNX Runtime's own run first.
"""
from __future__ import annotations

import argparse
import sys
from collections import deque
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from vit_export import bundle as B
from vit_export import runtime
from vit_export.errors import VitExportError
from vit_export.timing import seconds


def rate(fn, images: int, args, sync=lambda: None) -> float:
    """images/s of `fn`, which handles `images` images a call, by its median call."""
    times = seconds(fn, warmup=2, min_runs=5, min_seconds=args.min_seconds, sync=sync)
    return images / float(np.median(times))


def measure(runner, e2e, inner, config, batch: int, args) -> dict[str, float]:
    """images/s of each row at one batch size, outputs checked first."""
    cuda = runner.device == "cuda"
    rng = np.random.default_rng(batch)
    shape = (batch, config.in_chans, config.img_size, config.img_size)
    xs = [rng.standard_normal(shape).astype(np.float32) for _ in range(args.batches)]
    own = runner.run_unstaged(runner.cast_input(xs[0]))
    for name, got in [("host", runner.run_all(xs[0])),
                      ("stream", next(runtime.stream(runner, xs[:1])))]:
        assert all(np.array_equal(got[k], own[k]) for k in own), f"{name} differs"
    rates: dict[str, float] = {}
    sync = lambda: None
    if cuda:
        import torch

        on_device, sync = torch.from_numpy(xs[0]).cuda(), torch.cuda.synchronize
        rates["device"] = rate(lambda: runner(on_device), batch, args, sync)
    rates["host-ort"] = rate(lambda: runner.run_unstaged(runner.cast_input(xs[0])), batch, args)
    rates["host"] = rate(lambda: runner.run_all(xs[0]), batch, args)
    rates["stream"] = rate(lambda: deque(runtime.stream(runner, xs), maxlen=0),
                           batch * len(xs), args)
    if e2e is not None:
        images = [rng.integers(0, 256, (batch, config.img_size, config.img_size,
                                        config.in_chans), dtype=np.uint8)
                  for _ in range(args.batches)]
        want = e2e.run_unstaged(images[0])
        got = next(runtime.stream(e2e, images[:1]))
        assert all(np.array_equal(got[k], want[k]) for k in want), "e2e-stream differs"
        rates["e2e-stream"] = rate(lambda: deque(runtime.stream(e2e, images), maxlen=0),
                                   batch * len(images), args)
        if cuda:
            rates["e2e-inner-device"] = rate(lambda: inner(on_device), batch, args, sync)
    return rates


def positive(text: str) -> int:
    if not (text.isascii() and text.isdigit()) or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number >= 1")
    return int(text)


def batch_sizes(text: str) -> list[int]:
    return [positive(part) for part in text.split(",")]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("bundle", type=Path)
    parser.add_argument("--file", default=B.ONNX_FILE, help="the ONNX model of the bundle "
                        "that takes pixel values (model.e2e.onnx is timed beside it)")
    parser.add_argument("--provider", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--batch-sizes", type=batch_sizes, default=[1, 64])
    parser.add_argument("--batches", type=positive, default=16, help="batches in one stream")
    parser.add_argument("--min-seconds", type=float, default=1.0)
    args = parser.parse_args()
    if args.file == B.E2E_FILE:
        parser.error(f"--file {B.E2E_FILE}: it takes images, and is timed beside the model "
                     f"--file names")
    try:
        return run(args)
    except VitExportError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1


def run(args) -> int:
    bundle = B.read_bundle(args.bundle)
    runner = runtime.open_runner(bundle, bundle.runner_name(args.file), args.provider)
    config = bundle.config
    e2e = (runtime.ort_runner(bundle.file(bundle.e2e_model), args.provider, name="e2e")
           if bundle.e2e_model else None)
    inner = runtime.open_runner(bundle, "onnxruntime", args.provider) if e2e else None
    print(f"{bundle.path.name}/{args.file} on ONNX Runtime ({runner.device}); images/s, and "
          f"the ratio to device input")
    if runner.device != "cuda":
        print(f"  device input: CUDA only (this run is on {runner.device})")
    for batch in args.batch_sizes:
        rates = measure(runner, e2e, inner, config, batch, args)
        line = []
        for name, value in rates.items():
            if name == "e2e-inner-device":
                continue
            base = rates.get("e2e-inner-device" if name.startswith("e2e") else "device")
            line.append(f"{name} {value:9.1f}" + (f" ({value / base:.2f}x)" if base else ""))
        print(f"  batch {batch:3d}: " + "  ".join(line))
    return 0


if __name__ == "__main__":
    sys.exit(main())
