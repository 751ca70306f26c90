"""Rotary position embeddings on the patch grid (RoPE), as timm's `pos_embed_sincos` builds
them for its `Eva` models: EVA02, ROPE-ViT, Perception Encoder and DINOv3.

A rotary table holds, for every patch of the grid, the sine and cosine of angles that grow
with the patch's row and column; attention rotates each query and key by them, so their
product depends on where two patches sit relative to each other. The table is a function of
the grid, never a weight (ROPE-ViT's mixed variant learns the frequencies, not the table):
it is computed here from the grid's height and width, so under a dynamic image size the
exported graph computes it from the input's shape, and at a fixed size it folds to a
constant.

Three of timm's variants (its `rope_type`):
- "cat" (`RotaryEmbeddingCat`): integer positions, optionally `+ grid_offset` and rescaled
  to a reference grid (`ref_feat_shape`, EVA02's way of running at other sizes), times
  frequencies `temperature ** -(i / bands)`. EVA02, ROPE-ViT axial, Perception Encoder.
- "dinov3" (`RotaryEmbeddingDinoV3`): patch centres normalised to [-1, 1] on each axis,
  periods `temperature ** (2i / (head_dim / 2))`, angles `2 pi * coord / period`.
- "mixed" (`RotaryEmbeddingMixed`): learned frequencies per block and head over both axes
  at once (ROPE-ViT mixed); the table is [depth, heads, N, 2 * head_dim].

The table is [N, 2 * head_dim]: sines then cosines, each in the layout `apply` expects,
interleaved ([f0, f0, f1, f1, ...]) or, with `rotate_half`, halves ([f0, f1, ..., f0, f1]).
"""
from __future__ import annotations

import math

import torch
from torch import nn

from .config import ROPE_TYPES  # noqa: F401  (re-exported)

Side = int  # a grid side: an int, or a traced/symbolic size standing in for one


def _layout(x: torch.Tensor, rotate_half: bool) -> torch.Tensor:
    """Per-frequency values [..., F] -> [..., 2F] in the rotation's layout."""
    return torch.cat([x, x], dim=-1) if rotate_half else x.repeat_interleave(2, dim=-1)


def _rotate(x: torch.Tensor, rotate_half: bool) -> torch.Tensor:
    """The 90-degree partner of each pair: [-x1, x0, -x3, x2, ...] interleaved, or
    [-x_{d/2..}, x_{..d/2}] for halves."""
    if rotate_half:
        first, second = x.chunk(2, dim=-1)
        return torch.cat([-second, first], dim=-1)
    return torch.stack([-x[..., 1::2], x[..., ::2]], dim=-1).reshape(x.shape)


def apply(x: torch.Tensor, table: torch.Tensor, rotate_half: bool) -> torch.Tensor:
    """Rotate `x` [..., N, d] by `table` [..., N, 2d] (sines, cosines), in the table's
    precision, back to x's dtype (timm's apply_rot_embed_cat)."""
    sin, cos = table.chunk(2, dim=-1)
    return (x * cos + _rotate(x, rotate_half) * sin).to(x.dtype)


def _arange(n: Side, like: torch.Tensor) -> torch.Tensor:
    """0, 1, ..., n - 1 as float32 [n] on `like`'s device (exact below 2 ** 24).

    Made from `like` rather than by torch.arange: a device given to arange is a constant in
    a TorchScript trace (made on CPU, the table then stays on CPU when the file runs on
    CUDA), and an arange with no device makes the table on CPU beside a model on CUDA. The
    trace keeps new_ones' device as `like`'s, whatever device it later runs on."""
    return like.new_ones(n, dtype=torch.float32).cumsum(0) - 1.0


def _axes(height: Side, width: Side, indexing: str, like: torch.Tensor
          ) -> tuple[torch.Tensor, torch.Tensor]:
    """Each patch's (row, column) index as float32 [N] vectors, row-major, in the channel
    order `indexing` says: (row, column) for "ij", (column, row) for "xy"."""
    rows, cols = _arange(height, like), _arange(width, like)
    grid_r, grid_c = torch.meshgrid(rows, cols, indexing="ij")  # [H, W] each
    first, second = (grid_r, grid_c) if indexing == "ij" else (grid_c, grid_r)
    return first.reshape(-1), second.reshape(-1)


