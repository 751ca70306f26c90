"""The on-disk bundle: one folder that describes itself and deploys as it is.

    model.onnx            ONNX, input `pixel_values` [batch, C, H, W], output `logits` [batch, K];
                          H and W are symbolic (`height`, `width`) in a dynamic-size bundle
    model.e2e.onnx        optional: uint8 images [batch, height, width, C] in, preprocessing
                          in the graph, `logits` out (export --embed-preprocessing)
    model.onnx.data       external weights, only when the model is too big for one protobuf
    model.ts              TorchScript (torch.jit.trace)
    weights.safetensors   the eager source of truth, with config.json
    config.json           the description (model config, preprocessing, labels, versions) + sha256s
    parity.json           the validation report made at export time
    performance.json      `bench --record`: measured speeds and the fastest validated model

The description also travels inside model.onnx (metadata_props) and model.ts (extra files),
so one file alone is still self-describing. Every write goes through a temporary name in the
same folder and a rename: a failed write leaves nothing half-written behind.
"""
from __future__ import annotations

import hashlib
import json
import os
import platform
import re
import shutil
import stat
import tempfile
import uuid
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import torch

from . import jsonio, verified
from .archives import METADATA_KEY, carried_description, check_program, is_package
from .errors import BundleError, ConfigError, first_line
from .model import VisionTransformer, ViTConfig
from .preprocessing import MAX_IMAGE_SIDE, Preprocessing
from .schema import (
    BOOLEAN,
    OBJECT,
    STRING,
    Kind,
    check_fields,
    integer,
    list_of,
    object_of,
    one_of,
)
from .verified import Loaded

FORMAT = "vit-export-bundle"
FORMAT_VERSION = 1
ONNX_FILE = "model.onnx"
ONNX_DATA_FILE = "model.onnx.data"
TS_FILE = "model.ts"
PT2_FILE = "model.pt2"  # export --pt2: a torch.export ExportedProgram
AOTI_FILE = "model.aoti.pt2"  # export --aoti: the program compiled by AOTInductor
# export --aoti-precision: what model.aoti.pt2 computes in, and the tolerance profile that
# judges it (fp16: the model's .half() copy, fed fp16, compiled for CUDA)
AOTI_PRECISIONS = ("fp32", "fp16")
WEIGHTS_FILE = "weights.safetensors"
CONFIG_FILE = "config.json"
PARITY_FILE = "parity.json"
PERFORMANCE_FILE = "performance.json"  # bench --record: the fastest validated model here
# METADATA_KEY (archives): key of the description in ONNX metadata_props, TorchScript and
# torch.export extra files, AOTInductor package metadata
INPUT_NAME = "pixel_values"
# The outputs are named for what they are (config.output): logits, embedding, tokens, the
# last with the symbolic PATCHES_AXIS in a dynamic-size model
BATCH_DIM = "batch"
HEIGHT_DIM, WIDTH_DIM = "height", "width"  # symbolic input sides: dynamic size, e2e images


def io_names(config: ViTConfig) -> dict[str, Any]:
    """The input, outputs and symbolic axis names every file of a bundle uses."""
    io = {"input": INPUT_NAME, "outputs": list(config.output_names), "batch_axis": BATCH_DIM}
    if config.dynamic_img_size:
        io.update(height_axis=HEIGHT_DIM, width_axis=WIDTH_DIM)
    return io

E2E_FILE = "model.e2e.onnx"
E2E_INPUT_NAME = "images"
MAX_EXPORT_BATCH = 1024


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
        try:  # the config's own checks name the field; the file is named here
            described = cls(config=ViTConfig.from_dict(values["model"], strict=True),
                            preprocessing=Preprocessing.from_dict(values["preprocessing"]),
                            labels=labels, name=name, export=values.get("export", {}),
                            versions=values.get("versions", {}), extra=values.get("extra", {}))
        except (ConfigError, BundleError) as exc:
            raise BundleError(f"{source}: {exc}") from None
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


