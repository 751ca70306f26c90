"""What every runner is fed: seeded random batches at each batch size and image size, and
the real data a user gives."""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Optional

import numpy as np

from ..model import random_input

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
