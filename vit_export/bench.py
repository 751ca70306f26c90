"""Timing harness: every backend of a bundle on the same inputs, in one process -> BenchResult.

Each backend runs once at each batch size (its peak resident memory taken then); then, one
batch size at a time, every backend is warmed up and all are timed in turns
(timing.in_turns), so that a shared machine's slow seconds fall on all of them alike. The
result holds latency percentiles, images/s, that peak resident memory, effective GFLOP/s,
the fraction of the GEMM peak of the backend's own precision (fp32, bf16, int8: on a CPU
each timed in turns with the runners, on CUDA measured first) and the speedup over eager
PyTorch at the same batch size. `recommend` then names the
fastest validated backend at each batch size, from those figures; `against_peer` sets that
backend beside one peer's figures (scripts/peers_summary.py prints it).
"""
from __future__ import annotations

import dataclasses
import itertools
import logging
import os
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Optional

import numpy as np

from . import bundle as B
from . import cpu, gpu, runtime, timing
from .checkpoints import timm_model
from .errors import BundleError, ConfigError, ProviderError, first_line, option
from .model import random_input
from .parity import compare, labelled_accuracy, profile_tolerance, read_proof, validated_runners
from .variants import batch_dependence

log = logging.getLogger(__name__)

# A model's tolerance profile -> the precision its GEMMs run in, whose peak it is held to.
# CPUs have no fp16 GEMM that ONNX Runtime uses: fp16 rows are held to the fp32 peak there;
# on CUDA to the fp16 peak (int8 has no CUDA peak measured: held to fp16's).
PRECISION_OF_PROFILE = {"fp32": "fp32", "tf32": "fp32", "fp16": "fp32", "int8": "int8",
                        "int8-static": "int8", "bf16": "bf16"}
CUDA_PRECISION_OF_PROFILE = {"fp32": "fp32", "tf32": "fp32", "fp16": "fp16", "int8": "fp16",
                             "int8-static": "fp16"}


@dataclass
class BenchRow:
    backend: str  # eager, torchscript, onnxruntime, onnxruntime[model.int8.onnx], ...
    device: str  # where it ran: cpu | cuda
    io: str  # host: numpy in and out, a batch at a time; stream (CUDA, runners that stage
    # host input): STREAM_BATCHES host batches through runtime.stream, the next one's copy
    # overlapping the current run, per batch; device: a tensor already on the device
    batch: int
    runs: int
    p50_ms: float
    p90_ms: float
    p99_ms: float
    images_per_s: float
    gflops: float  # effective: model FLOPs / median latency
    peak_fraction: float  # gflops / measured GEMM peak of this row's precision
    speedup: float  # eager p50 / this p50, same batch size and input placement
    peak_rss_mb: float  # resident memory high-water mark while it first ran
    precision: str = "fp32"  # whose GEMM peak peak_fraction is against: fp32 | bf16 | int8
    # (CPU), fp32 | fp16 (CUDA)
    validated: bool = False  # its parity at export passed (eager, the reference, always);
    # for a peer (`bench --peers`): its output matched eager's at this batch in this run
    peer: bool = False  # not a file of the bundle: timed for comparison, never recommended


