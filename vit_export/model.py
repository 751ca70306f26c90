"""The Vision Transformer (Dosovitskiy et al., 2020) as the design notes describe it.

Submodule names follow timm's `VisionTransformer`, so timm state dicts load without renaming.
This module knows nothing of ONNX or ONNX Runtime.
"""
from __future__ import annotations

import dataclasses
import math
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Optional

import torch
import torch.nn.functional as F
from torch import nn

from . import rope as R
from .errors import ConfigError
from .rope import ROPE_TYPES
from .schema import check_fields, dataclass_kinds, field_type, wrong


@dataclass(frozen=True)
class ViTConfig:
    img_size: int = 224  # input height == width, in pixels
    patch_size: int = 16  # side of a square patch; img_size must be a multiple of it
    in_chans: int = 3  # input channels (3 for RGB, 1 for grayscale)
    num_classes: int = 1000  # head outputs; 0 means no head (forward returns features)
    embed_dim: int = 768  # D, the token width
    depth: int = 12  # number of encoder blocks
    num_heads: int = 12  # attention heads; embed_dim must be a multiple of it
    mlp_ratio: float = 4.0  # MLP hidden width = mlp_ratio * D
    qkv_bias: bool = True  # bias on the fused qkv Linear
    drop_rate: float = 0.0  # dropout after the position embedding, attn proj and MLP layers
    attn_drop_rate: float = 0.0  # dropout on the attention weights
    drop_path_rate: float = 0.0  # stochastic depth at the last block; rises linearly from 0
    representation_size: Optional[int] = None  # optional pre-logits Linear+Tanh of this width
    patch_norm: bool = False  # LayerNorm on the patch tokens right after the projection
    norm_eps: float = 1e-6  # epsilon of every LayerNorm (timm 1e-6, Hugging Face 1e-12)
    distilled: bool = False  # DeiT: a distillation token and second head, averaged at inference
    # Accept any height and width that are multiples of patch_size (timm's dynamic_img_size):
    # pos_embed, learned for img_size, is resampled to the input's patch grid in forward.
    dynamic_img_size: bool = False
    # The options of timm's VisionTransformer that today's families use (DINOv2, CLIP,
    # SigLIP, DeiT III, registers, pooled heads), with timm's names and meanings:
    class_token: bool = True  # a learned class token first in the sequence
    reg_tokens: int = 0  # register tokens after the class token (DINOv2 with registers)
    no_embed_class: bool = False  # the position embedding covers patches only, not prefix tokens
    # "token" (class token), "avg" (mean of patch tokens), "map" (attention pool), and
    # "token_avg": the class token and the patch tokens' mean side by side, 2 x embed_dim
    # wide (DINOv2's linear head, transformers' Dinov2ForImageClassification; not timm's)
    global_pool: str = "token"
    fc_norm: Optional[bool] = None  # final norm after pooling; None: on for "avg" pooling
    final_norm: bool = True  # a LayerNorm after the blocks (or after pooling with fc_norm)
    init_values: Optional[float] = None  # LayerScale (ls1, ls2) starting at this value
    pre_norm: bool = False  # LayerNorm before the blocks (norm_pre, CLIP); patch proj unbiased
    qk_norm: bool = False  # LayerNorm on each head's queries and keys
    act_layer: str = "gelu"  # MLP activation: "gelu", "gelu_tanh", "quick_gelu" or "silu"
    # "mlp": Linear - act - Linear; "swiglu_packed": timm's SwiGLUPacked (GluMlp, the gate
    # first): fc1 packs act's input and the gate, fc2 takes half its width (ViT-g DINOv2)
    mlp_layer: str = "mlp"
    # How pos_embed is resampled to another grid (at import, and in forward under
    # dynamic_img_size): bicubic, antialiased as timm's resample_abs_pos_embed, or not, as
    # Hugging Face's interpolate_pos_encoding (ViT, CLIP, SigLIP, DINOv2; not DINOv2 with
    # registers, which antialiases)
    pos_embed_antialias: bool = True
    # ... and with which filter: "bicubic" (timm, Hugging Face's interpolate_pos_encoding) or
    # "bilinear" (SigLIP2's NaFlex table, antialiased)
    pos_embed_interpolation: str = "bicubic"
    # The patch grid side the learned table holds, where it is not img_size's: the table is
    # kept as its source ships it and resampled once in forward, from that grid to the
    # input's (Hugging Face's models resample their shipped table in every forward: DINOv2's
    # is for 518 px, its processor crops 224). None: the img_size grid.
    pos_embed_grid: Optional[int] = None
    # What forward returns, comma-separated in the order it returns them:
    # "logits", the head's output; "embedding", the pooled features timm's
    # forward_head(pre_logits=True) gives (Hugging Face's pooler_output; with projection_head
    # the projection, CLIP's image_embeds); "tokens", the patch tokens of forward_features,
    # [B, N, D], the prefix left out (DINOv2's x_norm_patchtokens, for dense tasks). None:
    # the logits where there is a head, else the embedding.
    output: Optional[str] = None
    # The head projects into an embedding space rather than classifying (CLIP's bias-free
    # visual_projection): its output is the embedding (Hugging Face's image_embeds)
    projection_head: bool = False
    normalize: bool = False  # the embedding divided by its L2 norm in forward
    # The options of timm's Eva that the rotary families use (EVA02, ROPE-ViT, Perception
    # Encoder, DINOv3), with timm's names and meanings; see rope.py for the tables.
    pos_embed: str = "learn"  # "learn": the learned table above; "none": no absolute table
    rope_type: Optional[str] = None  # rotary embeddings: None (off), "cat", "dinov3", "mixed"
    rope_temperature: float = 10000.0  # the frequencies' base (ROPE-ViT 100 or 10, DINOv3 100)
    rope_grid_offset: float = 0.0  # added to each patch position (Perception Encoder 1)
    rope_grid_indexing: str = "ij"  # "ij": row then column frequencies; "xy": column first
    rope_rotate_half: bool = False  # rotate halves ([x0..x_d/2], DINOv3) not pairs (EVA02)
    # EVA02's rescale: positions scaled onto this pretraining grid side, whatever the grid
    ref_feat_shape: Optional[int] = None
    scale_mlp: bool = False  # a LayerNorm on the MLP's hidden layer (EVA02's sub-LN)
    scale_attn_inner: bool = False  # a LayerNorm on the attention output before proj (EVA-CLIP)
    pool_include_prefix: bool = False  # the attention pool sees the prefix tokens too (Eva)
    attn_pool_num_heads: Optional[int] = None  # the attention pool's heads; None: num_heads
    attn_pool_mlp_ratio: Optional[float] = None  # its MLP ratio; None: mlp_ratio

    def __post_init__(self) -> None:
        # each field on its own first (FIELD_CHECKS), then how they fit together (RULES)
        for name, fits, message in FIELD_CHECKS:
            value = getattr(self, name)
            if not fits(value):
                raise ConfigError(message.format(name=name, value=value))
        for broken, message in RULES:
            if broken(self):
                raise ConfigError(message.format(c=self))

    @property
    def grid_size(self) -> int:
        return self.img_size // self.patch_size

    @property
    def num_patches(self) -> int:
        return self.grid_size ** 2

    @property
    def head_dim(self) -> int:
        """Width of one attention head (timm's Attention.head_dim)."""
        return self.embed_dim // self.num_heads

    @property
    def mlp_hidden_dim(self) -> int:
        """Width of the MLP's hidden layer (timm's Block: int(dim * mlp_ratio))."""
        return int(self.embed_dim * self.mlp_ratio)

    @property
    def num_prefix_tokens(self) -> int:
        """Tokens before the patches: class, distillation, registers (timm's order)."""
        return int(self.class_token) + int(self.distilled) + self.reg_tokens

    @property
    def table_grid(self) -> int:
        """The patch grid side pos_embed holds (pos_embed_grid, else the img_size grid)."""
        return self.pos_embed_grid or self.grid_size

    @property
    def pos_embed_tokens(self) -> int:
        """Rows of pos_embed: the table's patches, plus the prefix unless no_embed_class."""
        if self.pos_embed == "none":
            return 0
        return self.table_grid ** 2 + (0 if self.no_embed_class else self.num_prefix_tokens)

    @property
    def use_fc_norm(self) -> bool:
        """timm's rule: the final norm moves after pooling for avg pooling, unless fc_norm
        says otherwise."""
        return self.global_pool == "avg" if self.fc_norm is None else self.fc_norm

    @property
    def num_features(self) -> int:
        """Width of the pooled embedding forward_head(pre_logits=True) returns."""
        if self.global_pool == "token_avg":
            return 2 * self.embed_dim
        return self.representation_size or self.embed_dim

    @property
    def output_names(self) -> tuple[str, ...]:
        """What forward returns, in order (see `output`): ("logits",), ("embedding",), or
        several, e.g. ("logits", "embedding", "tokens")."""
        if self.output:
            return tuple(self.output.split(","))
        return ("logits",) if self.num_classes and not self.projection_head else ("embedding",)

    @property
    def embedding_width(self) -> int:
        """Width of the embedding: the pooled features, or the projection's."""
        return self.num_classes if self.projection_head else self.num_features

    def output_shape(self, name: str) -> tuple[int | str, ...]:
        """The shape of output `name` past the batch axis: [K] logits, [F] an embedding,
        [N, D] the patch tokens (N is the symbolic "patches" under dynamic_img_size)."""
        if name == "logits":
            return (self.num_classes,)
        if name == "embedding":
            return (self.embedding_width,)
        return (PATCHES_AXIS if self.dynamic_img_size else self.num_patches, self.embed_dim)

    def forward_bytes(self, batch: int) -> int:
        """A rough peak of the memory one forward pass holds at `batch` (fp32, no grad): the
        input, and inside a block the residual, its norm, qkv, two attention maps and the
        MLP's hidden layer before and after GELU. For refusing batch sizes that cannot fit
        before allocating them; ONNX Runtime's arena and torch's allocator add to it."""
        tokens = self.num_patches + self.num_prefix_tokens
        per_image = (self.in_chans * self.img_size ** 2
                     + tokens * self.embed_dim * (6 + 2 * self.mlp_ratio)
                     + 2 * self.num_heads * tokens ** 2)
        return int(4 * batch * per_image)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def family_options(self) -> dict[str, Any]:
        """The architecture fields that differ from the 2020 ViT's (the defaults), e.g.
        {"init_values": 1e-05, "reg_tokens": 4} for DINOv2 with registers."""
        fields = ("distilled", "patch_norm", "representation_size", *FAMILY_FIELDS)
        default = ViTConfig()
        return {f: getattr(self, f) for f in fields if getattr(self, f) != getattr(default, f)}

    @classmethod
    def from_dict(cls, values: Mapping[str, Any], strict: bool = False) -> "ViTConfig":
        """From --set strings or JSON. `strict` (a file we read) takes each value only in its
        own JSON type: "12" or true is not a depth there."""
        unknown = sorted(set(values) - {f.name for f in dataclasses.fields(cls)})
        if unknown:
            raise ConfigError(f"unknown config field(s): {', '.join(unknown)}")
        if strict:
            check_fields(values, CONFIG_KINDS, error=ConfigError)
        return cls(**{k: _coerce(k, v) for k, v in values.items()})

    def replace(self, **overrides: Any) -> "ViTConfig":
        return ViTConfig.from_dict({**self.to_dict(), **overrides})


