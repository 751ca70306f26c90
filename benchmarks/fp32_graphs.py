"""Which fp32 ONNX graph does ONNX Runtime run fastest on this CPU? The same model's graph as
the dynamo exporter writes it, with GELU reordered as `export` now writes it (the order
ONNX Runtime's fusions recognise), and as the TorchScript exporter writes it; then each one
through the transformer optimizer (`--optimize`).

    python benchmarks/fp32_graphs.py [--preset vit_base_patch16_224] [--batches 1,8]
                                     [--threads 2] [--rounds 5]

Prints, per graph, ONNX Runtime CPU milliseconds per batch (the median of `--rounds` rounds,
each the median of a few runs) and the speed against the dynamo graph as exported, measured
in the same run, interleaved round by round so that a busy moment hits every graph alike.
Random weights: speed does not depend on them.
"""
import argparse
import tempfile
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import torch

from vit_export import cpu, fusion, timing, variants
from vit_export.model import create_model, random_input


def export(model, path: Path, dynamo: bool) -> None:
    x = random_input(model.config, 2, 0)
    torch.onnx.export(model, (x,), str(path), dynamo=dynamo, opset_version=18,
                      input_names=["pixel_values"], output_names=["logits"], verbose=False,
                      **({} if dynamo else {"dynamic_axes": {"pixel_values": {0: "batch"}}}),
                      **({"dynamic_shapes": {"x": {0: torch.export.Dim("batch")}}}
                         if dynamo else {}))


def session(path: Path, threads: int) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.log_severity_level = 3
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--preset", default="vit_base_patch16_224")
    parser.add_argument("--batches", default="1,8")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    batches = [int(b) for b in args.batches.split(",")]
    torch.manual_seed(0)
    model = create_model(args.preset).eval()
    config = model.config
    print(f"CPU: {cpu.isa().summary}; {args.threads} threads; {args.preset}")
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        graphs = {}
        export(model, tmp / "dynamo.onnx", dynamo=True)
        proto = onnx.load(str(tmp / "dynamo.onnx"))
        graphs["dynamo, as exported"] = tmp / "dynamo.onnx"
        fusion.gelu_for_fusion(proto)
        onnx.save(proto, str(tmp / "reordered.onnx"))
        graphs["dynamo, GELU reordered"] = tmp / "reordered.onnx"
        export(model, tmp / "torchscript.onnx", dynamo=False)
        graphs["torchscript"] = tmp / "torchscript.onnx"
        for name in list(graphs):
            optimized = variants.to_optimized(graphs[name], config)
            graphs[name + ", optimized"] = tmp / f"{len(graphs)}.onnx"
            onnx.save(optimized, str(graphs[name + ", optimized"]))
        sessions = {name: session(path, args.threads) for name, path in graphs.items()}
        inputs = {b: random_input(config, b, 1).numpy() for b in batches}
        times = {(name, b): [] for name in sessions for b in batches}
        for _ in range(args.rounds):
            for b in batches:
                for name, s in sessions.items():
                    run = (lambda s=s, b=b: s.run(None, {"pixel_values": inputs[b]}))
                    times[name, b].append(float(np.median(timing.seconds(run, min_runs=3))))
    base = "dynamo, as exported"
    print(f"{'graph':<36} " +
          " ".join(f"{'b' + str(b) + ' ms':>9} {'vs base':>8}" for b in batches))
    for name in sessions:
        row = []
        for b in batches:
            ms = float(np.median(times[name, b])) * 1e3
            row.append(f"{ms:>9.1f} {np.median(times[base, b]) * 1e3 / ms:>7.2f}x")
        print(f"{name:<36} " + " ".join(row))


if __name__ == "__main__":
    main()
