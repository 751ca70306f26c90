"""Does every exported artifact compute what eager PyTorch computes? Returns data, never prints.

`validate(bundle)` rebuilds eager PyTorch from weights.safetensors + config.json, runs it, the
TorchScript file and the ONNX Runtime session on the same seeded inputs at batch sizes that
prove the batch axis is dynamic, compares logits pair by pair, and scans the ONNX graph for a
batch size baked into a shape constant.
"""
from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Optional, Sequence

import numpy as np

from . import bundle as B
from . import runtime
from .errors import ParityError


@dataclass(frozen=True)
class Tolerance:
    atol: float  # max abs error on logits
    rtol: float  # max abs error relative to the largest reference magnitude
    min_cosine: float  # per-sample cosine similarity, the lowest one
    min_top1: float  # fraction of samples whose top-1 class agrees (near-ties excused)


# Defaults per (precision, provider). fp32 CPU is the contract: max abs <= 1e-4 on logits.
TOLERANCES = {
    ("fp32", "cpu"): Tolerance(atol=1e-4, rtol=1e-4, min_cosine=0.99999, min_top1=1.0),
    ("fp32", "cuda"): Tolerance(atol=1e-3, rtol=1e-3, min_cosine=0.9999, min_top1=1.0),
}


def default_tolerance(provider: str, precision: str = "fp32") -> Tolerance:
    return TOLERANCES[(precision, provider)]


@dataclass
class PairResult:
    """One comparison: a candidate against the eager reference at one batch size."""
    reference: str
    candidate: str
    batch: int
    inputs: str  # what was fed: "random(seed=0)" or the name of a real-data set
    max_abs: float
    max_rel: float
    cosine: float
    top1: float  # raw top-1 agreement
    top1_decisive: float  # agreement counting only samples that are not within atol of a tie
    passed: bool
    failures: list[str] = field(default_factory=list)
    accuracy: Optional[float] = None  # candidate's top-1 accuracy, when labels are known
    reference_accuracy: Optional[float] = None  # eager's, on the same inputs


@dataclass
class GraphCheck:
    name: str
    passed: bool
    detail: str


@dataclass
class ParityReport:
    bundle: str
    passed: bool
    provider_requested: str
    provider_used: str
    torch_device: str
    tf32: bool
    seed: int
    batch_sizes: list[int]
    export_batch: int
    tolerance: Tolerance
    results: list[PairResult]
    graph_checks: list[GraphCheck]
    notes: list[str]
    versions: dict[str, str]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def failures(self) -> list[str]:
        lines = [f"{c.name}: {c.detail}" for c in self.graph_checks if not c.passed]
        for r in self.results:
            lines += [f"{r.candidate} batch {r.batch} ({r.inputs}): {f}" for f in r.failures]
        return lines


def compare(reference: np.ndarray, candidate: np.ndarray, tol: Tolerance) -> dict[str, Any]:
    """Metrics of candidate vs reference logits [B, K], and which tolerances they break."""
    if reference.shape != candidate.shape:
        return dict(max_abs=float("inf"), max_rel=float("inf"), cosine=0.0, top1=0.0,
                    top1_decisive=0.0, passed=False,
                    failures=[f"shape {candidate.shape} != reference {reference.shape}"])
    ref, cand = reference.astype(np.float64), candidate.astype(np.float64)
    diff = np.abs(ref - cand)
    max_abs = float(diff.max()) if diff.size else 0.0
    scale = float(np.abs(ref).max()) if ref.size else 0.0
    max_rel = max_abs / scale if scale > 0 else max_abs
    r2, c2 = ref.reshape(len(ref), -1), cand.reshape(len(cand), -1)
    norms = np.linalg.norm(r2, axis=1) * np.linalg.norm(c2, axis=1)
    cosines = np.where(norms > 0, (r2 * c2).sum(axis=1) / np.maximum(norms, 1e-300), 1.0)
    cosine = float(cosines.min()) if len(cosines) else 1.0
    ref_top, cand_top = r2.argmax(axis=1), c2.argmax(axis=1)
    rows = np.arange(len(r2))
    top1 = float((ref_top == cand_top).mean()) if len(rows) else 1.0
    # A flip between classes whose reference logits lie within atol is a tie, not an error.
    excused = r2[rows, ref_top] - r2[rows, cand_top] <= 2 * tol.atol
    top1_decisive = float(((ref_top == cand_top) | excused).mean()) if len(rows) else 1.0
    failures = []
    if not np.isfinite(cand).all():
        failures.append("non-finite values in the output")
    if not max_abs <= tol.atol:
        failures.append(f"max abs error {max_abs:.3g} > {tol.atol:g}")
    if not max_rel <= tol.rtol:
        failures.append(f"max rel error {max_rel:.3g} > {tol.rtol:g}")
    if not cosine >= tol.min_cosine:
        failures.append(f"cosine {cosine:.7f} < {tol.min_cosine}")
    if not top1_decisive >= tol.min_top1:
        failures.append(f"top-1 agreement {top1_decisive:.4f} < {tol.min_top1}")
    return dict(max_abs=max_abs, max_rel=max_rel, cosine=cosine, top1=top1,
                top1_decisive=top1_decisive, passed=not failures, failures=failures)


