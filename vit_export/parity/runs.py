"""What a run stage gave, as data (Polygraphy's RunResults): every runner's whole outputs on
every input set, where each runner ran and the profile that judges it. `compare` judges it;
`saved` keeps it on disk."""
from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Optional

import numpy as np

from .inputs import ImageSet, InputSet

# set index -> runner name -> output name -> values ([N, K] logits, ...)
Outputs = list[dict[str, dict[str, np.ndarray]]]


@dataclass(frozen=True)
class RunnerRecord:
    """One runner of a run: where it really ran, and how it is judged."""
    name: str  # eager, torchscript, onnxruntime[model.fp16.onnx], pillow+eager, ...
    device: str  # where it ran: cuda or cpu (ONNX Runtime's provider, verified when opened)
    profile: str  # the tolerance profile that judges it ("fp32" for a reference)
    reference: Optional[str] = None  # the runner it is judged against; None: a reference


@dataclass
class RunResult:
    """Every runner of a bundle run on the same inputs, nothing compared yet: what
    `validate` compares, `validate --save-outputs` keeps and `compare` judges against
    another run of the same bundle on the same inputs (a GPU box's against CPU CI's)."""
    bundle: str  # the bundle's path, as given
    files: dict[str, str]  # the sha256 of every file of the bundle (config.json's `files`)
    provider_requested: str  # auto, cuda or cpu
    device: str  # where the runners ran
    tf32: bool  # ONNX Runtime's CUDA provider computed fp32 in TF32 (--profile tf32)
    seed: int
    threads: Optional[int]  # intra-op threads asked of PyTorch and ONNX Runtime; None: theirs
    batch_sizes: list[int]
    image_sizes: list[list[int]]  # [H, W] of the random inputs
    export_batch: int
    output_names: list[str]  # the model's outputs: logits, embedding, tokens
    runners: list[RunnerRecord]  # every runner that ran; references before their candidates
    sets: list[InputSet]
    outputs: Outputs  # of `sets`
    # model.e2e.onnx's uint8 images and the outputs of Pillow + eager and of the model
    image_sets: list[ImageSet] = field(default_factory=list)
    image_outputs: Outputs = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # what the runners said (CUDA not used, ...)
    versions: dict[str, str] = field(default_factory=dict)

    def record(self, name: str) -> RunnerRecord:
        return next(r for r in self.runners if r.name == name)

    def judged(self, reference: str) -> dict[str, str]:
        """The runners judged against `reference`, in run order -> the profile of each."""
        return {r.name: r.profile for r in self.runners if r.reference == reference}

    def groups(self) -> list[tuple[str, Sequence[InputSet | ImageSet], Outputs]]:
        """(reference, sets, outputs): the tensors, then model.e2e.onnx's images, if any."""
        return [(next(r.name for r in self.runners if r.reference is None and r.name in
                      outputs[0]), sets, outputs)
                for sets, outputs in ((self.sets, self.outputs),
                                      (self.image_sets, self.image_outputs)) if sets]


def input_digest(arrays: Sequence[np.ndarray], labels: Optional[np.ndarray]) -> str:
    """The sha256 of what a set feeds the runners: each array's dtype, shape and bytes, then
    the labels'. Two runs compared must have fed the same inputs, bit for bit."""
    digest = hashlib.sha256()
    for tag, array in [("x", a) for a in arrays] + ([("labels", labels)]
                                                    if labels is not None else []):
        array = np.ascontiguousarray(array)
        digest.update(f"{tag} {array.dtype.str} {array.shape};".encode())
        digest.update(array.data)
    return digest.hexdigest()


def set_digest(s: InputSet | ImageSet) -> str:
    return input_digest([s.x] if isinstance(s, InputSet) else s.images, s.labels)
