"""Where does an ONNX model's time go in ONNX Runtime? Op types by time, GEMMs against peak.

    python benchmarks/ort_profile.py BUNDLE/model.int8-static.onnx [--batch 8] [--threads N]
    python benchmarks/ort_profile.py BUNDLE/model.fp16.onnx --provider cuda [--batch 64]

Runs the model with ONNX Runtime's profiler (after warm-up), sums the kernel time of each op
type over the profiled runs, and for GEMM-like ops (MatMul, Gemm, MatMulInteger,
MatMulIntegerToFloat, DynamicQuantizeMatMul, QLinearMatMul, FusedMatMul) counts their FLOPs
from the shapes the profiler recorded, so each GEMM op type's rate can be read against the
GEMM peak of its precision, measured in the same run (vit_export.cpu).

On CUDA ONNX Runtime's node times are host-side launch times, not GPU time, so there the
GPU's own record is read instead: PyTorch's profiler (CUPTI) sees every kernel launched in
the process, ONNX Runtime's too. It prints the kernels by GPU time (input already on the GPU,
through IO binding) and where ONNX Runtime placed each op type (runtime.node_placement).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from vit_export import cpu

GEMMS = {"MatMul": "fp32", "Gemm": "fp32", "FusedMatMul": "fp32", "MatMulInteger": "int8",
         "MatMulIntegerToFloat": "int8", "DynamicQuantizeMatMul": "int8",
         "QLinearMatMul": "int8", "QGemm": "int8"}


def gemm_flops(inputs: list[dict], outputs: list[dict]) -> float:
    """2 * (batch * M * K) * N from the profiler's shapes: A is the first input, N the last
    dim of the output (a prepacked weight is not listed among the inputs)."""
    a = next(iter(inputs[0].values())) if inputs else []
    y = next(iter(outputs[0].values())) if outputs else []
    if len(a) < 2 or not y:
        return 0.0
    return 2.0 * float(np.prod(a)) * y[-1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", type=Path)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--provider", choices=["cpu", "cuda"], default="cpu")
    args = parser.parse_args()
    if args.provider == "cuda":
        return cuda_main(args)

    import onnxruntime as ort
    import torch

    torch.set_num_threads(args.threads)
    peaks = cpu.gemm_peaks(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        options = ort.SessionOptions()
        options.intra_op_num_threads = args.threads
        options.inter_op_num_threads = 1
        options.log_severity_level = 3
        session = ort.InferenceSession(str(args.model), options,
                                       providers=["CPUExecutionProvider"])
        meta = session.get_inputs()[0]
        x = np.random.default_rng(0).standard_normal(
            [args.batch, *meta.shape[1:]]).astype(np.float32)
        session.run(None, {meta.name: x})  # warm-up, unprofiled
        options.enable_profiling = True
        options.profile_file_prefix = str(Path(tmp) / "p")
        session = ort.InferenceSession(str(args.model), options,
                                       providers=["CPUExecutionProvider"])
        session.run(None, {meta.name: x})  # warm-up of this session
        for _ in range(args.runs):
            session.run(None, {meta.name: x})
        events = json.loads(Path(session.end_profiling()).read_text())
    runs = [e for e in events if e.get("name") == "model_run"]
    per_run = [e["dur"] for e in runs][-args.runs:]
    time_by_op: dict[str, float] = {}
    flops_by_op: dict[str, float] = {}
    for e in events:
        a = e.get("args") or {}
        if e.get("cat") != "Node" or "op_name" not in a or not e["name"].endswith("_kernel_time"):
            continue
        op = a["op_name"]
        time_by_op[op] = time_by_op.get(op, 0.0) + e["dur"]
        if op in GEMMS:
            flops_by_op[op] = flops_by_op.get(op, 0.0) + gemm_flops(
                a.get("input_type_shape", []), a.get("output_type_shape", []))
    total = sum(time_by_op.values())
    runs_seen = len(runs)  # the warm-up run of the profiled session is in the profile too
    print(f"{args.model.name}, batch {args.batch}, {args.threads} threads; "
          f"model_run median {np.median(per_run) / 1e3:.1f} ms; "
          f"peaks: " + ", ".join(f"{p.precision} {p.gflops:.0f}" for p in peaks.values()))
    print(f"{'op type':<24} {'ms/run':>8} {'share':>6} {'GFLOP/s':>8} {'of peak':>8}")
    for op, us in sorted(time_by_op.items(), key=lambda kv: -kv[1]):
        line = f"{op:<24} {us / runs_seen / 1e3:>8.1f} {us / total:>6.1%}"
        if op in flops_by_op and us > 0:
            rate = flops_by_op[op] / (us / 1e6) / 1e9
            line += f" {rate:>8.1f} {rate / peaks[GEMMS[op]].gflops:>7.2f} ({GEMMS[op]})"
        print(line)


def cuda_main(args) -> None:
    """Kernels by GPU time over `args.runs` runs on CUDA, and ONNX Runtime's placement."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    from vit_export import gpu, runtime

    runner = runtime.ort_runner(args.model, "cuda")
    meta = runner.input
    if not all(isinstance(d, int) for d in meta.shape[1:]):
        sys.exit(f"{args.model.name} takes any image size ({meta.shape}): profile a "
                 f"fixed-size export")
    x = torch.randn([args.batch, *meta.shape[1:]], generator=torch.Generator().manual_seed(0))
    x = x.to("cuda")
    for _ in range(3):  # warm-up: cuDNN / cuBLAS choices, allocations
        runner(x)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(args.runs):
            runner(x)
        torch.cuda.synchronize()
    kernels: dict[str, list[float]] = {}
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            kernels.setdefault(event.name, []).append(event.device_time)  # us
    total = sum(sum(t) for t in kernels.values())
    peaks = gpu.gemm_peaks()
    print(f"{args.model.name}, batch {args.batch}, CUDA ({gpu.name()}); GPU time per run "
          f"{total / args.runs / 1e3:.3f} ms in {sum(map(len, kernels.values())) // args.runs} "
          f"kernels; peaks: " + ", ".join(f"{p.precision} {p.gflops / 1e3:.0f} TFLOP/s"
                                          for p in peaks.values()))
    print(f"{'ms/run':>8} {'share':>6} {'calls':>5}  kernel")
    for name, times in sorted(kernels.items(), key=lambda kv: -sum(kv[1]))[:25]:
        print(f"{sum(times) / args.runs / 1e3:>8.3f} {sum(times) / total:>6.1%} "
              f"{len(times) // args.runs:>5}  {name[:110]}")
    placement = runtime.node_placement(args.model, "cuda", x[:1].cpu().numpy())
    print("placement (op type: provider -> nodes): " + "; ".join(
        f"{op}: " + ", ".join(f"{p.replace('ExecutionProvider', '')} {n}" for p, n in by.items())
        for op, by in placement.items()))


if __name__ == "__main__":
    main()
