"""The Vision Transformer (Dosovitskiy et al., 2020) as the design notes describe it.

Submodule names follow timm's `VisionTransformer`, so timm state dicts load without renaming.
Its configuration (ViTConfig, presets, the names of what it builds) lives in `config`, which
needs no torch; the names are re-exported here. This module knows nothing of ONNX or ONNX
Runtime.
"""
from __future__ import annotations

import copy
import math
from typing import Any, Optional

import torch
import torch.nn.functional as F
from torch import nn

from . import rope as R
from .config import (  # noqa: F401  (re-exported: the model's names, as callers import them)
    ACTIVATIONS,
    CONFIG_KINDS,
    FAMILY_FIELDS,
    GRID_INDEXINGS,
    INTERPOLATIONS,
    LIMITS,
    MLP_LAYERS,
    OUTPUTS,
    PATCHES_AXIS,
    POOLS,
    POS_EMBEDS,
    PRESETS,
    ViTConfig,
    preset_config,
)
from .errors import ConfigError


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

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        _, C, H, W = x.shape
        torch._assert(C == self.in_chans,
                      f"expected {self.in_chans} input channels, got {C}")
        P = self.patch_size
        if not self.dynamic:
            torch._assert(H == self.img_size and W == self.img_size,
                          f"expected a {self.img_size}x{self.img_size} image, got {H}x{W}")
        else:
            torch._assert(H % P == 0 and W % P == 0,
                          f"expected height and width that are multiples of {P}, got {H}x{W}")
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
    config, in a shallow copy (the model given keeps its own)."""
    config = model.config.replace(output=output or model.config.output,
                                  normalize=normalize or model.config.normalize)
    answering = copy.copy(model)  # its own attributes; the modules and weights shared
    answering.config = config  # no module depends on these two fields
    return answering


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
    interpolate_embeddings does (without antialias). Bilinear, antialiased (SigLIP2): as
    transformers gives it on the CPU, one patch wide too (one_wide_as_torch_cpu)."""
    prefix, grid = pos_embed[:, :num_prefix], pos_embed[:, num_prefix:]
    old = math.isqrt(grid.shape[1])
    if old * old != grid.shape[1]:
        raise ConfigError(f"position embedding of {grid.shape[1]} patches is not a square grid")
    h, w = (new_size, new_size) if isinstance(new_size, int) else new_size
    D = grid.shape[-1]
    grid = grid.reshape(1, old, old, D).permute(0, 3, 1, 2)  # [1, D, g, g]
    grid = F.interpolate(grid.float(), size=(h, w), mode=mode, align_corners=align_corners,
                         antialias=antialias)  # [1, D, h, w]
    if mode == "bilinear" and antialias:  # SigLIP2's table (its only bilinear one)
        grid = one_wide_as_torch_cpu(grid, old)
    grid = grid.permute(0, 2, 3, 1).reshape(1, h * w, D)  # [1, h*w, D]
    return torch.cat([prefix, grid.to(pos_embed.dtype)], dim=1)


def one_wide_as_torch_cpu(grid: torch.Tensor, old: int) -> torch.Tensor:
    """SigLIP2's table [1, D, h, w], resized from `old` x `old` bilinearly and antialiased,
    as transformers gives it on the CPU, which is not the formula on a grid one patch wide:
    there every row is the first row.

    transformers resizes `weight.reshape(g, g, D).permute(2, 0, 1).unsqueeze(0)`, which
    torch's CPU kernel takes as contiguous (NCHW). It resamples the width first, then the
    height in a loop (basic_loop_aa_vertical) that reads the source rows and weights of the
    first output row it is given for the whole innermost axis, which it takes to be the
    width: at width 1 the innermost axis is the height, and each of the h rows is row 0's
    mix. Ours is channels-last, its innermost axis the channels, and gives the formula, as
    torch does on CUDA (one thread per output value). At height 1, at the table's own
    height (no second pass) and at widths of two and more both give the formula. (With
    more than 32,768 values and a thread count that splits a column, e.g. 5 threads, torch
    gives other rows there too; not followed.) Tensor ops, not a Python `if`, so that a
    traced or exported graph keeps it at every size (torch.export would specialise a test
    of a side)."""
    _, _, h, w = grid.shape
    width = torch.ones(w, dtype=torch.long, device=grid.device).sum()  # w and h as tensors:
    height = torch.ones(h, dtype=torch.long, device=grid.device).sum()  # symbolic in a graph
    first_row = (width == 1) & (height != old)  # [] bool
    return torch.where(first_row, grid[:, :, :1], grid)  # [1, D, h, w]


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