def sha256_file(path: Path, chunk: int = 1 << 20) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def output_target(path: str | os.PathLike) -> tuple[Path, bool]:
    """Where an output named `path` goes, and whether it is written through rather than
    replaced: (target, write_through). A new path or a regular file is the target itself,
    replaced atomically. A symlink is followed, never replaced (the link stays; what it points
    to is written by these rules). A character device or a FIFO (/dev/null, /dev/stdout, a
    pipe) is written through, as a shell redirection would: renaming a file over it would
    destroy the node. A folder or any other kind of file is refused."""
    path = Path(path)
    try:
        target = path.resolve() if path.is_symlink() else path
        mode = target.stat().st_mode if target.exists() else None
    except (OSError, RuntimeError) as exc:  # RuntimeError: a symlink loop (Python < 3.13)
        raise BundleError(f"cannot write {path}: {getattr(exc, 'strerror', None) or exc}") \
            from None
    if mode is None or stat.S_ISREG(mode):
        return target, False
    if stat.S_ISCHR(mode) or stat.S_ISFIFO(mode):
        return target, True
    kind = "a folder" if stat.S_ISDIR(mode) else "not a regular file, device or FIFO"
    raise BundleError(f"cannot write {path}: it is {kind}")


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
    atomic_write_chunks(path, [data])


def atomic_write_chunks(path: str | os.PathLike, chunks: Iterable) -> None:
    """Write to a temporary file beside `path`, then rename over it. Every byte goes through
    Python's own file I/O, so a full disk is an OSError ("No space left on device") and the
    temporary file is removed; the old file, if any, stays as it was. What `path` is decides
    first (`output_target`): a symlink is followed, a device or FIFO written through."""
    path, write_through = output_target(path)
    if write_through:
        with open(path, "wb") as f:
            f.writelines(chunks)
        return
    if path.parent and not path.parent.is_dir():
        raise BundleError(f"folder {path.parent} does not exist")
    try:
        fd, tmp = tempfile.mkstemp(prefix=".vx-", suffix=".tmp", dir=path.parent)
    except OSError as exc:
        raise BundleError(f"cannot write {path}: {exc.strerror}") from None
    try:
        with os.fdopen(fd, "wb") as f:
            f.writelines(chunks)  # bytes-like objects, written one after another
            f.flush()
            os.fsync(f.fileno())
        _make_shareable(Path(tmp))
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_json(path: str | os.PathLike, data: Any) -> None:
    """`data` as JSON (jsonio's one format: NaN refused before anything is written)."""
    atomic_write_text(path, jsonio.dumps(data, what=str(path)))


def _make_shareable(path: Path) -> None:
    """Permissions as a plain file write would give (0666 less umask): mkstemp, safetensors
    and ONNX's external data writer make files 0600, and a bundle is for sharing."""
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(path, 0o666 & ~umask)


def _remove(path: Path) -> None:
    """Remove a file, a symlink (not what it points to) or a folder tree."""
    if path.is_symlink() or path.is_file():
        path.unlink(missing_ok=True)
    elif path.exists():
        shutil.rmtree(path, ignore_errors=True)


