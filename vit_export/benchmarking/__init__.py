"""Timing harness: every backend of a bundle on the same inputs, in one process -> BenchResult.

Each backend runs once at each batch size (its peak resident memory taken then); then, one
batch size at a time, every backend is warmed up and all are timed in turns
(timing.in_turns), so that a shared machine's slow seconds fall on all of them alike. The
result holds latency percentiles, images/s, that peak resident memory, effective GFLOP/s,
the fraction of the GEMM peak of the backend's own precision (fp32, bf16, int8: on a CPU
each timed in turns with the runners, on CUDA measured first) and the speedup over eager
PyTorch at the same batch size. `recommend` then names the
fastest validated backend at each batch size, from those figures; `against_peer` sets that
backend beside one peer's figures.

One module per job, every public name re-exported here:
  results.py   BenchRow, BenchResult; a model's FLOPs, each profile's GEMM precision
  peers.py     the peers (PyTorch's own fast paths, CUDA graphs, timm) and what bench times
  options.py   BenchOptions, checked when made
  choice.py    the fastest validated backend: recommended, recorded, set beside a peer
  harness.py   bench(): run once, then timed in turns -> BenchResult
"""
from .choice import AgainstPeer, against_peer, fastest_validated, recommend, record
from .harness import STREAM_BATCHES, bench, streamed
from .options import BenchOptions, bench_options
from .peers import (
    COMPILE_MODE,
    CUDA_GRAPH_SUFFIX,
    CUDA_PEERS,
    PEERS,
    TIMM_COMPILE_MODES,
    check_peers,
    peer_runners,
    runners_to_time,
)
from .results import (
    CUDA_PRECISION_OF_PROFILE,
    PRECISION_OF_PROFILE,
    BenchResult,
    BenchRow,
    matmul_peak_gflops,
    model_flops,
)

__all__ = [
    "COMPILE_MODE", "CUDA_GRAPH_SUFFIX", "CUDA_PEERS", "CUDA_PRECISION_OF_PROFILE", "PEERS",
    "PRECISION_OF_PROFILE", "STREAM_BATCHES", "TIMM_COMPILE_MODES", "AgainstPeer",
    "BenchOptions", "BenchResult", "BenchRow", "against_peer", "bench", "bench_options",
    "check_peers", "fastest_validated", "matmul_peak_gflops", "model_flops", "peer_runners",
    "recommend", "record", "runners_to_time", "streamed",
]
