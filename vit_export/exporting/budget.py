"""Static int8 within an accuracy budget: quantize, measure on a labelled set against eager
fp32, and keep the most divergent blocks in fp32, one at a time, until the budget holds."""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, Optional

import numpy as np

from .. import runtime
from ..errors import ExportError
from ..model import as_tuple
from ..parity import compare, compare_stages, profile_tolerance, run_stages
from ..parity.budget import AccuracyBudget, Measured, measure, over_budget
from ..parity.inputs import REAL_DATA_BATCH
from ..parity.runs import input_digest
from .variants import VARIANTS, make_variant, weight_gemms

PROFILE = VARIANTS["static"][1]  # the tolerance profile validate judges static int8 by
STAGE_IMAGES = 32  # labelled images the blocks are ranked on (validate --layers' comparison)


def _eager_logits(model, x: np.ndarray) -> np.ndarray:
    import torch

    at = model.config.output_names.index("logits")
    device = next(model.parameters()).device
    with torch.inference_mode():
        return np.concatenate([
            as_tuple(model(torch.from_numpy(x[i:i + REAL_DATA_BATCH]).to(device)))[at]
            .float().cpu().numpy()
            for i in range(0, len(x), REAL_DATA_BATCH)])


def _logits(path: Path, x: np.ndarray) -> np.ndarray:
    runner = runtime.ort_runner(path, "cpu")
    return np.concatenate([runner.run_all(x[i:i + REAL_DATA_BATCH])["logits"]
                           for i in range(0, len(x), REAL_DATA_BATCH)])


def rank_blocks(model, path: Path, x: np.ndarray) -> list[str]:
    """The blocks of the quantized model at `path`, most divergent first: what each adds to
    the relative L2 error of the residual stream against eager (the stages validate --layers
    compares), on the first STAGE_IMAGES of `x`."""
    x = x[:STAGE_IMAGES]
    ours, theirs = run_stages(model, path, x, "cpu")
    rows = {r.stage: r.rel_l2 for r in compare_stages(
        path.name, model.config, ours, theirs, len(x), profile_tolerance(PROFILE))}
    before, added = rows.get("pos_embed", 0.0), {}
    for i in range(model.config.depth):
        after = rows.get(f"blocks.{i}")
        if after is not None:
            added[f"blocks.{i}"] = after - before
            before = after
    return sorted(added, key=lambda b: -added[b])


def _judged(budget: AccuracyBudget, reference: np.ndarray, logits: np.ndarray,
            labels: np.ndarray) -> tuple[Measured, Optional[str]]:
    """What a variant's logits lose against eager's, and why it is over the budget (None when
    within it). The profile validate then judges the model by counts too, on the same
    images: a model within the budget that validation would refuse keeps more blocks."""
    measured = measure(reference, logits, labels)
    judged = compare(reference, logits, profile_tolerance(PROFILE))
    broken = over_budget(budget, measured) or (
        None if judged["passed"] else f"falls outside the {PROFILE} profile validate "
                                      f"judges it by: {judged['failures'][0]}")
    return measured, broken


def _record(budget: AccuracyBudget, kept: list[str], blocks: dict[str, list[str]],
            measured: Measured, name: str, x: np.ndarray, labels: np.ndarray) -> dict[str, Any]:
    """What config.json keeps of a variant made within a budget: the budget, the blocks (and
    their nodes) kept in fp32, and what was measured on which images."""
    return {"max_drop": budget.max_drop, "min_cosine": budget.min_cosine,
            "kept_fp32": kept, "kept_nodes": [n for b in kept for n in blocks[b]],
            "measured": {**measured.to_dict(), "inputs": name,
                         "inputs_sha256": input_digest([x], labels)}}


def static_within_budget(budget: AccuracyBudget, model, source: Path, folder: Path,
                         description_json: str, calibration, static_options: dict[str, Any],
                         labelled: tuple[str, np.ndarray, np.ndarray],
                         progress: Optional[Callable[[str], None]] = None
                         ) -> tuple[str, dict[str, Any]]:
    """Make model.int8-static.onnx in `folder` within `budget` on a labelled set.

    Quantize every weight GEMM (variants.to_int8_static) and measure; while over budget (or
    outside the int8-static profile validation then judges it by, on the same images), keep
    the next most divergent block's GEMMs in fp32 (ranked once, on the fully quantized model,
    by rank_blocks) and quantize again.

    Args:
        budget: What the model may lose against eager fp32.
        model: Eager fp32, in eval mode, on the CPU: the reference.
        source: model.onnx, which the variant is derived from.
        folder: Where the variant is written (the export's staging folder).
        description_json: The description the variant carries.
        calibration (images.CalibrationSet): The calibration images.
        static_options: The recipe (variants.static_int8_options).
        labelled: (name, preprocessed images [N, C, H, W], labels [N]).
        progress: Told each attempt.

    Returns:
        The variant's file name and the record config.json keeps: the budget, the blocks
        kept in fp32, and what was measured.

    Raises:
        ExportError: The budget is not met even with every block but one kept in fp32 (no
            block left to quantize), or the model gives no logits.
    """
    if "logits" not in model.config.output_names:
        raise ExportError("an accuracy budget is measured on logits, and this model gives "
                          f"{', '.join(model.config.output_names)}")
    name, x, labels = labelled
    step = progress or (lambda _: None)
    blocks = weight_gemms(source)
    reference = _eager_logits(model, x)
    kept: list[str] = []
    ranked: Optional[list[str]] = None
    while True:
        step(f"static int8 with {', '.join(kept) or 'no block'} kept in fp32, measured on "
             f"{len(x)} labelled images")
        file = make_variant("static", source, folder, model.config, description_json,
                            calibration=calibration, static_options=static_options,
                            exclude=[n for b in kept for n in blocks[b]])
        measured, broken = _judged(budget, reference, _logits(folder / file, x), labels)
        if broken is None:
            break
        if ranked is None:
            ranked = [b for b in rank_blocks(model, folder / file, x) if b in blocks]
        left = [b for b in ranked if b not in kept]
        if len(left) <= 1:  # keeping the last one too leaves nothing in int8
            (folder / file).unlink()
            raise ExportError(f"static int8 cannot meet the accuracy budget on {name}, nothing "
                              f"written: with "
                              f"{', '.join(kept) or 'no block'} kept in fp32 it {broken}")
        kept.append(left[0])
    return file, _record(budget, kept, blocks, measured, name, x, labels)
