"""A bundle folder as read from disk (Bundle, read_bundle) and a model file given alone
(ModelFile), each with its description; read_model takes whichever a command was given."""
from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO, Optional

from .. import verified
from ..archives import METADATA_KEY, carried_description, check_program, is_package
from ..config import ViTConfig
from ..errors import BundleError
from ..jsonio import parse_json
from ..schema import check_fields
from ..verified import Loaded, differs
from .description import EXPORT_KINDS, Description
from .names import (
    AOTI_FILE,
    CONFIG_FILE,
    E2E_FILE,
    MODEL_FILES,
    ONNX_FILE,
    PT2_FILE,
    TS_FILE,
    WEIGHTS_FILE,
    plain_name,
)
from .onnxfiles import OnnxModel, onnx_model, read_onnx
from .writes import atomic_write_json, sha256_file

if TYPE_CHECKING:
    from ..model import VisionTransformer

# The most config.json may hold: a description and the files' sha256s, a few KiB, and the
# class names, which ImageNet-21k's 21,843 make about 0.6 MiB; read whole and parsed, so a
# file of hundreds of MB is refused before it costs gigabytes
CONFIG_BYTES = 16 << 20

# Files whose loader copies what it is given (torch.jit.load, the AOTInductor loader): used
# once, their bytes are not kept once loaded
LOADED_ONCE = (TS_FILE, AOTI_FILE)


@dataclass
class Bundle:
    """A bundle folder as read from disk."""
    path: Path
    description: Description
    hashes: dict[str, str]
    # The sha256 of config.json's bytes as they were read and parsed (what a Ray driver
    # hands its workers, `checked_files`)
    config_sha256: str = field(default="", compare=False)
    # What this command has read of the bundle, each file hashed as it was read: the bytes
    # (and each ONNX model, parsed) are handed to every later use, never read again
    loaded: dict[str, Loaded] = field(default_factory=dict, repr=False, compare=False)
    models: dict[str, OnnxModel] = field(default_factory=dict, repr=False, compare=False)
    checked: set[str] = field(default_factory=set, repr=False, compare=False)
    # A bundle being made: files hashed as they were opened, read from that open file
    opened: dict[str, BinaryIO] = field(default_factory=dict, repr=False, compare=False)

    @property
    def config(self) -> ViTConfig:
        return self.description.config

    def file(self, name: str) -> Path:
        return self.path / name

    def read_file(self, name: str) -> Loaded:
        """The bytes of the bundle's file `name`, read once and checked against the sha256
        config.json lists (`verified.read_once`): what is loaded is what was checked. A
        second use takes the same bytes, never the file again.

        Raises:
            BundleError: the file has no sha256 in config.json, or does not match it.
        """
        if name not in self.hashes:
            raise BundleError(f"{self.file(name)} has no sha256 in {CONFIG_FILE}, so it may "
                              f"not be the file that was validated")
        if name in self.loaded:
            return self.loaded[name]
        opened = self.opened.pop(name, None)
        if opened is not None:  # hashed as it was opened: its bytes are read from that file
            with opened:
                loaded = Loaded(self.file(name), opened.read(), self.hashes[name])
        else:
            loaded = verified.read_once(self.file(name), self.hashes[name])
        self.checked.add(name)
        if name not in LOADED_ONCE:
            self.loaded[name] = loaded
        return loaded

    def onnx_model(self, name: str) -> "OnnxModel":
        """The bundle's ONNX model `name` as it is loaded (`onnx_model`): its bytes, parsed
        once, and its external data, each file read once and checked against config.json.
        Every use (a session, the static checks, the stage scans) shares it."""
        def hashed(location: str) -> Loaded:
            if location not in self.hashes or not plain_name(location):
                raise BundleError(f"{self.file(name)} names external data {location!r}, which "
                                  f"has no sha256 in {CONFIG_FILE}")
            return self.read_file(location)

        if name not in self.models:
            self.models[name] = onnx_model(self.read_file(name), hashed)
        return self.models[name]

    def check_unread(self) -> None:
        """Hash every file config.json lists that this command has not read yet, so that a
        verdict on the whole bundle (validate) covers every file: each is hashed once, as
        it is read for use or here.

        Raises:
            BundleError: a file does not match its sha256 in config.json.
        """
        for name in self.hashes:
            if name not in self.checked:
                with verified.open_checked(self.file(name), self.hashes[name]):
                    self.checked.add(name)

    def close(self) -> None:
        """Close the files a bundle being made holds open (`staged_bundle`) unread."""
        for opened in self.opened.values():
            opened.close()
        self.opened.clear()

    @property
    def onnx_path(self) -> Path:
        return self.path / ONNX_FILE

    @property
    def onnx_models(self) -> dict[str, str]:
        """ONNX file -> tolerance profile, for every ONNX model of the bundle on disk."""
        models = self.description.export.get("onnx_models") or {ONNX_FILE: "fp32"}
        return {name: profile for name, profile in models.items() if self.file(name).is_file()}

    @property
    def io_shapes(self) -> tuple[tuple[int | str, ...], dict[str, tuple[int | str, ...]]]:
        return self.description.io_shapes

    @property
    def e2e_model(self) -> Optional[str]:
        """The ONNX model with preprocessing inside (uint8 images in), when the bundle has one."""
        name = self.description.export.get("e2e_model")
        return name if name and self.file(name).is_file() else None

    @property
    def main_onnx(self) -> str:
        return ONNX_FILE

    @staticmethod
    def runner_name(onnx_file: str) -> str:
        """How reports and benchmarks name the ONNX Runtime runner of one of its models."""
        return "onnxruntime" if onnx_file == ONNX_FILE else f"onnxruntime[{onnx_file}]"

    @property
    def ts_path(self) -> Path:
        return self.path / TS_FILE

    @property
    def torch_files(self) -> dict[str, str]:
        """Runner name -> file, for the PyTorch artifacts on disk besides the eager weights:
        TorchScript, the torch.export program, the AOTInductor package."""
        return {name: file for name, file in (("torchscript", TS_FILE), ("pt2", PT2_FILE),
                                              ("aoti", AOTI_FILE)) if self.file(file).is_file()}

    @property
    def torch_profiles(self) -> dict[str, str]:
        """Runner name -> tolerance profile, for `torch_files`: fp32, and the AOTInductor
        package in the precision export compiled it in (export.aoti.precision; fp32 where
        the record names none, as packages made before fp16 ones were)."""
        made = self.description.export.get("aoti", {}).get("precision", "fp32")
        return {name: made if name == "aoti" else "fp32" for name in self.torch_files}

    def load_eager(self) -> "VisionTransformer":
        from .weights import load_eager

        return load_eager(self)


