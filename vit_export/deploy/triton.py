"""A Triton Inference Server model repository from a bundle, correct without running the server.

    REPO/
      <name>_onnx/           config.pbtxt, labels.txt, 1/model.onnx (+ its external data file)
      <name>_onnx_fp16/      one more model per ONNX variant of the bundle (fp16, opt, int8)
      <name>_torchscript/    config.pbtxt, labels.txt, 1/model.pt (only when asked: it runs
                           the TorchScript program, code the bundle carries)

Each config.pbtxt follows Triton's ModelConfig schema (common/protobuf/model_config.proto):
names, data types and dims come from the ONNX graph itself, with the batch axis left out as
Triton's batching models want. The repository is staged beside REPO and renamed into place,
and every file copied is checked against the bundle's sha256.
"""
from __future__ import annotations

import json
import os
import re
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import onnx

from .. import bundle as B
from ..errors import BundleError, ConfigError, param
from ..exporting.variants import batch_dependence
from . import DEFAULT_MAX_BATCH_SIZE

DEVICES = ("cpu", "cuda")  # where Triton runs the models: KIND_CPU or KIND_GPU
DEFAULT_QUEUE_DELAY_US = 100  # Triton's own example value (docs/user_guide/batcher.md)
CONFIG_FILE = "config.pbtxt"
LABELS_FILE = "labels.txt"
VERSION = "1"
ONNX_MODEL_FILE = "model.onnx"  # the onnxruntime backend's default_model_filename
TORCHSCRIPT_MODEL_FILE = "model.pt"  # the pytorch backend's default_model_filename
_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*")

# ONNX element type -> Triton data type (server docs/user_guide/model_configuration.md#datatypes)
TRITON_TYPES = {
    onnx.TensorProto.BOOL: "TYPE_BOOL",
    onnx.TensorProto.UINT8: "TYPE_UINT8",
    onnx.TensorProto.UINT16: "TYPE_UINT16",
    onnx.TensorProto.UINT32: "TYPE_UINT32",
    onnx.TensorProto.UINT64: "TYPE_UINT64",
    onnx.TensorProto.INT8: "TYPE_INT8",
    onnx.TensorProto.INT16: "TYPE_INT16",
    onnx.TensorProto.INT32: "TYPE_INT32",
    onnx.TensorProto.INT64: "TYPE_INT64",
    onnx.TensorProto.FLOAT16: "TYPE_FP16",
    onnx.TensorProto.FLOAT: "TYPE_FP32",
    onnx.TensorProto.DOUBLE: "TYPE_FP64",
    onnx.TensorProto.STRING: "TYPE_STRING",
    onnx.TensorProto.BFLOAT16: "TYPE_BF16",
}


@dataclass(frozen=True)
class TritonOptions:
    """How Triton should schedule and place every model of the repository."""
    device: str = "cpu"  # one of DEVICES: instance_group KIND_CPU or KIND_GPU (cuda)
    max_batch_size: int = DEFAULT_MAX_BATCH_SIZE
    preferred_batch_sizes: tuple[int, ...] = ()  # empty: [max_batch_size], Triton's own default
    max_queue_delay_us: int = DEFAULT_QUEUE_DELAY_US
    instances: int = 1  # model instances per device
    tf32: bool = False  # GPU ONNX models: let ONNX Runtime's CUDA EP use TF32
    tensorrt: bool = False  # GPU ONNX models: ONNX Runtime's TensorRT EP first
    name: Optional[str] = None  # prefix of the model names [default: the bundle's name]
    # model.ts too: Triton's libtorch backend runs the TorchScript program it holds, so a
    # bundle (data) deploys it only when asked (--torchscript, --trust-code)
    torchscript: bool = False

    def __post_init__(self) -> None:
        if self.name is not None and not _NAME.fullmatch(self.name):
            raise ConfigError(f"model name {self.name!r} must be letters, digits, '_', '-' "
                              f"or '.'")
        if self.device not in DEVICES:
            raise ConfigError(f"device must be one of {DEVICES}, got {self.device!r}")
        if self.max_batch_size < 1:
            raise ConfigError(f"max batch size must be >= 1, got {self.max_batch_size}")
        too_big = [b for b in self.preferred_batch_sizes if not 1 <= b <= self.max_batch_size]
        if too_big:
            raise ConfigError(f"preferred batch size {too_big[0]} is not in [1, max batch size "
                              f"{self.max_batch_size}]")
        if self.max_queue_delay_us < 0 or self.instances < 1:
            raise ConfigError("queue delay must be >= 0 and instances >= 1")
        if self.device != "cuda" and (self.tf32 or self.tensorrt):
            raise ConfigError(f"TF32 and TensorRT apply to {param('provider', 'cuda')}"
                              f" only")

    @property
    def kind(self) -> str:
        return "KIND_GPU" if self.device == "cuda" else "KIND_CPU"


