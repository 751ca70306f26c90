"""Comparison: a candidate's outputs against the reference's, metrics and verdict. Pure
functions over whole arrays, whole input sets and whole runs; nothing here runs a model."""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Optional

import numpy as np

from ..errors import SavedRunError
from .inputs import ImageSet, InputSet
from .runs import RunResult, set_digest
from .tolerance import Tolerance

NEIGHBOURS = 10  # an embedding's decisions: each sample's nearest neighbours in its set
# Neighbours whose reference cosines differ by less than this are tied: float32 rounding
# of a dot product of unit vectors, not a decision.
NEIGHBOUR_TIE = 1e-5
# Fewer images cannot judge neighbours: with k + 1 every other image is one, and any random
# ranking overlaps by about k / (N - 1). From this many, chance is at most a third.
MIN_NEIGHBOUR_IMAGES = 3 * NEIGHBOURS + 1


@dataclass
class PairResult:
    """One comparison: a candidate against the eager reference at one batch size."""
    reference: str
    candidate: str  # "torchscript", "onnxruntime", "onnxruntime[model.fp16.onnx]", ...
    profile: str
    batch: int
    inputs: str  # what was fed: "random(seed=0)" or the name of a real-data set
    max_abs: float
    max_rel: float
    cosine: float
    # the decisions: logits' top-1 class; an embedding's 10 nearest neighbours among the
    # images of a real set (None on random inputs, which have no neighbours worth keeping)
    top1: Optional[float]  # raw agreement
    top1_decisive: Optional[float]  # agreement with near-ties excused
    passed: bool
    failures: list[str] = field(default_factory=list)
    accuracy: Optional[float] = None  # candidate's top-1 accuracy, when labels are known
    reference_accuracy: Optional[float] = None  # eager's, on the same inputs
    output: str = "logits"  # which output of the model: logits, embedding or tokens


def compare(reference: np.ndarray, candidate: np.ndarray, tol: Tolerance,
            output: str = "logits", neighbours: bool = False) -> dict[str, Any]:
    """Metrics of candidate vs reference values of `output` (logits [B, K], an embedding
    [B, F], tokens [B, N, D]), and which tolerances they break.

    The decisions compared (`top1`, and `top1_decisive` with near-ties excused): the top-1
    class of logits (min_top1); for an embedding of real images (`neighbours`), each
    image's 10 nearest neighbours (cosine) among the others (min_neighbours): a search
    index built on the candidate must return what one built on eager would. An embedding
    of random inputs is judged by its values and direction only; tokens by their values
    and each token's direction (cosine per token, the least of them)."""
    embedding = output != "logits"
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
    if output == "tokens":  # [B, N, D]: each token's direction
        cosine = float(cosines(ref.reshape(-1, ref.shape[-1]),
                                cand.reshape(-1, cand.shape[-1])).min()) if ref.size else 1.0
    else:
        cosine = float(cosines(r2, c2).min()) if len(r2) else 1.0
    top1: Optional[float]
    if embedding:
        top1 = top1_decisive = None
        if output == "embedding" and neighbours and len(r2) >= MIN_NEIGHBOUR_IMAGES:
            top1, top1_decisive = neighbour_agreement(r2, c2, NEIGHBOURS, NEIGHBOUR_TIE)
    else:
        ref_top, cand_top = r2.argmax(axis=1), c2.argmax(axis=1)
        rows = np.arange(len(r2))
        top1 = float((ref_top == cand_top).mean()) if len(rows) else 1.0
        # A flip between classes whose reference logits lie within atol is a tie.
        margin = min(2 * tol.atol, 2 * tol.rtol * scale)
        excused = r2[rows, ref_top] - r2[rows, cand_top] <= margin
        top1_decisive = float(((ref_top == cand_top) | excused).mean()) if len(rows) else 1.0
    failures = []
    if not np.isfinite(cand).all():
        failures.append("non-finite values in the output")
    if not max_abs <= tol.atol:
        failures.append(f"max abs error {max_abs:.3g} > {tol.atol:g}")
    if not max_rel <= tol.rtol:
        failures.append(f"max rel error {max_rel:.3g} > {tol.rtol:g}")
    least_cosine = tol.min_token_cosine if output == "tokens" else tol.min_cosine
    if not cosine >= least_cosine:
        failures.append(f"{'token ' if output == 'tokens' else ''}cosine {cosine:.7f} < "
                        f"{least_cosine}")
    least = tol.min_neighbours if embedding else tol.min_top1
    if top1_decisive is not None and not top1_decisive >= least:
        what = f"top-{NEIGHBOURS} neighbour" if embedding else "top-1"
        failures.append(f"{what} agreement {top1_decisive:.4f} < {least}")
    return dict(max_abs=max_abs, max_rel=max_rel, cosine=cosine, top1=top1,
                top1_decisive=top1_decisive, passed=not failures, failures=failures)


