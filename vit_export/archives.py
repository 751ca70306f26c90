"""What PyTorch's zip archives (model.pt2, model.aoti.pt2, model.ts) hold, read as zip files,
without handing them to the loaders that would run what is inside.

A bundle is data that travels: whoever opens one may not be whoever made it. The loaders of
these archives are not data readers. `torch.export.load` unpickles, with `weights_only=False`,
every weight or constant its payload config marks `use_pickle`, any custom or opaque object,
and sample inputs that fail the safe load; it loads the compiled code of any AOTInductor model
it finds; on a RuntimeError it tries the legacy format, which unpickles too. `torch.jit.load`
runs TorchScript. An AOTInductor package is a shared library. So the description each one
carries is read here from the zip itself, and `program_problem` reads a model.pt2's own index
(its members and payload configs, what the loader acts on) before torch may read it: our
export never writes a pickled entry, so one is refused whatever the bundle says.
"""
from __future__ import annotations

import io
import json
import zipfile
from pathlib import Path
from typing import Any, Optional

from .errors import BundleError, first_line

METADATA_KEY = "vit_export"  # the description's key or file name in every archive
EXTRA_FILE = f"{METADATA_KEY}.json"  # ... as a torch.export / TorchScript extra file
# torch.export's archive layout (torch._C._export.pt2_archive_constants), under one root
AOTINDUCTOR_DIR = "data/aotinductor/"
WEIGHTS_DIR, CONSTANTS_DIR = "data/weights/", "data/constants/"
TENSOR_PREFIX = "tensor_"  # a constant stored as raw bytes (custom_obj_, opaque_obj_ pickle)
MODELS_DIR = "models/"
# What a program archive of ours holds, by folder: anything else is not read by us and may
# be read by the loader (executorch, MTIA, XL weights, ...)
PROGRAM_PARTS = ("models/", "data/weights/", "data/constants/", "data/sample_inputs/",
                 "extra/", ".data/", "archive_format", "archive_version", "byteorder")


def open_zip(path: Path) -> zipfile.ZipFile:
    try:
        return zipfile.ZipFile(path)
    except (OSError, zipfile.BadZipFile) as exc:
        raise BundleError(f"cannot read {path}: not a PyTorch archive ({first_line(exc)})") \
            from None


def _read(archive: zipfile.ZipFile, name: str, path: Path) -> bytes:
    try:
        return archive.read(name)
    except (zipfile.BadZipFile, OSError, ValueError, RuntimeError) as exc:  # damaged member
        raise BundleError(f"cannot read {path}: {name}: {first_line(exc)}") from None


def package_metadata(path: Path) -> dict[str, str]:
    """What an AOTInductor package says it was compiled for (AOTI_DEVICE_KEY, AOTI_CPU_ISA,
    ...) and carries (the description), read from the archive without loading it."""
    with open_zip(path) as archive:
        names = [n for n in archive.namelist()
                 if f"/{AOTINDUCTOR_DIR}" in n and n.endswith("wrapper_metadata.json")]
        if not names:
            raise BundleError(f"{path} is not an AOTInductor package (no compiled model in it)")
        try:
            values = json.loads(_read(archive, names[0], path))
        except ValueError as exc:
            raise BundleError(f"{path}: unreadable package metadata: {first_line(exc)}") \
                from None
    if not isinstance(values, dict) or not all(isinstance(v, str) for v in values.values()):
        raise BundleError(f"{path}: its package metadata is not a map of strings")
    return values


def is_package(path: Path) -> bool:
    """An AOTInductor package (compiled code), rather than an ExportedProgram."""
    with open_zip(path) as archive:
        return any(f"/{AOTINDUCTOR_DIR}" in n for n in archive.namelist())


def parse_description(text: Optional[str]) -> Any:
    """The description JSON an archive carries, parsed, or None when it is absent or does
    not parse (the caller says what it lacks)."""
    try:
        return json.loads(text) if text else None
    except ValueError:
        return None


