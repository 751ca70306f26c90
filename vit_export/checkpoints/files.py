"""A checkpoint's files, each read once and hashed as read: what the import builds from, what
the bundle's import record lists (name -> sha256), and what source parity builds the
framework's own model from. Nothing here is ever opened again by path.

An import reads a checkpoint file, or a Hugging Face folder's config.json,
preprocessor_config.json and weights (model.safetensors, else pytorch_model.bin). Source
parity reads, from a file or folder the user names, exactly the names a bundle's record
lists: each a plain file name (never a path, never `..`), each hashing to the sha256 the
record gives, so a verdict is about the bytes the bundle was built from.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, Optional

from .. import bundle as B
from ..errors import BundleError, CheckpointError, raw
from ..verified import Loaded, fd_path, open_hashed, read_once

FOLDER_JSON = ("config.json", "preprocessor_config.json")  # what a folder's import reads
FOLDER_WEIGHTS = ("model.safetensors", "pytorch_model.bin")  # the first found is read
WEIGHT_SUFFIXES = (".safetensors", ".pth", ".pt", ".bin", ".ckpt")
MAX_JSON_BYTES = 16 << 20  # a config with 21k labels is about 1 MiB


@dataclass(frozen=True)
class Opened:
    """A weights file hashed as it was read through once and kept open: what is mapped or
    read from it later (`where`, `reader`) is what was hashed, whatever is renamed over its
    path meanwhile, and it is not held in memory (a ViT-H's are gigabytes)."""
    path: Path  # named in messages, never opened again
    sha256: str
    file: BinaryIO

    def where(self) -> str:
        """A path to the open file (/proc/self/fd/N): what safetensors maps."""
        return fd_path(self.file, self.path)

    def reader(self) -> BinaryIO:
        """The open file at its start: what torch.load reads."""
        self.file.seek(0)
        return self.file


@dataclass(frozen=True)
class CheckpointFiles:
    """The files of one checkpoint, read once: file name -> its bytes (the config files)
    or the open file (the weights), and sha256."""
    where: Path  # what was named (a file or a folder): in messages only, never opened again
    files: dict[str, Loaded | Opened]

    def digests(self) -> dict[str, str]:
        """name -> sha256: what an import record lists."""
        return {name: loaded.sha256 for name, loaded in self.files.items()}

    def close(self) -> None:
        """Close the weights files kept open."""
        for held in self.files.values():
            if isinstance(held, Opened):
                held.file.close()

    def weights(self) -> tuple[str, Opened]:
        """The one weights file: its name (its suffix says how it reads) and the open file."""
        named = [(n, f) for n, f in self.files.items() if n.endswith(WEIGHT_SUFFIXES)]
        if len(named) != 1:
            raise CheckpointError(f"{self.where}: expected one weights file, found "
                                  f"{len(named)}")
        return named[0]

    def json(self, name: str) -> Optional[Any]:
        """The JSON file `name` parsed (strict), or None where it was not read."""
        loaded = self.files.get(name)
        if loaded is None:
            return None
        return B.parse_json(loaded.data, str(loaded.path), CheckpointError, unique_keys=False)


def _read(path: Path) -> Loaded | Opened:
    """A config file's bytes (at most MAX_JSON_BYTES), or a weights file hashed and kept
    open."""
    try:
        if path.suffix == ".json":
            return read_once(path, limit=MAX_JSON_BYTES)
        file, digest = open_hashed(path)
        return Opened(path, digest, file)
    except BundleError as exc:
        raise CheckpointError(raw(exc)) from None


def read_checkpoint(path: str | os.PathLike) -> CheckpointFiles:
    """The files an import of `path` reads: the file itself, or a Hugging Face folder's
    config files and its weights (model.safetensors, else pytorch_model.bin).

    Raises:
        CheckpointError: missing, not a regular file of a fixed size, a JSON file over
            MAX_JSON_BYTES, or a folder without weights.
    """
    path = Path(path)
    if not path.is_dir():
        if not path.exists():
            raise CheckpointError(f"{path} does not exist")
        if path.suffix not in WEIGHT_SUFFIXES:
            raise CheckpointError(f"{path}: expected .pth, .pt, .bin, .safetensors or a "
                                  f"Hugging Face folder")
        return CheckpointFiles(path, {path.name: _read(path)})
    files = {name: _read(path / name) for name in FOLDER_JSON if (path / name).exists()}
    weights = [name for name in FOLDER_WEIGHTS if (path / name).exists()]
    if not weights:
        raise CheckpointError(f"{path} has no model.safetensors or pytorch_model.bin")
    files[weights[0]] = _read(path / weights[0])
    return CheckpointFiles(path, files)


def plain_name(name: Any) -> bool:
    """A file name alone: no folder, no `..`, nothing a path could climb or reach with."""
    return isinstance(name, str) and name not in ("", ".", "..") and "/" not in name and \
        "\\" not in name and "\0" not in name and os.path.basename(name) == name


def read_recorded(path: str | os.PathLike, recorded: dict[str, str]) -> CheckpointFiles:
    """The files an import record lists (name -> sha256), read from the file or folder
    `path` the user named: from a folder, each name in it; a file is the record's one
    weights file, whatever it is called now. Each must hash to its recorded sha256.

    Raises:
        CheckpointError: a recorded name that is not a plain file name, a file missing or
            not the one the bundle was imported from.
    """
    path = Path(path)
    bad = [n for n in recorded if not plain_name(n)]
    if bad or not recorded:
        raise CheckpointError(f"the bundle's import record names {bad[0]!r}, not a file name"
                              if bad else "the bundle's import record lists no files")
    if not path.exists():
        raise CheckpointError(f"{path} does not exist")
    if path.is_dir():
        pairs = [(name, path / name, digest) for name, digest in recorded.items()]
    else:
        weights = [(n, d) for n, d in recorded.items() if n.endswith(WEIGHT_SUFFIXES)]
        if len(recorded) != 1 or len(weights) != 1:
            raise CheckpointError(f"{path} is a file, and the bundle was imported from a "
                                  f"folder's {', '.join(recorded)}: name the folder")
        pairs = [(weights[0][0], path, weights[0][1])]
    files = {}
    for name, file, digest in pairs:
        if not file.exists():
            raise CheckpointError(f"{file} is not here: the bundle was imported from "
                                  f"{', '.join(recorded)}")
        files[name] = _read(file)
        if files[name].sha256 != digest:
            raise CheckpointError(f"{file} is not the file the bundle was imported from (its "
                                  f"sha256 differs from the import record's)")
    return CheckpointFiles(path, files)
