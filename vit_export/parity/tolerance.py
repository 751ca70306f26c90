"""Tolerance profiles: how far each precision may stray from eager PyTorch, and by what measure."""
from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import Optional

from ..errors import ParityError


@dataclass(frozen=True)
class Tolerance:
    """How far one comparison's candidate may stray from its reference, and still pass.

    `rtol` is the max abs error over the largest |reference| value: one number per
    comparison, max|cand - ref| / max|ref| <= rtol (the max abs error itself where every
    reference value is 0). It is not numpy's elementwise rtol (|cand - ref| <= atol + rtol *
    |ref| for each element). parity.json keeps the name.
    """
    atol: float  # max abs error on logits
    rtol: float  # max abs error over the largest |reference| value (see above)
    min_cosine: float  # per-sample cosine similarity, the lowest one
    min_top1: float  # fraction of samples whose top-1 class agrees (near-ties excused)
    stage_rel_l2: float  # relative L2 error allowed on an intermediate stage (--layers)
    # An embedding on real images: the mean overlap of each image's 10 nearest neighbours,
    # ties excused. Set from scripts/embedding_precisions.py (docs: guides/embeddings.md): the
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
    # of Pillow's on a few pixels (docs: guides/preprocessing.md); the logits
    # move by what those pixels move them, so decisions must agree, not every digit.
    "e2e": Tolerance(atol=0.1, rtol=0.02, min_cosine=0.999, min_top1=1.0, stage_rel_l2=1e-2,
                     min_neighbours=0.95, min_token_cosine=0.999),
    "int8-static": Tolerance(atol=float("inf"), rtol=0.25, min_cosine=0.99, min_top1=0.98,
                             stage_rel_l2=0.3, min_neighbours=0.9, min_token_cosine=0.98),
    # bf16 compute of the fp32 model (OpenVINO's bf16 runner): 8 bits of mantissa, so
    # direction and decisions, as for fp16, with a cosine and top-1 of their own.
    "bf16": Tolerance(atol=float("inf"), rtol=0.05, min_cosine=0.9995, min_top1=0.99,
                      stage_rel_l2=5e-2, min_neighbours=0.9, min_token_cosine=0.998),
}


def profile_tolerance(profile: str, overrides: Optional[dict[str, float]] = None) -> Tolerance:
    """The tolerance of `profile`, with the fields `overrides` gives (None keeps the
    profile's); a --min-cosine override bounds each token's cosine too."""
    if profile not in PROFILES:
        raise ParityError(f"unknown tolerance profile {profile!r}; choose one of "
                          f"{', '.join(PROFILES)}")
    given = {k: v for k, v in (overrides or {}).items() if v is not None}
    if "min_cosine" in given:  # --min-cosine: per sample, and per token
        given.setdefault("min_token_cosine", given["min_cosine"])
    return replace(PROFILES[profile], **given)


def precision_of_profile(profile: str) -> str:
    """The storage precision a profile is for: "tf32" judges an fp32 file, "int8-static" an
    int8 one."""
    return "fp32" if profile == "tf32" else re.split("[-_]", profile)[0]
