"""What the framework that trained the weights says about its preprocessing: timm's
pretrained_cfg, a Hugging Face preprocessor_config.json, torchvision's weights transforms,
else a guess; then --set preprocessing.FIELD=VALUE. Every value records where it came from."""
from __future__ import annotations

import math
from dataclasses import replace
from fractions import Fraction
from typing import Any, Optional

from ..config import ViTConfig
from ..errors import CheckpointError, ConfigError, param
from ..schema import (
    BOOLEAN,
    NUMBER,
    POSITIVE_NUMBER,
    check_fields,
    either,
    integer,
    list_of,
    object_of,
    one_of,
)
from .recipe import GUESSED, MAX_IMAGE_SIDE, PREPROCESSING_FIELDS, Preprocessing

# Each reader below turns one framework's own description into a Preprocessing that
# pipeline.preprocess reproduces pixel for pixel, and records where every value came from.

IMAGENET_MEAN, IMAGENET_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
PREPROCESSING_PREFIX = "preprocessing."
HF_CONFIG = "hf preprocessor_config.json"
HF_RESAMPLE = {0: "nearest", 1: "lanczos", 2: "bilinear", 3: "bicubic", 4: "box", 5: "hamming"}
IMAGENET_STANDARD = (0.5, 0.5, 0.5)  # Hugging Face's name for timm's ViT mean and std
# Fixed by a framework's code rather than by a model's config: recorded as coming from it.
CONVENTIONS = ("crop_offset", "rescale_factor", "alpha", "resize_backend")


