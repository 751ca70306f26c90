"""Which of torch's ONNX exporters should be the default? Export time, parity, ORT speed.

    python benchmarks/exporters.py [--preset vit_base_patch16_224] [--batches 1,8]

Exports the same randomly initialised model with both exporters and prints, per exporter,
the export time, the max abs error against eager, and ONNX Runtime CPU latency per batch size
with the ratio to eager PyTorch measured in the same run.
"""
import argparse
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from vit_export import bundle as B
from vit_export import runtime, timing
from vit_export.exporting import ExportOptions, export_bundle
from vit_export.model import create_model, random_input


def median_seconds(fn, x, repeats):
    return float(np.median(timing.seconds(lambda: fn(x), min_runs=repeats)))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--preset", default="vit_base_patch16_224")
    parser.add_argument("--batches", default="1,8")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    batches = [int(b) for b in args.batches.split(",")]
    torch.manual_seed(0)
    model = create_model(args.preset).eval()
    eager = runtime.TorchRunner(model, "eager")
    inputs = {b: random_input(model.config, b, 0).numpy() for b in batches}
    eager_s = {b: median_seconds(eager, inputs[b], args.repeats) for b in batches}
    print(f"{'exporter':<12} {'export s':>8} {'max abs':>9} " +
          " ".join(f"{'b' + str(b) + ' ms':>9} {'vs eager':>8}" for b in batches))
    print(f"{'eager':<12} {'':>8} {'':>9} " +
          " ".join(f"{eager_s[b] * 1e3:>9.1f} {'1.00x':>8}" for b in batches))
    with tempfile.TemporaryDirectory() as tmp:
        for exporter in ("dynamo", "torchscript"):
            description = B.Description(model.config, B.Preprocessing.default_for(model.config))
            start = time.perf_counter()
            out = Path(tmp) / exporter
            export_bundle(model, out, description, ExportOptions(exporter=exporter))  # validation included
            export_s = time.perf_counter() - start
            session = runtime.ort_runner(out / B.ONNX_FILE, "cpu")
            errors = [np.abs(session(inputs[b]) - eager(inputs[b])).max() for b in batches]
            row = []
            for b in batches:
                s = median_seconds(session, inputs[b], args.repeats)
                row.append(f"{s * 1e3:>9.1f} {eager_s[b] / s:>7.2f}x")
            print(f"{exporter:<12} {export_s:>8.1f} {max(errors):>9.2e} " + " ".join(row))


if __name__ == "__main__":
    main()