@dataclass
class BenchResult:
    model: str
    threads: int
    device: str  # where every backend ran: the device ONNX Runtime really got
    matmul_peak_gflops: float  # fp32, measured in this run
    gflop_per_image: float
    batch_sizes: list[int]
    rows: list[BenchRow]
    settings: dict[str, Any] = field(default_factory=dict)  # threads of each runtime, spinning
    versions: dict[str, str] = field(default_factory=dict)
    cpu_model: str = ""
    isa: str = ""  # "AVX2 (no AVX-512, VNNI, AMX, BF16)"
    peaks: dict[str, dict[str, Any]] = field(default_factory=dict)  # precision -> cpu.Peak
    recommendation: dict[int, dict[str, Any]] = field(default_factory=dict)  # see recommend
    gpu: str = ""  # on CUDA: the device, CUDA version and driver
    # peers left out, and why; runners whose answers depend on the batch (BATCH_DEPENDENT)
    notes: list[str] = field(default_factory=list)
    files: dict[str, str] = field(default_factory=dict)  # the sha256s of the files timed
    # backend -> its top-1 accuracy on the labelled images its parity.json measured, beside
    # eager's (`parity.labelled_accuracy`): a quantized model's speed next to what it costs
    accuracy: dict[str, dict[str, Any]] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def model_flops(config) -> float:
    """Forward FLOPs of one image (2 per multiply-add; softmax, norms, GELU not counted)."""
    D, T = config.embed_dim, config.num_patches + config.num_prefix_tokens
    hidden = int(D * config.mlp_ratio)
    glu = config.mlp_layer == "swiglu_packed"  # fc2 takes half of fc1's width
    patch = config.num_patches * D * config.in_chans * config.patch_size ** 2
    block = T * D * 3 * D + 2 * T * T * D + T * D * D + (1.5 if glu else 2) * T * D * hidden
    # the classifier (or CLIP's projection) runs unless the output is the features before it
    names = config.output_names  # the head runs for logits, or for a projection's embedding
    skipped = "logits" not in names and not ("embedding" in names and config.projection_head)
    head = 0 if skipped else config.num_features * max(config.num_classes, 0)
    if config.representation_size:
        head += D * config.representation_size
    if config.global_pool == "map":  # one latent query over the patch tokens, then an MLP
        head += 2 * D * D + 2 * config.num_patches * D * D + 2 * config.num_patches * D \
            + 2 * D * hidden
    return 2.0 * (patch + config.depth * block + head)


def matmul_peak_gflops(n: int = 2048, repeats: int = 5) -> float:
    """Best fp32 GEMM rate of this machine now, by torch.mm on n x n matrices (CPU, with
    torch's current thread count)."""
    return cpu.fp32_peak(n, repeats).gflops


def fastest_validated(rows: Sequence[BenchRow], io: str = "host") -> dict[int, BenchRow]:
    """The fastest validated row at each batch size with its input placed at `io` (host |
    device), by p50. Peers are not files of the bundle that infer or serve could run: never
    chosen."""
    best: dict[int, BenchRow] = {}
    for r in rows:
        if r.io == io and r.validated and not r.peer and (r.batch not in best
                                              or r.p50_ms < best[r.batch].p50_ms):
            best[r.batch] = r
    return dict(sorted(best.items()))


def recommend(rows: Sequence[BenchRow]) -> dict[int, dict[str, Any]]:
    """The fastest validated backend at each batch size (host input), from measured rows:
    batch -> backend, p50 ms, images/s, speedup over eager, precision (`fastest_validated`).
    Above batch 1 a backend whose answer for one image depends on the others in its batch
    (dynamic int8, `batch_dependence`) is passed over for the fastest one whose answers do
    not, and the note says so: serve and infer batch different requests together."""
    fastest = fastest_validated(rows)
    steady = fastest_validated([r for r in rows if not batch_dependence(r.backend)])
    chosen: dict[int, dict[str, Any]] = {}
    for b, r in fastest.items():
        note = batch_dependence(r.backend) if b > 1 else None
        if note and b in steady:
            why = note.partition(": ")[2]  # batch_dependence says "NAME: why"
            note = (f"{r.backend} ran faster ({r.images_per_s:.3g} img/s), but {why}; "
                    f"chosen instead: {steady[b].backend}, whose answers do not")
            r = steady[b]
        chosen[b] = {"backend": r.backend, "p50_ms": r.p50_ms, "images_per_s": r.images_per_s,
                     "speedup_vs_eager": r.speedup, "precision": r.precision,
                     **({"note": note} if note else {})}
    return chosen


