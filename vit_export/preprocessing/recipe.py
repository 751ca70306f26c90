"""The Preprocessing a bundle records: its fields, the values each may take, and the checks
of a config.json's `preprocessing`."""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import MISSING, asdict, dataclass, field, fields, replace
from typing import Any

import numpy as np

from ..config import ViTConfig
from ..errors import BundleError, ConfigError, raw
from ..schema import NUMBER, check_fields, dataclass_kinds, list_of

# Pillow's resampling filters, by the names timm and torchvision give them.
INTERPOLATIONS = ("bicubic", "bilinear", "nearest", "box", "hamming", "lanczos")
CROP_MODES = ("center", "squash", "border")  # timm's names; see Preprocessing.crop_mode
CROP_OFFSETS = ("round", "floor")
ALPHA_MODES = ("drop", "white")
RESIZE_BACKENDS = ("pillow", "torch")  # see Preprocessing.resize_backend
TORCH_INTERPOLATIONS = ("bilinear", "bicubic", "nearest")  # torchvision's tensor resize
GUESSED = "default (guessed)"
MAX_IMAGE_SIDE = 8192  # no ViT takes more; bigger values in a config are corruption


@dataclass(frozen=True)
class Preprocessing:
    """How an image becomes the model's input, step for step as the framework that trained it
    does it on a PIL image: convert to RGB (or L), resize with Pillow, center crop, scale the
    uint8 pixels by `rescale_factor`, normalize with mean/std.

    The defaults of the fields after `interpolation` reproduce bundles written before those
    fields existed. `sources` says where each value came from (a framework's config, `--set`,
    or a guess), so a guess is never silent.
    """
    img_size: int  # side of the center crop, the model's input size
    resize_size: int  # center: the short side; squash: both sides; border: the long side
    mean: tuple[float, ...]  # per-channel mean, on pixels already scaled by rescale_factor
    std: tuple[float, ...]  # per-channel std
    interpolation: str = "bicubic"  # Pillow's filter, one of INTERPOLATIONS
    # center: keep the aspect ratio, short side to resize_size, long side truncated
    # (torchvision's Resize(int)); squash: both sides to resize_size (Hugging Face's exact
    # size); border: long side to resize_size, padded with the mean colour (timm's border).
    crop_mode: str = "center"
    # Offset of the crop, (size - img_size) / 2: "round" half to even as torchvision's and
    # timm's CenterCrop do; "floor" as Hugging Face's center_crop does.
    crop_offset: str = "floor"
    rescale_factor: float = 1 / 255  # uint8 pixel * rescale_factor, before mean/std
    # Transparent images: "drop" the alpha channel (Pillow's convert("RGB"), as timm's and
    # torchvision's image loaders do) or composite onto "white" (Hugging Face's convert_to_rgb).
    alpha: str = "drop"
    # Who resizes: "pillow" the uint8 image (timm, torchvision, Hugging Face's PIL backend);
    # "torch" the pixels already scaled by rescale_factor, in float32 with torch's antialiased
    # interpolate (Hugging Face's torchvision-backend processors that rescale first: DINOv3)
    resize_backend: str = "pillow"
    sources: dict[str, str] = field(default_factory=dict, hash=False)  # field -> where from

    def __post_init__(self) -> None:
        if len(self.mean) != len(self.std):
            raise ConfigError(f"mean has {len(self.mean)} channels but std {len(self.std)}")
        if self.img_size < 1:
            raise ConfigError(f"img_size must be >= 1, got {self.img_size}")
        if self.resize_size < self.img_size:
            raise ConfigError(
                f"resize_size {self.resize_size} is smaller than img_size {self.img_size}")
        for name, allowed in (("interpolation", INTERPOLATIONS), ("crop_mode", CROP_MODES),
                              ("crop_offset", CROP_OFFSETS), ("alpha", ALPHA_MODES),
                              ("resize_backend", RESIZE_BACKENDS)):
            if getattr(self, name) not in allowed:
                raise ConfigError(f"{name} must be one of {allowed}, "
                                  f"got {getattr(self, name)!r}")
        if self.resize_backend == "torch" and (
                self.crop_mode == "border" or self.interpolation not in TORCH_INTERPOLATIONS):
            raise ConfigError(f"resize_backend torch resizes with "
                              f"{', '.join(TORCH_INTERPOLATIONS)} and crops center or squash, "
                              f"got {self.interpolation}, {self.crop_mode}")
        if not all(math.isfinite(v) for v in self.mean + self.std):
            raise ConfigError(f"mean and std must be finite, got {self.mean}, {self.std}")
        if any(s <= 0 or not np.float32(s) > 0 for s in self.std):  # 1e-320 is 0 in float32
            raise ConfigError(f"std must be positive (in float32, as the models compute), got "
                              f"{self.std}")
        if not 0 < self.rescale_factor <= 1:  # 1/255 to [0, 1], or 1 to keep 0..255
            raise ConfigError(f"rescale_factor must be positive and at most 1, got "
                              f"{self.rescale_factor}")
        top = 255 * self.rescale_factor  # the largest rescaled pixel: statistics of pixels
        if not all(0 <= m <= top for m in self.mean) or any(s > top for s in self.std):
            raise ConfigError(f"mean must lie in [0, {top:g}] and std at most {top:g}, the "
                              f"range of pixels scaled by rescale_factor {self.rescale_factor:g};"
                              f" got {self.mean}, {self.std}")
        if not 1 <= self.img_size <= self.resize_size <= MAX_IMAGE_SIDE:
            raise ConfigError(f"resize_size must be in [img_size, {MAX_IMAGE_SIDE}], got "
                              f"{self.resize_size}")
        unknown = sorted(set(self.sources) - set(PREPROCESSING_FIELDS))
        if unknown:
            raise ConfigError(f"sources name unknown preprocessing field(s): "
                              f"{', '.join(unknown)}")

    @classmethod
    def default_for(cls, config: ViTConfig) -> "Preprocessing":
        """timm's ViT defaults: mean = std = 0.5, bicubic, crop_pct 0.9 (none on tiny images),
        every value recorded as guessed."""
        resize = config.img_size if config.img_size < 64 else math.floor(config.img_size / 0.9)
        return cls(config.img_size, resize, (0.5,) * config.in_chans, (0.5,) * config.in_chans,
                   crop_offset="round").with_source(GUESSED)

    def with_source(self, source: str, names: Sequence[str] = ()) -> "Preprocessing":
        """A copy whose `names` (every field when empty) are recorded as coming from `source`."""
        names = names or PREPROCESSING_FIELDS
        return replace(self, sources={**self.sources, **{name: source for name in names}})

    def source_of(self, name: str) -> str:
        return self.sources.get(name, "unrecorded: written before vit-export recorded sources")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, values: Any) -> "Preprocessing":
        """From config.json, each value in its own JSON type; fields it lacks (older bundles)
        take the defaults above."""
        check_fields(values, PREPROCESSING_KINDS, error=BundleError, section="preprocessing",
                     required=REQUIRED_FIELDS, closed=True)
        try:
            return cls(**{k: tuple(v) if k in ("mean", "std") else v for k, v in values.items()})
        except ConfigError as exc:
            raise BundleError(f"preprocessing: {raw(exc)}") from None


# What each field may hold in config.json, read from the field types once.
PREPROCESSING_KINDS = dataclass_kinds(Preprocessing, mean=list_of(NUMBER, 1, 64),
                                      std=list_of(NUMBER, 1, 64))
REQUIRED_FIELDS = tuple(f.name for f in fields(Preprocessing)
                        if f.default is MISSING and f.default_factory is MISSING)
PREPROCESSING_FIELDS = tuple(f.name for f in fields(Preprocessing) if f.name != "sources")