# The largest value of each size field any published ViT comes near, times a margin.
LIMITS = {"img_size": 8192, "patch_size": 1024, "in_chans": 64, "num_classes": 1_000_000,
          "embed_dim": 16384, "depth": 256, "num_heads": 1024, "mlp_ratio": 64,
          "representation_size": 16384, "reg_tokens": 256, "attn_pool_num_heads": 1024,
          "attn_pool_mlp_ratio": 64, "ref_feat_shape": 8192, "pos_embed_grid": 8192,
          "rope_temperature": 1e6,
          "rope_grid_offset": 256}
FAMILY_FIELDS = ("class_token", "reg_tokens", "no_embed_class", "global_pool", "fc_norm",
                 "final_norm", "init_values", "pre_norm", "qk_norm", "act_layer",
                 "pos_embed_antialias", "pos_embed_interpolation", "pos_embed_grid",
                 "mlp_layer", "pos_embed", "rope_type",
                 "rope_temperature", "rope_grid_offset", "rope_grid_indexing",
                 "rope_rotate_half", "ref_feat_shape", "scale_mlp", "scale_attn_inner",
                 "pool_include_prefix", "attn_pool_num_heads", "attn_pool_mlp_ratio")
POOLS = ("token", "avg", "map", "token_avg")  # timm's global_pool values we build, and DINOv2's
ACTIVATIONS = ("gelu", "gelu_tanh", "quick_gelu", "silu")  # timm's act_layer names we build
# "swiglu": timm's SwiGLU, the gate and the input in two Linears (fc1_g, fc1_x; EVA02, DINOv3)
MLP_LAYERS = ("mlp", "swiglu_packed", "swiglu")
POS_EMBEDS = ("learn", "none")  # timm's pos_embed values we build
INTERPOLATIONS = ("bicubic", "bilinear")  # pos_embed_interpolation's filters
GRID_INDEXINGS = ("ij", "xy")  # rope_grid_indexing's orders
OUTPUTS = ("logits", "embedding", "tokens")  # what forward can return (config.output)
PATCHES_AXIS = "patches"  # the tokens' symbolic patch count under dynamic_img_size



