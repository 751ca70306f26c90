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
from .verified import Loaded

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


# What an archive may declare, checked from its central directory before any member is read.
# torch.save, torch.export.save and torch.jit.save store tensors as they are; TorchScript
# deflates its code and debug tables, which shrink at most 5.5 times (a small vit_seed_tiny's
# model.ts, 63 kB of them). A member that inflates more than MAX_RATIO times, or compressed members
# inflating to more than MAX_INFLATED together, are not one of theirs: a zip bomb (a 0.3 MB
# model.pt2 whose sample inputs inflate to 64 MiB was read whole before).
MAX_RATIO = 64
MAX_INFLATED = 256 << 20
MAX_MEMBER_READ = 64 << 20  # what we read of one member ourselves: configs, sample inputs
Source = Path | Loaded  # a path, or a file's bytes as read once (`verified.read_once`)


def _where(source: Source) -> Path:
    return source.path if isinstance(source, Loaded) else Path(source)


def open_zip(source: Source) -> zipfile.ZipFile:
    """The zip archive at `source` (a path, or bytes read once), its central directory
    checked first (`_index_problem`): one that Python's zipfile and torch's reader would read
    two ways, or that declares more than it can hold, is refused in one line."""
    path = _where(source)
    try:
        if isinstance(source, Loaded):
            archive, size = zipfile.ZipFile(io.BytesIO(source.data)), len(source.data)
        else:
            archive, size = zipfile.ZipFile(source), Path(source).stat().st_size
    except (OSError, zipfile.BadZipFile, ValueError) as exc:
        raise BundleError(f"cannot read {path}: not a PyTorch archive ({first_line(exc)})") \
            from None
    problem = _index_problem(archive.infolist(), size)
    if problem:
        archive.close()
        raise BundleError(f"{path} is refused before torch reads it: {problem}")
    return archive


def _index_problem(members: list[zipfile.ZipInfo], size: int) -> Optional[str]:
    """Why an archive's central directory cannot be read one way only, or None. Python's
    zipfile takes the last of two members of one name and matches names exactly; torch's
    reader (miniz) finds a name by a case-blind binary search, landing on either: so two
    names that are equal, or equal but for case, are refused outright. A stored member must
    declare its own size and lie inside the file; compressed ones are held to MAX_RATIO and
    MAX_INFLATED, all from the sizes declared, before anything is decompressed."""
    seen: dict[str, str] = {}
    inflated = 0
    for member in members:
        name = member.filename
        folded = name.casefold()
        if folded in seen:
            if seen[folded] == name:
                return f"it names {name} twice"
            return f"its members {seen[folded]} and {name} differ only in case"
        seen[folded] = name
        if member.compress_type == zipfile.ZIP_STORED:
            if member.file_size != member.compress_size or \
                    member.header_offset + member.compress_size > size:
                return (f"{name} declares {member.file_size} bytes stored in "
                        f"{member.compress_size}, in a file of {size}")
            continue
        inflated += member.file_size
        if member.file_size > max(MAX_RATIO * member.compress_size, 1 << 20) or \
                inflated > MAX_INFLATED:
            return (f"{name} declares {member.file_size} bytes inflated from "
                    f"{member.compress_size} (a zip bomb: more than {MAX_RATIO} times, or "
                    f"{MAX_INFLATED >> 20} MiB in all)")
    return None


def _read(archive: zipfile.ZipFile, name: str, path: Path) -> bytes:
    """One member's bytes, at most MAX_MEMBER_READ as the archive declares it."""
    try:
        declared = archive.getinfo(name).file_size
        if declared > MAX_MEMBER_READ:
            raise BundleError(f"cannot read {path}: {name} declares {declared} bytes, more "
                              f"than the {MAX_MEMBER_READ >> 20} MiB such a member holds")
        return archive.read(name)
    except (zipfile.BadZipFile, OSError, ValueError, RuntimeError, KeyError) as exc:
        raise BundleError(f"cannot read {path}: {name}: {first_line(exc)}") from None


def package_metadata(source: Source) -> dict[str, str]:
    """What an AOTInductor package says it was compiled for (AOTI_DEVICE_KEY, AOTI_CPU_ISA,
    ...) and carries (the description), read from the archive without loading it."""
    path = _where(source)
    with open_zip(source) as archive:
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


def is_package(source: Source) -> bool:
    """An AOTInductor package (compiled code), rather than an ExportedProgram."""
    with open_zip(source) as archive:
        return any(f"/{AOTINDUCTOR_DIR}" in n for n in archive.namelist())


def parse_description(text: Optional[str]) -> Any:
    """The description JSON an archive carries, parsed, or None when it is absent or does
    not parse (the caller says what it lacks)."""
    try:
        return json.loads(text) if text else None
    except ValueError:
        return None


def carried_description(source: Source) -> Optional[str]:
    """The description JSON a model.pt2, model.aoti.pt2 or model.ts carries, or None: the
    extra file of a program or TorchScript archive, the metadata of a package."""
    path = _where(source)
    if path.suffix == ".pt2" and is_package(source):
        return package_metadata(source).get(METADATA_KEY)
    with open_zip(source) as archive:
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


def program_problem(source: Source) -> Optional[str]:
    """Why torch.export.load could run code from the model.pt2 at `source` (a path, or its
    bytes as read once: then the bytes torch is given), or None: read from the archive's own
    members and payload configs, before torch reads it."""
    path = _where(source)
    with open_zip(source) as archive:
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


def check_program(source: Source) -> None:
    """BundleError in one line where `program_problem` finds the model.pt2 could run code."""
    path = _where(source)
    problem = program_problem(source)
    if problem:
        raise BundleError(f"{path} is refused before torch reads it: {problem} (what "
                          f"torch.export.load would run as code; our export never writes it)")
