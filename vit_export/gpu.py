"""The CUDA device bench runs on: its name, and the GEMM peaks its rows are held to.

The counterpart of cpu.py for a run on CUDA: the peaks are measured in the same process, now,
by torch.mm on large matrices (fp32 with TF32 off, as every fp32 row runs; fp16 for the fp16
rows), timed with CUDA events after a warm-up.
"""
from __future__ import annotations

from .cpu import Peak
from .runtime import tf32


def name() -> str:
    """"NVIDIA H100 80GB HBM3; CUDA 13.0; driver 580.159.04" (driver when nvidia-smi or NVML
    says it)."""
    import torch

    text = f"{torch.cuda.get_device_name()}; CUDA {torch.version.cuda}"
    driver = _driver()
    return f"{text}; driver {driver}" if driver else text


def _driver() -> str:
    try:
        import pynvml  # nvidia-ml-py, where installed

        pynvml.nvmlInit()
        version = pynvml.nvmlSystemGetDriverVersion()
        return version.decode() if isinstance(version, bytes) else str(version)
    except Exception:  # not installed, or no NVML: the name is enough
        return ""


def _peak(dtype_name: str, n: int, repeats: int) -> Peak:
    import torch

    dtype = getattr(torch, dtype_name)
    a = torch.randn(n, n, device="cuda", dtype=dtype)
    b = torch.randn(n, n, device="cuda", dtype=dtype)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    best = float("inf")
    with tf32(False):
        torch.mm(a, b)
        for _ in range(repeats):
            start.record()
            torch.mm(a, b)
            end.record()
            end.synchronize()
            best = min(best, start.elapsed_time(end) / 1e3)
    precision = {"float32": "fp32", "float16": "fp16"}[dtype_name]
    note = "TF32 off" if precision == "fp32" else ""
    return Peak(precision, 2 * n ** 3 / best / 1e9, f"torch.mm {precision} {n}x{n} (CUDA)",
                True, note)


def gemm_peaks(n: int = 8192, repeats: int = 5) -> dict[str, Peak]:
    """fp32 (TF32 off) and fp16 GEMM peaks of the current CUDA device, measured now."""
    return {"fp32": _peak("float32", n, repeats), "fp16": _peak("float16", n, repeats)}