def _integer(low: int) -> Callable[[Any], bool]:
    return lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= low


def _positive(v: Any) -> bool:
    return math.isfinite(v) and v > 0  # NaN and infinity fail


def _optional(fits: Callable[[Any], bool]) -> Callable[[Any], bool]:
    return lambda v: v is None or fits(v)


def _outputs(v: Any) -> bool:
    names = str(v).split(",")
    return set(names) <= set(OUTPUTS) and len(set(names)) == len(names)


def _one_of(name: str, values: tuple[str, ...]) -> tuple[str, Callable[[Any], bool], str]:
    return (name, values.__contains__,
            f"{{name}} must be one of {', '.join(values)}, got {{value!r}}")


# Each field on its own, in this order: (field, whether a value fits, the error, formatted
# with the field's `name` and `value`).
FIELD_CHECKS: tuple[tuple[str, Callable[[Any], bool], str], ...] = (
    *((name, _integer(1), "{name} must be a positive integer, got {value!r}")
      for name in ("img_size", "patch_size", "in_chans", "embed_dim", "depth", "num_heads")),
    ("num_classes", lambda v: v >= 0, "{name} must be >= 0, got {value}"),
    # sizes no ViT has are corruption, not a model; NaN is left to the field's own check
    *((name, lambda v, high=high: v is None or not v > high,
       f"{{name}} must be at most {high:g}, got {{value!r}}") for name, high in LIMITS.items()),
    ("mlp_ratio", _positive, "{name} must be > 0, got {value}"),
    # LayerNorm's epsilon guards a division
    ("norm_eps", lambda v: 0 < v <= 1, "{name} must be in (0, 1], got {value}"),
    *((name, lambda v: 0.0 <= v < 1.0, "{name} must be in [0, 1), got {value}")
      for name in ("drop_rate", "attn_drop_rate", "drop_path_rate")),
    ("pos_embed_grid", _optional(_integer(1)),
     "{name} must be a positive integer or None, got {value!r}"),
    ("representation_size", _optional(lambda v: v > 0),
     "{name} must be positive or None, got {value}"),
    _one_of("global_pool", POOLS),
    _one_of("mlp_layer", MLP_LAYERS),
    _one_of("act_layer", ACTIVATIONS),
    ("reg_tokens", _integer(0), "{name} must be an integer >= 0, got {value!r}"),
    ("init_values", _optional(_positive), "{name} must be > 0 or None, got {value}"),
    ("output", _optional(_outputs),
     (f"{{name}} must name one or more of {', '.join(OUTPUTS)}, comma-separated, each once; "
      f"got {{value!r}}")),
    ("pos_embed_interpolation", INTERPOLATIONS.__contains__,
     "{name} must be bicubic or bilinear, got {value!r}"),
    _one_of("pos_embed", POS_EMBEDS),
    ("rope_type", _optional(ROPE_TYPES.__contains__),
     f"{{name}} must be one of {', '.join(ROPE_TYPES)} or none, got {{value!r}}"),
    ("rope_grid_indexing", GRID_INDEXINGS.__contains__,
     "{name} must be ij or xy, got {value!r}"),
    ("rope_temperature", _positive, "{name} must be > 0, got {value}"),
    ("rope_grid_offset", lambda v: 0 <= v <= LIMITS["rope_grid_offset"],
     f"{{name}} must be in [0, {LIMITS['rope_grid_offset']}], got {{value}}"),
    ("attn_pool_mlp_ratio", _optional(_positive), "{name} must be > 0, got {value}"),
)

# How the fields fit together, once each fits on its own: (when the config breaks the rule,
# the error, formatted with the config as `c`), in this order.
RULES: tuple[tuple[Callable[[ViTConfig], Any], str], ...] = (
    (lambda c: c.img_size % c.patch_size,
     "img_size {c.img_size} is not divisible by patch_size {c.patch_size}"),
    (lambda c: c.embed_dim % c.num_heads,
     "embed_dim {c.embed_dim} is not divisible by num_heads {c.num_heads}"),
    (lambda c: c.global_pool in ("token", "token_avg") and not c.class_token,
     "global_pool {c.global_pool} needs the class token (class_token=true)"),
    (lambda c: c.global_pool == "token_avg" and (c.fc_norm or c.representation_size),
     ("global_pool token_avg takes no fc_norm or representation_size (DINOv2's head is one "
      "Linear on the pooled pair)")),
    (lambda c: c.mlp_layer == "swiglu_packed" and c.mlp_hidden_dim % 2,
     "mlp_layer swiglu_packed needs an even MLP width, got {c.mlp_hidden_dim}"),
    (lambda c: c.projection_head and not c.num_classes,
     "projection_head needs a head (num_classes > 0, its width)"),
    (lambda c: "logits" in c.output_names and c.projection_head,
     "output logits needs a classifier head; this model's head gives an embedding"),
    (lambda c: "logits" in c.output_names and not c.num_classes,
     "output logits needs a classifier head (num_classes > 0)"),
    (lambda c: c.normalize and "embedding" not in c.output_names,
     "normalize applies to an embedding output (output=embedding)"),
    (lambda c: c.pos_embed_grid is not None and c.pos_embed != "learn",
     "pos_embed_grid is the learned table's grid (pos_embed learn)"),
    (lambda c: c.rope_type is not None and c.head_dim % 4,
     "rotary embeddings need a head width divisible by 4, got {c.head_dim}"),
    (lambda c: c.rope_type == "mixed" and c.rope_rotate_half,
     "rope_type mixed rotates pairs (rope_rotate_half=false)"),
    # the attention pool's options, set (not None or False) without it
    *((lambda c, name=name: getattr(c, name) not in (None, False) and c.global_pool != "map",
       f"{name} applies to the attention pool (global_pool map)")
      for name in ("attn_pool_num_heads", "attn_pool_mlp_ratio", "pool_include_prefix")),
    (lambda c: c.ref_feat_shape is not None and not (
        c.rope_type == "cat" and 0 < c.ref_feat_shape <= LIMITS["img_size"]),
     ("ref_feat_shape is a positive grid side of rope_type cat, got {c.ref_feat_shape!r} "
      "with rope_type {c.rope_type}")),
    (lambda c: c.attn_pool_num_heads is not None and (
        c.attn_pool_num_heads <= 0 or c.embed_dim % c.attn_pool_num_heads),
     "attn_pool_num_heads must divide embed_dim {c.embed_dim}, got {c.attn_pool_num_heads}"),
    (lambda c: c.distilled and (not c.class_token or c.reg_tokens or c.global_pool != "token"),
     "distilled (DeiT) needs the class token, no registers and global_pool token"),
)