@dataclass(frozen=True)
class AgainstPeer:
    """The bundle's fastest validated backend at one batch size and input placement, beside
    one peer's figure there (`against_peer`)."""
    batch: int
    io: str  # host | device: where the input was, for both
    backend: str  # the bundle's fastest validated backend here (`fastest_validated`)
    images_per_s: float
    precision: str  # whose GEMM peak peak_fraction is against
    peak_fraction: float
    peer: str
    peer_images_per_s: Optional[float]  # None: the peer has no row here (left out: the notes)
    peer_validated: bool  # the peer matched eager at this batch
    host_vs_device: Optional[float]  # the backend's best img/s with host input (host or
    # stream) over its img/s with the input already on the device; None where no row has
    # device input (CPU)
    graph_images_per_s: Optional[float]  # the backend again with a CUDA graph (peer
    # cuda-graph, never recommended) where that matched eager, else None

    @property
    def ratio(self) -> Optional[float]:
        """The backend's img/s over the peer's: 1.0 or more is at least as fast."""
        return None if self.peer_images_per_s is None else \
            self.images_per_s / self.peer_images_per_s


def against_peer(result: dict[str, Any], peer: str) -> list[AgainstPeer]:
    """The bundle's fastest validated backend at each batch size and input placement of a
    bench result (`BenchResult.to_dict()`: `bench --json` or `--report`) against `peer` (a
    PEERS name), host input first at each batch size. ConfigError for a peer PEERS does not
    name; BundleError in one line where the rows are not bench rows."""
    check_peers([peer])
    try:
        rows = [BenchRow(**row) for row in result["rows"]]
    except (KeyError, TypeError) as exc:
        raise BundleError(f"not a bench result "
                          f"({option('bench --json or --report', 'BenchResult.to_dict()')}): "
                          f"{exc}") from None
    by = {(r.backend, r.io, r.batch): r for r in rows}
    found = []
    for io in ("host", "device"):
        for batch, best in fastest_validated(rows, io).items():
            theirs = by.get((peer, io, batch))
            fed = [r for r in (by.get((best.backend, "host", batch)),
                               by.get((best.backend, "stream", batch))) if r]
            host = max(fed, key=lambda r: r.images_per_s, default=None)
            device = by.get((best.backend, "device", batch))
            graph = by.get((best.backend + CUDA_GRAPH_SUFFIX, io, batch))
            found.append(AgainstPeer(
                batch, io, best.backend, best.images_per_s, best.precision, best.peak_fraction,
                peer, theirs.images_per_s if theirs else None, bool(theirs and theirs.validated),
                host.images_per_s / device.images_per_s if host and device else None,
                graph.images_per_s if graph and graph.validated else None))
    return sorted(found, key=lambda a: (a.batch, a.io != "host"))


def record(result: BenchResult, bundle_dir: str | os.PathLike) -> Path:
    """Write the measured recommendation to the bundle's performance.json, atomically.

    A measurement of one machine, not part of the model: config.json and its sha256s are
    untouched. It records the sha256s of the files it timed, and is read only while the
    bundle still holds them (choosing.choose_runner).
    """
    path = Path(bundle_dir) / B.PERFORMANCE_FILE
    B.atomic_write_json(path, {
        "cpu": result.cpu_model, "isa": result.isa, "device": result.device, "gpu": result.gpu,
        "threads": result.threads, "peaks": result.peaks, "batch_sizes": result.batch_sizes,
        "fastest_validated": {str(b): v for b, v in result.recommendation.items()},
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "versions": result.versions,
        "files": result.files})
    return path


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


# Peers: ways to run the bundle's model that are not files of the bundle, timed beside it by
# `bench --peers` -> the tolerance profile they are checked against eager with. The timm peers
# are timm's own VisionTransformer holding the bundle's weights (checkpoints.timm_model: fused
# SDPA attention), as users run it: eager, .half() and torch.compile'd (mode default, and
# reduce-overhead: CUDA graphs).
PEERS = {"eager-amp": "fp16", "torch-compile": "fp32", "torch-compile-amp": "fp16",
         "cuda-graph": None,  # cuda-graph: every ONNX runner again, by its file's profile
         "timm": "fp32", "timm-compile": "fp32", "timm-fp16": "fp16",
         "timm-compile-fp16": "fp16", "timm-compile-ro-fp16": "fp16"}