@dataclass(frozen=True)
class TensorSpec:
    name: str
    data_type: str  # Triton's TYPE_* name
    dims: tuple[int, ...]  # without the batch axis; -1 where the graph leaves a size open


Tensors = tuple[TensorSpec, ...]


@dataclass(frozen=True)
class ModelSpec:
    """One model of the repository and the bundle files it serves."""
    name: str  # Triton's model name, also its folder
    platform: str
    backend: str
    source: str  # the bundle file copied to the version folder
    file: str  # its name there
    inputs: Tensors
    outputs: Tensors
    profile: str = "fp32"  # the bundle's tolerance profile of the model: its precision
    external_data: tuple[str, ...] = ()  # ONNX external data files, copied under their names


@dataclass(frozen=True)
class Repository:
    path: Path
    models: tuple[ModelSpec, ...]
    options: TritonOptions
    labels: bool  # whether labels.txt was written
    left_out: tuple[str, ...] = ()  # bundle files that carry code and were not asked for
    # for people: models whose answers depend on the requests batched with them
    notes: tuple[str, ...] = ()


def _batch_spec(value: onnx.ValueInfoProto, where: str) -> TensorSpec:
    """A graph input or output as Triton sees it: first axis the batch, left out of dims."""
    tensor = value.type.tensor_type
    if tensor.elem_type not in TRITON_TYPES:
        raise BundleError(f"{where}: {value.name!r} has ONNX type "
                          f"{onnx.TensorProto.DataType.Name(tensor.elem_type)}, which Triton "
                          f"does not serve")
    dims = list(tensor.shape.dim)
    if not dims or dims[0].HasField("dim_value"):
        raise BundleError(f"{where}: {value.name!r} has no dynamic batch axis first, which "
                          f"Triton's batching needs")
    rest = tuple(d.dim_value if d.HasField("dim_value") else -1 for d in dims[1:])
    return TensorSpec(value.name, TRITON_TYPES[tensor.elem_type], rest)


def read_onnx_io(source: "Path | onnx.ModelProto", name: str = ""
                 ) -> tuple[Tensors, Tensors, tuple[str, ...]]:
    """Inputs, outputs and external data files of an ONNX model: a bundle's, parsed from the
    bytes its sha256 covers (`Bundle.onnx_model`), or a file's, read from `source`. The
    external data is every tensor's location, walked over the whole model (subgraphs,
    sparse initializers, functions: `bundle.external_tensors`)."""
    if isinstance(source, onnx.ModelProto):
        proto = source
    else:
        name = name or source.name
        try:
            proto = onnx.load(str(source), load_external_data=False)
        except Exception as exc:  # protobuf's DecodeError and friends
            raise BundleError(f"cannot read ONNX model {source}: {type(exc).__name__}") from None
    weights = {t.name for t in proto.graph.initializer}  # IR < 4 lists them as inputs too
    inputs = tuple(_batch_spec(v, name) for v in proto.graph.input if v.name not in weights)
    outputs = tuple(_batch_spec(v, name) for v in proto.graph.output)
    locations = dict.fromkeys(entry.value for t, _ in B.external_tensors(proto)
                              for entry in t.external_data if entry.key == "location")
    for location in locations:  # copied under its own name, so it must be a plain file name
        if Path(location).name != location or location in (".", "..", ONNX_MODEL_FILE):
            raise BundleError(f"{name} keeps weights in {location!r}, not a file beside it")
    return inputs, outputs, tuple(locations)


def model_name(description: B.Description) -> str:
    """The bundle's name made safe as a folder and Triton model name."""
    return re.sub(r"[^A-Za-z0-9_-]", "_", description.name) or "vit"


def plan_models(bundle: B.Bundle, name: str, torchscript: bool = False
                ) -> tuple[ModelSpec, ...]:
    """One model per ONNX model of the bundle (model.e2e.onnx too), then, with
    `torchscript`, the TorchScript model."""
    models = []
    for file, profile in bundle.onnx_models.items():
        inputs, outputs, data = read_onnx_io(bundle.onnx_model(file).proto, file)
        variant = file.removeprefix("model.").removesuffix(".onnx")  # model.fp16.onnx -> fp16
        suffix = "" if file == B.ONNX_FILE else f"_{re.sub(r'[^A-Za-z0-9_-]', '_', variant)}"
        models.append(ModelSpec(f"{name}_onnx{suffix}", "onnxruntime_onnx", "onnxruntime",
                                file, ONNX_MODEL_FILE, inputs, outputs, profile, data))
    if bundle.e2e_model:  # uint8 images of any size in: a client sends the raw pixels
        inputs, outputs, data = read_onnx_io(bundle.onnx_model(bundle.e2e_model).proto,
                                             bundle.e2e_model)
        models.append(ModelSpec(f"{name}_onnx_e2e", "onnxruntime_onnx", "onnxruntime",
                                bundle.e2e_model, ONNX_MODEL_FILE, inputs, outputs, "e2e", data))
    if torchscript and B.TS_FILE in bundle.hashes:
        main = next((m for m in models if m.source == B.ONNX_FILE), None)
        if main is None:
            raise BundleError(f"{bundle.path} has {B.TS_FILE} but no {B.ONNX_FILE} to read its "
                              f"tensors from")
        models.append(_torchscript_spec(name, main))
    return tuple(models)