@contextmanager
def staged_folder(out_dir: str | os.PathLike, force: bool = False) -> Iterator[Path]:
    """Yield an empty staging folder beside `out_dir`; on success it becomes `out_dir`.

    An existing `out_dir` is replaced only with `force`, and only after the new one is
    complete; a symlink at `out_dir` is replaced, never what it points to. On any error (a
    signal too, once the CLI has turned it into an exception) the staging folder and any
    parent folders made for it are removed, and `out_dir` is left as it was. The staging
    name is short, so a legal `out_dir` name never becomes too long to stage.
    """
    out_dir = Path(out_dir)
    if (out_dir.exists() or out_dir.is_symlink()) and not force:
        raise BundleError(f"{out_dir} already exists; use --force to replace it")
    if out_dir.exists() and not out_dir.is_dir():
        raise BundleError(f"{out_dir} exists and is not a folder")
    parent = Path(os.path.abspath(out_dir)).parent
    made = [p for p in [parent, *parent.parents] if not p.exists()]
    try:
        parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        _remove_made(made)
        raise BundleError(f"cannot create {parent}: {exc.strerror}") from None
    tag = uuid.uuid4().hex[:12]
    staging = parent / f".vx-partial-{tag}"
    try:
        try:
            staging.mkdir()
        except OSError as exc:
            raise BundleError(f"cannot write in {parent}: {exc.strerror}") from None
        yield staging
        for file in staging.iterdir():
            if file.is_file():
                _make_shareable(file)
        if out_dir.exists() or out_dir.is_symlink():
            old = parent / f".vx-old-{tag}"
            os.rename(out_dir, old)
            try:
                os.rename(staging, out_dir)
            except BaseException:
                os.rename(old, out_dir)  # put the old bundle back
                raise
            _remove(old)
        else:
            os.rename(staging, out_dir)
    except BaseException:
        _remove(staging)
        _remove_made(made)
        raise


def _remove_made(made: list[Path]) -> None:
    """Remove the parent folders a failed write created (innermost first), if still empty."""
    for folder in made:
        try:
            folder.rmdir()
        except OSError:
            break


# torch dtype -> safetensors' name for it
SAFETENSORS_DTYPES = {torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16",
                      torch.float64: "F64", torch.int64: "I64", torch.int32: "I32",
                      torch.uint8: "U8", torch.bool: "BOOL"}


def write_weights(model: VisionTransformer, path: Path) -> None:
    """weights.safetensors, streamed tensor by tensor through Python's file I/O (a full disk
    is an OSError; the old file stays): safetensors' own `save` returns the file as bytes and
    copies them once more on the way (two copies of the weights beside the model, 8.5 GB for
    a ViT-g, measured), and `save_file` writes from Rust, where a full disk is its own error.
    The same bytes as `safetensors.torch.save` (a test compares them)."""
    state = {k: v.detach().contiguous().cpu() for k, v in model.state_dict().items()}
    # safetensors' order: larger elements first, then by name
    names = sorted(state, key=lambda k: (-state[k].element_size(), k))
    header, offset = {}, 0
    for name in names:
        tensor = state[name]
        size = tensor.numel() * tensor.element_size()
        header[name] = {"dtype": SAFETENSORS_DTYPES[tensor.dtype],
                        "shape": list(tensor.shape), "data_offsets": [offset, offset + size]}
        offset += size
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    chunks = [len(text).to_bytes(8, "little"), text] + [
        memoryview(state[n].reshape(-1).view(torch.uint8).numpy()) for n in names]
    atomic_write_chunks(path, chunks)


MODEL_FILES = (ONNX_FILE, TS_FILE, WEIGHTS_FILE)


def write_config(folder: Path, description: Description,
                 files: Sequence[str] = MODEL_FILES) -> None:
    """config.json: the description plus the sha256 of each file (and its external data)."""
    names = [n for name in files for n in (name, name + ".data") if (folder / n).exists()]
    hashes = {name: sha256_file(folder / name) for name in dict.fromkeys(names)}
    atomic_write_json(folder / CONFIG_FILE, {**description.to_dict(), "files": hashes})


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
            if location not in self.hashes or not _plain_name(location):
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

    def load_eager(self) -> VisionTransformer:
        return load_eager(self)


def _no_constant(name: str):
    raise ValueError(f"{name} is not JSON")


def parse_json(text: str | bytes, where: str, error: type[Exception] = BundleError) -> Any:
    """Strict JSON from a file we read: NaN and Infinity (Python's extension) are refused, and
    so is nesting too deep to parse, each as one line naming `where`."""
    try:
        return json.loads(text, parse_constant=_no_constant)
    except RecursionError:
        raise error(f"{where} is nested too deeply to be a description") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise error(f"{where} is not valid JSON: {exc}") from None


MAX_JSON_BYTES = 64 << 20  # far above any report we write; more is not one of ours


