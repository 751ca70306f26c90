"""bench(): every runner of a bundle run once at each batch size (its memory taken), then
warmed up and timed in turns with the others and the GEMM peaks -> BenchResult."""
from __future__ import annotations

import itertools
import logging
import os
import threading
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Optional

import numpy as np

from .. import bundle as B
from .. import cpu, gpu, runtime, timing
from ..errors import first_line
from ..exporting.variants import batch_dependence
from ..model import random_input
from ..parity import compare, labelled_accuracy, profile_tolerance, read_proof, validated_runners
from .choice import recommend
from .options import BenchOptions, bench_options
from .peers import COMPILE_MODE, CUDA_GRAPH_SUFFIX, PEERS, runners_to_time
from .results import (
    CUDA_PRECISION_OF_PROFILE,
    PRECISION_OF_PROFILE,
    BenchResult,
    BenchRow,
    model_flops,
)

log = logging.getLogger(__package__)  # one logger for bench, whichever of its modules logs

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


STREAM_BATCHES = 8  # host batches in one timed stream (placement "stream")


def _inputs(config, batch: int, seed: int, runner: runtime.Runner
            ) -> list[tuple[str, Any, Callable]]:
    """(placement, input, sync) to time with: host numpy always; on CUDA, for a runner that
    stages host input (`submit`), a stream of host batches; and a tensor already on the GPU
    (ONNX Runtime reads it through IO binding, no host copy)."""
    x = random_input(config, batch, seed)
    feeds: list[tuple[str, Any, Callable]] = [("host", x.numpy(), lambda: None)]
    if runner.device == "cuda":
        import torch

        if hasattr(runner, "submit"):
            feeds.append(("stream", x.numpy(), lambda: None))
        feeds.append(("device", x.to("cuda"), torch.cuda.synchronize))
    return feeds


def streamed(runner: runtime.Runner, batches: int = STREAM_BATCHES) -> Callable[[Any], None]:
    """A call that runs `batches` copies of its host batch through `runtime.stream` (each
    copied into the staging buffers as a new batch would be), every output read."""
    def run(x: Any) -> None:
        for _ in runtime.stream(runner, itertools.repeat(x, batches)):
            pass
    return run


def _profiles(bundle: B.Bundle, runners: runtime.RunnerSet) -> dict[str, str]:
    """Each runner's precision profile: what it computes; a peer's, by what it is built on."""
    profiles = {name: runners.computes.get(name) or bundle.onnx_models[file]
                for name, file in runners.onnx_files.items()} | bundle.torch_profiles
    for name in runners.peers:  # by the profile of what they compute
        base = name.removesuffix(CUDA_GRAPH_SUFFIX)
        profiles[name] = PEERS.get(name) or profiles.get(base, "fp32")
    return profiles


@dataclass
class _Timing:
    """What one bench run shares across its runners: the reference outputs and eager's
    medians the others are held to, the rows and notes so far."""
    config: Any
    options: BenchOptions
    flops: float
    validated: Any
    progress: Callable[[str], None]
    rows: list[BenchRow] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    reference: dict[int, np.ndarray] = field(default_factory=dict)
    rss: dict[str, float] = field(default_factory=dict)  # runner -> peak RSS MB, warming up


@dataclass
class _Series(timing.Series):
    """One row to be: a runner at one batch size and input placement, timed in turns with
    every other row (timing.in_turns)."""
    runner: Any = None
    index: int = 0
    batch: int = 1
    io: str = "host"
    each: int = 1  # batches one call runs (a stream runs several)
    prec: str = "fp32"
    agrees: bool = False
    peer: bool = False


def _prepare_batch(t: _Timing, runner, index: int, batch: int, is_peer: bool, profile: str,
                   prec: str) -> list[_Series]:
    """`runner` at `batch`: a peer checked against eager first, then each input kind run
    once (compiled, its memory taken), to be warmed up and timed."""
    o, config = t.options, t.config
    if index == 0:  # eager: the reference for the peers' check
        t.reference[batch] = runner(random_input(config, batch, o.seed).numpy())
    agrees = runner.name in t.validated
    if is_peer:
        t.progress(f"checking {runner.name} against eager at batch {batch}")
        base = runner.name.removesuffix(CUDA_GRAPH_SUFFIX)
        agrees = _agrees(runner, config, batch, o.seed, t.reference[batch], profile) and (
            base == runner.name or base in t.validated)
    found = []
    for io, x, sync in _inputs(config, batch, o.seed, runner):
        t.progress(f"running {runner.name} at batch {batch} ({io} input)")
        each = STREAM_BATCHES if io == "stream" else 1
        fn = streamed(runner, each) if io == "stream" else runner
        fn(x)
        sync()
        found.append(_Series(lambda fn=fn, x=x: fn(x), sync, runner=runner, index=index,
                             batch=batch, io=io, each=each, prec=prec,
                             agrees=agrees, peer=is_peer))
    if agrees and not is_peer and any(shape[0] == batch
                                      for shape in getattr(runner, "rows_split", {})):
        # OpenVINO cut its rows for this shape (runtime.ov_rows), which depends on this
        # machine and thread count: held to eager here too, whatever parity.json says
        t.progress(f"checking {runner.name} against eager at batch {batch} (rows cut)")
        agrees = _agrees(runner, config, batch, o.seed, t.reference[batch], profile)
        for s in found:
            s.agrees = agrees
        if not agrees:
            t.notes.append(f"{runner.name} at batch {batch}: with its rows cut it does not "
                           f"agree with eager by the {profile} profile: not counted as "
                           f"validated")
    return found


