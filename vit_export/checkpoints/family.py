"""What a checkpoint family is: the source framework a state dict was saved by, declared once.

A family says how to recognise its keys, how to rename them to ours (timm's names), what to
reshape after renaming, what its framework fixes in code (so its weights need not say it),
and, where it has one, how to read its own config file. The dispatcher (`formats`) iterates
over the registered families; adding one is a module declaring its `FAMILY` and a line there.
"""
from __future__ import annotations

import re
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from typing import Any, Optional

from ..errors import param


@dataclass(frozen=True)
class Family:
    """One source framework's checkpoints.

    name: the --format value. renames: (pattern, replacement) applied to every key in order.
    recognise: whether a set of keys is this family's. fixed: config fields its framework
    fixes in code. unused: keys (after renaming) that only training uses, dropped. layouts:
    reshapes the renamed tensors in place, given the raw state dict and the channel count
    its config file says. check_named: refuses raw weights whose architecture the weights
    cannot show and nothing named (`known`: a named model's and --set's fields). config_of:
    (model type, config fields) of the checkpoint's own config files (its `extras`), or
    (None, None)."""

    name: str
    renames: list[tuple[str, str]]
    recognise: Callable[[Collection[str]], bool]
    fixed: dict[str, Any] = field(default_factory=dict)
    unused: Optional[re.Pattern] = None
    layouts: Optional[Callable[[dict, dict, Optional[int]], None]] = None
    check_named: Optional[Callable[[dict, dict[str, Any]], None]] = None
    config_of: Optional[Callable[[dict[str, Any]], tuple[Optional[str], Optional[dict]]]] = None


def mlp_ratio_of(hidden: int, width: int) -> float:
    """An mlp_ratio whose int(width * ratio) is `hidden` (timm's rounding), whatever the
    float error of hidden / width (EVA02's 8/3)."""
    ratio = hidden / width
    return ratio if int(width * ratio) == hidden else (hidden + 0.5) / width


def set_option(name: str, value: object) -> str:
    """`--set NAME=VALUE` inside a message, as param() marks it: a Python caller reads the
    `overrides` entry instead."""
    return param("overrides", {name: value})