def read_json(path: Path) -> Any:
    """A JSON file we read (`parse_json`): a regular file (a symlink is followed) of at most
    MAX_JSON_BYTES, never a device or FIFO that would never end; or BundleError in one
    line."""
    try:
        with open(path, "rb", opener=lambda p, flags: os.open(p, flags | os.O_NONBLOCK)) as f:
            if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
                raise BundleError(f"{path} is not a regular file")
            data = f.read(MAX_JSON_BYTES + 1)
    except OSError as exc:
        raise BundleError(f"cannot read {path}: {exc.strerror}") from None
    if len(data) > MAX_JSON_BYTES:
        raise BundleError(f"{path} is larger than {MAX_JSON_BYTES >> 20} MiB: not one we wrote")
    return parse_json(data, str(path))


FILE_HASHES = object_of(STRING).named("an object mapping file names to sha256 strings")
PARITY_KINDS = {"passed": BOOLEAN, "files": FILE_HASHES}  # what is read; the rest is shown
BENCH_RECORD = Kind("an object with a string `backend`", lambda v: isinstance(v, dict)
                    and STRING.test(v.get("backend")) and v["backend"] != "")
PERFORMANCE_KINDS = {  # what infer and serve read of a performance.json
    "device": STRING, "cpu": STRING, "files": FILE_HASHES,
    "fastest_validated": Kind(
        "an object of batch sizes (1 to 1048576) -> {\"backend\": runner name}",
        lambda v: isinstance(v, dict) and all(
            re.fullmatch(r"[1-9][0-9]{0,6}", k) and int(k) <= 1 << 20 and BENCH_RECORD.test(r)
            for k, r in v.items()))}


def read_parity(path: str | os.PathLike) -> dict[str, Any]:
    """A parity.json (`validate --report`, or the one export writes into the bundle): an
    object with a boolean `passed`, or BundleError in one line. The one reader of it."""
    path = Path(path)
    report = read_json(path)
    check_fields(report, PARITY_KINDS, str(path), BundleError, required=("passed",))
    return report


def passed_runners(report: dict[str, Any]) -> set[str]:
    """The runners a parity report found in agreement with eager at every row it judged:
    none when the report as a whole failed."""
    results = report.get("results") if report.get("passed") is True else []
    rows = [r for r in results if isinstance(r, dict)] if isinstance(results, list) else []
    failed = {str(r.get("candidate")) for r in rows if r.get("passed") is not True}
    return {str(r.get("candidate")) for r in rows if r.get("passed") is True} - failed


def read_proof(bundle: Bundle) -> tuple[Optional[dict[str, Any]], Optional[str]]:
    """The bundle's parity.json (written by a passing export, or `validate --report` into the
    folder) where it judged the files the bundle holds now, else None; and why not. A
    verdict is tied to the sha256s it records (`files`): a model swapped in after it, even
    with config.json re-hashed, is not what it judged."""
    try:
        report = read_parity(bundle.file(PARITY_FILE))
    except BundleError as exc:
        return None, str(exc)
    if report.get("files") != bundle.hashes:
        return None, (f"{PARITY_FILE} judged other files than the bundle holds now (the "
                      f"sha256s it records differ from {CONFIG_FILE}'s)")
    return report, None


def validated_runners(bundle: Bundle) -> set[str]:
    """The runners the bundle's parity.json (`read_proof`) found in agreement with eager,
    plus eager itself. No report that judged these files: eager only."""
    report, _ = read_proof(bundle)
    return {"eager"} | (passed_runners(report) if report else set())


def validated_device(bundle: Bundle) -> Optional[str]:
    """The device the bundle's parity.json (`read_proof`) compared on (its provider_used),
    or None. A model proved on one device is not proved on another: other kernels round
    otherwise (an fp16 graph most of all: ONNX Runtime's CPU provider runs much of it in
    fp32)."""
    report, _ = read_proof(bundle)
    used = report.get("provider_used") if report else None
    return used if isinstance(used, str) else None