def read_bundle(path: str | os.PathLike, verify: bool = True) -> Bundle:
    """Read a bundle's config.json and check the folder: the description, the names it
    lists, every listed file present, no runnable file without a sha256. Each file's sha256
    is checked as the file is read for use (`Bundle.read_file`, `load_eager`), so nothing is
    used that its hash does not cover, and no file is read twice to check and then use it.
    `verify` is kept for callers: the check on use is always made."""
    path = Path(path)
    if not path.exists():
        raise BundleError(f"{path} does not exist")
    if not path.is_dir():
        raise BundleError(f"{path} is not a bundle folder")
    config_path = path / CONFIG_FILE
    if not config_path.is_file():
        raise BundleError(f"{path} has no {CONFIG_FILE}; is it a vit-export bundle?")
    config = verified.read_once(config_path, limit=CONFIG_BYTES, inside=path)
    values = parse_json(config.data, str(config_path))
    description = Description.from_dict(values, source=str(config_path))
    check_fields(description.export, EXPORT_KINDS, str(config_path), BundleError, "export")
    if description.config.dynamic_img_size and "export_size" not in description.export:
        raise BundleError(f"{config_path}: a dynamic-size model needs export.export_size, the "
                          f"size its graph is scanned against")
    hashes = values.get("files", {})
    for name in hashes:
        if name in ("", ".", "..") or "/" in name or "\\" in name or name.startswith("."):
            raise BundleError(f"{config_path}: `files` names {name!r}, which is not a file of "
                              f"the bundle folder")
    for name in (WEIGHTS_FILE,):
        if name not in hashes:
            raise BundleError(f"{config_path} lists no {name}")
    runnable = [TS_FILE, PT2_FILE, AOTI_FILE, E2E_FILE] + [
        n for m in description.export.get("onnx_models", {ONNX_FILE: ""}) for n in (m, m + ".data")]
    for name in runnable:  # a file that would run must be the one that was validated
        if (path / name).exists() and name not in hashes:
            raise BundleError(f"{path / name} has no sha256 in {CONFIG_FILE}, so it may not be "
                              f"the file that was validated")
    for name in hashes:  # each is hashed as it is read for use (Bundle.read_file)
        if not (path / name).is_file():
            raise BundleError(f"{path / name} is missing")
    if (path / PT2_FILE).is_file() and not is_package(path / PT2_FILE):
        check_program(path / PT2_FILE)  # what every command refuses, before torch reads it
    return Bundle(path, description, hashes, config_sha256=config.sha256)


