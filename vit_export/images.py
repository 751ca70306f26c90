"""Decoding images (and .npy arrays) into the model's input tensors."""
from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import numpy as np

from .bundle import Preprocessing
from .errors import InputError

IMAGE_SUFFIXES = {".png", ".jpg", ".jpeg", ".bmp", ".gif", ".tif", ".tiff", ".webp", ".ppm",
                  ".pgm"}
ARRAY_SUFFIX = ".npy"


def preprocess(image, prep: Preprocessing) -> np.ndarray:
    """A PIL image -> float32 [C, H, W], as the framework that trained the model does it.

    Grayscale, palette and RGBA images are converted to the model's channel count, not
    rejected. EXIF orientation is not applied, as timm, torchvision and Hugging Face do not
    apply it either: the model saw the pixels as stored. Call `ImageOps.exif_transpose` first
    where the training pipeline did.
    """
    channels = len(prep.mean)
    if channels not in (1, 3):
        raise InputError(f"images can feed 1- or 3-channel models, this one takes {channels}")
    image = _convert(image, "L" if channels == 1 else "RGB", prep.alpha)
    size = resized_size(image.size, prep)
    if size != image.size:  # Pillow returns a copy at the same size, so skipping changes nothing
        image = image.resize(size, _filter(prep.interpolation))
    image = _center_crop(image, prep)
    pixels = np.asarray(image).reshape(prep.img_size, prep.img_size, channels)
    return normalize(pixels.transpose(2, 0, 1), prep)  # [C, H, W]


def _filter(interpolation: str):
    from PIL import Image

    return Image.Resampling[interpolation.upper()]


def _convert(image, mode: str, alpha: str):
    """Pillow's convert, which drops an alpha channel; with alpha "white", transparent pixels
    are first composited onto white as Hugging Face's convert_to_rgb does."""
    from PIL import Image

    transparent = "A" in image.getbands() or image.info.get("transparency") is not None
    if alpha == "white" and transparent:
        rgba = image.convert("RGBA")
        image = Image.alpha_composite(Image.new("RGBA", image.size, (255, 255, 255, 255)), rgba)
    return image.convert(mode)


def resized_size(size: tuple[int, int], prep: Preprocessing) -> tuple[int, int]:
    """(width, height) after the resize, with each framework's own arithmetic: a pixel more or
    less on one side shifts the whole crop."""
    width, height = size
    target = prep.resize_size
    if prep.crop_mode == "squash":
        return target, target
    if prep.crop_mode == "border":  # timm's ResizeKeepRatio(longest=1): round(side / ratio)
        ratio = max(height / target, width / target)
        return round(width / ratio), round(height / ratio)
    # center: torchvision's Resize(int) (timm's and Hugging Face's shortest_edge are the same)
    if width <= height:
        return target, int(target * height / width)
    return int(target * width / height), target