def carried_description(path: Path) -> Optional[str]:
    """The description JSON a model.pt2, model.aoti.pt2 or model.ts carries, or None: the
    extra file of a program or TorchScript archive, the metadata of a package."""
    if path.suffix == ".pt2" and is_package(path):
        return package_metadata(path).get(METADATA_KEY)
    with open_zip(path) as archive:
        names = [n for n in archive.namelist() if n.endswith(f"/extra/{EXTRA_FILE}")]
        return _read(archive, names[0], path).decode("utf-8", "replace") if names else None


def _payload_problem(archive: zipfile.ZipFile, member: str, path: Path,
                     constants: bool) -> Optional[str]:
    """Why one payload config (`*_weights_config.json`, `*_constants_config.json`) would make
    the loader unpickle, or None."""
    try:
        values = json.loads(_read(archive, member, path))
        entries = values["config"]
        assert isinstance(entries, dict)
    except (ValueError, KeyError, TypeError, AssertionError):
        return f"{member} is not a payload config"
    for name, meta in entries.items():
        if not isinstance(meta, dict) or meta.get("use_pickle") is not False:
            return f"{member} marks {name!r} as pickled"
        where = meta.get("path_name")
        if not isinstance(where, str) or constants and not where.startswith(TENSOR_PREFIX):
            return f"{member} stores {name!r} as {where!r}, an object, not a tensor"
    return None


def _sample_inputs_problem(data: bytes) -> Optional[str]:
    """The loader reads sample inputs with torch.load(weights_only=True) and, where that
    fails, again with weights_only=False: they must pass the safe load."""
    import torch

    try:
        torch.load(io.BytesIO(data), weights_only=True)
    except Exception as exc:  # the restricted unpickler's refusal, or a damaged file
        return f"its sample inputs are not plain tensors ({first_line(exc)[:120]})"
    return None


def program_problem(path: Path) -> Optional[str]:
    """Why torch.export.load could run code from the model.pt2 at `path`, or None: read from
    the archive's own members and payload configs, before torch reads it."""
    with open_zip(path) as archive:
        names = archive.namelist()
        roots = {n.split("/", 1)[0] for n in names}
        if len(roots) != 1 or any("/" not in n for n in names):
            return "its members are not under one folder (a legacy or foreign archive)"
        root = f"{roots.pop()}/"
        inner = [n[len(root):] for n in names]
        if "archive_format" not in inner or \
                _read(archive, root + "archive_format", path) != b"pt2":
            return "it is not a torch.export archive (no archive_format pt2)"
        if any(n.startswith(AOTINDUCTOR_DIR) for n in inner):
            return "it holds compiled AOTInductor code"
        foreign = [n for n in inner if not n.startswith(PROGRAM_PARTS)]
        if foreign:
            return f"it holds {foreign[0]}, which torch.export.save does not write"
        models = [n[len(MODELS_DIR):-len(".json")] for n in inner
                  if n.startswith(MODELS_DIR) and n.endswith(".json")]
        if not models:
            return "it holds no program"
        for model in models:
            for folder, constants in ((WEIGHTS_DIR, False), (CONSTANTS_DIR, True)):
                if f"{folder}{model}.pt" in inner:  # the legacy format: one pickle
                    return f"it holds {folder}{model}.pt, a pickle"
                config = f"{folder}{model}_{'constants' if constants else 'weights'}_config.json"
                if config not in inner:
                    return f"it lacks {config}"
                problem = _payload_problem(archive, root + config, path, constants)
                if problem:
                    return problem
            samples = f"data/sample_inputs/{model}.pt"
            if samples in inner:
                problem = _sample_inputs_problem(_read(archive, root + samples, path))
                if problem:
                    return problem
    return None


def check_program(path: Path) -> None:
    """BundleError in one line where `program_problem` finds the model.pt2 could run code."""
    problem = program_problem(path)
    if problem:
        raise BundleError(f"{path} is refused before torch reads it: {problem} (what "
                          f"torch.export.load would run as code; our export never writes it)")