def read_performance(path: str | os.PathLike) -> dict[str, Any]:
    """A performance.json (`bench --record`): the device and CPU it was measured on, and
    `fastest_validated` as batch size (int) -> {"backend": runner name, ...}; or
    BundleError in one line. The one reader of it."""
    path = Path(path)
    record = read_json(path)
    check_fields(record, PERFORMANCE_KINDS, str(path), BundleError,
                 required=("device", "cpu", "fastest_validated"))
    return record | {"fastest_validated": {int(k): v for k, v
                                           in record["fastest_validated"].items()}}


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


def parse_onnx(loaded: Loaded):
    """The ModelProto in an ONNX file's bytes as read once (`verified.read_once`), without
    its external data; or BundleError in one line."""
    import onnx

    proto = onnx.ModelProto()
    try:
        proto.ParseFromString(loaded.data)
    except Exception as exc:  # protobuf's DecodeError and friends
        raise BundleError(f"cannot read ONNX model {loaded.path}: {type(exc).__name__}: "
                          f"{first_line(exc, 'truncated?')}") from None
    return proto


def _graph_tensors(graph) -> Iterator[Any]:
    """Every TensorProto a graph holds: initializers, sparse initializers (values and
    indices), and node attributes (a tensor, tensors, sparse tensors), into every subgraph
    (If, Loop, Scan)."""
    yield from graph.initializer
    yield from _sparse_tensors(graph.sparse_initializer)
    for node in graph.node:
        yield from _attribute_tensors(node.attribute)


def _sparse_tensors(sparse) -> Iterator[Any]:
    for tensor in sparse:
        yield tensor.values
        yield tensor.indices


def _attribute_tensors(attributes) -> Iterator[Any]:
    for attribute in attributes:
        if attribute.HasField("t"):
            yield attribute.t
        yield from attribute.tensors
        if attribute.HasField("sparse_tensor"):
            yield from _sparse_tensors([attribute.sparse_tensor])
        yield from _sparse_tensors(attribute.sparse_tensors)
        if attribute.HasField("g"):
            yield from _graph_tensors(attribute.g)
        for graph in attribute.graphs:
            yield from _graph_tensors(graph)


def external_tensors(proto) -> list[tuple[Any, bool]]:
    """Every tensor of an ONNX model whose data lies in another file (data_location
    EXTERNAL, or any external_data entry), found by walking the parsed graph (`_graph_tensors`
    over the main graph, and the nodes of its functions), with whether it is one of the main
    graph's own initializers. What ONNX Runtime would read from disk is among these: the
    bytes are parsed, never scanned for a key's encoding (a varint may be written long)."""
    import onnx

    own = len(proto.graph.initializer)  # _graph_tensors yields these first
    tensors = [*_graph_tensors(proto.graph),
               *(t for function in proto.functions for node in function.node
                 for t in _attribute_tensors(node.attribute))]
    return [(t, i < own) for i, t in enumerate(tensors)
            if t.data_location == onnx.TensorProto.EXTERNAL or len(t.external_data)]


def _location(tensor) -> str:
    values = {entry.key: entry.value for entry in tensor.external_data}
    return values.get("location", "")


def external_data(source: "str | os.PathLike | Loaded") -> list[str]:
    """The external data files an ONNX model names (each external tensor's `location`,
    `external_tensors`), read from the parsed graph without loading them."""
    loaded = source if isinstance(source, Loaded) else verified.read_once(source)
    return sorted({_location(t) for t, _ in external_tensors(parse_onnx(loaded))})


@dataclass(frozen=True)
class OnnxModel:
    """An ONNX model as it is loaded: the graph's bytes as read once (and checked against
    config.json in a bundle), and each tensor it keeps in external data as an array over the
    bytes of its file, read once and checked the same way. A session is built from these
    (ONNX Runtime: from the bytes, the arrays given as external initializers), never by
    opening a path again."""
    loaded: Loaded
    external: dict[str, Any] = field(default_factory=dict)  # initializer -> numpy array

    @property
    def path(self) -> Path:
        return self.loaded.path


