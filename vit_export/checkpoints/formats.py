"""The registered checkpoint families, and the two steps every one shares: telling which
family a state dict's keys are (`detect_format`), and renaming them to ours (`convert`).

A family is a module that declares its `Family` (see `family`); it is registered by its line
in FAMILIES, whose order is the order keys are tried in.
"""
from __future__ import annotations

import re
from typing import Optional

import torch

from ..errors import CheckpointError, param
from . import hf, timm, torchvision
from .family import Family

FAMILIES: dict[str, Family] = {family.name: family for family in (
    timm.FAMILY,
    hf.FAMILY,
    torchvision.FAMILY,
)}
FORMATS = tuple(FAMILIES)
# Each family's key renames and what its framework fixes in code, by --format value
RENAMES = {name: family.renames for name, family in FAMILIES.items()}
FORMAT_FIXED = {name: family.fixed for name, family in FAMILIES.items()}


def _format_of(keys) -> Optional[str]:
    keys = set(keys)
    return next((name for name, family in FAMILIES.items() if family.recognise(keys)), None)


def detect_format(keys, given: Optional[str] = None) -> str:
    """The format the keys show; `given` (--format) must not contradict them."""
    found = _format_of(keys)
    if given is not None:
        if given not in FAMILIES:
            raise CheckpointError(f"unknown format {given!r}; choose one of {tuple(FAMILIES)}")
        if found is not None and found != given:
            raise CheckpointError(
                f"{param('fmt', given)}, but the checkpoint's keys "
                f"are {found}'s; pass {param('fmt', found)} or leave "
                f"it out")
        return given
    if found is None:
        raise CheckpointError(f"cannot tell the checkpoint format from its keys "
                              f"({', '.join(sorted(map(str, keys))[:3])}, ...); pass "
                              f"{param('fmt')}")
    return found


def convert(state: dict[str, torch.Tensor], fmt: str, zero_key_bias: bool = False,
            channels: Optional[int] = None) -> dict[str, torch.Tensor]:
    """Rename keys to ours; fuse separate q, k, v into one qkv and reshape what the family
    stores in other shapes (its `layouts`)."""
    family = FAMILIES[fmt]
    rules = [(re.compile(p), r) for p, r in family.renames]
    out: dict[str, torch.Tensor] = {}
    for key, value in state.items():
        for pattern, replacement in rules:
            key = pattern.sub(replacement, key)
        if family.unused is not None and family.unused.fullmatch(key):
            continue
        out[key] = value
    if family.layouts is not None:
        family.layouts(out, state, channels)
    for key in [k for k in out if re.fullmatch(r"blocks\.\d+\.attn\.q\.(weight|bias)", k)]:
        prefix, kind = key.rsplit(".q.", 1)
        parts = [out.pop(f"{prefix}.{p}.{kind}", None) for p in "qkv"]
        if kind == "bias" and parts[1] is None and parts[0] is not None \
                and parts[2] is not None and zero_key_bias:  # EVA's and DINOv3's keys have none
            parts[1] = torch.zeros_like(parts[0])
        if any(p is None for p in parts):
            raise CheckpointError(f"{prefix}: query/key/value {kind} are not all present")
        out[f"{prefix}.qkv.{kind}"] = torch.cat(parts, dim=0)
    return out