CUDA_PEERS = ("eager-amp", "torch-compile-amp", "cuda-graph", "timm-fp16", "timm-compile-fp16",
              "timm-compile-ro-fp16")
COMPILE_MODE = "max-autotune"
# torch.compile's mode for the timm peers: what a user writes (default), or reduce-overhead
TIMM_COMPILE_MODES = {"timm-compile": "default", "timm-compile-fp16": "default",
                      "timm-compile-ro-fp16": "reduce-overhead"}
CUDA_GRAPH_SUFFIX = "+cuda-graph"


def check_peers(peers: Sequence[str]) -> None:
    """Every name one of PEERS, or ConfigError naming the first that is not."""
    unknown = [p for p in peers if p not in PEERS]
    if unknown:
        raise ConfigError(f"unknown peer {unknown[0]!r}; choose from {', '.join(PEERS)}")


def peer_runners(peers: Sequence[str], eager: runtime.TorchRunner, onnx_files: dict[str, str],
                 bundle: B.Bundle) -> list[runtime.Runner]:
    """The runners of `peers` (PEERS keys) beside `eager`: autocast fp16 eager, the module
    torch.compile'd (mode max-autotune, one graph per input shape; compiled at its first
    call), each ONNX runner in `onnx_files` again with CUDA graphs, and timm's own model
    with the bundle's weights (`checkpoints.timm_model`; one line where timm's
    VisionTransformer does not build this model)."""
    import torch

    check_peers(peers)
    cuda_only = [p for p in peers if p in CUDA_PEERS]
    if cuda_only and eager.device != "cuda":
        raise ProviderError(f"peer {cuda_only[0]} needs CUDA, and this run is on "
                            f"{eager.device}")
    runners: list[runtime.Runner] = []
    timm_built = None
    for peer in peers:
        if peer == "eager-amp":
            runners.append(runtime.TorchRunner(eager.module, peer, eager.device, eager.spec,
                                               "float16"))
        elif peer.startswith("torch-compile"):
            module = torch.compile(eager.module, mode=COMPILE_MODE, dynamic=False)
            runners.append(runtime.TorchRunner(module, peer, eager.device, eager.spec,
                                               "float16" if peer.endswith("-amp") else None,
                                               True))
        elif peer.startswith("timm"):
            half = peer.endswith("-fp16")
            if half:  # a copy of its own in fp16 (.half() converts in place)
                module = _timm_peer_model(bundle, eager).half()
            else:
                timm_built = timm_built or _timm_peer_model(bundle, eager)
                module = timm_built
            mode = TIMM_COMPILE_MODES.get(peer)
            if mode:
                module = torch.compile(module, mode=mode, dynamic=False)
            runners.append(runtime.TorchRunner(module, peer, eager.device, eager.spec,
                                               compiled=mode is not None, half=half))
        elif not onnx_files:
            raise ConfigError(f"peer cuda-graph runs the ONNX models, and "
                              f"{option('--runtimes', 'include')} chose none")
        else:
            runners += [runtime.OrtCudaGraphRunner(bundle.onnx_model(file), name + CUDA_GRAPH_SUFFIX,
                                                   eager.spec)
                        for name, file in onnx_files.items()]
    return runners


def _timm_peer_model(bundle: B.Bundle, eager: runtime.TorchRunner):
    """timm's VisionTransformer with the bundle's weights, on eager's device."""
    try:
        return timm_model(bundle.config, eager.module.state_dict()).to(eager.device)
    except ModuleNotFoundError as exc:  # timm is not a dependency of the package
        if exc.name != "timm":
            raise
        raise ConfigError("the timm peers need timm: pip install timm") from None


