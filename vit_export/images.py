"""Decoding images (and .npy arrays) into the model's input tensors."""
from __future__ import annotations

import contextlib
import math
import os
import struct
import zlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, Optional

import numpy as np

from .bundle import Preprocessing
from .errors import InputError, first_line

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
    if prep.resize_backend == "torch":
        return _torch_resized(np.asarray(image).reshape(image.size[1], image.size[0], channels),
                              size, prep)
    if size != image.size:  # Pillow returns a copy at the same size, so skipping changes nothing
        image = image.resize(size, _filter(prep.interpolation))
    image = _center_crop(image, prep)
    pixels = np.asarray(image).reshape(prep.img_size, prep.img_size, channels)
    return normalize(pixels.transpose(2, 0, 1), prep)  # [C, H, W]


def _torch_resized(pixels: np.ndarray, size: tuple[int, int], prep: Preprocessing) -> np.ndarray:
    """uint8 [H, W, C] -> float32 [C, H, W] as Hugging Face's torchvision backend does when it
    rescales first (DINOv3ViTImageProcessor): scale by rescale_factor in float32, resize as
    torchvision's tensor resize does (torch's interpolate, antialiased; no torchvision
    needed), center crop, then (x - mean) / std."""
    import torch
    import torch.nn.functional as F

    x = torch.from_numpy(np.ascontiguousarray(pixels.transpose(2, 0, 1))) * prep.rescale_factor
    nearest = prep.interpolation == "nearest"
    x = F.interpolate(x[None], size=(size[1], size[0]), mode=prep.interpolation,
                      align_corners=None if nearest else False, antialias=not nearest)[0]
    left, top = _crop_offsets((x.shape[2], x.shape[1]), prep)
    x = x[:, top:top + prep.img_size, left:left + prep.img_size]
    mean = torch.tensor(prep.mean, dtype=torch.float32)[:, None, None]
    std = torch.tensor(prep.std, dtype=torch.float32)[:, None, None]
    return ((x - mean) / std).numpy().astype(np.float32)


def _filter(interpolation: str):
    from PIL import Image

    return Image.Resampling[interpolation.upper()]


# Pillow's high-bit-depth single-channel modes and the value their full scale maps to.
HIGH_BIT_FULL_SCALE = {"I;16": 65535, "I;16L": 65535, "I;16B": 65535, "I;16N": 65535,
                       "I": 65535, "F": 1.0}


def _eight_bit(image):
    """A 16-bit, 32-bit integer or float image as the 8-bit grayscale it stands for: the full
    scale (65535, or 1.0 for float) becomes 255. Pillow's own convert clips instead, so a
    16-bit photo would turn white. Values outside the scale are refused, not clipped."""
    from PIL import Image

    full = HIGH_BIT_FULL_SCALE[image.mode]
    pixels = np.asarray(image, dtype=np.float64)
    if not np.isfinite(pixels).all():
        raise InputError(f"{image.mode} image holds NaN or infinite pixels")
    low, high = pixels.min(), pixels.max()
    if low < 0 or high > full:
        raise InputError(f"{image.mode} image has values in [{low:g}, {high:g}], outside "
                         f"[0, {full:g}]; save it as 8- or 16-bit")
    return Image.fromarray(np.round(pixels * (255 / full)).astype(np.uint8), "L")


def _convert(image, mode: str, alpha: str):
    """Pillow's convert, which drops an alpha channel; with alpha "white", transparent pixels
    are first composited onto white as Hugging Face's convert_to_rgb does. High-bit-depth
    images are scaled to 8 bits first (see `_eight_bit`)."""
    from PIL import Image

    if image.mode in HIGH_BIT_FULL_SCALE:
        image = _eight_bit(image)
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
    left, top = _crop_offsets((width, height), prep)
    return image.crop((left, top, left + crop, top + crop))


