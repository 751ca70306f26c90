"""The one timing loop: bench's runners, the GEMM peaks and the benchmarks all time with it."""
from __future__ import annotations

import time
from collections.abc import Callable


def seconds(fn: Callable[[], object], warmup: int = 1, min_runs: int = 1,
            min_seconds: float = 0.0, sync: Callable[[], object] = lambda: None) -> list[float]:
    """Wall-clock seconds of each call of `fn` after `warmup` untimed ones: at least
    `min_runs` calls and at least `min_seconds` in all. `sync` waits for the device to
    finish (torch.cuda.synchronize on CUDA), so a call's time is its work and not only its
    launch."""
    for _ in range(warmup):
        fn()
    sync()
    times: list[float] = []
    start = time.perf_counter()
    while len(times) < min_runs or time.perf_counter() - start < min_seconds:
        t0 = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t0)
    return times
