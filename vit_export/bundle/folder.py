"""A bundle folder as read from disk (Bundle, read_bundle) and a model file given alone
(ModelFile), each with its description; read_model takes whichever a command was given."""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Optional

from .. import verified
from ..archives import METADATA_KEY, carried_description, check_program, is_package
from ..config import ViTConfig
from ..errors import BundleError
from ..schema import check_fields
from ..verified import Loaded
from .description import EXPORT_KINDS, Description, parse_json
from .names import (
    AOTI_FILE,
    CONFIG_FILE,
    E2E_FILE,
    ONNX_FILE,
    PT2_FILE,
    TS_FILE,
    WEIGHTS_FILE,
    plain_name,
)
from .onnxfiles import OnnxModel, external_data, onnx_model, read_onnx
from .writes import sha256_file

if TYPE_CHECKING:
    from ..model import VisionTransformer

@dataclass
class Bundle:
    """A bundle folder as read from disk."""
    path: Path
    description: Description
    hashes: dict[str, str]

    @property
    def config(self) -> ViTConfig:
        return self.description.config

    def file(self, name: str) -> Path:
        return self.path / name

    def read_file(self, name: str) -> Loaded:
        """The bytes of the bundle's file `name`, read once and checked against the sha256
        config.json lists (`verified.read_once`): what is loaded is what was checked.

        Raises:
            BundleError: the file has no sha256 in config.json, or does not match it.
        """
        if name not in self.hashes:
            raise BundleError(f"{self.file(name)} has no sha256 in {CONFIG_FILE}, so it may "
                              f"not be the file that was validated")
        return verified.read_once(self.file(name), self.hashes[name])

    def onnx_model(self, name: str) -> "OnnxModel":
        """The bundle's ONNX model `name` as it is loaded (`onnx_model`): its bytes and its
        external data, each file read once and checked against config.json."""
        def hashed(location: str) -> Loaded:
            if location not in self.hashes or not plain_name(location):
                raise BundleError(f"{self.file(name)} names external data {location!r}, which "
                                  f"has no sha256 in {CONFIG_FILE}")
            return self.read_file(location)

        return onnx_model(self.read_file(name), hashed)

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
    """Read a bundle's config.json; with `verify`, check every listed file's sha256."""
    path = Path(path)
    if not path.exists():
        raise BundleError(f"{path} does not exist")
    if not path.is_dir():
        raise BundleError(f"{path} is not a bundle folder")
    config_path = path / CONFIG_FILE
    if not config_path.is_file():
        raise BundleError(f"{path} has no {CONFIG_FILE}; is it a vit-export bundle?")
    values = parse_json(config_path.read_bytes(), str(config_path))
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
    onnx_files = {n for n in runnable if n.endswith(".onnx")}
    for name, expected in hashes.items():
        file = path / name
        if not file.is_file():
            raise BundleError(f"{file} is missing")
        if not verify:
            continue
        if name not in onnx_files:
            if sha256_file(file) != expected:
                raise BundleError(f"{file} does not match its sha256 in {CONFIG_FILE} "
                                  f"(truncated or modified)")
            continue
        # ONNX Runtime reads whatever external data a graph names: found by parsing it
        for location in external_data(verified.read_once(file, expected)):
            if location not in hashes:
                raise BundleError(f"{file} names external data {location!r}, which has no "
                                  f"sha256 in {CONFIG_FILE}")
    if (path / PT2_FILE).is_file() and not is_package(path / PT2_FILE):
        check_program(path / PT2_FILE)  # what every command refuses, before torch reads it
    return Bundle(path, description, hashes)


@dataclass(frozen=True)
class ModelFile:
    """A model file given alone (.onnx, .ts or .pt2), with the description it carries."""
    path: Path
    description: Description

    @property
    def config(self) -> ViTConfig:
        return self.description.config

    @property
    def io_shapes(self) -> tuple[tuple[int | str, ...], dict[str, tuple[int | str, ...]]]:
        return self.description.io_shapes


def read_model(path: str | os.PathLike) -> "Bundle | ModelFile":
    """What a command was given, read once and handed down: a bundle folder (every file's
    sha256 checked) or a model file with its carried description."""
    path = Path(path)
    return read_bundle(path) if path.is_dir() else ModelFile(path, read_description(path))


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