def split_overrides(overrides: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """--set values: model config fields, and `preprocessing.FIELD` ones (prefix removed)."""
    model = {k: v for k, v in overrides.items() if not k.startswith(PREPROCESSING_PREFIX)}
    prep = {k[len(PREPROCESSING_PREFIX):]: v for k, v in overrides.items()
            if k.startswith(PREPROCESSING_PREFIX)}
    return model, prep


def timm_preprocessing(name: str, img_size: Optional[int] = None,
                       notes: Optional[list[str]] = None) -> Preprocessing:
    """timm's pretrained_cfg of `name` (`arch` or `arch.tag`), resolved by timm's own
    resolve_data_config, at `img_size` (default: the config's input size) as timm's
    create_transform makes it: resize to floor(img_size / crop_pct), then crop. The configs are
    part of timm's code: nothing is downloaded."""
    try:
        from timm.data import resolve_data_config
        from timm.models import get_pretrained_cfg
    except ImportError:
        raise ConfigError(f"timm is needed to read the preprocessing of {name!r}: "
                          f"pip install timm") from None
    try:
        cfg = get_pretrained_cfg(name, allow_unregistered=False)
    except RuntimeError as exc:  # timm's error for an unknown architecture or tag
        raise ConfigError(f"timm has no pretrained config {name!r}: {exc}") from None
    data = resolve_data_config(pretrained_cfg=cfg.to_dict())
    _, height, width = data["input_size"]
    source = f"timm pretrained_cfg {cfg.architecture}" + (f".{cfg.tag}" if cfg.tag else "")
    if height != width:
        raise ConfigError(f"{source} takes {height}x{width} inputs; only square ones fit a ViT "
                          f"here")
    size = img_size or height
    prep = Preprocessing(
        size, math.floor(size / data["crop_pct"]), tuple(data["mean"]), tuple(data["std"]),
        data["interpolation"], data["crop_mode"], crop_offset="round",
    ).with_source(source).with_source("timm create_transform", CONVENTIONS)
    if size == height:
        return prep
    if notes is not None:
        notes.append(f"{source} is for {height}x{height} inputs; the model takes {size}, "
                     f"so images are resized to floor({size} / crop_pct {data['crop_pct']})")
    return prep.with_source("model img_size", ["img_size"]).with_source(
        f"{source}, crop_pct {data['crop_pct']} at img_size {size}", ["resize_size"])


def timm_knows(name: str) -> bool:
    """Whether timm is installed and has a pretrained config `name`."""
    try:
        from timm.models import get_pretrained_cfg
    except ImportError:
        return False
    try:
        return get_pretrained_cfg(name, allow_unregistered=False) is not None
    except RuntimeError:
        return False


def _hf_square(values: dict[str, Any], key: str) -> tuple[str, int]:
    """Hugging Face's `size` or `crop_size` -> ("squash", side) for an exact square size or
    ("center", side) for shortest_edge; an int is a square, as ViTImageProcessor reads it."""
    size = values[key]
    if isinstance(size, int):
        return "squash", size
    if isinstance(size, dict) and set(size) == {"height", "width"}:
        if size["height"] != size["width"]:
            raise CheckpointError(f"preprocessor_config.json: {key} {size['height']}x"
                                  f"{size['width']} is not square; a ViT here takes squares")
        return "squash", int(size["height"])
    if isinstance(size, dict) and set(size) == {"shortest_edge"}:
        return "center", int(size["shortest_edge"])
    raise CheckpointError(f"preprocessor_config.json: {key} {size!r} is not supported (expected "
                          f"an int, height and width, or shortest_edge)")


def _hf_channels(value: Any) -> tuple[float, ...]:
    """image_mean / image_std: a list per channel, or one number for all three."""
    if isinstance(value, (list, tuple)):
        return tuple(float(v) for v in value)
    return (float(value),) * 3


_SIDE = integer(1, MAX_IMAGE_SIDE)
_HF_SIZE = either(_SIDE, object_of(_SIDE, nonempty=True)).named(
    f"a side in [1, {MAX_IMAGE_SIDE}] or an object of them")
_CHANNELS = list_of(NUMBER, 1, 64, sequences=(list, tuple))  # tuples: the class defaults
# Each preprocessor_config.json value in the type ViTImageProcessor reads it as.
HF_PROCESSOR_KINDS = {
    **dict.fromkeys(("do_resize", "do_center_crop", "do_rescale", "do_normalize",
                     "do_convert_rgb"), BOOLEAN),
    "rescale_factor": POSITIVE_NUMBER, "image_mean": either(NUMBER, _CHANNELS),
    "image_std": either(NUMBER, _CHANNELS),
    "resample": one_of(*HF_RESAMPLE).named("a Pillow resample code (0-5)"), "size": _HF_SIZE}
NAFLEX_KINDS = {"max_num_patches": _SIDE, "patch_size": _SIDE}  # SigLIP2's budget, not a size


OPENAI_CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
OPENAI_CLIP_STD = (0.26862954, 0.26130258, 0.27577711)
# Each image processor's class defaults (transformers 5.23, as save_pretrained writes a
# default-constructed one), for the keys a preprocessor_config.json leaves out; the fast
# (torchvision) classes save the same type name. Bit is DINOv2's processor.
_CLIP_DEFAULTS = {"size": {"shortest_edge": 224}, "resample": 3, "do_center_crop": True,
                  "crop_size": {"height": 224, "width": 224}, "image_mean": OPENAI_CLIP_MEAN,
                  "image_std": OPENAI_CLIP_STD, "do_convert_rgb": True}
HF_PROCESSORS: dict[str, dict[str, Any]] = {
    "ViTImageProcessor": {"do_resize": True, "size": {"height": 224, "width": 224},
                          "resample": 2, "do_center_crop": False, "crop_size": None,
                          "do_rescale": True, "rescale_factor": 1 / 255, "do_normalize": True,
                          "image_mean": IMAGENET_STANDARD, "image_std": IMAGENET_STANDARD,
                          "do_convert_rgb": False},
    "CLIPImageProcessor": _CLIP_DEFAULTS,
    "BitImageProcessor": _CLIP_DEFAULTS,
    "SiglipImageProcessor": {"resample": 3, "do_convert_rgb": True},
    "DINOv3ViTImageProcessor": {"image_mean": IMAGENET_MEAN, "image_std": IMAGENET_STD},
    "Siglip2ImageProcessor": {"max_num_patches": 256, "patch_size": 16},
}
# Processors that rescale before they resize, in float32 with torch (resize_backend "torch")
HF_RESCALE_FIRST = ("DINOv3ViTImageProcessor",)


def hf_preprocessing(values: dict[str, Any]) -> Preprocessing:
    """A Hugging Face preprocessor_config.json, as its PIL backend (ViTImageProcessorPil, the
    default processor of transformers 4; CLIP's, SigLIP's and Bit's (DINOv2's) alike) applies
    it: resize with Pillow, optional center crop (floor offsets), rescale in float64,
    normalize in float32. Keys it lacks take its image_processor_type's class defaults
    (ViTImageProcessor's for any other type), recorded as such."""
    if not isinstance(values, dict):
        raise CheckpointError("preprocessor_config.json: expected a JSON object")
    kind = str(values.get("image_processor_type")).removesuffix("Fast").removesuffix("Pil")
    kind = kind if kind in HF_PROCESSORS else "ViTImageProcessor"
    defaults = {**HF_PROCESSORS["ViTImageProcessor"], **HF_PROCESSORS[kind]}
    default_source = f"hf {kind} default"
    given = {k for k in defaults if values.get(k) is not None}
    merged = {k: values[k] if k in given else v for k, v in defaults.items()}
    if kind == "Siglip2ImageProcessor":  # NaFlex: no size, a patch budget (see checkpoints.py)
        check_fields(merged, NAFLEX_KINDS, "preprocessor_config.json", CheckpointError)
        patches, patch = merged.pop("max_num_patches"), merged.pop("patch_size")
        side = math.isqrt(patches) * patch  # a square image's grid: the most whole rows
        merged["size"] = {"height": side, "width": side}
        given |= {"size"} if "max_num_patches" in given else set()
    check_fields(merged, HF_PROCESSOR_KINDS, "preprocessor_config.json", CheckpointError)
    if merged["do_center_crop"] and merged["crop_size"] is not None:  # else it is not read
        check_fields(merged, {"crop_size": _HF_SIZE}, "preprocessor_config.json",
                     CheckpointError)
    if not merged["do_resize"]:
        raise CheckpointError("preprocessor_config.json: do_resize is false, so images must "
                              "come at the model's size; vit-export resizes every image")
    if merged["resample"] not in HF_RESAMPLE:
        raise CheckpointError(f"preprocessor_config.json: unknown resample {merged['resample']!r}")
    mode, resize = _hf_square(merged, "size")
    if merged["do_center_crop"] and merged["crop_size"] is None:
        raise CheckpointError("preprocessor_config.json: do_center_crop without a crop_size")
    crop = _hf_square(merged, "crop_size")[1] if merged["do_center_crop"] else resize
    mean, std = _hf_channels(merged["image_mean"]), _hf_channels(merged["image_std"])
    if not merged["do_normalize"]:
        mean, std = (0.0,) * len(mean), (1.0,) * len(std)
    prep = Preprocessing(
        crop, resize, mean, std, HF_RESAMPLE[merged["resample"]], mode, crop_offset="floor",
        rescale_factor=float(merged["rescale_factor"]) if merged["do_rescale"] else 1.0,
        alpha="white" if merged["do_convert_rgb"] else "drop",
        resize_backend="torch" if kind in HF_RESCALE_FIRST else "pillow")
    fields_from = {"img_size": ("do_center_crop", "crop_size", "size"),
                   "resize_size": ("size",), "crop_mode": ("size",), "mean": ("image_mean",
                   "do_normalize"), "std": ("image_std", "do_normalize"),
                   "interpolation": ("resample",),
                   "rescale_factor": ("rescale_factor", "do_rescale"),
                   "alpha": ("do_convert_rgb",), "resize_backend": ("image_processor_type",)}
    for field_name, keys in fields_from.items():
        source = HF_CONFIG if any(k in given for k in keys) else default_source
        prep = prep.with_source(source, [field_name])
    return prep.with_source("hf image processor center_crop", ["crop_offset"])


def torchvision_preprocessing(weights: str) -> Preprocessing:
    """The documented transforms of torchvision weights, e.g. ViT_B_16_Weights.IMAGENET1K_V1:
    ImageClassification resizes the short side (Pillow on a PIL image), center crops, scales
    to [0, 1] and normalizes."""
    try:
        from torchvision.models import get_weight
    except ImportError:
        raise ConfigError(f"torchvision is needed to read the transforms of {weights!r}: "
                          f"pip install torchvision") from None
    try:
        found = get_weight(weights)
    except (KeyError, ValueError):
        raise ConfigError(f"torchvision has no weights {weights!r} (expected e.g. "
                          f"ViT_B_16_Weights.IMAGENET1K_V1)") from None
    transform = found.transforms()
    if type(transform).__name__ != "ImageClassification":
        raise ConfigError(f"{found} transforms with {type(transform).__name__}, "
                          f"not ImageClassification")
    return Preprocessing(
        transform.crop_size[0], transform.resize_size[0], tuple(transform.mean),
        tuple(transform.std), transform.interpolation.value, "center", crop_offset="round",
    ).with_source(f"torchvision {found}").with_source("torchvision ImageClassification",
                                                      CONVENTIONS)


def _guessed_preprocessing(fmt: Optional[str], config: ViTConfig) -> Preprocessing:
    """The usual recipe of the checkpoint's framework, every value recorded as guessed."""
    if fmt == "hf":  # ViTImageProcessor's defaults: squash to the input size
        return Preprocessing(config.img_size, config.img_size, IMAGENET_STANDARD,
                               IMAGENET_STANDARD, "bilinear", "squash").with_source(GUESSED)
    if fmt == "torchvision" and config.in_chans == 3:  # ImageClassification's defaults
        return Preprocessing(config.img_size, round(config.img_size * 256 / 224),
                               IMAGENET_MEAN, IMAGENET_STD, "bilinear",
                               crop_offset="round").with_source(GUESSED)
    return Preprocessing.default_for(config)


def _fit_img_size(prep: Preprocessing, img_size: int, notes: list[str]) -> Preprocessing:
    """The source's pipeline at the model's input size when they differ (e.g. --set
    img_size=384): the same crop fraction (img_size / resize_size), floored as timm does."""
    if prep.img_size == img_size:
        return prep
    resize = math.floor(img_size * prep.resize_size / prep.img_size)
    notes.append(f"preprocessing of {prep.source_of('img_size')} crops to {prep.img_size}; "
                 f"the model takes {img_size}, so it resizes to {resize} with the same crop "
                 f"fraction")
    fitted = replace(prep, img_size=img_size, resize_size=resize)
    return fitted.with_source("model img_size", ["img_size"]).with_source(
        f"{prep.source_of('resize_size')}, scaled to img_size {img_size}", ["resize_size"])


def _parse_override(prep: Preprocessing, key: str, text: str) -> dict[str, Any]:
    if key == "img_size":
        use = param("overrides", {"img_size": "N"})
        raise ConfigError(f"preprocessing.img_size follows the model: use {use}")
    if key == "crop_pct":  # timm's way of stating the resize: floor(img_size / crop_pct)
        return {"resize_size": math.floor(prep.img_size / float(Fraction(text)))}
    if key in ("mean", "std"):  # one value serves every channel, as in timm
        values = tuple(float(Fraction(v)) for v in text.split(","))
        return {key: values * len(prep.mean) if len(values) == 1 else values}
    if key == "resize_size":
        return {key: int(text)}
    if key == "rescale_factor":  # "1/255" or a decimal
        return {key: float(Fraction(text))}
    if key in ("interpolation", "crop_mode", "crop_offset", "alpha"):
        return {key: text}
    raise ConfigError(f"unknown preprocessing field {key!r}; one of crop_pct, "
                      f"{', '.join(f for f in PREPROCESSING_FIELDS if f != 'img_size')}")


def apply_preprocessing_overrides(prep: Preprocessing,
                                  overrides: dict[str, Any]) -> Preprocessing:
    """--set preprocessing.FIELD=VALUE, recorded as coming from --set."""
    for key, text in overrides.items():
        try:
            changes = _parse_override(prep, key, str(text))
        except ConfigError:
            raise
        except (ValueError, ZeroDivisionError):  # int(), float() and Fraction() of bad text
            given = param("overrides", {f"preprocessing.{key}": text})
            raise ConfigError(f"{given}: not a valid value") from None
        source = "--set" + (f" crop_pct={text}" if key == "crop_pct" else "")
        prep = replace(prep, **changes).with_source(source, list(changes))
    return prep


def resolve_preprocessing(config: ViTConfig, fmt: Optional[str] = None,
                          extras: Optional[dict[str, Any]] = None,
                          timm_name: Optional[str] = None,
                          torchvision_weights: Optional[str] = None,
                          preset: Optional[str] = None,
                          overrides: Optional[dict[str, Any]] = None,
                          ) -> tuple[Preprocessing, list[str]]:
    """The preprocessing of the weights and notes on it. The first source that applies wins:
    a timm name or torchvision weights the user names, the checkpoint's own
    preprocessor_config.json, a preset timm knows (for timm weights or random ones: the preset
    names the architecture of other frameworks' weights, not how they were trained), else a
    guess (said in a note); then --set.
    """
    if timm_name and torchvision_weights:
        raise ConfigError(f"name one preprocessing source: {param('timm_name')} or "
                          f"{param('torchvision_weights')}, not both")
    notes: list[str] = []
    hf = (extras or {}).get("preprocessor_config.json")
    if timm_name:
        prep = timm_preprocessing(timm_name, config.img_size, notes)
    elif torchvision_weights:
        prep = torchvision_preprocessing(torchvision_weights)
    elif hf is not None:
        prep = hf_preprocessing(hf)
    elif preset and fmt in (None, "timm") and timm_knows(preset):  # a timm model's name
        prep = timm_preprocessing(preset, config.img_size, notes)
    else:
        prep = _guessed_preprocessing(fmt, config)
    prep = apply_preprocessing_overrides(_fit_img_size(prep, config.img_size, notes),
                                         overrides or {})
    guessed = [name for name in PREPROCESSING_FIELDS if prep.source_of(name) == GUESSED]
    if guessed:
        notes.append(f"preprocessing guessed ({', '.join(guessed)}); name its source with "
                     f"--timm-name or --torchvision-weights, or state it with --set "
                     f"preprocessing.FIELD=VALUE")
    return prep, notes
