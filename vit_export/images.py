"""Reading inputs: image files (decoded with the checks Pillow lacks), .npy arrays, labelled
.npz sets, folders and calibration sets; preprocessing.pipeline makes an image the model's
input."""
from __future__ import annotations

import contextlib
import os
import struct
import zlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, Optional

import numpy as np

from .bundle import sha256_file
from .errors import InputError, first_line, param, raw, shown
from .preprocessing import Preprocessing, pixels, preprocess
from .preprocessing.pipeline import (
    check_resize_cost,
    resized_size,
)

IMAGE_SUFFIXES = {".png", ".jpg", ".jpeg", ".bmp", ".gif", ".tif", ".tiff", ".webp", ".ppm",
                  ".pgm"}
ARRAY_SUFFIX = ".npy"


def load_image(path: str | os.PathLike, prep: Preprocessing) -> np.ndarray:
    return _decoded(path, lambda image: preprocess(image, prep), prep=prep)


def open_image(path: str | os.PathLike, then: Callable):
    """`then` applied to the decoded image file, with the one-line errors of load_image."""
    return _decoded(path, then)


def load_pixels(path: str | os.PathLike, prep: Preprocessing) -> np.ndarray:
    """An image file as uint8 [H, W, C] for model.e2e.onnx (see `pixels`)."""
    return _decoded(path, lambda image: pixels(image, prep), prep=prep)


def load_image_bytes(data: bytes, name: str, prep: Preprocessing,
                     raw: bool = False) -> np.ndarray:
    """An encoded image held in memory (a request's body) -> [C, H, W], with the checks and
    one-line errors of load_image; `name` stands for the file in them. `raw`: uint8
    [H, W, C], not resized, for model.e2e.onnx (`load_pixels`)."""
    import io

    return _decoded(io.BytesIO(data), _reader(prep, raw), name, prep)


def image_size(data: bytes, name: str) -> tuple[int, int]:
    """An encoded image's (width, height), read from its header: no pixel is decoded. What
    a server budgets a request's images by before it decodes any; InputError, one line, as
    load_image_bytes says it, where Pillow cannot read the header."""
    import io

    from PIL import Image

    if not data:
        raise InputError(f"{name} is empty (0 bytes), not an image")
    with _one_line(name), Image.open(io.BytesIO(data)) as image:
        return image.size


def resize_cost(size: tuple[int, int], prep: Preprocessing) -> int:
    """The pixels an image of `size` (width, height) is held as on its way to the model's
    input, itself or its resize, whichever is larger: a 1x1 image costs its resize, not one
    pixel. InputError where the resize is over the budget an image file is held to
    (`check_resize_cost`)."""
    check_resize_cost(size, prep)
    width, height = resized_size(size, prep)
    return max(size[0] * size[1], width * height)


def _reader(prep: Preprocessing, raw: bool) -> Callable:
    """What a decoded image becomes: the model's pixel values, or with `raw` uint8 pixels
    for model.e2e.onnx (`preprocessing.pixels`)."""
    return (lambda image: pixels(image, prep)) if raw else (lambda image: preprocess(image, prep))


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


def _decoded(source, then, name: Optional[str] = None, prep: Optional[Preprocessing] = None):
    """`then` of the image decoded from `source` (a path, or with `name` a file object);
    with `prep`, its resize is budgeted from its header before any pixel is decoded."""
    from PIL import Image

    path = source if name is None else name
    with _one_line(path), \
            open(source, "rb") if name is None else contextlib.nullcontext(source) as f:
        if prep is not None:
            with Image.open(f) as header:  # the header alone: nothing decoded yet
                check_resize_cost(header.size, prep)
            f.seek(0)
        short = png_shortfall(f)
        f.seek(0)
        if short:
            raise InputError(short)
        with Image.open(f) as image:
            image.load()
            return then(image)


@contextlib.contextmanager
def _one_line(path) -> Iterator[None]:
    """Pillow's errors reading the image at `path` (a path or a name) as one InputError."""
    from PIL import Image, UnidentifiedImageError

    try:
        yield
    except UnidentifiedImageError:
        raise InputError(f"{path} is not an image Pillow can read") from None
    except Image.DecompressionBombError as exc:  # over twice Pillow's MAX_IMAGE_PIXELS
        raise InputError(f"{path}: {exc}") from None
    except (OSError, SyntaxError, ValueError) as exc:  # truncated or corrupt image data
        raise InputError(f"{path}: cannot decode image: {exc}") from None
    except InputError as exc:
        raise InputError(f"{path}: {raw(exc)}") from None


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
    if array.dtype.kind not in "fiu":  # timedelta64 is an integer to numpy, not a number
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
        elif item.exists():  # a FIFO, a device, a socket: nothing we read as an image
            raise InputError(f"{shown(item)} is not a regular file or folder")
        else:
            raise InputError(f"{shown(item)} does not exist")
    return files


def iter_inputs(files: Iterable[Path], prep: Preprocessing,
                raw: bool = False) -> Iterator[tuple[str, np.ndarray]]:
    """(name, [C, H, W] array) for each input; an .npy of N arrays yields N named items.
    `raw`: (name, uint8 [H, W, C]) of each image as it is, for model.e2e.onnx, which
    preprocesses in its graph (`load_pixels`); an .npy file, pixel values already, is
    refused."""
    for path in files:
        if path.suffix.lower() != ARRAY_SUFFIX:
            yield str(path), _decoded(path, _reader(prep, raw), prep=prep)
        elif raw:
            raise InputError(f"{path}: model.e2e.onnx takes images and preprocesses them "
                             f"itself; an .npy array is pixel values already (run it with "
                             f"another {param('runtime')})")
        else:
            arrays = load_array(path, prep)
            for i, array in enumerate(arrays):
                yield (f"{path}[{i}]" if len(arrays) > 1 else str(path)), array


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


ZIP_MAGIC = b"PK\x03\x04"  # how an .npz (a zip archive) begins


def not_an_npz(path: str | os.PathLike) -> Optional[str]:
    """What the file at `path` is, when it is not an .npz: np.load would take an .npy or a
    pickle for its own (a pickle refused with numpy's advice to load it unsafely)."""
    with open(path, "rb") as f:
        magic = f.read(4)
    if magic == ZIP_MAGIC:
        return None
    return ("an .npy array" if magic == b"\x93NUM" else
            "pickled data" if magic[:1] == b"\x80" else "not an .npz archive")


def _read_npz(path, num_classes: Optional[int] = None
              ) -> tuple[np.ndarray, Optional[np.ndarray]]:
    """`images` and `labels` of a labelled .npz, each checked here, at the boundary."""
    if Path(path).exists() and not Path(path).is_file():  # a FIFO would block np.load forever
        raise InputError(f"{path} is not a regular file")
    try:
        what = not_an_npz(path)
    except OSError as exc:
        raise InputError(f"cannot read {path}: {exc.strerror}") from None
    if what:
        raise InputError(f"{path} is not an .npz of `images` and `labels`: it is {what} (an "
                         f".npz is read without unpickling)")
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
