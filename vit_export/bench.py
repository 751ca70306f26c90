"""Timing harness: every backend of a bundle on the same inputs, in one process -> BenchResult.

Each backend is timed after warm-up at each batch size; the result holds latency
percentiles, images/s, peak resident memory while it ran, effective GFLOP/s, the fraction
of this machine's fp32 matmul peak (measured in the same run) and the speedup over eager
PyTorch at the same batch size.
"""
from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Optional

import numpy as np

from . import bundle as B
from . import runtime
from .errors import ConfigError
from .model import random_input


@dataclass
class BenchRow:
    backend: str  # eager, torchscript, onnxruntime, onnxruntime[model.int8.onnx], ...
    batch: int
    runs: int
    p50_ms: float
    p90_ms: float
    p99_ms: float
    images_per_s: float
    gflops: float  # effective: model FLOPs / median latency
    peak_fraction: float  # gflops / measured fp32 matmul peak
    speedup: float  # eager p50 / this p50, same batch size
    peak_rss_mb: float  # resident memory high-water mark while this backend ran


@dataclass
class BenchResult:
    model: str
    threads: int
    provider: str
    matmul_peak_gflops: float  # fp32, measured in this run
    gflop_per_image: float
    batch_sizes: list[int]
    rows: list[BenchRow]
    settings: dict[str, Any] = field(default_factory=dict)  # threads of each runtime, spinning
    versions: dict[str, str] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def model_flops(config) -> float:
    """Forward FLOPs of one image (2 per multiply-add; softmax, norms, GELU not counted)."""
    D, T = config.embed_dim, config.num_patches + config.num_prefix_tokens
    hidden = int(D * config.mlp_ratio)
    patch = config.num_patches * D * config.in_chans * config.patch_size ** 2
    block = T * D * 3 * D + 2 * T * T * D + T * D * D + 2 * T * D * hidden
    head = (config.representation_size or D) * max(config.num_classes, 0)
    if config.representation_size:
        head += D * config.representation_size
    return 2.0 * (patch + config.depth * block + head)


def matmul_peak_gflops(threads: int, n: int = 2048, repeats: int = 5) -> float:
    """Best fp32 GEMM rate of this machine now, by torch.mm on n x n matrices."""
    import torch

    torch.set_num_threads(threads)
    a, b = torch.randn(n, n), torch.randn(n, n)
    torch.mm(a, b)
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        torch.mm(a, b)
        best = min(best, time.perf_counter() - start)
    return 2 * n ** 3 / best / 1e9


class _RssPeak:
    """Highest resident set size seen while the block runs (sampled every 2 ms)."""

    def __enter__(self) -> "_RssPeak":
        self.peak = self._rss()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def _watch(self) -> None:
        while not self._stop.wait(0.002):
            self.peak = max(self.peak, self._rss())

    @staticmethod
    def _rss() -> int:
        try:
            with open("/proc/self/statm") as f:
                return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
        except OSError:  # not Linux: no sampling
            return 0


def time_backend(fn: Callable[[np.ndarray], Any], x: np.ndarray, warmup: int,
                 min_runs: int, min_seconds: float) -> list[float]:
    """Latencies in seconds: warm-up, then at least min_runs and min_seconds of runs."""
    for _ in range(warmup):
        fn(x)
    times: list[float] = []
    start = time.perf_counter()
    while len(times) < min_runs or time.perf_counter() - start < min_seconds:
        t0 = time.perf_counter()
        fn(x)
        times.append(time.perf_counter() - t0)
    return times


def backends(bundle: B.Bundle, provider: str, threads: int,
             include: Optional[Sequence[str]] = None) -> list[tuple[str, Callable]]:
    """(name, factory) for eager, TorchScript and every ONNX model of the bundle; a factory
    builds its runner when called, so that each is loaded only while it is measured."""
    import torch

    torch.set_num_threads(threads)
    found: list[tuple[str, Callable]] = [
        ("eager", lambda: runtime.TorchRunner(B.load_eager(bundle)))]
    if bundle.ts_path.exists():
        found.append(("torchscript", lambda: runtime.load_torchscript(bundle.ts_path)))
    for name in bundle.onnx_models:
        found.append((B.runner_label(name), lambda n=name: runtime.create_session(
            bundle.file(n), provider, threads=threads)))
    if include:
        unknown = sorted(set(include) - {n for n, _ in found})
        if unknown:
            raise ConfigError(f"no backend {unknown[0]!r} in this bundle; it has "
                              f"{', '.join(n for n, _ in found)}")
        found = [(n, r) for n, r in found if n == "eager" or n in include]
    return found


def bench(path: str | os.PathLike, batch_sizes: Sequence[int] = (1, 8, 32), *,
          threads: Optional[int] = None, provider: str = "cpu", warmup: int = 2,
          min_runs: int = 5, min_seconds: float = 2.0, seed: int = 0,
          include: Optional[Sequence[str]] = None) -> BenchResult:
    """Time every backend of the bundle at `path` at each batch size, eager first."""
    threads = threads or os.cpu_count() or 1
    bundle = B.read_bundle(path, verify=False)
    config = bundle.config
    peak = matmul_peak_gflops(threads)
    flops = model_flops(config)
    rows: list[BenchRow] = []
    eager_p50: dict[int, float] = {}
    used = "cpu"
    for name, make in backends(bundle, provider, threads, include):
        with _RssPeak() as rss:
            runner = make()
            used = getattr(runner, "provider", used)
            for batch in batch_sizes:
                x = random_input(config, batch, seed).numpy()
                times = np.asarray(time_backend(runner, x, warmup, min_runs, min_seconds))
                p50 = float(np.percentile(times, 50))
                if name == "eager":
                    eager_p50[batch] = p50
                gflops = flops * batch / p50 / 1e9
                rows.append(BenchRow(
                    name, batch, len(times), p50 * 1e3, float(np.percentile(times, 90)) * 1e3,
                    float(np.percentile(times, 99)) * 1e3, batch / p50, gflops, gflops / peak,
                    eager_p50[batch] / p50, 0.0))
            for row in rows:
                if row.backend == name:
                    row.peak_rss_mb = rss.peak / 2 ** 20
        del runner
    import torch

    settings = {"torch_threads": torch.get_num_threads(), "ort_intra_op_threads": threads,
                "ort_inter_op_threads": 1, "ort_allow_spinning": True,
                "warmup": warmup, "min_runs": min_runs, "min_seconds": min_seconds}
    return BenchResult(str(Path(path)), threads, used, peak, flops / 1e9, list(batch_sizes),
                       rows, settings, B.package_versions())


def plot(result: BenchResult, path: str | os.PathLike) -> None:
    """Throughput against batch size, one line per backend (matplotlib)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for name in dict.fromkeys(r.backend for r in result.rows):
        rows = [r for r in result.rows if r.backend == name]
        ax.plot([r.batch for r in rows], [r.images_per_s for r in rows], marker="o", label=name)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("batch size")
    ax.set_ylabel("images / s")
    ax.set_title(f"{Path(result.model).name}: {result.threads} threads, {result.provider}, "
                 f"fp32 matmul peak {result.matmul_peak_gflops:.0f} GFLOP/s", fontsize=9)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    tmp = Path(path).with_name(f".{Path(path).name}.tmp.png")
    fig.savefig(tmp, dpi=100)
    plt.close(fig)
    os.replace(tmp, path)