def _torchscript_spec(name: str, onnx_model: ModelSpec) -> ModelSpec:
    """The TorchScript model serves the same tensors as model.onnx: both are exports of the one
    eager model (traced and exported from it, and checked against it at export time), and a
    TorchScript file records no dtypes or shapes to read instead.

    Names: Triton's PyTorch backend (libtorch platform) matches a config input to a forward()
    argument name, else to `<name>__<index>`, else falls back to the config's order; outputs
    only by `<name>__<index>` or order (server docs/user_guide/model_configuration.md, "Special
    Conventions for PyTorch Backend"; pytorch_backend src/pt/model_instance_state.cc,
    GetNamingConvention). A trace's forward argument is `x`, which says nothing to a client, so
    we use `<name>__<index>` with the bundle's names: `pixel_values__0` -> `logits__0`. The
    newer ARGS[0]/RESULT names belong to the torch_aoti (.pt2) platform only.
    """
    def renamed(tensors: Sequence[TensorSpec]) -> Tensors:
        return tuple(TensorSpec(f"{t.name}__{i}", t.data_type, t.dims)
                     for i, t in enumerate(tensors))

    return ModelSpec(f"{name}_torchscript", "pytorch_libtorch", "pytorch", B.TS_FILE,
                     TORCHSCRIPT_MODEL_FILE, renamed(onnx_model.inputs),
                     renamed(onnx_model.outputs), onnx_model.profile)


class _Enum(str):
    """A protobuf enum value: written bare in text format (KIND_GPU, TYPE_FP32)."""


def _scalar(value: Any) -> str:
    if isinstance(value, _Enum):
        return str(value)
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    return json.dumps(str(value))  # double quotes and backslash escapes, as text format reads


def _pbtxt(message: dict[str, Any], depth: int = 0) -> list[str]:
    """Protobuf text format of a message given as a dict; a list of dicts is a repeated
    message field, a list of scalars a repeated scalar field."""
    pad, lines = "  " * depth, []
    for key, value in message.items():
        if isinstance(value, dict):
            lines += [f"{pad}{key} {{", *_pbtxt(value, depth + 1), f"{pad}}}"]
        elif isinstance(value, list) and value and isinstance(value[0], dict):
            lines.append(f"{pad}{key} [")
            for i, item in enumerate(value):
                comma = "," if i < len(value) - 1 else ""
                lines += [f"{pad}  {{", *_pbtxt(item, depth + 2), f"{pad}  }}{comma}"]
            lines.append(f"{pad}]")
        elif isinstance(value, list):
            lines.append(f"{pad}{key}: [ {', '.join(_scalar(v) for v in value)} ]")
        else:
            lines.append(f"{pad}{key}: {_scalar(value)}")
    return lines


def _tensor(t: TensorSpec, label_file: Optional[str] = None) -> dict[str, Any]:
    entry: dict[str, Any] = {"name": t.name, "data_type": _Enum(t.data_type), "dims": list(t.dims)}
    if label_file:
        entry["label_filename"] = label_file
    return entry


def _gpu_accelerators(model: ModelSpec, options: TritonOptions) -> list[dict[str, Any]]:
    """ONNX Runtime's GPU execution providers in priority order (onnxruntime_backend README,
    "ONNX Runtime with TensorRT optimization" and "... with CUDA Execution Provider
    optimization"). The backend hands a `cuda` accelerator's parameters to the CUDA EP as they
    are (src/onnxruntime.cc, Triton 24.06 and newer). The CUDA EP runs fp32 GEMMs and
    convolutions in TF32 by default (onnxruntime cuda_execution_provider_info.h: use_tf32
    true); parity was proven with TF32 off, so that is what we ask for unless told otherwise."""
    accelerators = []
    if options.tensorrt:  # only in backends built with TensorRT, as NGC's containers are
        precision = "FP16" if model.profile == "fp16" else "FP32"
        accelerators.append({"name": "tensorrt", "parameters": [
            {"key": "precision_mode", "value": precision}]})
    accelerators.append({"name": "cuda", "parameters": [
        {"key": "use_tf32", "value": "1" if options.tf32 else "0"}]})
    return accelerators


