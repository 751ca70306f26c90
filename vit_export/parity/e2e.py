"""Preprocessing, checked end to end: model.e2e.onnx on uint8 images against our Pillow
pipeline + eager PyTorch, and our pipeline against the one of the framework a model came
from."""
from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Optional

import numpy as np

from .. import bundle as B
from .. import runtime
from ..errors import InputError
from ..images import load_image, open_image
from ..preprocessing import framework_pipeline, preprocess
from .compare import PairResult, compare_sets
from .inputs import REAL_DATA_BATCH, ImageSet
from .report import Check
from .tolerance import Tolerance

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
    return compare_sets(image_sets, outputs, E2E_REFERENCE, {name: "e2e"}, {"e2e": tol})


def pipeline_check(reference: runtime.Runner, prep: B.Preprocessing,
                   files: Sequence[str | os.PathLike], atol: float, output: str = "logits"
                   ) -> tuple[Optional[Check], Optional[str]]:
    """Our preprocessing against the one of the framework it came from, end to end: the
    reference model on both tensors of each image file, compared on its first `output`. It
    fails when a top-1 class differs or the values differ by more than `atol` (the peers
    resize with Pillow, as we do, so they agree to rounding). Without such a framework, a
    note says why and nothing fails."""

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