def _prepare_runner(t: _Timing, runner, index: int, is_peer: bool, profile: str,
                    prec: str) -> list[_Series]:
    """Every batch size of one runner, run once, with the peak memory it reached; a peer
    that fails is left out with a note."""
    try:
        with _RssPeak() as rss:
            found = [s for batch in t.options.batch_sizes
                     for s in _prepare_batch(t, runner, index, batch, is_peer, profile, prec)]
    except Exception as exc:  # a peer's compiler or capture fails in its own types
        if not is_peer:
            raise
        _leave_out(t, runner, exc)
        return []
    t.rss[runner.name] = rss.peak / 2 ** 20
    return found


def _leave_out(t: _Timing, runner, exc: BaseException) -> None:
    t.notes.append(f"{runner.name} left out: {first_line(exc)}")
    log.info("%s", t.notes[-1])


def _time_in_turns(t: _Timing, series: list[_Series], gemms: dict[str, cpu.Gemm],
                   peaks: dict[str, cpu.Peak]) -> dict[str, cpu.Peak]:
    """Each batch size's series warmed up, then timed in turns (timing.in_turns), then the
    rows. One batch size at a time: its rows are held to each other (eager's at that
    batch), and a runtime that keeps a few input shapes compiled (OpenVINO) does not
    compile again inside a timed call. A peer that fails now is left out with a note, as
    one that failed its first run. The `gemms` take their turns beside the runners at every
    batch size, and each precision's peak is its GEMM's median rate over those turns: a
    row's fraction of the peak is then a ratio of medians taken in the same seconds, so a
    busy spell on a shared machine slows both alike. Returns `peaks` with those."""
    o = t.options
    gone: set[str] = set()
    kernels = {key: _Series(gemm.call) for key, gemm in gemms.items()}

    def failed(s: _Series, exc: BaseException) -> list[_Series]:
        if not s.peer:
            raise exc
        gone.add(s.runner.name)
        _leave_out(t, s.runner, exc)
        return [other for other in series if other.runner is s.runner]

    for batch in o.batch_sizes:
        here = [s for s in series if s.batch == batch and s.runner.name not in gone]
        t.progress(f"warming up {len({s.runner.name for s in here})} runners at batch {batch}")
        for s in [*here, *kernels.values()]:
            try:
                for _ in range(o.warmup):
                    s.call()
                s.sync()
            except Exception as exc:
                failed(s, exc)
        t.progress(f"timing them at batch {batch}, in turns")
        timing.in_turns([*(s for s in here if s.runner.name not in gone), *kernels.values()],
                        o.min_runs, o.min_seconds, max(1, min(timing.TURNS, o.min_runs)),
                        failed)
    series = [s for s in series if s.runner.name not in gone]
    peaks = {**peaks, **cpu.fastest({key: gemms[key].timed(float(np.median(k.times)), "median")
                                     for key, k in kernels.items()})}
    p50 = {(s.index, s.batch, s.io): float(np.percentile(np.asarray(s.times) / s.each, 50))
           for s in series}
    for s in series:
        times = np.asarray(s.times) / s.each
        here = p50[(s.index, s.batch, s.io)]
        # eager has no stream row: a stream is held to eager's host input
        eager_at = p50[(0, s.batch, "host" if s.io == "stream" else s.io)]
        gflops = t.flops * s.batch / here / 1e9
        t.rows.append(BenchRow(
            s.runner.name, s.runner.device, s.io, s.batch, len(times), here * 1e3,
            float(np.percentile(times, 90)) * 1e3, float(np.percentile(times, 99)) * 1e3,
            s.batch / here, gflops, gflops / peaks[s.prec].gflops, eager_at / here,
            t.rss[s.runner.name], s.prec, s.agrees, s.peer))
    return peaks


