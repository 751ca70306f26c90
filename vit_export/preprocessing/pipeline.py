"""The pipeline: a decoded PIL image -> the model's input, as the framework that trained the
model does it (convert, resize, center crop, rescale, normalize), and those frameworks' own
pipelines (timm, Hugging Face, torchvision), built from the same values, to hold ours against."""
from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from ..errors import InputError
from .recipe import Preprocessing
from .sources import HF_RESAMPLE


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
    check_resize_cost(image.size, prep)
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


# The resized image (before the crop) may hold the most of: this many times the resize
# square, the decoded image's own pixels (a photo is only ever made smaller), and
# RESIZE_FLOOR pixels (48 MB of RGB). Any aspect ratio up to 64:1 goes through; a 20000x1
# strip whose short side becomes 256 (5,120,000 x 256, 3.9 GB of RGB) is refused before any
# work, in Pillow as in model.e2e.onnx.
RESIZE_BUDGET = 64
RESIZE_FLOOR = 1 << 24


def resize_allowance(prep: Preprocessing) -> int:
    """The pixels one image's resize may make whatever the image's own size: RESIZE_BUDGET
    resize squares, or RESIZE_FLOOR (a server budgets a request's images by it)."""
    return max(RESIZE_BUDGET * prep.resize_size ** 2, RESIZE_FLOOR)


def check_resize_cost(size: tuple[int, int], prep: Preprocessing) -> None:
    """InputError when resizing an image of `size` (width, height) as `prep` says would
    make more pixels than the image itself and `resize_allowance`."""
    width, height = resized_size(size, prep)
    budget = max(size[0] * size[1], resize_allowance(prep))
    if width * height > budget:
        raise InputError(f"image is {size[0]}x{size[1]}: resizing it as the model's "
                         f"preprocessing does (short side to {prep.resize_size}) would make it "
                         f"{width}x{height} ({width * height / 1e6:.0f} M pixels, over the "
                         f"{budget / 1e6:.0f} M allowed); crop it nearer to square first")


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
    check_resize_cost(image.size, prep)  # model.e2e.onnx resizes it as preprocess would
    mode = "L" if len(prep.mean) == 1 else "RGB"
    image = _convert(image, mode, prep.alpha)
    return np.asarray(image).reshape(image.size[1], image.size[0], len(prep.mean))


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
