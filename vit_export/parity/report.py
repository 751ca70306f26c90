"""The report: what a validation found (checks, comparison rows, stages), as parity.json
holds it. `render` turns it into text, Markdown or JUnit."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from .compare import NEIGHBOURS, PairResult
from .tolerance import Tolerance


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
    profile: str = "fp32"  # the tolerance profile the model's stages are judged by


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
    # the sha256 of every file of the bundle judged (config.json's `files`): the verdict is
    # read only while the bundle still holds these files (parity.proof.read_proof)
    files: dict[str, str] = field(default_factory=dict)
    # the source framework's model compared with eager and model.onnx (an imported bundle):
    # framework, version, model, its files' sha256, sizes and status (passed, failed or
    # skipped with its reason); empty where the bundle was not imported
    source: dict[str, Any] = field(default_factory=dict)

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