# What each field may hold in a JSON file (read from the field types once), and what a
# --set string becomes: the type without Optional, and whether None is allowed.
CONFIG_KINDS = dataclass_kinds(ViTConfig)
_FIELD_TYPES = {name: field_type(hint) for name, hint in typing.get_type_hints(ViTConfig).items()}


def _coerce(name: str, value: Any) -> Any:
    """Turn JSON or command-line values into the field's type; reject what does not fit."""
    base, optional = _FIELD_TYPES[name]
    try:
        if value is None or (isinstance(value, str) and value.lower() in ("none", "null")
                             and (base is not str or optional)):  # "none" is a pos_embed
            if optional:
                return None
            raise ValueError("None")
        if base is str:
            if not isinstance(value, str):
                raise ValueError(value)
            return value
        if base is bool:
            if isinstance(value, str):
                if value.lower() in ("true", "1", "yes"):
                    return True
                if value.lower() in ("false", "0", "no"):
                    return False
                raise ValueError(value)
            return bool(value)
        if base is int:
            number = float(value)
            if number != int(number):
                raise ValueError(value)
            return int(number)
        return float(value)
    except (TypeError, ValueError, OverflowError):  # float("inf") has no int
        raise ConfigError(wrong(name, CONFIG_KINDS[name], value)) from None


# Presets under timm's names; each is a few overrides of ViTConfig's defaults.
PRESETS: dict[str, dict[str, Any]] = {
    "vit_seed_tiny": dict(img_size=32, patch_size=8, in_chans=3, num_heads=4, embed_dim=64,
                          depth=2, num_classes=10),
    "vit_tiny_patch16_224": dict(embed_dim=192, depth=12, num_heads=3),
    "vit_small_patch16_224": dict(embed_dim=384, depth=12, num_heads=6),
    "vit_base_patch16_224": dict(embed_dim=768, depth=12, num_heads=12),
    "vit_base_patch32_224": dict(patch_size=32, embed_dim=768, depth=12, num_heads=12),
    "vit_large_patch16_224": dict(embed_dim=1024, depth=24, num_heads=16),
    "vit_huge_patch14_224": dict(patch_size=14, embed_dim=1280, depth=32, num_heads=16),
}


def preset_config(name: str, **overrides: Any) -> ViTConfig:
    if name not in PRESETS:
        raise ConfigError(f"unknown preset {name!r}; choose one of: {', '.join(PRESETS)}")
    return ViTConfig.from_dict({**PRESETS[name], **overrides})


def create_model(name_or_config: str | ViTConfig, **overrides: Any) -> "VisionTransformer":
    """`create_model("vit_base_patch16_224", num_classes=10)` or `create_model(config)`."""
    if isinstance(name_or_config, ViTConfig):
        config = name_or_config.replace(**overrides) if overrides else name_or_config
    else:
        config = preset_config(name_or_config, **overrides)
    return VisionTransformer(config)