def _constant_values(graph, names: set[str]) -> dict[str, np.ndarray]:
    """The values of the constants among `names` (initializers or Constant nodes).

    Only the named ones are read: big weights may live in external data we did not load.
    """
    import onnx
    from onnx import numpy_helper

    values = {t.name: numpy_helper.to_array(t) for t in graph.initializer
              if t.name in names and t.data_location != onnx.TensorProto.EXTERNAL}
    for node in graph.node:
        if node.op_type == "Constant" and node.output[0] in names:
            for attr in node.attribute:
                if attr.name == "value":
                    values[node.output[0]] = numpy_helper.to_array(attr.t)
    return values


def scan_graph(onnx_path: str | os.PathLike, export_batch: int) -> list[GraphCheck]:
    """Static checks: symbolic batch on input and output; no shape constant = export batch.

    The "baked batch" bug: a Reshape/Expand/Tile whose shape (or repeats) is a constant with
    the export batch size in the batch position; the graph then only runs at that batch.
    """
    import onnx

    proto = onnx.load(str(onnx_path), load_external_data=False)
    graph = proto.graph
    checks = []
    for value in list(graph.input) + list(graph.output):
        dims = value.type.tensor_type.shape.dim
        symbolic = bool(dims) and bool(dims[0].dim_param)
        shown = dims[0].dim_param or dims[0].dim_value if dims else "none"
        checks.append(GraphCheck(f"symbolic batch axis on {value.name}", symbolic,
                                 f"dim 0 is {shown!r}"))
    shaping = [n for n in graph.node
               if n.op_type in ("Reshape", "Expand", "Tile") and len(n.input) > 1]
    constants = _constant_values(graph, {n.input[1] for n in shaping})
    baked = []
    for node in shaping:
        shape = constants.get(node.input[1])
        if shape is not None and shape.ndim == 1 and shape.size > 1 \
                and int(shape[0]) == export_batch:
            baked.append(f"{node.op_type} {node.name or node.output[0]} {shape.tolist()}")
    checks.append(GraphCheck(
        "no baked batch in shape constants", not baked,
        f"{len(baked)} node(s) with batch {export_batch} baked in: {'; '.join(baked[:3])}"
        if baked else f"no Reshape/Expand/Tile constant starts with {export_batch}"))
    return checks