def neighbour_agreement(reference: np.ndarray, candidate: np.ndarray, k: int,
                        margin: float = 0.0, block: int = 512) -> tuple[float, float]:
    """For each row, the overlap of its k nearest other rows by cosine in the reference and
    in the candidate, averaged: raw, and with a candidate neighbour counted where its
    reference cosine is within `margin` of the k-th (a near-tie). Needs more than k + 1
    rows (with fewer, every other row is a neighbour and the overlap is 1 by construction).
    Memory: `block` rows of similarities at a time, not N x N."""
    n = len(reference)
    if n <= k + 1:
        raise ValueError(f"{n} rows cannot rank {k} neighbours")

    def unit(x: np.ndarray) -> np.ndarray:
        x = x.astype(np.float64)
        return x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-300)

    def nearest(sims: np.ndarray) -> np.ndarray:  # [rows, k], nearest first
        top = np.argpartition(-sims, k - 1, axis=1)[:, :k]
        order = np.argsort(-np.take_along_axis(sims, top, axis=1), axis=1, kind="stable")
        return np.take_along_axis(top, order, axis=1)

    ref, cand = unit(reference), unit(candidate)
    raw = decisive = 0.0
    for start in range(0, n, block):
        rows = np.arange(start, min(start + block, n))
        r, c = ref[rows] @ ref.T, cand[rows] @ cand.T
        r[rows - start, rows] = c[rows - start, rows] = -np.inf  # not one's own neighbour
        ref_top, cand_top = nearest(r), nearest(c)
        kth = np.take_along_axis(r, ref_top[:, -1:], axis=1)
        for i in range(len(rows)):
            same = np.isin(cand_top[i], ref_top[i])
            near = r[i, cand_top[i]] >= kth[i, 0] - margin
            raw += same.sum() / k
            decisive += (same | near).sum() / k
    return raw / n, decisive / n


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Row by row cosine similarity of [N, F] arrays; 1 where a row is all zeros."""
    norms = np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1)
    return np.where(norms > 0, (a * b).sum(axis=1) / np.maximum(norms, 1e-300), 1.0)


def compare_sets(sets: Sequence[InputSet | ImageSet],
                 outputs: Sequence[dict[str, dict[str, np.ndarray]]],
                 reference: str, profiles: dict[str, str],
                 tolerances: dict[str, Tolerance]) -> list[PairResult]:
    """Every candidate against the reference on each whole input set, output by output
    (pure: no running).

    `profiles` maps each candidate's name to the profile that judges it. A verdict sees whole
    sets, so it never depends on how the run stage chunked them.
    """
    results = []
    for s, row in zip(sets, outputs):
        for name, profile in profiles.items():
            for output, ref in row[reference].items():
                results.append(compare_pair(reference, name, profile, s.name, s.labels, output,
                                            ref, row[name].get(output), tolerances[profile],
                                            s.real))
    return results


def compare_pair(reference: str, name: str, profile: str, inputs: str,
                 labels: Optional[np.ndarray], output: str, ref: np.ndarray,
                 cand: Optional[np.ndarray], tol: Tolerance, real: bool) -> PairResult:
    """One candidate's `output` against the reference's on one set; accuracy for logits of
    labelled inputs (an embedding has no classes)."""
    if cand is None:  # a model file without this output
        return PairResult(reference, name, profile, len(ref), inputs, float("inf"),
                          float("inf"), 0.0, None, None, False,
                          [f"no output {output!r}"], output=output)
    metrics = compare(ref, cand, tol, output, neighbours=real)
    if labels is not None and output == "logits":
        metrics["accuracy"] = float((cand.argmax(axis=1) == labels).mean())
        metrics["reference_accuracy"] = float((ref.argmax(axis=1) == labels).mean())
    return PairResult(reference, name, profile, len(ref), inputs, **metrics, output=output)


def compare_run(run: RunResult, tolerances: dict[str, Tolerance]) -> list[PairResult]:
    """Every candidate of a run against its own reference, as `validate` judges them: the
    runners against eager on the tensors, then model.e2e.onnx against Pillow + eager on the
    images (pure: the run is data)."""
    return [result for reference, sets, outputs in run.groups()
            for result in compare_sets(sets, outputs, reference, run.judged(reference),
                                       tolerances)]


def compare_runs(a: RunResult, b: RunResult, tolerances: dict[str, Tolerance],
                 tags: tuple[str, str] = ("A", "B"),
                 names: Optional[tuple[str, str]] = None) -> list[PairResult]:
    """The reference of run `a` against every runner of run `b`, its reference too, on each
    whole input set, each judged by the profile `b` judged it by (a reference: fp32). Rows
    name each side by runner, device and run: `eager@cuda (A)` vs `onnxruntime@cpu (B)`.
    Runs of different bundles or inputs cannot be judged together: SavedRunError, naming
    them by `names` (their files) or else by their tags (pure)."""
    comparable(a, b, names or tags)

    def label(run: RunResult, name: str, tag: str) -> str:
        return f"{name}@{run.record(name).device} ({tag})"

    results = []
    for (reference, sets, ours), (b_reference, _, theirs) in zip(a.groups(), b.groups()):
        ref = label(a, reference, tags[0])
        judged = {label(b, name, tags[1]): profile for name, profile in
                  {b_reference: b.record(b_reference).profile, **b.judged(b_reference)}.items()}
        rows = [{ref: mine[reference]} | {label(b, name, tags[1]): values
                                          for name, values in other.items()}
                for mine, other in zip(ours, theirs)]
        results += compare_sets(sets, rows, ref, judged, tolerances)
    return results


def comparable(a: RunResult, b: RunResult, names: tuple[str, str] = ("A", "B")) -> None:
    """Runs `a` and `b` are of the same bundle (every file's sha256) and fed the same inputs
    (every set's arrays and labels, bit for bit), or SavedRunError says how they differ,
    naming the runs by `names`."""
    first, second = names
    if a.files != b.files:
        name = next(n for n in sorted(set(a.files) | set(b.files))
                    if a.files.get(n) != b.files.get(n))
        hashes = [f"sha256 {run.files[name][:12]}" if name in run.files else "no such file"
                  for run in (a, b)]
        raise SavedRunError(f"{first} and {second} are runs of different bundles: {name}: "
                            f"{hashes[0]} in {first}, {hashes[1]} in {second}")
    for kind, mine, theirs in (("input set", a.sets, b.sets),
                               ("image set", a.image_sets, b.image_sets)):
        if _shown(mine) != _shown(theirs):
            raise SavedRunError(f"{first} and {second} ran on different inputs: {kind}s "
                                f"{_shown(mine)} in {first}, {_shown(theirs)} in {second}")
        for s, t in zip(mine, theirs):
            ours, others = set_digest(s), set_digest(t)
            if ours != others:
                raise SavedRunError(f"{first} and {second} ran on different inputs: {kind} "
                                    f"{s.name} differs (sha256 {ours[:12]} in {first}, "
                                    f"{others[:12]} in {second})")


def _shown(sets: Sequence[InputSet | ImageSet]) -> str:
    """Input sets for people: each one's name and size, "random(seed=0) x3"."""
    sizes = [len(s.x) if isinstance(s, InputSet) else len(s.images) for s in sets]
    return "[" + ", ".join(f"{s.name} x{n}" for s, n in zip(sets, sizes)) + "]"
