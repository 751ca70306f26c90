"""Does every exported artifact compute what eager PyTorch computes? Returns data, never prints.

`validate(bundle)` rebuilds eager PyTorch from weights.safetensors + config.json, runs it, the
TorchScript file and every ONNX model of the bundle (plain, optimized, fp16, int8) on the same
seeded inputs at batch sizes that prove the batch axis is dynamic, compares logits pair by
pair under each model's tolerance profile, and scans the ONNX graph for a batch size baked
into a shape constant. With `layers=True` it also compares the intermediate tensors stage by
stage and names the first stage that diverges.

Polygraphy's split: runners are built by `runtime.open_runners`, the run stage collects each
runner's whole outputs, the compare stage is pure functions over whole input sets, and
`render` turns the resulting report into text, Markdown or JUnit.
"""
from __future__ import annotations

import ast
import os
import re
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Optional

import numpy as np

from . import bundle as B
from . import runtime
from .errors import ParityError, first_line
from .model import random_input, size_values


@dataclass(frozen=True)
class Tolerance:
    atol: float  # max abs error on logits
    rtol: float  # max abs error over the largest reference magnitude (not numpy's
    # elementwise rtol: one number per comparison)
    min_cosine: float  # per-sample cosine similarity, the lowest one
    min_top1: float  # fraction of samples whose top-1 class agrees (near-ties excused)
    stage_rel_l2: float  # relative L2 error allowed on an intermediate stage (--layers)
    # An embedding on real images: the mean overlap of each image's 10 nearest neighbours,
    # ties excused. Set from scripts/embedding_precisions.py (README, "Embeddings"): the
    # lowest seen on 320 photos, tiny CLIP/SigLIP/DINOv2 with random weights, was fp16
    # 0.9997, e2e 0.9994, bf16 0.957, int8 0.931, static int8 0.956; a trained model's
    # embeddings spread further apart, and its neighbours flip less.
    min_neighbours: float = 1.0
    # Patch tokens ([B, N, D]): the lowest cosine of any one token. A token is one vector,
    # not a pool of many, so reduced precision moves it further. The lowest seen, on the
    # 320 photos of scripts/embedding_precisions.py (tiny CLIP/SigLIP/DINOv2) and on the
    # 360 held-out digits (the shipped model, 64 wide: the lower of the two each time), was
    # fp16 0.99998, e2e 0.99916, bf16 0.99873, int8 0.9892, static int8 0.9844; tf32 (CUDA
    # only) is not measured and keeps its per-sample cosine.
    min_token_cosine: float = 0.99999


# Profiles by precision. fp32 is the contract: max abs <= 1e-4 on logits, on CPU and on CUDA
# with TF32 off. Reduced precisions are judged mostly by direction (cosine) and decisions.
PROFILES = {
    "fp32": Tolerance(atol=1e-4, rtol=1e-4, min_cosine=0.99999, min_top1=1.0,
                      stage_rel_l2=1e-5),
    "tf32": Tolerance(atol=5e-3, rtol=5e-3, min_cosine=0.9999, min_top1=0.99,
                      stage_rel_l2=5e-3, min_neighbours=0.99, min_token_cosine=0.9999),
    "fp16": Tolerance(atol=5e-2, rtol=2e-2, min_cosine=0.999, min_top1=0.98,
                      stage_rel_l2=2e-2, min_neighbours=0.99, min_token_cosine=0.999),
    "int8": Tolerance(atol=float("inf"), rtol=0.25, min_cosine=0.99, min_top1=0.95,
                      stage_rel_l2=0.3, min_neighbours=0.9, min_token_cosine=0.98),
    # model.e2e.onnx against Pillow + eager: ONNX's Resize lands within a uint8 level or two
    # of Pillow's on a few pixels (README, "Preprocessing inside the model"); the logits
    # move by what those pixels move them, so decisions must agree, not every digit.
    "e2e": Tolerance(atol=0.1, rtol=0.02, min_cosine=0.999, min_top1=1.0, stage_rel_l2=1e-2,
                     min_neighbours=0.95, min_token_cosine=0.999),
    "int8-static": Tolerance(atol=float("inf"), rtol=0.25, min_cosine=0.99, min_top1=0.98,
                             stage_rel_l2=0.3, min_neighbours=0.9, min_token_cosine=0.98),
    # bf16 compute of the fp32 model (OpenVINO's bf16 runner): 8 bits of mantissa, so
    # direction and decisions, as for fp16, with the cosine and top-1 of issue 12.
    "bf16": Tolerance(atol=float("inf"), rtol=0.05, min_cosine=0.9995, min_top1=0.99,
                      stage_rel_l2=5e-2, min_neighbours=0.9, min_token_cosine=0.998),
}


def profile_tolerance(profile: str, overrides: Optional[dict[str, float]] = None) -> Tolerance:
    if profile not in PROFILES:
        raise ParityError(f"unknown tolerance profile {profile!r}; choose one of "
                          f"{', '.join(PROFILES)}")
    given = {k: v for k, v in (overrides or {}).items() if v is not None}
    if "min_cosine" in given:  # --min-cosine: per sample, and per token
        given.setdefault("min_token_cosine", given["min_cosine"])
    return replace(PROFILES[profile], **given)


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


@dataclass
class StageResult:
    """One intermediate tensor of one ONNX model against eager (validate --layers)."""
    model: str
    stage: str  # our module path: patch_embed, pos_embed, blocks.3.attn, blocks.3, norm, ...
    label: str  # for people: "block 3 attention"
    batch: int
    max_abs: float
    rel_l2: float
    cosine: float
    passed: bool


@dataclass
class Check:
    name: str
    passed: bool
    detail: str