def random_inputs(config, batch: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng([seed, batch])
    shape = (batch, config.in_chans, config.img_size, config.img_size)
    return rng.standard_normal(shape, dtype=np.float32)


def default_batch_sizes(export_batch: int) -> list[int]:
    """1, the export batch + 1, and the prime 7: the batch axis must really be dynamic."""
    return sorted({1, export_batch + 1, 7})


def validate(path: str | os.PathLike, batch_sizes: Optional[Sequence[int]] = None, *,
             provider: str = "auto", seed: int = 0, tolerance: Optional[Tolerance] = None,
             real_inputs: Optional[dict[str, tuple[np.ndarray, Optional[np.ndarray]]]] = None,
             ) -> ParityReport:
    """Compare eager PyTorch with TorchScript and ONNX Runtime for the bundle at `path`.

    `real_inputs` maps a name to (preprocessed [N, C, H, W] array, labels [N] or None), e.g.
    held-out images; each set is compared like the random inputs, in chunks of the largest
    batch size, and with labels the report gives every runner's accuracy.
    """
    bundle = B.read_bundle(path)
    export_batch = int(bundle.description.export.get("export_batch", 2))
    sizes = sorted(set(batch_sizes)) if batch_sizes else default_batch_sizes(export_batch)
    if any(b < 1 for b in sizes):
        raise ParityError(f"batch sizes must be >= 1, got {sizes}")
    runtime.set_torch_tf32(False)
    session = runtime.create_session(bundle.onnx_path, provider, tf32=False)
    device = runtime.torch_device(session.provider)
    tol = tolerance or default_tolerance(session.provider)
    eager = runtime.TorchRunner(B.load_eager(bundle).to(device), device, name="eager")
    candidates = [session]
    if bundle.ts_path.exists():
        candidates.insert(0, runtime.load_torchscript(bundle.ts_path, device))

    feeds = [(f"random(seed={seed})", b, random_inputs(bundle.config, b, seed), None)
             for b in sizes]
    for name, (data, labels) in (real_inputs or {}).items():
        step = max(sizes)
        feeds += [(name, len(data[i:i + step]), data[i:i + step],
                   None if labels is None else labels[i:i + step])
                  for i in range(0, len(data), step)]
    results = []
    for inputs, batch, x, labels in feeds:
        reference = eager(x)
        for runner in candidates:
            out = runner(x)
            metrics = compare(reference, out, tol)
            if labels is not None:
                metrics["accuracy"] = float((out.argmax(axis=1) == labels).mean())
                metrics["reference_accuracy"] = float((reference.argmax(axis=1) == labels).mean())
            results.append(PairResult("eager", runner.name, batch, inputs, **metrics))
    results = _merge_real(results)
    checks = scan_graph(bundle.onnx_path, export_batch)
    passed = all(r.passed for r in results) and all(c.passed for c in checks)
    return ParityReport(
        bundle=str(Path(path)), passed=passed, provider_requested=provider,
        provider_used=session.provider, torch_device=device, tf32=False, seed=seed,
        batch_sizes=sizes, export_batch=export_batch, tolerance=tol, results=results,
        graph_checks=checks, notes=session.notes, versions=B.package_versions())


def _merge_real(results: list[PairResult]) -> list[PairResult]:
    """Real-data sets run in chunks; report each set as one row per candidate."""
    merged: dict[tuple[str, str], list[PairResult]] = {}
    out = []
    for r in results:
        if r.inputs.startswith("random("):
            out.append(r)
        else:
            merged.setdefault((r.inputs, r.candidate), []).append(r)
    for (inputs, candidate), rows in merged.items():
        n = sum(r.batch for r in rows)
        out.append(PairResult(
            "eager", candidate, n, inputs,
            max_abs=max(r.max_abs for r in rows), max_rel=max(r.max_rel for r in rows),
            cosine=min(r.cosine for r in rows),
            top1=sum(r.top1 * r.batch for r in rows) / n,
            top1_decisive=sum(r.top1_decisive * r.batch for r in rows) / n,
            passed=all(r.passed for r in rows),
            failures=[f for r in rows for f in r.failures],
            accuracy=_weighted(rows, "accuracy"),
            reference_accuracy=_weighted(rows, "reference_accuracy")))
    return out


def _weighted(rows: list[PairResult], name: str) -> Optional[float]:
    values = [getattr(r, name) for r in rows]
    if any(v is None for v in values):
        return None
    return sum(v * r.batch for v, r in zip(values, rows)) / sum(r.batch for r in rows)