def bench(path: str | os.PathLike | B.Bundle, batch_sizes: Optional[Sequence[int]] = None,
          options: Optional[BenchOptions] = None, *,
          progress: Optional[Callable[[str], None]] = None, **keywords: Any) -> BenchResult:
    """Time every runner of the bundle at `path` at each batch size, eager first; all of
    them on the device ONNX Runtime really runs on for `provider`; with the "openvino"
    runtime in `runtimes`, OpenVINO's CPU runners too; with `peers` (PEERS),
    PyTorch's own fast paths and ONNX Runtime's CUDA graphs, each checked against eager at
    every batch size before it is timed (a peer that cannot run here is left out with a
    note). fp32 runs with TF32 off. The files that can carry code are timed where `runners`
    names them or with `trust_code` (runtime.open_runners). `options`: a BenchOptions, or
    its fields as keyword arguments."""
    if batch_sizes is not None:
        keywords["batch_sizes"] = batch_sizes
    o = bench_options(options, keywords)
    threads = o.threads or os.cpu_count() or 1
    # every file it times is the one config.json hashes (a Bundle: read so already)
    bundle = path if isinstance(path, B.Bundle) else B.read_bundle(path)
    this_cpu = cpu.isa()
    t = _Timing(bundle.config, o, model_flops(bundle.config), validated_runners(bundle),
                progress or (lambda _: None))
    with runtime.torch_threads(threads), runtime.tf32(False):
        runners, unrunnable = runners_to_time(bundle, o.provider, threads, o.runners,
                                              o.runtimes, o.peers, o.trust_code)
        on_cuda = runners.device == "cuda"
        if on_cuda:
            t.progress("measuring the GEMM peaks of the GPU")
            peaks, gemms, gpu_name = gpu.gemm_peaks(), {}, gpu.name()
        else:  # timed in turns with the runners, made after their memory is measured
            peaks, gemms, gpu_name = {}, {}, ""
        of_profile = CUDA_PRECISION_OF_PROFILE if on_cuda else PRECISION_OF_PROFILE
        profiles = _profiles(bundle, runners)
        t.notes += [f"{p} left out: it needs CUDA, and this run is on {runners.device}"
                    for p in unrunnable]  # peers left out
        t.notes += [note for r in runners.runners if (note := batch_dependence(r.name))]
        series = []
        for index, runner in enumerate(runners.runners):
            profile = profiles.get(runner.name, "fp32")
            prec = of_profile.get(profile, "fp32")
            series += _prepare_runner(t, runner, index, runner.name in runners.peers, profile,
                                      prec)
        if not on_cuda:  # OpenVINO's GEMMs where its runners are timed
            gemms = cpu.gemms(threads, this_cpu, openvino=any(
                r.name.startswith("openvino") for r in runners.runners))
        peaks = _time_in_turns(t, series, gemms, peaks)
        import torch

        settings = {"torch_threads": torch.get_num_threads(), "ort_intra_op_threads": threads,
                    "ort_inter_op_threads": 1, "ort_allow_spinning": True, "tf32": False,
                    "warmup": o.warmup, "min_runs": o.min_runs, "min_seconds": o.min_seconds,
                    "in_turns": max(1, min(timing.TURNS, o.min_runs))}
        if "torch-compile" in o.peers or "torch-compile-amp" in o.peers:
            settings["torch_compile_mode"] = COMPILE_MODE
    return BenchResult(str(bundle.path), threads, runners.device, peaks["fp32"].gflops,
                       t.flops / 1e9, list(o.batch_sizes), t.rows, settings,
                       B.package_versions(), this_cpu.model, this_cpu.summary,
                       {k: asdict(v) for k, v in peaks.items()}, recommend(t.rows),
                       gpu_name, t.notes, dict(bundle.hashes),
                       _accuracy(bundle, {r.backend for r in t.rows}))


def _accuracy(bundle: B.Bundle, backends: set[str]) -> dict[str, dict[str, Any]]:
    """What the bundle's parity.json measured on labelled images, for the backends timed."""
    measured = labelled_accuracy(read_proof(bundle)[0])
    return {name: found for name, found in measured.items() if name in backends}


def _agrees(runner: runtime.Runner, config, batch: int, seed: int, reference: np.ndarray,
            profile: str, calls: int = 3) -> bool:
    """The peer's output on the seeded input against eager's, by the profile of what it
    computes (parity.compare: max abs, max rel, cosine, top-1). The last of `calls` calls is
    judged: the first ones of a CUDA graph or a compiled module run before the capture
    that is then timed."""

    x = random_input(config, batch, seed).numpy()
    for _ in range(calls):
        out = runner(x)
    return bool(compare(reference, out, profile_tolerance(profile),
                        config.output_names[0])["passed"])
