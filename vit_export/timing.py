"""The one timing loop: bench's runners, the GEMM peaks and the benchmarks all time with it."""
from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Optional


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


TURNS = 5  # rounds each series of `in_turns` is timed in


@dataclass
class Series:
    """Calls of one function to be timed beside others (`in_turns`): `sync` as `seconds`
    takes it; `times` fills with each call's seconds."""
    call: Callable[[], object]
    sync: Callable[[], object] = lambda: None
    times: list[float] = field(default_factory=list)


def in_turns(series: Sequence[Series], min_runs: int = 1, min_seconds: float = 0.0,
             turns: int = TURNS,
             failed: Optional[Callable[[Series, BaseException], Iterable[Series]]] = None
             ) -> None:
    """Time every series in turns: each round, each series runs for min_seconds / turns
    (one call at least), the order shifted by one each round, until each has min_runs
    calls and min_seconds in all. A shared machine speeds up and slows down for seconds at
    a time (another tenant on the same cores); one series timed after another would take
    its share of that into its figures, while series in turns share it. `failed(s, exc)`
    hears of a call that raised and gives the series to leave out from then on (s and any
    that go with it); without it the exception propagates. Warm-up is the caller's."""
    live = list(series)
    slice_ = min_seconds / max(turns, 1)
    spent = {id(s): 0.0 for s in live}

    def done(s: Series) -> bool:
        return len(s.times) >= min_runs and spent[id(s)] >= min_seconds

    rounds, dropped = 0, set()
    while live and (rounds < turns or not all(done(s) for s in live)):
        shift = rounds % len(live)
        for s in live[shift:] + live[:shift]:
            if id(s) in dropped or (rounds >= turns and done(s)):
                continue
            start = time.perf_counter()
            try:
                while True:
                    t0 = time.perf_counter()
                    s.call()
                    s.sync()
                    s.times.append(time.perf_counter() - t0)
                    if time.perf_counter() - start >= slice_:
                        break
            except Exception as exc:
                if failed is None:
                    raise
                dropped |= {id(d) for d in failed(s, exc)} | {id(s)}
            spent[id(s)] += time.perf_counter() - start
        live = [s for s in live if id(s) not in dropped]
        rounds += 1