def onnx_model(loaded: Loaded, read_data) -> OnnxModel:
    """`loaded` (an ONNX file's bytes) with its external tensors, each read through
    `read_data(location) -> Loaded`, which says which files may be read (a bundle: the ones
    config.json hashes). Only the main graph's initializers may be external (what ONNX's
    own saver writes, and what a session can be given); offsets and lengths must fit.

    Raises:
        BundleError: an external tensor elsewhere, a location not allowed, a range that
            does not fit its file or its tensor.
    """
    import numpy as np
    import onnx

    proto = parse_onnx(loaded)
    found = external_tensors(proto)
    if not found:
        return OnnxModel(loaded)
    arrays, files = {}, {}
    for tensor, own in found:
        if not own:
            raise BundleError(f"{loaded.path} keeps tensor {tensor.name!r} outside the graph's "
                              f"initializers in external data, which is not read")
        values = {entry.key: entry.value for entry in tensor.external_data}
        location = values.get("location", "")
        if location not in files:
            files[location] = read_data(location)
        data = files[location].data
        try:
            dtype = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(tensor.data_type))
            offset, length = int(values.get("offset", 0)), int(values["length"])
            count = int(np.prod(tensor.dims, dtype=np.int64))
        except (KeyError, ValueError, TypeError) as exc:
            raise BundleError(f"{loaded.path}: external tensor {tensor.name!r} is not "
                              f"described ({first_line(exc)})") from None
        if dtype.kind not in "biuf" or offset < 0 or length != count * dtype.itemsize or \
                offset + length > len(data):
            raise BundleError(f"{loaded.path}: external tensor {tensor.name!r} does not fit "
                              f"{location}: {length} bytes at {offset} of {len(data)}, for "
                              f"{count} x {dtype}")
        arrays[tensor.name] = np.frombuffer(data, dtype, count, offset).reshape(
            tuple(tensor.dims))
    return OnnxModel(loaded, arrays)


def read_onnx_file(path: str | os.PathLike) -> OnnxModel:
    """An ONNX file the user named, read once (`onnx_model`): its external data may only be
    files beside it, named plainly."""
    loaded = verified.read_once(path)

    def beside(location: str) -> Loaded:
        if not _plain_name(location):
            raise BundleError(f"{loaded.path} names external data {location!r}, which is not "
                              f"a file beside it")
        return verified.read_once(loaded.path.parent / location)

    return onnx_model(loaded, beside)


def _plain_name(name: str) -> bool:
    """A file of the folder itself: no path parts, not hidden, not empty."""
    return bool(name) and name not in (".", "..") and "/" not in name and "\\" not in name \
        and not name.startswith(".") and "\0" not in name


def _onnx_models(models: Any) -> bool:
    return isinstance(models, dict) and all(  # printable: each names a runner in reports
        isinstance(k, str) and k.endswith(".onnx") and "/" not in k and k.isprintable()
        and isinstance(v, str) for k, v in models.items())


