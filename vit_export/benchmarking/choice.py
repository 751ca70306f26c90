"""The fastest validated backend at each batch size, from measured rows: recommended,
recorded in the bundle's performance.json, and set beside one peer's figures."""
from __future__ import annotations

import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from .. import bundle as B
from ..errors import BundleError
from ..exporting.variants import batch_dependence
from .peers import CUDA_GRAPH_SUFFIX, check_peers
from .results import BenchResult, BenchRow


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
        raise BundleError(f"not a bench result (bench --json or --report, "
                          f"BenchResult.to_dict()): {exc}") from None
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
