"""Reading a checkpoint's state dict: a .pth/.pt/.bin/.safetensors file or a Hugging Face
folder, unwrapped (training wrappers, DataParallel's prefix) and checked tensor by tensor."""
from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

import torch

from .. import bundle as B
from ..errors import CheckpointError, first_line
from .files import FOLDER_JSON, CheckpointFiles, read_checkpoint

WRAPPER_KEYS = ("state_dict", "model", "model_state_dict", "module")


def read_state_dict(source: str | os.PathLike | CheckpointFiles
                    ) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """Tensors of a .pth/.pt/.bin/.safetensors file or a Hugging Face folder (or of its
    files read once already), plus its config files (`config.json`,
    `preprocessor_config.json`) when it is a folder. Loaded from the bytes that were read
    and hashed, never from the path again."""
    files = source if isinstance(source, CheckpointFiles) else read_checkpoint(source)
    extras: dict[str, Any] = {name: files.json(name) for name in FOLDER_JSON
                              if name in files.files}
    name, weights = files.weights()
    path = weights.path
    try:
        if name.endswith(".safetensors"):  # mapped through the file hashed, kept open
            from safetensors.torch import load_file

            state: Any = load_file(weights.where())
        else:
            # timm's train.py saves its argparse.Namespace beside the weights: plain data
            with torch.serialization.safe_globals([argparse.Namespace]):
                state = torch.load(weights.reader(), map_location="cpu", weights_only=True)
    except Exception as exc:  # pickle, zip and safetensors errors of many kinds
        raise CheckpointError(f"cannot read checkpoint {path}: {first_line(exc)}") from None
    if isinstance(state, dict) and isinstance(state.get("arch"), str):
        extras["arch"] = state["arch"]  # timm's train.py: the model's name (--model)
    for key in WRAPPER_KEYS:  # {"model": state_dict}, {"state_dict": ...}
        if isinstance(state, dict) and isinstance(state.get(key), dict):
            state = state[key]
            break
    if not isinstance(state, dict) or not state or \
            not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise CheckpointError(f"{path} holds no state dict of tensors")
    if all(k.startswith("module.") for k in state):  # saved from DataParallel / DDP
        state = {k[len("module."):]: v for k, v in state.items()}
    for key, value in state.items():
        _check_tensor(path, key, value)
    return state, extras


def _check_tensor(path: Path, key: str, value: torch.Tensor) -> None:
    """A state dict entry that our model can take as a weight, or one line on why not."""
    problem = B.weight_problem(key, value)
    if problem:
        raise CheckpointError(f"{path}: {problem}")