def render_config(model: ModelSpec, options: TritonOptions,
                  num_labels: Optional[int] = None) -> str:
    """config.pbtxt of one model: every output with its dims (a client asks for the ones it
    wants by name). The logits, one axis of num_labels classes, get the labels."""
    def label_file(t: TensorSpec) -> Optional[str]:
        logits = t.name.split("__")[0] == "logits"  # TorchScript's: logits__0
        return LABELS_FILE if num_labels and logits and t.dims == (num_labels,) else None

    config: dict[str, Any] = {
        "name": model.name, "platform": model.platform, "backend": model.backend,
        "max_batch_size": options.max_batch_size,
        "input": [_tensor(t) for t in model.inputs],
        "output": [_tensor(t, label_file(t)) for t in model.outputs],
        # Triton fills an empty preferred_batch_size with [max_batch_size] itself
        # (core src/model_config_utils.cc); we write what it will use.
        "dynamic_batching": {
            "preferred_batch_size": list(options.preferred_batch_sizes
                                         or (options.max_batch_size,)),
            "max_queue_delay_microseconds": options.max_queue_delay_us},
        "instance_group": [{"count": options.instances, "kind": _Enum(options.kind)}],
    }
    if options.device == "cuda" and model.backend == "onnxruntime":
        config["optimization"] = {"execution_accelerators": {
            "gpu_execution_accelerator": _gpu_accelerators(model, options)}}
    header = f"# Written by vit-export from the bundle's {model.source}."
    return "\n".join([header, *_pbtxt(config)]) + "\n"


def _check_target(bundle_dir: Path, repo: Path) -> None:
    """REPO must be neither the bundle, inside it, nor around it, nor hold a file the bundle
    links to: replacing it would delete what the bundle holds, and a repository inside a
    bundle is a file the bundle does not list."""
    B.refuse_overwriting({"the repository": repo}, [bundle_dir])


def _copy_verified(bundle: B.Bundle, name: str, target: Path) -> None:
    """Copy one bundle file and check the copy itself against the bundle's sha256: what
    Triton will load is what is hashed, once, whenever the bundle's file was changed."""
    expected = bundle.hashes.get(name)
    if expected is None:
        raise BundleError(f"{bundle.file(B.CONFIG_FILE)} lists no sha256 for {name}")
    shutil.copyfile(bundle.file(name), target)
    if B.sha256_file(target) != expected:  # the copy is what Triton loads: hashed once
        raise BundleError(f"{bundle.file(name)} does not match its sha256 in {B.CONFIG_FILE} "
                          f"(truncated or modified)")
    bundle.checked.add(name)


def _labels_text(labels: Sequence[str]) -> str:
    """labels.txt: one class name per line, line i naming class i."""
    broken = [label for label in labels if "\n" in label or "\r" in label]
    if broken:
        raise BundleError(f"label {broken[0]!r} holds a line break; labels.txt has one per line")
    return "".join(f"{label}\n" for label in labels)


def write_repository(bundle_path: str | os.PathLike, repo: str | os.PathLike,
                     options: Optional[TritonOptions] = None, *,
                     force: bool = False) -> Repository:
    """Write a Triton model repository for the bundle at `bundle_path` to `repo`, atomically.

    An existing `repo` is replaced only with `force`; `repo` may not be, hold or lie inside
    the bundle.
    """
    bundle_path, repo = Path(bundle_path), Path(repo)
    _check_target(bundle_path, repo)
    if (repo.exists() or repo.is_symlink()) and not force:  # before hashing a large bundle
        raise BundleError(f"{repo} already exists; use {param('force')} to replace it")
    options = options or TritonOptions()
    bundle = B.read_bundle(bundle_path)  # each file hashed once: as copied, or at the end
    models = plan_models(bundle, options.name or model_name(bundle.description),
                         options.torchscript)
    left_out = (B.TS_FILE,) if B.TS_FILE in bundle.hashes and not options.torchscript else ()
    # class names name logits; an embedding's axes are no classes
    labels = bundle.description.labels if "logits" in bundle.config.output_names else None
    labels_text = _labels_text(labels) if labels else None
    with B.staged_folder(repo, force=force) as staging:
        for model in models:
            version = staging / model.name / VERSION
            version.mkdir(parents=True)
            _copy_verified(bundle, model.source, version / model.file)
            for data in model.external_data:
                _copy_verified(bundle, data, version / data)
            if labels_text:
                B.atomic_write_text(staging / model.name / LABELS_FILE, labels_text)
            B.atomic_write_text(staging / model.name / CONFIG_FILE,
                                render_config(model, options, len(labels) if labels else None))
        bundle.check_unread()  # a repository is made of a bundle whose every file is sound
    # dynamic batching puts different clients' requests in one batch
    notes = tuple(f"{m.name} serves {note}" for m in models
                  if options.max_batch_size > 1 and (note := batch_dependence(m.source)))
    return Repository(repo, models, options, bool(labels), left_out, notes)