def runners_to_time(bundle: B.Bundle, provider: str, threads: Optional[int],
                    include: Optional[Sequence[str]], runtimes: Sequence[str],
                    peers: Sequence[str], trust_code: bool
                    ) -> tuple[runtime.RunnerSet, list[str]]:
    """What `bench` times: every runner of the bundle on each runtime the registry lists
    (the opt-in ones where `runtimes` names them), eager first, then the `peers` that can
    run here. Returns the set and the peers left out because they need CUDA and this run
    is elsewhere (each said in a note, as any peer that cannot run here)."""
    runners = runtime.open_runners(bundle, provider, threads=threads, include=include,
                                   runtimes=runtimes, trust_code=trust_code)
    ort_files = {r.name: runners.onnx_files[r.name] for r in runners.candidates
                 if isinstance(r, runtime.OrtRunner)}
    unrunnable = [p for p in peers if p in CUDA_PEERS and runners.device != "cuda"]
    added = peer_runners([p for p in peers if p not in unrunnable], runners.reference,
                         ort_files, bundle)
    return dataclasses.replace(runners, runners=runners.runners + added,
                               peers=[r.name for r in added]), unrunnable


@dataclass(frozen=True)
class BenchOptions:
    """What `bench` times and how long; the defaults are those of `vit-export bench`.
    Checked when made (ConfigError): the one home of bench's rules."""
    batch_sizes: Sequence[int] = (1, 8, 32)
    threads: Optional[int] = None  # intra-op threads [default: every core]
    provider: str = runtime.DEFAULT_PROVIDER  # "auto", "cuda" or "cpu"
    warmup: int = 2  # untimed calls before each timed series
    min_runs: int = 5  # timed calls at least, ...
    min_seconds: float = 2.0  # ... and for at least this long
    seed: int = 0  # of the timed inputs
    include: Optional[Sequence[str]] = None  # runner names to time (None: every one)
    runtimes: Sequence[str] = ()  # opt-in runtimes to time too ("openvino")
    peers: Sequence[str] = ()  # PEERS: PyTorch's own fast paths, CUDA graphs, timm
    trust_code: bool = False  # also time the files that can carry code

    def __post_init__(self) -> None:
        from .runtime.registry import by_name

        for name in ("batch_sizes", "runtimes", "peers"):  # each once, in the order given
            object.__setattr__(self, name, tuple(dict.fromkeys(getattr(self, name))))
        if not self.batch_sizes or min(self.batch_sizes) < 1:
            raise ConfigError(f"batch sizes must be >= 1, got {list(self.batch_sizes)}")
        if self.warmup < 0 or self.min_runs < 1 or self.min_seconds < 0:
            raise ConfigError("warmup must be >= 0, min_runs >= 1 and min_seconds >= 0")
        if self.threads is not None and self.threads < 1:
            raise ConfigError(f"threads must be >= 1, got {self.threads}")
        for name in self.runtimes:
            by_name(name)
        check_peers(self.peers)


def bench_options(options: Optional[BenchOptions], keywords: dict[str, Any]) -> BenchOptions:
    """`options`, or the keyword arguments bench took before there were options
    (`openvino=True`: the "openvino" runtime); the two together: `options` with them
    replaced."""
    if keywords.pop("openvino", False):
        base = options.runtimes if options else keywords.get("runtimes", ())
        keywords["runtimes"] = tuple(base) + ("openvino",)
    if options is None:
        return BenchOptions(**keywords)
    return dataclasses.replace(options, **keywords) if keywords else options


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
    kernels = {precision: _Series(gemm.call) for precision, gemm in gemms.items()}

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
    peaks = {**peaks, **{precision: gemms[precision].timed(float(np.median(k.times)), "median")
                         for precision, k in kernels.items()}}
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
    runtime (`openvino=True` as before), OpenVINO's CPU runners too; with `peers` (PEERS),
    PyTorch's own fast paths and ONNX Runtime's CUDA graphs, each checked against eager at
    every batch size before it is timed (a peer that cannot run here is left out with a
    note). fp32 runs with TF32 off. The files that can carry code are timed where `include`
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
        runners, unrunnable = runners_to_time(bundle, o.provider, threads, o.include,
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
        if not on_cuda:
            gemms = cpu.gemms(threads, this_cpu)
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

