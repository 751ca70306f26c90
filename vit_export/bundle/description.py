"""The description a bundle and each of its files carry: Description (model config,
preprocessing, labels, export record, versions), config.json written with the sha256 of
each file and read back strictly, and the kinds its fields may hold."""
from __future__ import annotations

import json
import platform
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from .. import jsonio
from ..config import ViTConfig
from ..errors import BundleError, ConfigError, raw
from ..preprocessing.recipe import MAX_IMAGE_SIDE, Preprocessing
from ..schema import (
    OBJECT,
    STRING,
    Kind,
    check_fields,
    integer,
    list_of,
    object_of,
    one_of,
)
from .names import (
    AOTI_PRECISIONS,
    CONFIG_FILE,
    E2E_FILE,
    FORMAT,
    FORMAT_VERSION,
    HEIGHT_DIM,
    MAX_EXPORT_BATCH,
    MODEL_FILES,
    WIDTH_DIM,
    io_names,
)
from .writes import atomic_write_json, sha256_file


@dataclass
class Description:
    """What a model file or bundle says about itself; the same in every file of a bundle."""
    config: ViTConfig
    preprocessing: Preprocessing
    labels: Optional[list[str]] = None  # class names, index = class id
    name: str = "vit"  # preset or checkpoint the model came from
    export: dict[str, Any] = field(default_factory=dict)  # exporter, opset, export batch, ...
    versions: dict[str, str] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)  # e.g. training or import notes
    # the framework road: the framework's own module the eager model is (checkpoints.module:
    # {"framework": "timm", "name", "kwargs"} or {"framework": "transformers", "class",
    # "config"}); `config` then holds its inputs and outputs only. None: our rebuild
    module: Optional[dict[str, Any]] = None

    def __post_init__(self) -> None:
        if self.labels is not None and len(self.labels) != self.config.num_classes:
            raise ConfigError(f"{len(self.labels)} labels for a model with "
                              f"{self.config.num_classes} classes")
        broken = [i for i, label in enumerate(self.labels or []) if not label.isprintable()]
        if broken:  # infer prints a line per input: a line break would split its answer
            raise ConfigError(f"label {broken[0]} ({self.labels[broken[0]]!r}) holds a line "
                              f"break or another unprintable character")
        if self.preprocessing.img_size != self.config.img_size:
            raise ConfigError(f"preprocessing crops to {self.preprocessing.img_size} but the "
                              f"model takes {self.config.img_size}")
        if len(self.preprocessing.mean) != self.config.in_chans:
            raise ConfigError(f"preprocessing normalizes {len(self.preprocessing.mean)} "
                              f"channels but the model takes {self.config.in_chans}")

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": FORMAT, "format_version": FORMAT_VERSION, "name": self.name,
            "model": self.config.to_dict(), "preprocessing": self.preprocessing.to_dict(),
            "labels": self.labels,
            "io": io_names(self.config),
            "export": self.export, "versions": self.versions, "extra": self.extra,
            **({"module": self.module} if self.module is not None else {}),
        }

    def to_json(self) -> str:
        return jsonio.dumps(self.to_dict())

    @property
    def io_shapes(self) -> tuple[tuple[int | str, ...], dict[str, tuple[int | str, ...]]]:
        """Input [C, H, W] and each output's shape past the batch axis (logits [K], an
        embedding [F], tokens [N, D]) that every model described must have; H, W and N are
        symbolic ("height", "width", "patches") in a dynamic-size model."""
        c = self.config
        side: tuple[int | str, int | str] = (HEIGHT_DIM, WIDTH_DIM) if c.dynamic_img_size \
            else (c.img_size, c.img_size)
        return (c.in_chans, *side), {name: c.output_shape(name) for name in c.output_names}

    @classmethod
    def from_dict(cls, values: dict[str, Any], source: str = "description") -> "Description":
        if not isinstance(values, dict) or values.get("format") != FORMAT:
            raise BundleError(f"{source} is not a {FORMAT} description")
        check_fields(values, DESCRIPTION_KINDS, source, BundleError,
                     required=("model", "preprocessing"))
        version = values.get("format_version", 0)
        if version > FORMAT_VERSION:
            raise BundleError(f"{source} has format version {version}; "
                              f"this vit-export reads up to {FORMAT_VERSION}")
        labels, name = values.get("labels"), values.get("name", "vit")
        module = values.get("module")
        if module is not None:
            from ..frameworks import check_record  # data only: no framework loaded

            check_record(module, source)
        try:  # the config's own checks name the field; the file is named here
            described = cls(config=ViTConfig.from_dict(values["model"], strict=True),
                            preprocessing=Preprocessing.from_dict(values["preprocessing"]),
                            labels=labels, name=name, export=values.get("export", {}),
                            versions=values.get("versions", {}), extra=values.get("extra", {}),
                            module=module)
        except (ConfigError, BundleError) as exc:
            raise BundleError(f"{source}: {raw(exc)}") from None
        io = io_names(described.config)
        legacy = {**io, "output": io["outputs"][0]}  # before a bundle had several outputs
        del legacy["outputs"]
        if values.get("io", io) not in (io, legacy if len(io["outputs"]) == 1 else io):
            raise BundleError(f"{source}: `io` must be {json.dumps(io)}, got "
                              f"{json.dumps(values.get('io'))}")
        return described


def package_versions() -> dict[str, str]:
    """The versions that made an artifact, recorded so a run can be reproduced."""
    from importlib import metadata

    versions = {"python": platform.python_version()}
    for dist in ("vit-export", "torch", "onnx", "onnxruntime-gpu", "onnxruntime", "onnxscript",
                 "numpy", "safetensors"):
        try:
            versions[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            pass
    return versions


def write_config(folder: Path, description: Description,
                 files: Sequence[str] = MODEL_FILES) -> None:
    """config.json: the description plus the sha256 of each file (and its external data)."""
    names = [n for name in files for n in (name, name + ".data") if (folder / n).exists()]
    hashes = {name: sha256_file(folder / name) for name in dict.fromkeys(names)}
    atomic_write_json(folder / CONFIG_FILE, {**description.to_dict(), "files": hashes})


FILE_HASHES = object_of(STRING).named("an object mapping file names to sha256 strings")


def _onnx_models(models: Any) -> bool:
    return isinstance(models, dict) and all(  # printable: each names a runner in reports
        isinstance(k, str) and k.endswith(".onnx") and "/" not in k and k.isprintable()
        and isinstance(v, str) for k, v in models.items())


# What config.json's fields may hold; the model's and preprocessing's own fields are checked
# by ViTConfig.from_dict and Preprocessing.from_dict.
DESCRIPTION_KINDS = {
    "format_version": integer(0), "model": OBJECT, "preprocessing": OBJECT,
    "labels": list_of(STRING).or_null(), "name": STRING, "export": OBJECT, "versions": OBJECT,
    "extra": OBJECT, "module": OBJECT,
    "files": FILE_HASHES}
# The fields of `export` that drive what is run, checked once when a bundle is read.
EXPORT_KINDS = {
    "export_batch": integer(2, MAX_EXPORT_BATCH),
    "export_size": list_of(integer(1, MAX_IMAGE_SIDE), 2, 2).named("[height, width]"),
    "e2e_model": one_of(E2E_FILE),
    "onnx_models": Kind("an object mapping .onnx file names in the bundle to profile names",
                        _onnx_models),
    "aoti": Kind(f"an object whose precision, where given, is one of "
                 f"{', '.join(AOTI_PRECISIONS)}",
                 lambda v: isinstance(v, dict) and v.get("precision", "fp32") in AOTI_PRECISIONS)}