def _center_crop(image, prep: Preprocessing):
    """Crop the middle img_size square; in border mode pad with the mean colour first, as
    timm's CenterCropOrPad does (other modes never leave an image smaller than the crop)."""
    from PIL import ImageOps

    crop = prep.img_size
    width, height = image.size
    if crop > width or crop > height:
        fill = tuple(round(255 * m) for m in prep.mean)
        border = ((crop - width) // 2 if crop > width else 0,
                  (crop - height) // 2 if crop > height else 0,
                  (crop - width + 1) // 2 if crop > width else 0,
                  (crop - height + 1) // 2 if crop > height else 0)
        image = ImageOps.expand(image, border=border, fill=fill if len(fill) > 1 else fill[0])
        width, height = image.size
    if prep.crop_offset == "round":  # Python's round, half to even, as torchvision's CenterCrop
        left, top = int(round((width - crop) / 2.0)), int(round((height - crop) / 2.0))
    else:
        left, top = (width - crop) // 2, (height - crop) // 2
    return image.crop((left, top, left + crop, top + crop))


def normalize(pixels: np.ndarray, prep: Preprocessing) -> np.ndarray:
    """uint8 [C, H, W] -> float32 (pixels * rescale_factor - mean) / std.

    The product is taken in float64 and rounded to float32 as Hugging Face's rescale does;
    for 1/255 that is exactly torchvision's float32 division by 255 (x / 255 is never close
    enough to a float32 rounding boundary for the two to differ), so one formula serves both.
    """
    scaled = (pixels.astype(np.float64) * prep.rescale_factor).astype(np.float32)
    mean = np.asarray(prep.mean, np.float32)[:, None, None]
    std = np.asarray(prep.std, np.float32)[:, None, None]
    return (scaled - mean) / std


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


# Channels a stored image may have: grayscale, RGB, RGBA (converted as image files are).
IMAGE_CHANNELS = (1, 3, 4)


def _read_npz(path: str | os.PathLike) -> tuple[np.ndarray, Optional[np.ndarray]]:
    """`images` (uint8 [N, H, W] or [N, H, W, C], C in IMAGE_CHANNELS) and `labels`, checked."""
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
    if images.ndim == 4 and images.shape[3] not in IMAGE_CHANNELS:
        raise InputError(f"{path}: images with {images.shape[3]} channels; expected 1 "
                         f"(grayscale), 3 (RGB) or 4 (RGBA)")
    if labels is not None and labels.shape != (len(images),):
        raise InputError(f"{path}: {labels.shape} labels for {len(images)} images")
    return images, labels


def _preprocess_stored(images: np.ndarray, prep: Preprocessing) -> np.ndarray:
    from PIL import Image

    if images.ndim == 4 and images.shape[3] == 1:
        images = images[..., 0]
    return np.stack([preprocess(Image.fromarray(im), prep) for im in images])


def load_labelled_npz(path: str | os.PathLike,
                      prep: Preprocessing) -> tuple[np.ndarray, Optional[np.ndarray]]:
    """A .npz with `images` (uint8 [N, H, W] or [N, H, W, C]) and optional `labels` [N]:
    the images go through the same preprocessing as image files. Returns ([N, C, H, W], labels).
    """
    images, labels = _read_npz(path)
    return _preprocess_stored(images, prep), labels


# ---------------------------------------------------------------- calibration sets

MIN_CALIBRATION_IMAGES = 16  # fewer give activation ranges that one odd image decides
DEFAULT_CALIBRATION_IMAGES = 64


@dataclass
class CalibrationSet:
    """Preprocessed images to calibrate static quantization on, and what they came from."""
    x: np.ndarray  # [n, C, H, W] float32, preprocessed as the model's images are
    record: dict[str, Any]  # source, kind, sha256, available, images, seed: kept in the bundle


def _folder_sha256(files: list[Path], root: Path) -> str:
    """One digest over the names (relative to root) and contents of files, in order."""
    import hashlib

    digest = hashlib.sha256()
    for f in files:
        digest.update(str(f.relative_to(root)).encode() + b"\0")
        digest.update(f.read_bytes())
    return digest.hexdigest()


def load_calibration(path: str | os.PathLike, prep: Preprocessing, *,
                     count: int = DEFAULT_CALIBRATION_IMAGES, seed: int = 0) -> CalibrationSet:
    """A seeded sample of `count` images (all when fewer) from a folder of image/.npy files
    or a .npz with `images`, preprocessed as the model's images are.

    An empty or unreadable source, images of a channel count the model cannot take, and
    fewer than MIN_CALIBRATION_IMAGES images are an InputError.
    """
    from .bundle import sha256_file

    path = Path(path)
    if not path.exists():
        raise InputError(f"calibration set {path} does not exist")
    rng = np.random.default_rng(seed)
    if path.is_dir():
        files = expand_inputs([path])  # raises when it holds none
        names_arrays = list(iter_inputs(files, prep))  # an unreadable file raises, named
        available = len(names_arrays)
        kind, digest = "folder", _folder_sha256(files, path)
    else:
        if path.suffix.lower() != ".npz":
            raise InputError(f"calibration set {path}: expected a folder of images or a .npz "
                             f"with `images`")
        images, _ = _read_npz(path)
        available, kind, digest = len(images), "npz", sha256_file(path)
    if available < MIN_CALIBRATION_IMAGES:
        raise InputError(f"calibration set {path} holds {available} image(s); static "
                         f"quantization needs at least {MIN_CALIBRATION_IMAGES}")
    chosen = np.sort(rng.permutation(available)[:count])
    if kind == "folder":
        x = np.stack([names_arrays[i][1] for i in chosen])
    else:
        x = _preprocess_stored(images[chosen], prep)
    record = {"source": path.name, "kind": kind, "sha256": digest, "available": available,
              "images": len(chosen), "seed": seed}
    return CalibrationSet(x.astype(np.float32), record)