def _sides(height: Side, width: Side, indexing: str) -> tuple[Side, Side]:
    return (height, width) if indexing == "ij" else (width, height)


class RotaryEmbedding(nn.Module):
    """The rotary table of a config's `rope_type` for a grid of (height, width) patches.

    forward(height, width, like) -> [N, 2 * head_dim] ("cat", "dinov3") or
    [depth, heads, N, 2 * head_dim] ("mixed") on the device of `like` (the tokens it will
    rotate); float32 whatever the model's dtype (angles of far patches lose their phase in
    half precision).
    """

    def __init__(self, config):
        super().__init__()
        self.kind = config.rope_type
        self.head_dim = config.embed_dim // config.num_heads
        self.temperature = float(config.rope_temperature)
        self.grid_offset = float(config.rope_grid_offset)
        self.indexing = config.rope_grid_indexing
        self.rotate_half = config.rope_rotate_half
        self.ref = config.ref_feat_shape
        if self.kind == "mixed":  # learned: (x, y) x depth x heads x head_dim / 2
            self.freqs = nn.Parameter(torch.zeros(2, config.depth, config.num_heads,
                                                  self.head_dim // 2))

    def forward(self, height: Side, width: Side, like: torch.Tensor) -> torch.Tensor:
        if self.kind == "mixed":
            return self._mixed(height, width, like)
        if self.kind == "dinov3":
            angles = self._dinov3_angles(height, width, like)
        else:
            angles = self._cat_angles(height, width, like)
        return torch.cat([_layout(angles.sin(), self.rotate_half),
                          _layout(angles.cos(), self.rotate_half)], dim=-1)

    def _cat_angles(self, height: Side, width: Side, like: torch.Tensor) -> torch.Tensor:
        """timm's build_rotary_pos_embed(in_pixels=False): [N, head_dim / 2]."""
        bands = self.head_dim // 4
        exponent = _arange(bands, like) / bands
        freqs = 1.0 / (self.temperature ** exponent)  # [bands]
        coords = []
        for t, side in zip(_axes(height, width, self.indexing, like),
                           _sides(height, width, self.indexing)):
            t = t + self.grid_offset
            if self.ref is not None:  # EVA02: positions rescaled onto the pretraining grid
                t = t / side * self.ref
            coords.append(t[:, None] * freqs)  # [N, bands]
        return torch.cat(coords, dim=-1)  # [N, 2 * bands]: first axis, then second

    def _dinov3_angles(self, height: Side, width: Side, like: torch.Tensor) -> torch.Tensor:
        """timm's RotaryEmbeddingDinoV3 (separate normalisation): [N, head_dim / 2]."""
        count = self.head_dim // 4
        exponent = 2.0 * _arange(count, like) / (self.head_dim // 2)
        periods = self.temperature ** exponent  # [count]
        coords = []
        for t, side in zip(_axes(height, width, self.indexing, like),
                           _sides(height, width, self.indexing)):
            centred = (t + 0.5 + self.grid_offset) / side  # patch centres in [0, 1]
            coords.append(2.0 * centred - 1.0)  # [-1, 1]
        coords = torch.stack(coords, dim=-1)  # [N, 2]
        angles = 2 * math.pi * coords[:, :, None] / periods[None, None, :]  # [N, 2, count]
        return angles.flatten(1)  # [N, 2 * count]

    def _mixed(self, height: Side, width: Side, like: torch.Tensor) -> torch.Tensor:
        """timm's get_mixed_freqs: [depth, heads, N, 2 * head_dim], always interleaved."""
        t_x, t_y = _axes(height, width, self.indexing, like)  # [N] each
        freqs = self.freqs.float()
        angles = t_x[:, None] * freqs[0][..., None, :] + t_y[:, None] * freqs[1][..., None, :]
        return torch.cat([_layout(angles.sin(), False), _layout(angles.cos(), False)],
                         dim=-1).to(self.freqs.dtype)

    def extra_repr(self) -> str:
        return (f"kind={self.kind}, head_dim={self.head_dim}, temperature={self.temperature:g}, "
                f"indexing={self.indexing}, rotate_half={self.rotate_half}")
