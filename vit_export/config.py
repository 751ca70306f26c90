"""The Vision Transformer's configuration: `ViTConfig`, its checks and presets, and the names
of what it can build (OUTPUTS, POOLS, ...).

Kept apart from the model's modules so that what only reads or checks a configuration (the
command line's help, `presets`, a bundle's description) does not load torch.
"""
from __future__ import annotations

import dataclasses
import math
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Optional

from .errors import ConfigError
from .schema import check_fields, dataclass_kinds, field_type, wrong

ROPE_TYPES = ("cat", "dinov3", "mixed")  # timm's rope_type values we build


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