def _finite(value: Any) -> Any:
    """`value` with every non-finite float replaced by None (JSON has no Infinity or NaN)."""
    if isinstance(value, float):
        return value if np.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite(v) for v in value]
    return value


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
    image_sizes: list[list[int]]  # [H, W] of the random inputs; several for a dynamic size
    export_batch: int
    profiles: dict[str, Tolerance]
    results: list[PairResult]
    checks: list[Check]
    stages: list[StageResult]
    first_divergence: dict[str, str]  # ONNX model or model.pt2 -> "block 7 MLP first exceeds rel L2 1e-05"
    placement: dict[str, dict[str, dict[str, int]]]  # CUDA only: model -> op -> provider -> n
    notes: list[str]
    versions: dict[str, str]
    outputs: list[str] = field(default_factory=lambda: ["logits"])  # the model's, compared

    @staticmethod
    def agreement(output: str) -> str:
        """The name of what a result's `top1` measures for `output`, for people."""
        return {"logits": "top-1", "embedding": f"nn@{NEIGHBOURS}"}.get(output, "-")

    def to_dict(self) -> dict[str, Any]:
        """As parity.json holds it: standard JSON, so an infinite value (a profile's "no
        limit" on max abs, the error of a wrong-shaped output) is null."""
        return _finite(asdict(self))

    @property
    def failures(self) -> list[str]:
        """One line per failed item; the JUnit file has one failed test case per line."""
        lines = [f"{c.name}: {c.detail}" for c in self.checks if not c.passed]
        lines += [f"{r.candidate} batch {r.batch} ({r.inputs}): {'; '.join(r.failures)}"
                  for r in self.results if not r.passed]
        lines += [f"{s.model} {s.label} batch {s.batch}: rel L2 {s.rel_l2:.3g}"
                  for s in self.stages if not s.passed]
        return lines


NEIGHBOURS = 10  # an embedding's decisions: each sample's nearest neighbours in its set


# Neighbours whose reference cosines differ by less than this are tied: float32 rounding
# of a dot product of unit vectors, not a decision.
NEIGHBOUR_TIE = 1e-5
# Fewer images cannot judge neighbours: with k + 1 every other image is one, and any random
# ranking overlaps by about k / (N - 1). From this many, chance is at most a third.
MIN_NEIGHBOUR_IMAGES = 3 * NEIGHBOURS + 1


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
        cosine = float(_cosines(ref.reshape(-1, ref.shape[-1]),
                                cand.reshape(-1, cand.shape[-1])).min()) if ref.size else 1.0
    else:
        cosine = float(_cosines(r2, c2).min()) if len(r2) else 1.0
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


def _cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    norms = np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1)
    return np.where(norms > 0, (a * b).sum(axis=1) / np.maximum(norms, 1e-300), 1.0)


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


def scan_graph(onnx_path: str | os.PathLike, export_batch: int, config=None,
               export_size: Optional[Sequence[int]] = None) -> list[Check]:
    """Static checks: symbolic batch on input and output; no shape constant = export batch.

    The "baked batch" bug: a Reshape/Expand/Tile whose shape (or repeats) is a constant with
    the export batch size in the batch position; the graph then only runs at that batch.
    For a dynamic-size model (`config.dynamic_img_size`, exported at `export_size`) the
    input's height and width must be symbolic too, and no Reshape/Expand/Tile constant may
    hold a number of the example's size (its sides, grid or token count, chosen by
    export.example_size to differ from every size of the model itself), nor a Resize take
    constant sizes.
    """

    graph = B.read_onnx(onnx_path).graph
    name = Path(onnx_path).name
    checks = []
    for value in list(graph.input) + list(graph.output):
        dims = value.type.tensor_type.shape.dim
        symbolic = bool(dims) and bool(dims[0].dim_param)
        shown = dims[0].dim_param or dims[0].dim_value if dims else "none"
        checks.append(Check(f"{name}: symbolic batch axis on {value.name}", symbolic,
                            f"dim 0 is {shown!r}"))
    shaping = [n for n in graph.node
               if n.op_type in ("Reshape", "Expand", "Tile") and len(n.input) > 1]
    constants = _constant_values(graph, {n.input[1] for n in shaping})
    baked = []
    for node in shaping:
        shape = constants.get(node.input[1])
        if "rope" in node_scopes(node):  # the rotary table has no batch axis (mixed: depth)
            continue
        if shape is not None and shape.ndim == 1 and shape.size > 1 \
                and int(shape[0]) == export_batch:
            baked.append(f"{node.op_type} {node.name or node.output[0]} {shape.tolist()}")
    checks.append(Check(
        f"{name}: no baked batch in shape constants", not baked,
        f"{len(baked)} node(s) with batch {export_batch} baked in: {'; '.join(baked[:3])}"
        if baked else f"no Reshape/Expand/Tile constant starts with {export_batch}"))
    if config is not None and config.dynamic_img_size and export_size:
        checks += _scan_sizes(graph, name, config, export_size, shaping, constants)
    if config is not None and config.rope_type:
        checks.append(_scan_rope(graph, name, config, export_size))
    return checks