class PatchEmbed(nn.Module):
    """Image to patch tokens: Conv2d with kernel = stride = patch, flatten, optional LayerNorm.

    With `dynamic`, any height and width that are multiples of the patch are accepted and the
    tokens come out on their grid, [B, H/P, W/P, D] (timm's NHWC output for dynamic_img_size).
    """

    def __init__(self, img_size: int, patch_size: int, in_chans: int, embed_dim: int,
                 norm: bool = False, eps: float = 1e-6, dynamic: bool = False,
                 bias: bool = True):
        super().__init__()
        self.img_size = img_size
        self.patch_size = patch_size
        self.in_chans = in_chans
        self.dynamic = dynamic
        self.proj = nn.Conv2d(in_chans, embed_dim, kernel_size=patch_size, stride=patch_size,
                              bias=bias)
        self.norm = nn.LayerNorm(embed_dim, eps=eps) if norm else nn.Identity()
        # The same arithmetic as one GEMM: patches cut out by reshapes, then the conv's
        # weight as a Linear's (kernel = stride = patch, no padding). An export-time
        # lowering (export --patch-embed gemm), never a field of the model.
        self.as_gemm = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, C, H, W = x.shape
        torch._assert(C == self.in_chans,
                      f"expected {self.in_chans} input channels, got {C}")
        P = self.patch_size
        if not self.dynamic:
            torch._assert(H == self.img_size and W == self.img_size,
                          f"expected a {self.img_size}x{self.img_size} image, got {H}x{W}")
        else:
            torch._assert(H % P == 0 and W % P == 0,
                          f"expected height and width that are multiples of {P}, got {H}x{W}")
        if self.as_gemm:
            x = x.reshape(B, C, H // P, P, W // P, P).permute(0, 2, 4, 1, 3, 5)
            x = x.reshape(B, H // P, W // P, C * P * P)
            weight = self.proj.weight.reshape(self.proj.out_channels, C * P * P)
            x = nn.functional.linear(x, weight, self.proj.bias)  # [B, H/P, W/P, D]
            return self.norm(x if self.dynamic else x.flatten(1, 2))
        x = self.proj(x)  # [B, D, H/P, W/P]
        if not self.dynamic:
            return self.norm(x.flatten(2).transpose(1, 2))  # [B, N, D]
        return self.norm(x.permute(0, 2, 3, 1))  # [B, H/P, W/P, D]


class Attention(nn.Module):
    """Multi-head self-attention with one fused qkv Linear and scale head_dim ** -0.5;
    with `qk_norm`, a LayerNorm over each head's queries and keys (timm's q_norm, k_norm).
    Given a rotary table, the patches' queries and keys are rotated by it (the prefix tokens
    are not), as timm's EvaAttention and AttentionRope; `scale_norm`: a LayerNorm on the
    heads' output before proj (timm's scale_attn_inner)."""

    def __init__(self, dim: int, num_heads: int, qkv_bias: bool = True,
                 attn_drop: float = 0.0, proj_drop: float = 0.0, qk_norm: bool = False,
                 eps: float = 1e-6, num_prefix_tokens: int = 0, rotate_half: bool = False,
                 scale_norm: bool = False):
        super().__init__()
        self.num_heads = num_heads
        self.head_dim = dim // num_heads
        self.scale = self.head_dim ** -0.5
        self.num_prefix_tokens = num_prefix_tokens
        self.rotate_half = rotate_half
        self.qkv = nn.Linear(dim, dim * 3, bias=qkv_bias)
        self.q_norm = nn.LayerNorm(self.head_dim, eps=eps) if qk_norm else nn.Identity()
        self.k_norm = nn.LayerNorm(self.head_dim, eps=eps) if qk_norm else nn.Identity()
        self.attn_drop = nn.Dropout(attn_drop)
        self.norm = nn.LayerNorm(dim, eps=eps) if scale_norm else nn.Identity()
        self.proj = nn.Linear(dim, dim)
        self.proj_drop = nn.Dropout(proj_drop)

    def _rotate(self, x: torch.Tensor, rope: torch.Tensor) -> torch.Tensor:
        """[B, H, T, d] with the patches (after the prefix) rotated by rope [.., N, 2d]."""
        n = self.num_prefix_tokens
        patches = R.apply(x[:, :, n:], rope, self.rotate_half)  # [B, H, N, d]
        return torch.cat([x[:, :, :n], patches], dim=2) if n else patches

    def forward(self, x: torch.Tensor, rope: Optional[torch.Tensor] = None) -> torch.Tensor:
        B, N, D = x.shape
        qkv = self.qkv(x).reshape(B, N, 3, self.num_heads, self.head_dim)  # [B, N, 3, H, d]
        q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)  # 3 x [B, H, N, d]
        q, k = self.q_norm(q), self.k_norm(k)
        if rope is not None:
            q, k = self._rotate(q, rope), self._rotate(k, rope)
        attn = (q * self.scale) @ k.transpose(-2, -1)  # [B, H, N, N]
        attn = self.attn_drop(attn.softmax(dim=-1))
        x = (attn @ v).transpose(1, 2).reshape(B, N, D)  # [B, N, D]
        return self.proj_drop(self.proj(self.norm(x)))


class QuickGELU(nn.Module):
    """x * sigmoid(1.702 x): the GELU approximation OpenAI's CLIP was trained with."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.sigmoid(1.702 * x)


def activation(name: str) -> nn.Module:
    """timm's act_layer by name: exact GELU, its tanh approximation, quick GELU, or SiLU."""
    if name == "gelu_tanh":
        return nn.GELU(approximate="tanh")
    if name == "silu":
        return nn.SiLU()
    return QuickGELU() if name == "quick_gelu" else nn.GELU()


class Mlp(nn.Module):
    """Linear(D, hidden) - activation - Linear(hidden, D), with dropout after each Linear
    (`layer` "mlp"); or gated, act(gate) * x into Linear(width, D): "swiglu_packed", timm's
    SwiGLUPacked, with the gate and x as the halves of one fc1 (width hidden / 2);
    "swiglu", timm's SwiGLU, with them in two Linears fc1_g and fc1_x (width hidden).
    `norm`: a LayerNorm on the layer fc2 takes (timm's scale_mlp, EVA02's sub-LN)."""

    def __init__(self, dim: int, hidden: int, drop: float = 0.0, act: str = "gelu",
                 layer: str = "mlp", norm: bool = False, eps: float = 1e-6):
        super().__init__()
        self.layer = layer
        if layer == "swiglu":
            self.fc1_g = nn.Linear(dim, hidden)
            self.fc1_x = nn.Linear(dim, hidden)
        else:
            self.fc1 = nn.Linear(dim, hidden)
        self.act = activation(act)
        self.drop1 = nn.Dropout(drop)
        width = hidden // 2 if layer == "swiglu_packed" else hidden
        self.norm = nn.LayerNorm(width, eps=eps) if norm else nn.Identity()
        self.fc2 = nn.Linear(width, dim)
        self.drop2 = nn.Dropout(drop)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.layer == "swiglu":
            x = self.act(self.fc1_g(x)) * self.fc1_x(x)  # [B, T, hidden]
        elif self.layer == "swiglu_packed":
            x, gate = self.fc1(x).chunk(2, dim=-1)  # [B, T, hidden / 2] each
            x = self.act(x) * gate
        else:
            x = self.act(self.fc1(x))  # [B, T, hidden]
        return self.drop2(self.fc2(self.norm(self.drop1(x))))


class DropPath(nn.Module):
    """Stochastic depth: drop a residual branch per sample, scale survivors by 1 / (1 - p)."""

    def __init__(self, drop_prob: float = 0.0):
        super().__init__()
        self.drop_prob = drop_prob

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.drop_prob == 0.0 or not self.training:
            return x
        keep = 1.0 - self.drop_prob
        shape = (x.shape[0],) + (1,) * (x.ndim - 1)  # one draw per sample
        mask = torch.empty(shape, dtype=x.dtype, device=x.device).bernoulli_(keep)
        return x * mask / keep

    def extra_repr(self) -> str:
        return f"drop_prob={self.drop_prob:.3f}"


class LayerScale(nn.Module):
    """x * gamma, one learned scale per channel (CaiT, DeiT III, DINOv2; timm's LayerScale)."""

    def __init__(self, dim: int, init_values: float = 1e-5):
        super().__init__()
        self.gamma = nn.Parameter(torch.full((dim,), float(init_values)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.gamma


class Block(nn.Module):
    """Pre-norm encoder block; LayerScale on each branch when init_values is set."""

    def __init__(self, config: ViTConfig, drop_path: float):
        super().__init__()
        dim, init = config.embed_dim, config.init_values
        self.norm1 = nn.LayerNorm(dim, eps=config.norm_eps)
        self.attn = Attention(dim, config.num_heads, config.qkv_bias,
                              config.attn_drop_rate, config.drop_rate, config.qk_norm,
                              config.norm_eps, config.num_prefix_tokens,
                              config.rope_rotate_half, config.scale_attn_inner)
        self.ls1 = LayerScale(dim, init) if init else nn.Identity()
        self.norm2 = nn.LayerNorm(dim, eps=config.norm_eps)
        self.mlp = Mlp(dim, int(dim * config.mlp_ratio), config.drop_rate, config.act_layer,
                       config.mlp_layer, config.scale_mlp, config.norm_eps)
        self.ls2 = LayerScale(dim, init) if init else nn.Identity()
        self.drop_path = DropPath(drop_path)

    def forward(self, x: torch.Tensor, rope: Optional[torch.Tensor] = None) -> torch.Tensor:
        x = x + self.drop_path(self.ls1(self.attn(self.norm1(x), rope)))  # [B, T, D]
        x = x + self.drop_path(self.ls2(self.mlp(self.norm2(x))))  # [B, T, D]
        return x


class AttentionPoolLatent(nn.Module):
    """Multi-head attention pooling (MAP, SigLIP's head) as timm's AttentionPoolLatent with
    VisionTransformer's arguments: one learned latent query attends over the tokens, then
    proj, and a residual MLP behind a LayerNorm. [B, N, D] -> [B, D]."""

    def __init__(self, config: ViTConfig):
        super().__init__()
        dim = config.embed_dim
        self.num_heads = config.attn_pool_num_heads or config.num_heads
        self.head_dim = dim // self.num_heads
        self.scale = self.head_dim ** -0.5
        self.latent = nn.Parameter(torch.zeros(1, 1, dim))
        self.q = nn.Linear(dim, dim)
        self.kv = nn.Linear(dim, dim * 2)
        self.proj = nn.Linear(dim, dim)
        self.norm = nn.LayerNorm(dim, eps=config.norm_eps)
        ratio = config.attn_pool_mlp_ratio or config.mlp_ratio
        self.mlp = Mlp(dim, int(dim * ratio), act=config.act_layer)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, N, D = x.shape
        q = self.q(self.latent.expand(B, -1, -1))  # [B, 1, D]
        q = q.reshape(B, 1, self.num_heads, self.head_dim).transpose(1, 2)  # [B, H, 1, d]
        kv = self.kv(x).reshape(B, N, 2, self.num_heads, self.head_dim)  # [B, N, 2, H, d]
        k, v = kv.permute(2, 0, 3, 1, 4).unbind(0)  # 2 x [B, H, N, d]
        attn = ((q * self.scale) @ k.transpose(-2, -1)).softmax(dim=-1)  # [B, H, 1, N]
        x = self.proj((attn @ v).transpose(1, 2).reshape(B, 1, D))  # [B, 1, D]
        x = x + self.mlp(self.norm(x))  # [B, 1, D]
        return x[:, 0]  # [B, D]


class VisionTransformer(nn.Module):
    """timm's VisionTransformer for the options ViTConfig has, under timm's module names.

    tokens: [class][dist][registers] patches -> (+ pos_embed) -> norm_pre -> blocks -> norm
    (with rope_type, each block's attention also rotates the patches' queries and keys by a
    rotary table of the input's patch grid: timm's Eva)
    head:   pool ("token", "avg" or the "map" attention pool) -> fc_norm -> pre_logits -> head
    """

    def __init__(self, config: ViTConfig):
        super().__init__()
        self.config = config
        D = config.embed_dim
        self.patch_embed = PatchEmbed(config.img_size, config.patch_size, config.in_chans, D,
                                      norm=config.patch_norm, eps=config.norm_eps,
                                      dynamic=config.dynamic_img_size,
                                      bias=not config.pre_norm)  # timm: CLIP's is unbiased
        self.cls_token = nn.Parameter(torch.zeros(1, 1, D)) if config.class_token else None
        self.dist_token = nn.Parameter(torch.zeros(1, 1, D)) if config.distilled else None
        self.reg_token = nn.Parameter(torch.zeros(1, config.reg_tokens, D)) \
            if config.reg_tokens else None
        self.pos_embed = nn.Parameter(torch.zeros(1, config.pos_embed_tokens, D)) \
            if config.pos_embed == "learn" else None
        self.pos_drop = nn.Dropout(config.drop_rate)
        self.rope = R.RotaryEmbedding(config) if config.rope_type else None
        self.norm_pre = nn.LayerNorm(D, eps=config.norm_eps) if config.pre_norm \
            else nn.Identity()
        step = config.drop_path_rate / max(config.depth - 1, 1)
        rates = [i * step for i in range(config.depth)]  # linear over depth, 0 at the first
        self.blocks = nn.ModuleList(Block(config, rate) for rate in rates)
        final = config.final_norm
        self.norm = nn.LayerNorm(D, eps=config.norm_eps) if final and not config.use_fc_norm \
            else nn.Identity()
        self.attn_pool = AttentionPoolLatent(config) if config.global_pool == "map" else None
        self.fc_norm = nn.LayerNorm(D, eps=config.norm_eps) if final and config.use_fc_norm \
            else nn.Identity()
        if config.representation_size:
            self.pre_logits = nn.Sequential()
            self.pre_logits.add_module("fc", nn.Linear(D, config.representation_size))
            self.pre_logits.add_module("act", nn.Tanh())
        else:
            self.pre_logits = nn.Identity()
        self.num_features = config.num_features
        k = config.num_classes
        self.head = nn.Linear(self.num_features, k) if k > 0 else nn.Identity()
        if config.distilled:
            self.head_dist = nn.Linear(D, k) if k > 0 else nn.Identity()
        self.init_weights()

    def init_weights(self) -> None:
        """Trunc-normal(0.02) for Linear and Conv weights and the tokens; LayerNorm (1, 0);
        LayerScale keeps its init_values."""
        for p in (self.cls_token, self.dist_token, self.reg_token, self.pos_embed):
            if p is not None:
                nn.init.trunc_normal_(p, std=0.02)
        if self.rope is not None and self.config.rope_type == "mixed":
            self.rope.freqs.data.copy_(mixed_freqs(self.config))
        if self.attn_pool is not None:
            nn.init.trunc_normal_(self.attn_pool.latent, std=self.config.embed_dim ** -0.5)
        for m in self.modules():
            if isinstance(m, (nn.Linear, nn.Conv2d)):
                nn.init.trunc_normal_(m.weight, std=0.02)
                if m.bias is not None:
                    nn.init.zeros_(m.bias)
            elif isinstance(m, nn.LayerNorm):
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)

    def _pos_embed(self, x: torch.Tensor) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
        """Prefix tokens and the position embedding, as timm's `_pos_embed` (added before the
        prefix joins when no_embed_class); for a dynamic size the embedding is resampled to
        the input's patch grid, in the graph. With rope_type, also the rotary table of the
        grid: from the input's shape under a dynamic size, else from the config (a constant
        once traced)."""
        c = self.config
        pos_embed = self.pos_embed  # [1, (prefix) + table_grid**2, D] or None
        h = w = c.grid_size
        if c.dynamic_img_size:
            B, h, w, D = x.shape  # [B, h, w, D]: the input's patch grid
            x = x.reshape(B, h * w, D)  # [B, h*w, D]
        if pos_embed is not None and (c.dynamic_img_size or c.table_grid != c.grid_size):
            # once, from the table as its source holds it, to the input's grid
            pos_embed = resample_pos_embed(self.pos_embed, (h, w),
                                           0 if c.no_embed_class else c.num_prefix_tokens,
                                           antialias=c.pos_embed_antialias,
                                           mode=c.pos_embed_interpolation)  # [1, .. + h*w, D]
        rope = self.rope(h, w, x) if self.rope is not None else None  # [.., h*w, 2 head_dim]
        prefix = [t.expand(x.shape[0], -1, -1)  # [B, 1 or R, D] each
                  for t in (self.cls_token, self.dist_token, self.reg_token) if t is not None]
        if c.no_embed_class:
            x = x if pos_embed is None else x + pos_embed  # [B, N, D]
            return self.pos_drop(torch.cat(prefix + [x], dim=1) if prefix else x), rope
        x = torch.cat(prefix + [x], dim=1) if prefix else x  # [B, prefix + N, D]
        x = x if pos_embed is None else x + pos_embed
        return self.pos_drop(x), rope  # [B, prefix + N, D]

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        """All tokens after the final norm, as timm's: [B, C, H, W] -> [B, prefix + N, D]."""
        x, rope = self._pos_embed(self.patch_embed(x))  # [B, prefix + N, D]
        x = self.norm_pre(x)
        mixed = self.config.rope_type == "mixed"  # one table per block: [depth, H, N, 2d]
        for i, block in enumerate(self.blocks):
            x = block(x, rope[i] if mixed else rope)  # [B, prefix + N, D]
        return self.norm(x)

    def pool(self, x: torch.Tensor) -> torch.Tensor:
        """timm's pooling: the class token, the mean of the patch tokens, or the attention
        pool over them, [B, T, D] -> [B, D]; DINOv2's class token and mean, [B, 2D]."""
        if self.attn_pool is not None:
            return self.attn_pool(x if self.config.pool_include_prefix
                                  else x[:, self.config.num_prefix_tokens:])
        if self.config.global_pool == "avg":
            return x[:, self.config.num_prefix_tokens:].mean(dim=1)
        if self.config.global_pool == "token_avg":
            patches = x[:, self.config.num_prefix_tokens:].mean(dim=1)  # [B, D]
            return torch.cat([x[:, 0], patches], dim=-1)  # [B, 2D]
        return x[:, 0]

    def forward_head(self, x: torch.Tensor, pre_logits: bool = False) -> torch.Tensor:
        """Pool forward_features' output, then classify, as timm's: [B, T, D] -> [B, F] with
        `pre_logits` (the embedding), else [B, K]. DeiT averages its two tokens."""
        if self.dist_token is not None:
            cls, dist = x[:, 0], x[:, 1]  # [B, D] each
            if pre_logits and self.config.representation_size:
                return self.pre_logits(cls)  # Hugging Face DeiTModel's pooler: the class token
            if pre_logits:
                return (cls + dist) / 2
            return (self.head(cls) + self.head_dist(dist)) / 2  # [B, K]
        x = self.pre_logits(self.fc_norm(self.pool(x)))  # [B, F]
        return x if pre_logits else self.head(x)

    def forward(self, x: torch.Tensor) -> torch.Tensor | tuple[torch.Tensor, ...]:
        """[B, C, H, W] -> the logits [B, K], the embedding [B, F] or the patch tokens
        [B, N, D]; a tuple of them, in config.output's order, where it names several."""
        c = self.config
        tokens = self.forward_features(x)  # [B, prefix + N, D]
        outputs = []
        for name in c.output_names:
            if name == "tokens":
                outputs.append(tokens[:, c.num_prefix_tokens:])  # [B, N, D]
            elif name == "logits":
                outputs.append(self.forward_head(tokens))  # [B, K]
            else:
                embedding = self.forward_head(tokens, pre_logits=not c.projection_head)
                outputs.append(F.normalize(embedding, dim=-1) if c.normalize else embedding)
        return outputs[0] if len(outputs) == 1 else tuple(outputs)


def mixed_freqs(config: ViTConfig, seed: int = 0) -> torch.Tensor:
    """ROPE-ViT mixed's starting frequencies, as timm's init_random_2d_freqs: per block and
    head a random rotation of the axial bands, [2, depth, heads, head_dim / 2]."""
    head_dim = config.embed_dim // config.num_heads
    magnitude = 1.0 / (config.rope_temperature
                       ** (torch.arange(0, head_dim, 4, dtype=torch.float32) / head_dim))
    g = torch.Generator().manual_seed(seed)
    angles = torch.rand(config.depth, config.num_heads, 1, generator=g) * 2 * math.pi
    fx = torch.cat([magnitude * torch.cos(angles), magnitude * torch.cos(angles + math.pi / 2)],
                   dim=-1)
    fy = torch.cat([magnitude * torch.sin(angles), magnitude * torch.sin(angles + math.pi / 2)],
                   dim=-1)
    return torch.stack([fx, fy], dim=0)


def as_tuple(outputs: Any) -> tuple:
    """forward's answer as a tuple, one item per output (a lone tensor is one)."""
    return tuple(outputs) if isinstance(outputs, (tuple, list)) else (outputs,)


def with_dynamic_size(model: "VisionTransformer") -> "VisionTransformer":
    """The same weights in a model that takes any multiple of the patch (dynamic_img_size)."""
    if model.config.dynamic_img_size:
        return model
    dynamic = VisionTransformer(model.config.replace(dynamic_img_size=True))
    dynamic.load_state_dict(model.state_dict(), strict=True)
    return dynamic.train(model.training)


def with_output(model: "VisionTransformer", output: Optional[str],
                normalize: bool = False) -> "VisionTransformer":
    """The model answering `output` (one or more of OUTPUTS, comma-separated; None: as it
    is), its embedding L2-normalised where `normalize`: the same modules and weights, another
    config."""
    config = model.config.replace(output=output or model.config.output,
                                  normalize=normalize or model.config.normalize)
    model.config = config  # no module depends on these two fields
    return model


def random_input(config: ViTConfig, batch: int, seed: int = 0,
                 size: Optional[tuple[int, int]] = None) -> torch.Tensor:
    """Seeded standard-normal input [batch, C, H, W] at `size` (H, W; default the config's
    img_size); the same (seed, batch, size) gives the same."""
    height, width = size or (config.img_size, config.img_size)
    shift = 0 if size is None else 7919 * (height * 8191 + width)  # other sizes, other draws
    g = torch.Generator().manual_seed(seed * 1_000_003 + batch + shift)
    return torch.randn(batch, config.in_chans, height, width, generator=g)


def size_values(config, grid_h: int, grid_w: int) -> dict[int, str]:
    """The numbers a graph holds when an input size is baked in: sides, grid, token counts."""
    P, n = config.patch_size, grid_h * grid_w
    return {P * grid_h: "height", P * grid_w: "width", grid_h: "grid height",
            grid_w: "grid width", n: "patch tokens", n + config.num_prefix_tokens: "tokens"}


def model_constants(config) -> tuple[int, ...]:
    """Sizes of the model itself that legitimately appear in shape constants."""
    D, heads = config.embed_dim, config.num_heads
    head = D // heads
    rope = (head // 4, head // 2, 2 * head, config.depth) if config.rope_type else ()
    pool = (config.attn_pool_num_heads or heads, D // (config.attn_pool_num_heads or heads))
    table = (config.table_grid, config.pos_embed_tokens) if config.pos_embed_grid else ()
    return (0, 1, 2, 3, -1, config.in_chans, D, 3 * D, heads, head, *table,
            int(D * config.mlp_ratio), config.num_classes, config.num_prefix_tokens,
            config.representation_size or 0, config.reg_tokens, 2 * D,
            int(D * config.mlp_ratio) // 2, *rope, *pool)


def resample_pos_embed(pos_embed: torch.Tensor, new_size: int | tuple[int, int],
                       num_prefix: int, antialias: bool = True,
                       mode: str = "bicubic", align_corners: bool = False) -> torch.Tensor:
    """The patch part of a [1, prefix + g*g, D] embedding resampled to a new grid (an int for
    a square one, or (h, w)) as timm's resample_abs_pos_embed does, for checkpoints and for
    dynamic_img_size alike: bicubic, antialias on, align_corners off. It always interpolates
    (at the same size that is an exact copy): an early return would bake the example input's
    size into a traced or exported graph. `antialias=False`: as Hugging Face's
    interpolate_pos_encoding does; `align_corners=True`: as torchvision's
    interpolate_embeddings does (without antialias)."""
    prefix, grid = pos_embed[:, :num_prefix], pos_embed[:, num_prefix:]
    old = math.isqrt(grid.shape[1])
    if old * old != grid.shape[1]:
        raise ConfigError(f"position embedding of {grid.shape[1]} patches is not a square grid")
    h, w = (new_size, new_size) if isinstance(new_size, int) else new_size
    D = grid.shape[-1]
    grid = grid.reshape(1, old, old, D).permute(0, 3, 1, 2)  # [1, D, g, g]
    grid = F.interpolate(grid.float(), size=(h, w), mode=mode, align_corners=align_corners,
                         antialias=antialias)  # [1, D, h, w]
    grid = grid.permute(0, 2, 3, 1).reshape(1, h * w, D)  # [1, h*w, D]
    return torch.cat([prefix, grid.to(pos_embed.dtype)], dim=1)


def train_step_check(config: ViTConfig, batch: int = 2, seed: int = 0,
                     device: str = "cpu") -> dict[str, Any]:
    """The seed's self-check: forward, cross-entropy, backward, one AdamW step, shape checks."""
    torch.manual_seed(seed)
    model = VisionTransformer(config).to(device).train()
    x = torch.randn(batch, config.in_chans, config.img_size, config.img_size, device=device)
    target = torch.randint(0, max(config.num_classes, 1), (batch,), device=device)
    logits = as_tuple(model(x))[0]  # [B, K]: the first output
    expected = (batch, *config.output_shape(config.output_names[0]))
    if tuple(logits.shape) != expected:
        raise ConfigError(f"logits shape {tuple(logits.shape)}, expected {expected}")
    tokens = model.forward_features(x)  # [B, T, D]
    expected_tokens = (batch, config.num_patches + config.num_prefix_tokens, config.embed_dim)
    if tuple(tokens.shape) != expected_tokens:
        raise ConfigError(f"features shape {tuple(tokens.shape)}, expected {expected_tokens}")
    pooled = model.forward_head(tokens, pre_logits=True)  # [B, F]
    if tuple(pooled.shape) != (batch, model.num_features):
        raise ConfigError(f"pre-logits shape {tuple(pooled.shape)}, "
                          f"expected {(batch, model.num_features)}")
    loss = F.cross_entropy(logits, target)  # scalar
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    before = model.head.weight.detach().clone()
    optimizer.zero_grad()
    loss.backward()
    missing = [n for n, p in model.named_parameters() if p.requires_grad and p.grad is None]
    if missing:
        raise ConfigError(f"no gradient reached {missing[:3]}")
    optimizer.step()
    return {"logits_shape": tuple(logits.shape), "loss": loss.item(),
            "pred": logits.argmax(dim=1).tolist(),
            "updated": bool((model.head.weight.detach() != before).any())}
