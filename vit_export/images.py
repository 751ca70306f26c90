"""Decoding images (and .npy arrays) into the model's input tensors."""
from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Optional

import numpy as np

from .bundle import Preprocessing
from .errors import InputError

IMAGE_SUFFIXES = {".png", ".jpg", ".jpeg", ".bmp", ".gif", ".tif", ".tiff", ".webp", ".ppm",
                  ".pgm"}
ARRAY_SUFFIX = ".npy"


def preprocess(image, prep: Preprocessing) -> np.ndarray:
    """A PIL image -> float32 [C, H, W]: convert mode, resize short side, center crop, normalize.

    Grayscale, palette and RGBA images are converted to the model's channel count, not rejected.
    """
    from PIL import Image

    channels = len(prep.mean)
    if channels not in (1, 3):
        raise InputError(f"images can feed 1- or 3-channel models, this one takes {channels}")
    image = image.convert("L" if channels == 1 else "RGB")
    w, h = image.size
    scale = prep.resize_size / min(w, h)
    size = (max(prep.img_size, round(w * scale)), max(prep.img_size, round(h * scale)))
    resample = {"bicubic": Image.Resampling.BICUBIC, "bilinear": Image.Resampling.BILINEAR,
                "nearest": Image.Resampling.NEAREST}[prep.interpolation]
    if size != (w, h):
        image = image.resize(size, resample)
    left = (size[0] - prep.img_size) // 2
    top = (size[1] - prep.img_size) // 2
    image = image.crop((left, top, left + prep.img_size, top + prep.img_size))
    pixels = np.asarray(image, dtype=np.float32) / 255.0
    pixels = pixels.reshape(prep.img_size, prep.img_size, channels).transpose(2, 0, 1)
    mean = np.asarray(prep.mean, np.float32)[:, None, None]
    std = np.asarray(prep.std, np.float32)[:, None, None]
    return (pixels - mean) / std  # [C, H, W]


def load_image(path: str | os.PathLike, prep: Preprocessing) -> np.ndarray:
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(path) as image:
            image.load()
            return preprocess(image, prep)
    except UnidentifiedImageError:
        raise InputError(f"{path} is not an image Pillow can read") from None
    except (OSError, SyntaxError, ValueError) as exc:  # truncated or corrupt image data
        raise InputError(f"{path}: cannot decode image: {exc}") from None


def load_array(path: str | os.PathLike, prep: Preprocessing) -> list[np.ndarray]:
    """A .npy of preprocessed input: [C, H, W] or [N, C, H, W]."""
    try:
        array = np.load(path, allow_pickle=False)
    except (OSError, ValueError) as exc:
        raise InputError(f"{path}: cannot read .npy array: {exc}") from None
    expected = (len(prep.mean), prep.img_size, prep.img_size)
    batch = array[None] if array.ndim == 3 else array
    if batch.ndim != 4 or tuple(batch.shape[1:]) != expected:
        raise InputError(f"{path}: array of shape {tuple(array.shape)} does not fit the model's "
                         f"input [N, {', '.join(map(str, expected))}]")
    array = batch
    if len(array) == 0:
        raise InputError(f"{path}: holds no arrays (shape {tuple(array.shape)})")
    if not np.issubdtype(array.dtype, np.number):
        raise InputError(f"{path}: array of dtype {array.dtype} is not numeric")
    return list(array.astype(np.float32))


def expand_inputs(inputs: Iterable[str | os.PathLike]) -> list[Path]:
    """Files as given; folders become their image and .npy files, sorted by name."""
    files = []
    for item in map(Path, inputs):
        if item.is_dir():
            found = sorted(p for p in item.iterdir() if p.is_file() and not p.name.startswith(".")
                           and p.suffix.lower() in IMAGE_SUFFIXES | {ARRAY_SUFFIX})
            if not found:
                raise InputError(f"{item} holds no image or .npy files")
            files += found
        elif item.is_file():
            files.append(item)
        else:
            raise InputError(f"{item} does not exist")
    return files


def iter_inputs(files: Iterable[Path], prep: Preprocessing) -> Iterator[tuple[str, np.ndarray]]:
    """(name, [C, H, W] array) for each input; an .npy of N arrays yields N named items."""
    for path in files:
        if path.suffix.lower() == ARRAY_SUFFIX:
            arrays = load_array(path, prep)
            for i, array in enumerate(arrays):
                yield (f"{path}[{i}]" if len(arrays) > 1 else str(path)), array
        else:
            yield str(path), load_image(path, prep)


def load_labelled_npz(path: str | os.PathLike,
                      prep: Preprocessing) -> tuple[np.ndarray, Optional[np.ndarray]]:
    """A .npz with `images` (uint8 [N, H, W] or [N, H, W, C]) and optional `labels` [N]:
    the images go through the same preprocessing as image files. Returns ([N, C, H, W], labels).
    """
    from PIL import Image

    try:
        with np.load(path, allow_pickle=False) as data:
            images = data["images"]
            labels = data["labels"] if "labels" in data.files else None
    except KeyError:
        raise InputError(f"{path} has no `images` array") from None
    except (OSError, ValueError) as exc:
        raise InputError(f"{path}: cannot read .npz: {exc}") from None
    if images.dtype != np.uint8 or images.ndim not in (3, 4) or len(images) == 0:
        raise InputError(f"{path}: `images` must be uint8 [N, H, W] or [N, H, W, C], "
                         f"got {images.dtype} {tuple(images.shape)}")
    if labels is not None and labels.shape != (len(images),):
        raise InputError(f"{path}: {labels.shape} labels for {len(images)} images")
    arrays = np.stack([preprocess(Image.fromarray(im), prep) for im in images])
    return arrays, labels