def _scan_rope(graph, name: str, config, export_size: Optional[Sequence[int]]) -> Check:
    """Where a rotary model's tables come from. Under a dynamic size the graph must compute
    them from the input's grid: Sin and Cos nodes, and no constant shaped like the example's
    table ([.., N, 2 head_dim], N its patch count). At a fixed size they may be constants
    (the exporters fold them); which it is, is said."""
    P, width = config.patch_size, 2 * (config.embed_dim // config.num_heads)
    h, w = export_size if config.dynamic_img_size and export_size else (config.img_size,) * 2
    n = (h // P) * (w // P)
    shapes = [(i.name, list(i.dims)) for i in graph.initializer]
    shapes += [(node.output[0], list(a.t.dims)) for node in graph.node
               if node.op_type == "Constant" for a in node.attribute if a.name == "value"]
    tables = [f"{k} {dims}" for k, dims in shapes if dims[-2:] == [n, width]]
    trig = sum(node.op_type in ("Sin", "Cos") for node in graph.node)
    if config.dynamic_img_size:
        return Check(f"{name}: rotary tables computed from the input's grid",
                     trig >= 2 and not tables,
                     f"{trig} Sin/Cos node(s); constant(s) shaped like the {h}x{w} example's "
                     f"table: {', '.join(tables[:3]) or 'none'}")
    return Check(f"{name}: rotary tables of the {h // P}x{w // P} grid", bool(tables) or trig >= 2,
                 f"folded to constant(s): {', '.join(tables[:3])}" if tables else
                 f"computed in the graph ({trig} Sin/Cos node(s))")


def scan_program(path: str | os.PathLike, config) -> list[Check]:
    """The "baked batch" question for a torch.export program, from the program itself: the
    input's batch axis (and, for a dynamic-size model, its height and width) is a symbol in
    its range constraints, not a number."""
    import torch

    from .pt2 import symbolic_axes

    name = Path(path).name
    try:
        axes = symbolic_axes(torch.export.load(str(path)))
    except Exception as exc:  # deserialization raises many error types
        raise ParityError(f"cannot read the program in {name}: {first_line(exc)}") from None
    wanted = [(0, "batch")] + ([(2, "height"), (3, "width")] if config.dynamic_img_size else [])
    checks = []
    for axis, what in wanted:
        bound = axes.get(axis)
        detail = (f"dim {axis} ranges over [{bound[0]}, {bound[1]}] in the range constraints"
                  if bound else f"dim {axis} is a fixed size")
        checks.append(Check(f"{name}: symbolic {what} axis on {B.INPUT_NAME}",
                            bound is not None and bound[0] < bound[1], detail))
    return checks


def unseen_batch_check(name: str, results: Sequence[PairResult], export_batch: int
                       ) -> Check:
    """A compiled artifact that keeps no graph to scan (an AOTInductor package) shows its
    batch is not baked in by running, and agreeing, at batch sizes it was not made at."""
    ran = sorted({r.batch for r in results if r.candidate == name and r.batch != export_batch})
    failed = {r.batch for r in results if r.candidate == name and not r.passed}
    agreed = [batch for batch in ran if batch not in failed]  # every output agreed
    return Check(f"{name}: runs at batch sizes it was not compiled at", bool(ran) and
                 agreed == ran, f"compiled at batch {export_batch}; agreed with eager at "
                 f"{', '.join(map(str, agreed)) or 'none'} of {', '.join(map(str, ran)) or 'none'}")


# Ops that only a quantized graph holds: ONNX Runtime's dynamic (MatMulInteger, ...) and
# static (QDQ or QOperator) formats.
QUANTIZED_OPS = {"DynamicQuantizeLinear", "MatMulInteger", "MatMulIntegerToFloat",
                 "DynamicQuantizeMatMul", "QuantizeLinear", "DequantizeLinear", "QLinearMatMul",
                 "QLinearConv", "ConvInteger", "QGemm", "QAttention", "QLinearAdd"}


def graph_precision(onnx_path: str | os.PathLike) -> str:
    """What the file is, whatever config.json says: "int8" if it holds quantized ops,
    "fp16" or "bf16" if most weight elements are stored so, else "fp32"."""
    import onnx

    graph = B.read_onnx(onnx_path).graph
    if any(node.op_type in QUANTIZED_OPS for node in graph.node):
        return "int8"
    elements: dict[int, int] = {}
    for tensor in graph.initializer:
        count = int(np.prod(tensor.dims)) if tensor.dims else 1
        elements[tensor.data_type] = elements.get(tensor.data_type, 0) + count
    if not elements:
        return "fp32"
    most = max(elements, key=elements.get)
    return {onnx.TensorProto.FLOAT16: "fp16", onnx.TensorProto.BFLOAT16: "bf16"}.get(most, "fp32")


def precision_of_profile(profile: str) -> str:
    """The storage precision a profile is for: "tf32" judges an fp32 file, "int8-static" an
    int8 one."""
    return "fp32" if profile == "tf32" else re.split("[-_]", profile)[0]


def judged_profiles(bundle: B.Bundle, profile: Optional[str] = None
                    ) -> tuple[dict[str, str], list[Check]]:
    """The profile each ONNX model is judged by, and a check per model that the precision
    config.json declares is the one its graph holds: a looser profile cannot be claimed for
    an fp32 file. A mismatch fails and the model is judged by what it is. `profile` replaces
    the profile of the models it is for (tf32: the fp32 ones; an fp16 model beside them keeps
    fp16)."""
    models, checks = {}, []
    for name, declared in bundle.onnx_models.items():
        found = graph_precision(bundle.file(name))
        agrees = precision_of_profile(declared) == found
        checks.append(Check(f"{name}: precision is the declared {declared}", agrees,
                            f"the graph holds {found} weights and ops"))
        own = declared if agrees else found
        models[name] = profile if profile and precision_of_profile(profile) == \
            precision_of_profile(own) else own
    if profile and profile not in models.values():
        raise ParityError(f"--profile {profile} is for {precision_of_profile(profile)} models, "
                          f"and this bundle has none ({', '.join(sorted(models))})")
    return models, checks


def _scan_sizes(graph, name: str, config, export_size: Sequence[int], shaping,
                constants: dict[str, np.ndarray]) -> list[Check]:
    """The dynamic-size half of scan_graph."""
    dims = graph.input[0].type.tensor_type.shape.dim
    sides = [d.dim_param or d.dim_value for d in dims[2:4]]
    checks = [Check(f"{name}: symbolic height and width on {graph.input[0].name}",
                    len(sides) == 2 and all(isinstance(s, str) and s for s in sides),
                    f"dims 2 and 3 are {sides}")]
    h, w = export_size
    telling = size_values(config, h // config.patch_size, w // config.patch_size)
    baked = []
    for node in shaping:
        shape = constants.get(node.input[1])
        if shape is None:
            continue
        hits = sorted({telling[int(v)] for v in shape.reshape(-1) if int(v) in telling})
        if hits:
            baked.append(f"{node.op_type} {node.name or node.output[0]} {shape.tolist()} "
                         f"({', '.join(hits)})")
    resizes = [n for n in graph.node if n.op_type == "Resize" and len(n.input) > 3]
    fixed = _constant_values(graph, {n.input[3] for n in resizes})
    baked += [f"Resize {n.name or n.output[0]} to constant sizes {fixed[n.input[3]].tolist()}"
              for n in resizes if n.input[3] in fixed]
    checks.append(Check(
        f"{name}: no baked image size in shape constants", not baked,
        f"{len(baked)} node(s) with the {h}x{w} example's size baked in: "
        f"{'; '.join(baked[:3])}" if baked else
        f"no Reshape/Expand/Tile constant holds {sorted(telling)} (the {h}x{w} example's "
        f"sides, grid and tokens), no Resize to constant sizes"))
    return checks


def validation_sizes(config) -> list[tuple[int, int]]:
    """Image sizes a dynamic-size model is validated at: the native one, a smaller and a
    larger multiple of the patch (5/7 and 9/7 of it: 160 and 288 for 224), and a
    non-square one (native x smaller). A fixed-size model: the native one only."""
    native = config.img_size
    if not config.dynamic_img_size:
        return [(native, native)]
    P = config.patch_size

    def side(fraction: float) -> int:
        return max(P, round(native * fraction / P) * P)

    smaller, larger = side(5 / 7), side(9 / 7)
    return list(dict.fromkeys([(native, native), (smaller, smaller), (larger, larger),
                               (native, smaller)]))


def default_batch_sizes(export_batch: int) -> list[int]:
    """1, the export batch + 1, and the prime 7: the batch axis must really be dynamic."""
    return sorted({1, export_batch + 1, 7})


# ---------------------------------------------------------------- per-stage divergence


def stage_names(config) -> list[tuple[str, str]]:
    """(module path, label) of each stage, in forward order; only modules the config has."""
    stages = [("patch_embed", "patch embedding"), ("pos_embed", "position embedding")]
    if config.rope_type:  # where the graph computes it: a dynamic size, or kept fp32 in fp16
        stages.append(("rope", "rotary table"))
    if config.pre_norm:
        stages.append(("norm_pre", "pre-norm"))
    attention = "rotary attention" if config.rope_type else "attention"
    mlp = "SwiGLU MLP" if config.mlp_layer.startswith("swiglu") else "MLP"
    for i in range(config.depth):
        stages.append((f"blocks.{i}.attn", f"block {i} {attention}"))
        if config.init_values:
            stages.append((f"blocks.{i}.ls1", f"block {i} attention LayerScale"))
        stages.append((f"blocks.{i}.mlp", f"block {i} {mlp}"))
        if config.init_values:
            stages.append((f"blocks.{i}.ls2", f"block {i} MLP LayerScale"))
        stages.append((f"blocks.{i}", f"block {i} output"))
    if config.final_norm and not config.use_fc_norm:
        stages.append(("norm", "final norm"))
    if config.global_pool == "map":
        stages.append(("attn_pool", "attention pool"))
    if config.final_norm and config.use_fc_norm:
        stages.append(("fc_norm", "norm after pooling"))
    return stages


def _entry(config) -> str:
    """The module that takes the tokens with their position embedding: the "pos_embed"
    stage is what it receives."""
    return "norm_pre" if config.pre_norm else "blocks.0"


def eager_stages(model, x) -> dict[str, np.ndarray]:
    """Intermediate tensors of the eager model, by forward hooks."""
    import torch

    captured: dict[str, np.ndarray] = {}
    handles = []

    def keep(name):
        return lambda module, args, out: captured.__setitem__(name, out.float().cpu().numpy())

    modules = dict(model.named_modules())
    for name, _ in stage_names(model.config):
        if name == "pos_embed":  # what the entry receives: tokens + position embedding
            handles.append(modules[_entry(model.config)].register_forward_pre_hook(
                lambda module, args: captured.__setitem__(
                    "pos_embed", args[0].float().cpu().numpy())))
        else:
            handles.append(modules[name].register_forward_hook(keep(name)))
    try:
        device = next(model.parameters()).device
        with torch.inference_mode():
            model(torch.from_numpy(x).to(device))
    finally:
        for h in handles:
            h.remove()
    return captured


def node_scopes(node) -> list[str]:
    """Module paths a node sits in, from the exporter's metadata (dynamo) or name (TorchScript)."""
    for prop in node.metadata_props:
        if prop.key == "pkg.torch.onnx.name_scopes":
            try:
                return [s for s in ast.literal_eval(prop.value)[:-1] if s]
            except (ValueError, SyntaxError):
                return []
    if node.name.startswith("/"):
        parts = node.name.split("/")[1:-1]
        return [".".join(parts[:i + 1]) for i in range(len(parts))]
    return []


def onnx_stage_values(proto, config) -> dict[str, str]:
    """Module path -> the ONNX value that is that module's output.

    A module's output is the last value produced inside its scope and consumed outside it,
    unless a fused ONNX Runtime node consumes it.
    "pos_embed" is what the entry module (the first block, or norm_pre) consumes from
    outside itself.
    """
    nodes = list(proto.graph.node)
    scopes = [set(node_scopes(n)) for n in nodes]
    graph_outputs = {o.name for o in proto.graph.output}
    consumers: dict[str, list[int]] = {}
    for i, n in enumerate(nodes):
        for name in n.input:
            consumers.setdefault(name, []).append(i)
    found = {}
    for stage, _ in stage_names(config):
        if stage == "pos_embed":
            inside = [i for i, s in enumerate(scopes) if _entry(config) in s]
            produced = {o for i in inside for o in nodes[i].output}
            entering = [v for i in inside for v in nodes[i].input
                        if v and v not in produced and not _is_constant(proto, v)]
            if entering:
                found[stage] = entering[0]
            continue
        inside = {i for i, s in enumerate(scopes) if stage in s}
        for i in sorted(inside, reverse=True):
            out = nodes[i].output[0]
            outside = [c for c in consumers.get(out, []) if c not in inside]
            if out in graph_outputs or outside:
                # An ONNX Runtime fusion (com.microsoft, no scope) that takes it may hold the
                # rest of the module: SkipLayerNormalization holds the projection's bias and
                # the residual Add. Then the module has no output of its own to compare.
                if not any(nodes[c].domain == "com.microsoft" for c in outside):
                    found[stage] = out
                break
    return found


def _is_constant(proto, name: str) -> bool:
    return any(t.name == name for t in proto.graph.initializer) or any(
        n.op_type == "Constant" and name in n.output for n in proto.graph.node)


def onnx_stages(onnx_path: Path, config, x: np.ndarray, device: str, tf32: bool = False
                ) -> dict[str, np.ndarray]:
    """Run a temporary copy of the model with the stage values as extra graph outputs.

    The model file itself is never modified; external data is linked, not copied.
    """
    import onnx
    from onnx import shape_inference

    proto = B.read_onnx(onnx_path)
    values = onnx_stage_values(proto, config)
    if not values:
        return {}
    typed = onnx.ModelProto()
    typed.CopyFrom(proto)
    del typed.graph.value_info[:]  # infer types afresh; converters may leave stale ones
    types = {v.name: v.type.tensor_type.elem_type
             for v in shape_inference.infer_shapes(typed).graph.value_info}
    for value in values.values():
        proto.graph.output.append(onnx.helper.make_tensor_value_info(
            value, types.get(value, onnx.TensorProto.FLOAT), None))
    with tempfile.TemporaryDirectory(prefix="vit-export-layers-") as tmp:
        copy = Path(tmp) / onnx_path.name
        onnx.save(proto, str(copy))
        for data in onnx_path.parent.glob(onnx_path.name + ".data"):
            os.symlink(data.resolve(), Path(tmp) / data.name)
        runner = runtime.create_session(copy, device, tf32=tf32)
        names = [o.name for o in runner.session.get_outputs()]
        outputs = dict(zip(names, runner.session.run(
            None, {runner.input.name: runner.cast_input(x)})))
    return {stage: outputs[value].astype(np.float32) for stage, value in values.items()}


def program_stages(path: Path, config, x: np.ndarray, device: str) -> dict[str, np.ndarray]:
    """The stage values of a torch.export program (model.pt2), by running its graph node by
    node: a module's output is the last node inside its scope (the nn_module_stack torch.export
    records), "pos_embed" what the first block takes from outside itself."""
    import torch

    try:
        program = torch.export.load(str(path))
        if device != "cpu":
            from torch.export.passes import move_to_device_pass

            program = move_to_device_pass(program, device)
    except Exception as exc:  # deserialization raises many error types
        raise ParityError(f"cannot read the program in {path.name}: {first_line(exc)}") from None
    module = program.module()
    nodes = [n for n in module.graph.nodes if n.op == "call_function"]

    def scopes(node) -> set[str]:
        return {path for path, _ in (node.meta.get("nn_module_stack") or {}).values()}

    wanted = {}
    for stage, _ in stage_names(config):
        if stage == "pos_embed":
            entry = _entry(config)
            first = next((n for n in nodes if entry in scopes(n)), None)
            entering = [a for a in (first.all_input_nodes if first else ())
                        if a.op == "call_function" and entry not in scopes(a)]
            if entering:
                wanted[entering[0]] = stage
            continue
        inside = [n for n in nodes if stage in scopes(n)]
        if inside:
            wanted[inside[-1]] = stage
    captured: dict[str, np.ndarray] = {}

    class Keep(torch.fx.Interpreter):
        def run_node(self, node):
            out = super().run_node(node)
            if node in wanted and isinstance(out, torch.Tensor):
                captured[wanted[node]] = out.float().cpu().numpy()
            return out

    with torch.inference_mode():
        Keep(module).run(torch.from_numpy(x).to(device))
    return captured


def compare_stages(model, path: Path, x: np.ndarray, device: str,
                   tol: Tolerance, tf32: bool = False) -> list[StageResult]:
    """Each stage of the ONNX model or torch.export program at `path` against eager's."""
    ours = eager_stages(model, x)
    theirs = (program_stages(path, model.config, x, device) if path.name == B.PT2_FILE
              else onnx_stages(path, model.config, x, device, tf32))
    results = []
    for stage, label in stage_names(model.config):
        if stage not in theirs or stage not in ours:
            continue
        rows = 1 if stage == "rope" else len(x)  # the rotary table has no batch axis
        a = ours[stage].astype(np.float64).reshape(rows, -1)
        b = theirs[stage].astype(np.float64).reshape(rows, -1)
        if a.shape != b.shape:
            continue
        norm = np.linalg.norm(a)
        rel_l2 = float(np.linalg.norm(a - b) / norm) if norm > 0 else float(np.linalg.norm(b))
        results.append(StageResult(
            path.name, stage, label, len(x), float(np.abs(a - b).max()), rel_l2,
            float(_cosines(a, b).min()), rel_l2 <= tol.stage_rel_l2))
    return results


# ---------------------------------------------------------------- run, then compare


# Real data runs in batches of this size, whatever --batch-sizes says (those prove the batch
# axis on random inputs). A fixed size keeps results reproducible: a dynamic int8 model picks
# one activation scale per batch, so its output for an image depends on the batch it is in.
REAL_DATA_BATCH = 32


@dataclass
class InputSet:
    """Inputs fed to every runner: one random batch, or a real-data set run in chunks."""
    name: str  # "random(seed=0)" or the name of a real-data set
    x: np.ndarray  # [N, C, H, W]
    labels: Optional[np.ndarray] = None  # [N] true classes, when known
    chunk: Optional[int] = None  # run in batches of this size to bound memory (None: one)
    real: bool = False  # images (or arrays) a user gave, not seeded random numbers


# A dynamic-size model is also run at each other image size, on one batch of this size.
OTHER_SIZE_BATCH = 2


def input_sets(config, batch_sizes: Sequence[int], seed: int,
               real_inputs: Optional[dict[str, tuple[np.ndarray, Optional[np.ndarray]]]] = None,
               image_sizes: Sequence[tuple[int, int]] = ()) -> list[InputSet]:
    """One seeded random batch per batch size at the native size, one at each other image
    size (a dynamic-size model), then each real-data set whole."""
    sets = [InputSet(f"random(seed={seed})", random_input(config, b, seed).numpy())
            for b in batch_sizes]
    native = (config.img_size, config.img_size)
    sets += [InputSet(f"random(seed={seed}) {h}x{w}",
                      random_input(config, OTHER_SIZE_BATCH, seed, size=(h, w)).numpy())
             for h, w in image_sizes if (h, w) != native]
    sets += [InputSet(name, data, labels, chunk=REAL_DATA_BATCH, real=True)
             for name, (data, labels) in (real_inputs or {}).items()]
    return sets


def run_stage(runners: Sequence[runtime.Runner], sets: Sequence[InputSet],
              progress: Optional[Callable[[str], None]] = None
              ) -> list[dict[str, dict[str, np.ndarray]]]:
    """Every output of every runner on every input set: [set index] -> runner -> output
    name -> values, e.g. [N, K] logits.

    One runner at a time on every set: those open already first, then each deferred one
    (runtime.Deferred) is opened, run and released, so no two candidates' weights are held
    at once. The first runner, the reference, is kept."""
    outputs: list[dict[str, dict[str, np.ndarray]]] = [{} for _ in sets]
    waiting = [i > 0 and not getattr(r, "opened", True) for i, r in enumerate(runners)]
    order = [r for r, w in zip(runners, waiting) if not w] + \
        [r for r, w in zip(runners, waiting) if w]
    for runner in order:
        for s, row in zip(sets, outputs):
            step = s.chunk or len(s.x)
            if progress:
                progress(f"running {runner.name} on {s.name}, {len(s.x)} input(s)")
            chunks = [runner.run_all(s.x[i:i + step]) for i in range(0, len(s.x), step)]
            row[runner.name] = {name: np.concatenate([c[name] for c in chunks])
                                for name in chunks[0]}
        if runner is not runners[0] and hasattr(runner, "release"):
            runner.release()
    return outputs


def compare_sets(sets: Sequence[InputSet], outputs: Sequence[dict[str, dict[str, np.ndarray]]],
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
                results.append(_pair(reference, name, profile, s.name, s.labels, output, ref,
                                     row[name].get(output), tolerances[profile], s.real))
    return results


def _pair(reference: str, name: str, profile: str, inputs: str,
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


# ---------------------------------------------------------------- model.e2e.onnx


E2E_REFERENCE = "pillow+eager"  # our Python pipeline (images.preprocess), then eager PyTorch


def e2e_images(config, seed: int = 0) -> list[np.ndarray]:
    """Seeded Pillow-made pictures, uint8 [H, W, C]: smooth colour fields with hard-edged
    shapes, at the model's size and at larger, smaller, landscape and portrait sizes, so
    the graph's resize both shrinks and enlarges and its crop moves on both axes."""
    from PIL import Image, ImageDraw

    rng = np.random.default_rng(seed)
    S, C = config.img_size, config.in_chans
    sizes = [(S, S), (int(1.9 * S) + 1, int(1.3 * S)), (int(0.8 * S) + 1, int(1.45 * S)),
             (max(1, int(0.6 * S)) + 1, max(1, int(0.7 * S)) + 1)]  # (width, height)
    mode = "L" if C == 1 else "RGB"
    pictures = []
    for width, height in sizes:
        field = rng.integers(0, 256, (5, 6, C), dtype=np.uint8)
        image = Image.fromarray(field.squeeze(-1) if C == 1 else field, mode).resize(
            (width, height), Image.Resampling.BICUBIC)
        draw = ImageDraw.Draw(image)
        for _ in range(3):
            x0, y0 = int(rng.integers(0, width)), int(rng.integers(0, height))
            box = (x0, y0, x0 + int(rng.integers(1, width + 1)), y0 + int(rng.integers(1, height + 1)))
            colour = tuple(int(v) for v in rng.integers(0, 256, C))
            (draw.ellipse if rng.random() < 0.5 else draw.rectangle)(
                box, fill=colour if C > 1 else colour[0])
        pictures.append(np.asarray(image).reshape(height, width, C))
    return pictures


@dataclass
class ImageSet:
    """uint8 images [H, W, C] (sizes may differ) for model.e2e.onnx, with labels when known."""
    name: str
    images: list[np.ndarray]
    labels: Optional[np.ndarray] = None
    real: bool = False  # a user's images, not our seeded pictures


def _by_size(images: Sequence[np.ndarray]) -> list[list[int]]:
    """Indices of the images, grouped by size (one batch per size), in chunks."""
    groups: dict[tuple[int, ...], list[int]] = {}
    for i, image in enumerate(images):
        groups.setdefault(image.shape, []).append(i)
    return [g[i:i + REAL_DATA_BATCH] for g in groups.values()
            for i in range(0, len(g), REAL_DATA_BATCH)]


def run_e2e(reference: runtime.Runner, e2e: runtime.Runner, prep, image_sets: Sequence[ImageSet]
            ) -> list[dict[str, dict[str, np.ndarray]]]:
    """Each set through Pillow + eager and through model.e2e.onnx: set -> runner -> output
    name -> values."""
    from PIL import Image

    from .preprocessing import preprocess

    outputs = []
    for s in image_sets:
        pixels = np.stack([preprocess(Image.fromarray(im.squeeze(-1) if im.shape[-1] == 1
                                                      else im), prep) for im in s.images])
        chunks = [reference.run_all(pixels[i:i + REAL_DATA_BATCH])
                  for i in range(0, len(pixels), REAL_DATA_BATCH)]
        ours = {name: np.concatenate([c[name] for c in chunks]) for name in chunks[0]}
        theirs: dict[str, np.ndarray] = {}  # an output the graph lacks stays out: "no output"
        for group in _by_size(s.images):
            for name, values in e2e.run_all(np.stack([s.images[i] for i in group])).items():
                if name in ours:
                    theirs.setdefault(name, np.empty_like(ours[name]))[group] = values
        outputs.append({E2E_REFERENCE: ours, e2e.name: theirs})
    return outputs


def compare_e2e(image_sets: Sequence[ImageSet],
                outputs: Sequence[dict[str, dict[str, np.ndarray]]],
                name: str, tol: Tolerance) -> list[PairResult]:
    """model.e2e.onnx against Pillow + eager on each whole set, output by output (pure)."""
    return [_pair(E2E_REFERENCE, name, "e2e", s.name, s.labels, output, ref,
                  row[name].get(output), tol, s.real)
            for s, row in zip(image_sets, outputs)
            for output, ref in row[E2E_REFERENCE].items()]


def placement_check(model: str, placement: dict[str, dict[str, int]],
                    require_provider: Optional[str]) -> Check:
    """Heavy ops on the CPU provider of a CUDA session: named always, failed under
    `require_provider == "cuda"`."""
    on_cpu = runtime.heavy_ops_on_cpu(placement)
    light = sorted(op for op, by in placement.items()
                   if by.get(runtime.PROVIDERS["cpu"]) and op not in on_cpu)
    detail = (f"heavy ops on CPU: {', '.join(f'{op} x{n}' for op, n in on_cpu.items())}"
              if on_cpu else "every heavy op on CUDA")
    if light:
        detail += f"; shape ops on CPU: {', '.join(light)}"
    return Check(f"{model}: computed on CUDA", not (on_cpu and require_provider == "cuda"),
                 detail)


def pipeline_check(reference: runtime.Runner, prep: B.Preprocessing,
                   files: Sequence[str | os.PathLike], atol: float, output: str = "logits"
                   ) -> tuple[Optional[Check], Optional[str]]:
    """Our preprocessing against the one of the framework it came from, end to end: the
    reference model on both tensors of each image file, compared on its first `output`. It
    fails when a top-1 class differs or the values differ by more than `atol` (the peers
    resize with Pillow, as we do, so they agree to rounding). Without such a framework, a
    note says why and nothing fails."""
    from .errors import InputError
    from .images import load_image, open_image
    from .preprocessing import framework_pipeline

    try:
        name, theirs = framework_pipeline(prep)
    except InputError as exc:
        return None, str(exc)
    ours = np.stack([load_image(f, prep) for f in files])
    peer = np.stack([open_image(f, theirs) for f in files]).astype(np.float32)
    a, b = reference(ours), reference(peer)
    out, pixels = float(np.abs(a - b).max()), float(np.abs(ours - peer).max())
    if output != "logits":  # no classes to agree on: the vectors themselves
        return Check(f"images: our preprocessing vs {name}", out <= atol,
                     f"{len(files)} image(s): {output} max abs {out:.2e}, pixels max abs "
                     f"{pixels:.2e}"), None
    agree = float(np.mean(a.argmax(1) == b.argmax(1)))
    return Check(f"images: our preprocessing vs {name}", agree == 1.0 and out <= atol,
                 f"{len(files)} image(s): top-1 agreement {agree:.1%}, logits max abs "
                 f"{out:.2e}, pixels max abs {pixels:.2e}"), None


def validate(path: str | os.PathLike, batch_sizes: Optional[Sequence[int]] = None, *,
             provider: str = runtime.DEFAULT_PROVIDER, seed: int = 0,
             overrides: Optional[dict[str, float]] = None,
             real_inputs: Optional[dict[str, tuple[np.ndarray, Optional[np.ndarray]]]] = None,
             layers: bool = False, require_provider: Optional[str] = None,
             profile: Optional[str] = None,
             image_sizes: Optional[Sequence[tuple[int, int]]] = None,
             raw_images: Optional[dict[str, tuple[list[np.ndarray], Optional[np.ndarray]]]]
             = None,
             image_files: Optional[Sequence[str | os.PathLike]] = None,
             openvino: bool = False,
             progress: Optional[Callable[[str], None]] = None) -> ParityReport:
    """Compare eager PyTorch with TorchScript, the torch.export program, the AOTInductor
    package and every ONNX model of the bundle at `path`.

    Every runner is built on one device: the one ONNX Runtime really runs on for `provider`
    (eager PyTorch runs there too). `overrides` replaces tolerance fields (atol, rtol,
    min_cosine) in every profile. `real_inputs` maps a name to (preprocessed [N, C, H, W]
    array, labels [N] or None), e.g. held-out images; each set is judged whole, and with
    labels the report gives every runner's accuracy. `layers` adds the per-stage comparison
    of each ONNX model and of model.pt2 at the smallest batch size. `require_provider`
    ("cuda" or "cpu") fails the report when another provider ran. `profile` judges every ONNX model by that
    profile instead of its own (e.g. "tf32"). A dynamic-size bundle is also run at
    `image_sizes` (H, W) on random inputs, by default `validation_sizes`; its graph scan
    proves no size was baked in. A bundle with model.e2e.onnx has it run on uint8 images:
    seeded Pillow-made pictures (`e2e_images`) and `raw_images` (name -> (uint8 [H, W, C]
    images, labels or None)), against our Python pipeline + eager under the "e2e" profile.
    `openvino` adds OpenVINO's CPU runners of the ONNX models (`runtime.openvino_runners`),
    each judged by its file's profile, and its bf16 runner by the bf16 profile. `progress`
    is told each step as it starts.
    """
    bundle = B.read_bundle(path)
    export_batch = int(bundle.description.export.get("export_batch", 2))
    sizes = sorted(set(batch_sizes)) if batch_sizes else default_batch_sizes(export_batch)
    if any(b < 1 for b in sizes):
        raise ParityError(f"batch sizes must be >= 1, got {sizes}")
    config = bundle.config
    sizes_hw = [tuple(s) for s in image_sizes] if image_sizes else validation_sizes(config)
    if not config.dynamic_img_size and sizes_hw != [(config.img_size, config.img_size)]:
        raise ParityError(f"{path} takes {config.img_size}x{config.img_size} images only; "
                          f"other sizes need a dynamic-size bundle (export --dynamic-size)")
    bad = [f"{h}x{w}" for h, w in sizes_hw
           if h < 1 or w < 1 or h % config.patch_size or w % config.patch_size]
    if bad:
        raise ParityError(f"image size {bad[0]} is not a multiple of the patch size "
                          f"{config.patch_size}")
    export_size = bundle.description.export.get("export_size")
    models, precision_checks = judged_profiles(bundle, profile)
    # --profile tf32 judges ONNX Runtime computing in TF32 (CUDA's use_tf32) against eager
    # in full fp32: the reference never computes in reduced precision
    tf32 = profile == "tf32"
    with runtime.tf32(False):
        runners = runtime.open_runners(bundle, provider, openvino=openvino, tf32=tf32,
                                       deferred=True)
        if tf32 and runners.device != "cuda":
            raise ParityError(f"--profile tf32 judges TF32 compute, which ONNX Runtime has on "
                              f"CUDA only, and this run is on {runners.device}")
        judged = {r.name: (runners.computes.get(r.name) or models[runners.onnx_files[r.name]])
                  if r.name in runners.onnx_files else "fp32" for r in runners.candidates}
        tolerances = {p: profile_tolerance(p, overrides) for p in set(judged.values()) | {"fp32"}}
        sets = input_sets(config, sizes, seed, real_inputs, sizes_hw)
        outputs = run_stage(runners.runners, sets, progress)
        results = compare_sets(sets, outputs, runners.reference.name, judged, tolerances)
        if bundle.e2e_model:
            if progress:
                progress(f"running {bundle.e2e_model} on uint8 images")
            e2e = runtime.create_session(bundle.file(bundle.e2e_model), runners.device,
                                         name=bundle.runner_name(bundle.e2e_model))
            image_sets = [ImageSet(f"pictures(seed={seed})", e2e_images(config, seed))] + [
                ImageSet(name, list(images), labels, real=True)
                for name, (images, labels) in (raw_images or {}).items()]
            tolerances["e2e"] = profile_tolerance("e2e", overrides)
            results += compare_e2e(image_sets, run_e2e(
                runners.reference, e2e, bundle.description.preprocessing, image_sets),
                e2e.name, tolerances["e2e"])
        checks = precision_checks + [
            c for name in models
            for c in scan_graph(bundle.file(name), export_batch, config, export_size)]
        torch_files = bundle.torch_files
        if "pt2" in torch_files:
            checks += scan_program(bundle.file(torch_files["pt2"]), config)
        if "aoti" in torch_files:
            checks.append(unseen_batch_check("aoti", results, export_batch))
        if require_provider:
            checks.append(Check(f"provider is {require_provider}",
                                runners.device == require_provider,
                                f"{runners.device} ran (requested {provider})"))
        placement = {}
        if runners.device == "cuda":
            x = random_input(bundle.config, 1, seed).numpy()
            for name in models:
                placement[name] = runtime.node_placement(bundle.file(name), "cuda", x)
                checks.append(placement_check(name, placement[name], require_provider))
        stages, first = [], {}
        if layers:
            x = random_input(bundle.config, min(sizes), seed).numpy()
            eager_model = runners.reference.module
            staged = dict(models) | ({B.PT2_FILE: "fp32"} if B.PT2_FILE in
                                     bundle.torch_files.values() else {})
            for name, model_profile in staged.items():
                if progress:
                    progress(f"comparing the stages of {name}")
                tol = tolerances[model_profile]
                rows = compare_stages(eager_model, bundle.file(name), x, runners.device, tol,
                                      tf32)
                stages += rows
                bad = next((s for s in rows if not s.passed), None)
                if bad:
                    first[name] = (f"{bad.label} first exceeds rel L2 {tol.stage_rel_l2:g} "
                                   f"({bad.rel_l2:.3g})")
        notes = list(runners.notes)
        few = sorted({s.name for s in sets if s.real and len(s.x) < MIN_NEIGHBOUR_IMAGES})
        if "embedding" in config.output_names and few:
            notes.append(f"neighbours not judged on {', '.join(few)}: fewer than "
                         f"{MIN_NEIGHBOUR_IMAGES} images")
        if image_files:
            if progress:
                progress("running the source framework's preprocessing on the images")
            check, note = pipeline_check(runners.reference, bundle.description.preprocessing,
                                         image_files, tolerances["fp32"].atol,
                                         config.output_names[0])
            checks += [check] if check else []
            notes += [note] if note else []
    passed = all(r.passed for r in results) and all(c.passed for c in checks) \
        and all(s.passed for s in stages)
    return ParityReport(
        bundle=str(Path(path)), passed=passed, provider_requested=provider,
        provider_used=runners.device, torch_device=runners.device, tf32=tf32, seed=seed,
        batch_sizes=sizes, image_sizes=[list(s) for s in sizes_hw], export_batch=export_batch,
        profiles=tolerances, results=results,
        checks=checks, stages=stages, first_divergence=first, placement=placement,
        notes=notes, versions=B.package_versions(), outputs=list(config.output_names))
