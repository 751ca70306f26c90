"""Our fp32 graphs against optimum-onnx's export of the same Hugging Face model, side by side
on ONNX Runtime CPU.

    python benchmarks/optimum_peer.py --optimum-python /path/to/venv/bin/python
                                      [--batches 1,8] [--threads 2] [--rounds 5]

A transformers ViT-B/16 (ViTForImageClassification, random weights, saved once) is exported
by `vit-export export --checkpoint DIR --optimize` (model.onnx, model.opt.onnx) and by
optimum-onnx (`python -m optimum.exporters.onnx --model DIR`, run with `--optimum-python`: a
venv where optimum-onnx and the transformers it supports are installed). Every graph is
timed in one process, interleaved round by round, with the same input; the table gives each
one's milliseconds per batch (median over rounds) and its speed relative to optimum's
model.onnx measured in the same run.
"""
import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import onnxruntime as ort

from vit_export import cpu, timing


def session(path: Path, threads: int) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.log_severity_level = 3
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def make_checkpoint(folder: Path, small: bool) -> None:
    import torch
    from transformers import ViTConfig, ViTForImageClassification

    torch.manual_seed(0)
    sizes = dict(hidden_size=192, num_hidden_layers=2, num_attention_heads=3,
                 intermediate_size=768) if small else {}
    ViTForImageClassification(ViTConfig(num_labels=1000, **sizes)).eval().save_pretrained(folder)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--optimum-python", required=True,
                        help="a Python with optimum-onnx and a transformers it supports")
    parser.add_argument("--batches", default="1,8")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--small", action="store_true", help="a two-block ViT of width 192: "
                        "a check that the script runs, not a measurement")
    args = parser.parse_args()
    batches = [int(b) for b in args.batches.split(",")]
    print(f"CPU: {cpu.isa().summary}; {args.threads} threads; "
          f"{'a two-block ViT' if args.small else 'ViT-B/16'}, 224 px, fp32")
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        make_checkpoint(tmp / "hf", args.small)
        subprocess.run([sys.executable, "-c", "from vit_export.cli import main; main()", "export", str(tmp / "ours"),
                        "--checkpoint", str(tmp / "hf"), "--optimize"], check=True,
                       stdout=subprocess.DEVNULL)
        subprocess.run([args.optimum_python, "-m", "optimum.exporters.onnx", "--model",
                        str(tmp / "hf"), "--task", "image-classification", str(tmp / "optimum")],
                       check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        graphs = {"optimum model.onnx": tmp / "optimum" / "model.onnx",
                  "vit-export model.onnx": tmp / "ours" / "model.onnx",
                  "vit-export model.opt.onnx": tmp / "ours" / "model.opt.onnx"}
        sessions = {name: session(path, args.threads) for name, path in graphs.items()}
        rng = np.random.default_rng(0)
        inputs = {b: rng.standard_normal((b, 3, 224, 224), dtype=np.float32) for b in batches}
        times = {(name, b): [] for name in sessions for b in batches}
        for _ in range(args.rounds):
            for b in batches:
                for name, s in sessions.items():
                    feed = {s.get_inputs()[0].name: inputs[b]}
                    run = (lambda s=s, feed=feed: s.run(None, feed))
                    times[name, b].append(float(np.median(timing.seconds(run, min_runs=3))))
    base = "optimum model.onnx"
    print(f"{'graph':<28} " + " ".join(f"{'b' + str(b) + ' ms':>9} {'vs optimum':>10}"
                                       for b in batches))
    for name in sessions:
        row = []
        for b in batches:
            ms = float(np.median(times[name, b])) * 1e3
            row.append(f"{ms:>9.1f} {np.median(times[base, b]) * 1e3 / ms:>9.2f}x")
        print(f"{name:<28} " + " ".join(row))


if __name__ == "__main__":
    main()