def _crop_offsets(size: tuple[int, int], prep: Preprocessing) -> tuple[int, int]:
    """(left, top) of the center crop of a (width, height) image: (size - crop) / 2 rounded
    half to even (torchvision's CenterCrop, timm) or floored (Hugging Face)."""
    crop = prep.img_size
    if prep.crop_offset == "round":  # Python's round, half to even
        return tuple(round((side - crop) / 2.0) for side in size)
    return tuple((side - crop) // 2 for side in size)


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


def pixels(image, prep: Preprocessing) -> np.ndarray:
    """A PIL image -> uint8 [H, W, C], converted as `preprocess` converts it, not resized:
    what model.e2e.onnx takes (a server sends these)."""
    mode = "L" if len(prep.mean) == 1 else "RGB"
    image = _convert(image, mode, prep.alpha)
    return np.asarray(image).reshape(image.size[1], image.size[0], len(prep.mean))


def load_image(path: str | os.PathLike, prep: Preprocessing) -> np.ndarray:
    return _decoded(path, lambda image: preprocess(image, prep))


def open_image(path: str | os.PathLike, then: Callable):
    """`then` applied to the decoded image file, with the one-line errors of load_image."""
    return _decoded(path, then)


def load_pixels(path: str | os.PathLike, prep: Preprocessing) -> np.ndarray:
    """An image file as uint8 [H, W, C] for model.e2e.onnx (see `pixels`)."""
    return _decoded(path, lambda image: pixels(image, prep))


def load_image_bytes(data: bytes, name: str, prep: Preprocessing) -> np.ndarray:
    """An encoded image held in memory (a request's body) -> [C, H, W], with the checks and
    one-line errors of load_image; `name` stands for the file in them."""
    import io

    return _decoded(io.BytesIO(data), lambda image: preprocess(image, prep), name)


PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
PNG_STEP = 1 << 20  # bytes inflated at a time when counting a PNG's image data
PNG_CHANNELS = {0: 1, 2: 3, 3: 1, 4: 2, 6: 4}  # IHDR colour type -> samples per pixel
ADAM7 = ((0, 0, 8, 8), (4, 0, 8, 8), (0, 4, 4, 8), (2, 0, 4, 4), (0, 2, 2, 4), (1, 0, 2, 2),
         (0, 1, 1, 2))  # interlace passes: x0, y0, dx, dy


def png_shortfall(f: BinaryIO) -> Optional[str]:
    """Why a PNG's image data is incomplete, or None when it is whole (or not a PNG).

    Pillow fills the rows that a complete but short zlib stream leaves out with zeros and says
    nothing: a PNG holding 24 of its 64 rows decodes, and the model answers confidently about
    an image that is not there. This counts the bytes the IDAT stream inflates to against what
    IHDR's size needs, in bounded memory (a 9500x9500 header over ten rows costs ten rows).
    """
    if f.read(8) != PNG_SIGNATURE:
        return None
    need, inflate, got = 0, zlib.decompressobj(), 0
    while True:
        head = f.read(8)
        if len(head) < 8:
            break
        length, kind = struct.unpack(">I4s", head)
        data = f.read(length)
        f.read(4)  # CRC: Pillow checks it
        if kind == b"IHDR" and len(data) >= 13:
            width, height, depth, colour, _, _, interlace = struct.unpack(">IIBBBBB", data[:13])
            bits = depth * PNG_CHANNELS.get(colour, 4)
            passes = ADAM7 if interlace else ((0, 0, 1, 1),)
            for x0, y0, dx, dy in passes:
                w, h = -(-(width - x0) // dx), -(-(height - y0) // dy)
                need += h * (1 + -(-w * bits // 8)) if w > 0 and h > 0 else 0
        elif kind == b"IDAT" and got < need:
            pending = data
            while got < need:  # a megabyte at a time, however far it inflates
                cap = min(need - got, PNG_STEP)
                out = inflate.decompress(pending, cap)
                got += len(out)
                pending = inflate.unconsumed_tail
                if not pending and len(out) < cap:  # this chunk's data is all out
                    break
        elif kind == b"IEND":
            break
    if got < need:
        return f"PNG image data holds {got} of the {need} bytes its size needs (truncated)"
    return None


def _decoded(source, then, name: Optional[str] = None):
    from PIL import Image, UnidentifiedImageError

    path = source if name is None else name
    try:
        with open(source, "rb") if name is None else contextlib.nullcontext(source) as f:
            short = png_shortfall(f)
            f.seek(0)
            if short:
                raise InputError(short)
            with Image.open(f) as image:
                image.load()
                return then(image)
    except UnidentifiedImageError:
        raise InputError(f"{path} is not an image Pillow can read") from None
    except Image.DecompressionBombError as exc:  # over twice Pillow's MAX_IMAGE_PIXELS
        raise InputError(f"{path}: {exc}") from None
    except (OSError, SyntaxError, ValueError) as exc:  # truncated or corrupt image data
        raise InputError(f"{path}: cannot decode image: {exc}") from None
    except InputError as exc:
        raise InputError(f"{path}: {exc}") from None


def load_array(path: str | os.PathLike, prep: Preprocessing) -> list[np.ndarray]:
    """A .npy of preprocessed input: [C, H, W] or [N, C, H, W]."""
    try:
        array = np.load(path, allow_pickle=False)
    except Exception as exc:  # numpy's format errors, EOF in a truncated file, a zip (.npz)
        raise InputError(f"{path}: cannot read .npy array: {type(exc).__name__}: "
                         f"{first_line(exc, 'damaged')}") from None
    if not isinstance(array, np.ndarray):
        raise InputError(f"{path}: holds several arrays (an .npz?), not one .npy array")
    expected = (len(prep.mean), prep.img_size, prep.img_size)
    batch = array[None] if array.ndim == 3 else array
    if batch.ndim != 4 or tuple(batch.shape[1:]) != expected:
        raise InputError(f"{path}: array of shape {tuple(array.shape)} does not fit the model's "
                         f"input [N, {', '.join(map(str, expected))}]")
    array = batch
    if len(array) == 0:
        raise InputError(f"{path}: holds no arrays (shape {tuple(array.shape)})")
    if not (np.issubdtype(array.dtype, np.floating) or np.issubdtype(array.dtype, np.integer)):
        raise InputError(f"{path}: array of dtype {array.dtype} is not real numbers")
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


def load_labelled_npz(path: str | os.PathLike, prep: Preprocessing,
                      num_classes: Optional[int] = None
                      ) -> tuple[np.ndarray, Optional[np.ndarray]]:
    """A .npz with `images` (uint8 [N, H, W] or [N, H, W, C], C = 1 to 4: gray, gray and
    alpha, RGB, RGBA) and optional integer `labels` [N] in [0, num_classes): the images go
    through the same preprocessing as image files. Returns ([N, C, H, W], labels).
    """
    from PIL import Image

    images, labels = _read_npz(path, num_classes)
    arrays = np.stack([preprocess(Image.fromarray(im), prep) for im in images])
    return arrays, labels


def load_labelled_pixels(path: str | os.PathLike, prep: Preprocessing,
                         num_classes: Optional[int] = None
                         ) -> tuple[list[np.ndarray], Optional[np.ndarray]]:
    """The same .npz as uint8 [H, W, C] images for model.e2e.onnx, and its labels."""
    from PIL import Image

    images, labels = _read_npz(path, num_classes)
    return [pixels(Image.fromarray(im), prep) for im in images], labels


def _read_npz(path, num_classes: Optional[int] = None
              ) -> tuple[np.ndarray, Optional[np.ndarray]]:
    """`images` and `labels` of a labelled .npz, each checked here, at the boundary."""
    if Path(path).exists() and not Path(path).is_file():  # a FIFO would block np.load forever
        raise InputError(f"{path} is not a regular file")
    try:
        with np.load(path, allow_pickle=False) as data:
            images = data["images"]
            labels = data["labels"] if "labels" in data.files else None
    except KeyError:
        raise InputError(f"{path} has no `images` array") from None
    except Exception as exc:  # zipfile, zlib, numpy's format errors: a damaged file
        raise InputError(f"{path}: cannot read .npz: {type(exc).__name__}: "
                         f"{first_line(exc, 'damaged')}") from None
    if images.dtype != np.uint8 or images.ndim not in (3, 4) or len(images) == 0:
        raise InputError(f"{path}: `images` must be uint8 [N, H, W] or [N, H, W, C], "
                         f"got {images.dtype} {tuple(images.shape)}")
    if 0 in images.shape[1:3]:  # resizing one divided by its zero side
        raise InputError(f"{path}: `images` of shape {tuple(images.shape)} are empty "
                         f"(zero height or width)")
    if images.ndim == 4 and not 1 <= images.shape[-1] <= 4:
        raise InputError(f"{path}: `images` has {images.shape[-1]} channels; an image has 1 "
                         f"(gray), 2 (gray, alpha), 3 (RGB) or 4 (RGBA)")
    if images.ndim == 4 and images.shape[-1] == 1:
        images = images[..., 0]
    if labels is not None:
        if labels.shape != (len(images),):
            raise InputError(f"{path}: {labels.shape} labels for {len(images)} images")
        if not np.issubdtype(labels.dtype, np.integer):
            raise InputError(f"{path}: `labels` must be integers, got {labels.dtype}")
        if num_classes is not None and len(labels) and \
                not (labels.min() >= 0 and labels.max() < num_classes):
            raise InputError(f"{path}: labels must lie in [0, {num_classes}), got "
                             f"[{labels.min()}, {labels.max()}]")
    return images, labels


# ---------------------------------------------------------------- the source framework's own


FRAMEWORK_OF_SOURCE = {"timm": "timm create_transform",
                       "hf": "Hugging Face ViTImageProcessorPil",
                       "torchvision": "torchvision ImageClassification"}


def framework_pipeline(prep: Preprocessing) -> tuple[str, Callable]:
    """The pipeline of the framework the preprocessing came from, built by that framework from
    the bundle's values: its name and a function PIL image -> float32 [C, H, W]. It is the
    reference `validate --images` holds ours against. Raises InputError with the reason when
    there is none: the values were guessed or come from no framework, or it is not installed.
    """
    source = prep.source_of("mean").split(" ")[0]
    if source not in FRAMEWORK_OF_SOURCE:
        raise InputError(f"no framework pipeline to compare: the preprocessing's mean came "
                         f"from {prep.source_of('mean')!r}")
    try:
        build = {"timm": _timm_pipeline, "hf": _hf_pipeline,
                 "torchvision": _torchvision_pipeline}[source]
        return FRAMEWORK_OF_SOURCE[source], build(prep)
    except ImportError:
        raise InputError(f"no framework pipeline to compare: {source} is not installed") \
            from None


def _timm_pipeline(prep: Preprocessing) -> Callable:
    from timm.data import create_transform

    crop_pct = prep.img_size / prep.resize_size
    while math.floor(prep.img_size / crop_pct) < prep.resize_size:  # float division's ulp
        crop_pct = math.nextafter(crop_pct, 0)
    transform = create_transform(input_size=(len(prep.mean), prep.img_size, prep.img_size),
                                 interpolation=prep.interpolation, mean=prep.mean, std=prep.std,
                                 crop_pct=crop_pct, crop_mode=prep.crop_mode)
    mode = "L" if len(prep.mean) == 1 else "RGB"
    return lambda image: transform(image.convert(mode)).numpy()


def _hf_pipeline(prep: Preprocessing) -> Callable:
    from transformers import DINOv3ViTImageProcessor, ViTImageProcessorPil

    from .preprocessing.sources import HF_RESAMPLE

    if prep.crop_mode not in ("squash", "center"):
        raise InputError(f"no framework pipeline to compare: Hugging Face has no "
                         f"{prep.crop_mode!r} crop")
    size = {"height": prep.resize_size, "width": prep.resize_size} \
        if prep.crop_mode == "squash" else {"shortest_edge": prep.resize_size}
    resample = {name: code for code, name in HF_RESAMPLE.items()}[prep.interpolation]
    kind = DINOv3ViTImageProcessor if prep.resize_backend == "torch" else ViTImageProcessorPil
    processor = kind(
        do_resize=True, size=size, resample=resample,
        # a shortest-edge resize is square only for square images: crop it even to its size
        do_center_crop=prep.crop_mode == "center" or prep.resize_size != prep.img_size,
        crop_size={"height": prep.img_size, "width": prep.img_size},
        do_rescale=True, rescale_factor=prep.rescale_factor, do_normalize=True,
        image_mean=list(prep.mean), image_std=list(prep.std),
        do_convert_rgb=prep.alpha == "white")
    return lambda image: np.asarray(processor(image, return_tensors="pt")["pixel_values"][0])


def _torchvision_pipeline(prep: Preprocessing) -> Callable:
    from torchvision.transforms import InterpolationMode
    from torchvision.transforms._presets import ImageClassification

    transform = ImageClassification(crop_size=prep.img_size, resize_size=prep.resize_size,
                                    mean=prep.mean, std=prep.std,
                                    interpolation=InterpolationMode[prep.interpolation.upper()])
    mode = "L" if len(prep.mean) == 1 else "RGB"
    return lambda image: transform(image.convert(mode)).numpy()


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
    from PIL import Image

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
        x = np.stack([preprocess(Image.fromarray(images[i]), prep) for i in chosen])
    record = {"source": path.name, "kind": kind, "sha256": digest, "available": available,
              "images": len(chosen), "seed": seed}
    return CalibrationSet(x.astype(np.float32), record)