def staged_bundle(folder: Path, description: Description,
                  files: Sequence[str] = MODEL_FILES) -> Bundle:
    """config.json for a bundle being made (`write_config`), and the Bundle that validates
    it, each file hashed once: read here for its sha256, those bytes (weights.safetensors
    and the programs: the file as it is open here) are what validation loads. The caller
    closes it (`Bundle.close`)."""
    names = [n for name in files for n in (name, name + ".data") if (folder / n).exists()]
    loaded, opened, hashes = {}, {}, {}
    try:
        for name in dict.fromkeys(names):
            if name in (WEIGHTS_FILE, *LOADED_ONCE):
                opened[name], hashes[name] = verified.open_hashed(folder / name)
            else:
                loaded[name] = verified.read_once(folder / name)
                hashes[name] = loaded[name].sha256
        atomic_write_json(folder / CONFIG_FILE, {**description.to_dict(), "files": hashes})
        bundle = read_bundle(folder)  # config.json read back and checked as any bundle's
    except BaseException:
        for f in opened.values():
            f.close()
        raise
    bundle.loaded.update(loaded)
    bundle.opened.update(opened)
    bundle.checked.update(hashes)
    return bundle


@dataclass(frozen=True)
class ModelFile:
    """A model file given alone (.onnx, .ts or .pt2), with the description it carries."""
    path: Path
    description: Description
    # where given, the sha256 its bytes must have when loaded (the copy a Ray driver checked)
    sha256: Optional[str] = None

    @property
    def config(self) -> ViTConfig:
        return self.description.config

    @property
    def io_shapes(self) -> tuple[tuple[int | str, ...], dict[str, tuple[int | str, ...]]]:
        return self.description.io_shapes


def read_model(path: str | os.PathLike, checked: Optional[Mapping[str, str]] = None
               ) -> "Bundle | ModelFile":
    """What a command was given, read once and handed down: a bundle folder (each file's
    sha256 checked as it is read) or a model file with its carried description.

    `checked`: the files another process checked, by name -> sha256 (`checked_files`: a Ray
    driver's, for each of its workers, which reads its node's own copy). The copy read here
    must be that one: a bundle's config.json of the same bytes (so each file it runs is
    held to the same sha256 as it is read), a model file whose bytes, as loaded, hash the
    same.

    Raises:
        BundleError: a file differs from the checked copy, in one line naming it.
    """
    path = Path(path)
    if path.is_dir():
        bundle = read_bundle(path)
        if checked is not None:
            _hold_to(bundle, checked)
        return bundle
    if checked is not None and path.name not in checked:
        raise BundleError(f"{path} is not the model file that was checked "
                          f"({', '.join(sorted(checked))})")
    return ModelFile(path, read_description(path),
                     sha256=None if checked is None else checked[path.name])


def checked_files(model: "Bundle | ModelFile") -> dict[str, str]:
    """What a process that read `model` hands to others that read their own copy
    (`read_model(..., checked)`), by file name -> sha256: a bundle's config.json, as its
    bytes were read, and every file it lists; a model file given alone, its bytes."""
    if isinstance(model, Bundle):
        return {CONFIG_FILE: model.config_sha256, **model.hashes}
    return {model.path.name: model.sha256 or sha256_file(model.path)}


def _hold_to(bundle: Bundle, checked: Mapping[str, str]) -> None:
    """The bundle's files are the checked copy's: each it lists by the same sha256 (named
    when one differs: its config.json says another file), then config.json by its bytes."""
    theirs = {name: sha for name, sha in checked.items() if name != CONFIG_FILE}
    for name in sorted(set(theirs) | set(bundle.hashes)):
        here, there = bundle.hashes.get(name), theirs.get(name)
        if here != there:
            if here is None:
                raise BundleError(f"{bundle.file(CONFIG_FILE)} lists no {name}; the driver's "
                                  f"copy does")
            if there is None:
                raise BundleError(f"{bundle.file(CONFIG_FILE)} lists {name}; the driver's "
                                  f"copy does not")
            raise BundleError(differs(bundle.file(name), here, there))
    if checked.get(CONFIG_FILE) != bundle.config_sha256:
        raise BundleError(differs(bundle.file(CONFIG_FILE), bundle.config_sha256,
                                  checked.get(CONFIG_FILE, "")))


def read_description(path: str | os.PathLike) -> Description:
    """The description from a bundle folder, a model.onnx, model.ts or .pt2 file."""
    path = Path(path)
    if path.is_dir():
        return read_bundle(path, verify=False).description
    if not path.is_file():
        raise BundleError(f"{path} does not exist")
    if path.suffix == ".onnx":
        proto = read_onnx(path)
        props = {p.key: p.value for p in proto.metadata_props}
        text = props.get(METADATA_KEY)
    elif path.suffix in (".ts", ".pt", ".jit", ".pt2"):  # read from the zip: nothing is run
        if path.suffix == ".pt2" and not is_package(path):
            check_program(path)
        text = carried_description(path)
    else:
        raise BundleError(f"{path}: expected a bundle folder, a .onnx, .ts or .pt2 file")
    if not text:
        raise BundleError(f"{path} carries no vit-export description")
    values = parse_json(text, f"{path}: its embedded description")
    return Description.from_dict(values, source=str(path))
