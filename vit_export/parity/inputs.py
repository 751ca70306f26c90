"""What every runner is fed: seeded random batches at each batch size and image size, and
the real data a user gives (image files and folders, a labelled .npz), read as the bundle's
model takes them."""
from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import numpy as np

from .. import bundle as B
from ..images import (
    expand_inputs,
    iter_inputs,
    load_labelled_npz,
    load_labelled_pixels,
    load_pixels,
)

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


@dataclass
class ImageSet:
    """uint8 images [H, W, C] (sizes may differ) for model.e2e.onnx, with labels when known."""
    name: str
    images: list[np.ndarray]
    labels: Optional[np.ndarray] = None
    real: bool = False  # a user's images, not our seeded pictures


# A dynamic-size model is also run at each other image size, on one batch of this size.
OTHER_SIZE_BATCH = 2


def input_sets(config, batch_sizes: Sequence[int], seed: int,
               real_inputs: Optional[dict[str, tuple[np.ndarray, Optional[np.ndarray]]]] = None,
               image_sizes: Sequence[tuple[int, int]] = ()) -> list[InputSet]:
    """One seeded random batch per batch size at the native size, one at each other image
    size (a dynamic-size model), then each real-data set whole."""
    from ..model import random_input  # torch: only where random inputs are made

    sets = [InputSet(f"random(seed={seed})", random_input(config, b, seed).numpy())
            for b in batch_sizes]
    native = (config.img_size, config.img_size)
    sets += [InputSet(f"random(seed={seed}) {h}x{w}",
                      random_input(config, OTHER_SIZE_BATCH, seed, size=(h, w)).numpy())
             for h, w in image_sizes if (h, w) != native]
    sets += [InputSet(name, data, labels, chunk=REAL_DATA_BATCH, real=True)
             for name, (data, labels) in (real_inputs or {}).items()]
    return sets


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


@dataclass(frozen=True)
class FileInputs:
    """A user's images and labelled set, as ValidateOptions takes them."""
    # name -> (preprocessed [N, C, H, W] array, labels [N] or None)
    real_inputs: Optional[dict[str, tuple[np.ndarray, Optional[np.ndarray]]]] = None
    # the same images as uint8 [H, W, C], for a bundle with model.e2e.onnx
    raw_images: Optional[dict[str, tuple[list[np.ndarray], Optional[np.ndarray]]]] = None
    image_files: list[Path] = field(default_factory=list)  # for pipeline_check (no .npy)


def labelled_inputs(path: Optional[str | os.PathLike], description: B.Description
                    ) -> Optional[dict[str, tuple[np.ndarray, Optional[np.ndarray]]]]:
    """A labelled .npz (`images`, optional `labels`), preprocessed as the model's images are:
    {its stem: (pixels, labels)}; None without one."""
    if path is None:
        return None

    return {Path(path).stem: load_labelled_npz(path, description.preprocessing,
                                               description.config.num_classes)}


def inputs_from_files(bundle: B.Bundle, images: Sequence[str | os.PathLike] = (),
                      real_data: Optional[str | os.PathLike] = None) -> FileInputs:
    """Image files and folders (`images`, .npy arrays among them) and a labelled .npz
    (`real_data`), read as `validate --images/--real-data` reads them: preprocessed for the
    bundle's model ("images" and the .npz's stem), as uint8 pictures too where the bundle has
    model.e2e.onnx (which takes them raw; arrays are no pictures), and the image files for
    the check of our preprocessing against the source framework's."""
    description = bundle.description
    real = labelled_inputs(real_data, description) or {}
    raw = {}  # uint8 images for model.e2e.onnx, when the bundle has one
    files = []
    if images:
        files = expand_inputs(images)
        arrays = [a for _, a in iter_inputs(files, description.preprocessing)]
        real["images"] = (np.stack(arrays), None)
        if bundle.e2e_model:
            raw["images"] = ([load_pixels(f, description.preprocessing) for f in files
                              if f.suffix.lower() != ".npy"], None)
    if real_data is not None and bundle.e2e_model:
        raw[Path(real_data).stem] = load_labelled_pixels(real_data, description.preprocessing,
                                                         description.config.num_classes)
    return FileInputs(real_inputs=real or None,
                      raw_images={k: v for k, v in raw.items() if v[0]} or None,
                      image_files=[f for f in files if f.suffix.lower() != ".npy"])