# What config.json's fields may hold; the model's and preprocessing's own fields are checked
# by ViTConfig.from_dict and Preprocessing.from_dict.
DESCRIPTION_KINDS = {
    "format_version": integer(0), "model": OBJECT, "preprocessing": OBJECT,
    "labels": list_of(STRING).or_null(), "name": STRING, "export": OBJECT, "versions": OBJECT,
    "extra": OBJECT,
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


# What a weight may be stored as: the model takes these as they are (float64 rounds to
# float32, as a trained model's fp64 copy would). Anything else is refused, not taken as
# numbers: an int8 head holds quantized values, complex weights would lose their imaginary
# part, bool is a mask, float8 needs a scale the state dict does not carry. Integer
# buffers that are no weight (position ids, BatchNorm's counter) pass.
WEIGHT_DTYPES = ("float32", "float16", "bfloat16", "float64")
INTEGER_BUFFERS = ("position_ids", "num_batches_tracked")


def weight_problem(key: str, value) -> Optional[str]:
    """Why a state dict entry (a torch tensor) cannot be taken as a weight, or None."""
    if key.rsplit(".", 1)[-1] in INTEGER_BUFFERS and not value.is_floating_point():
        return None
    if value.is_meta or value.layout != torch.strided or value.is_quantized:
        kind = ("on the meta device (no values)" if value.is_meta else
                "quantized" if value.is_quantized else f"{value.layout} (not dense)")
        return f"{key} is {kind}; save a dense float state dict"
    if str(value.dtype).removeprefix("torch.") not in WEIGHT_DTYPES:
        return (f"{key} is {value.dtype}, not a float weight "
                f"({', '.join(WEIGHT_DTYPES)})")
    if not torch.isfinite(value).all():
        return f"{key} holds NaN or infinite values"
    return None


def _own_copy(tensor):
    import torch

    return tensor.to(torch.float32 if tensor.is_floating_point() else tensor.dtype, copy=True)


def load_eager(bundle: Bundle) -> VisionTransformer:
    """Rebuild the eager PyTorch model from weights.safetensors + config.json. The weights
    are hashed and read through one open file (`verified.open_checked`): one renamed over
    weights.safetensors after config.json's check is not read."""
    import torch

    with torch.device("meta"):  # no weights of its own: the file's are assigned below
        model = VisionTransformer(bundle.config)
    with verified.open_checked(bundle.file(WEIGHTS_FILE), bundle.hashes.get(WEIGHTS_FILE)) \
            as path:
        state = _read_weights(bundle.file(WEIGHTS_FILE), path)
    problems = [p for p in (weight_problem(k, v) for k, v in state.items()) if p]
    if problems:
        raise BundleError(f"{bundle.file(WEIGHTS_FILE)}: {problems[0]}")
    ours = model.state_dict()
    wrong = [f"{k} {list(v.shape)} vs config {list(ours[k].shape)}" for k, v in state.items()
             if k in ours and v.shape != ours[k].shape]
    if wrong:
        raise BundleError(f"{WEIGHTS_FILE} does not fit config.json: {len(wrong)} wrong shape "
                          f"({', '.join(wrong[:2])}{', ...' if len(wrong) > 2 else ''})")
    result = model.load_state_dict(state, strict=False, assign=True)
    if result.missing_keys or result.unexpected_keys:
        raise BundleError(f"{WEIGHTS_FILE} does not fit config.json: missing "
                          f"{result.missing_keys[:3]}, unexpected {result.unexpected_keys[:3]}")
    return model.eval()


def _read_weights(named: Path, path: str) -> dict[str, Any]:
    """Every tensor of the safetensors file at `path` (`named` in messages)."""
    from safetensors import safe_open

    try:  # one tensor at a time, each copied into torch's own (64-byte aligned) memory:
        # safetensors' is 16-byte aligned, and there oneDNN's GEMMs round differently from
        # TorchScript's, which loads into torch's memory. The file is opened (mapped) anew
        # for each: the pages of a mapping stay resident until it closes, and one mapping
        # would add the whole file to the peak (4.5 GB for a ViT-g).
        with safe_open(path, framework="pt") as f:
            keys = list(f.keys())
        state = {}
        for k in keys:
            with safe_open(path, framework="pt") as f:
                state[k] = _own_copy(f.get_tensor(k))
    except Exception as exc:  # safetensors raises its own error types
        raise BundleError(f"cannot read {named}: {exc}") from None
    return state


def read_onnx(path: str | os.PathLike):
    """An ONNX model's protobuf without its external weights, or one line on why not."""
    import onnx

    try:
        return onnx.load(str(path), load_external_data=False)
    except Exception as exc:  # protobuf's DecodeError and friends
        raise BundleError(f"cannot read ONNX model {path}: {type(exc).__name__}: "
                          f"{first_line(exc, 'truncated?')}") from None


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
