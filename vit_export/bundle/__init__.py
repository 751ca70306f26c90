"""The on-disk bundle: one folder that describes itself and deploys as it is.

    model.onnx            ONNX, input `pixel_values` [batch, C, H, W], output `logits` [batch, K];
                          H and W are symbolic (`height`, `width`) in a dynamic-size bundle
    model.e2e.onnx        optional: uint8 images [batch, height, width, C] in, preprocessing
                          in the graph, `logits` out (export --embed-preprocessing)
    model.onnx.data       external weights, only when asked, or when the model is too big for
                          one protobuf (by default model.onnx reads its weights from
                          weights.safetensors, at each tensor's byte offset)
    model.ts              TorchScript (torch.jit.trace)
    weights.safetensors   the eager source of truth, with config.json
    config.json           the description (model config, preprocessing, labels, versions) + sha256s
    parity.json           the validation report made at export time
    performance.json      `bench --record`: measured speeds and the fastest validated model

The description also travels inside model.onnx (metadata_props) and model.ts (extra files),
so one file alone is still self-describing. Every write goes through a temporary name in the
same folder and a rename: a failed write leaves nothing half-written behind.

One module per job, bottom-up: names (the format, file and axis names), writes (atomic
writes, staged folders), description (config.json), onnxfiles (ONNX graphs and external
data as loaded), weights (weights.safetensors), folder (Bundle, read_bundle, read_model).
Every public name is importable from the package, as it was from the one module.
"""
from ..archives import METADATA_KEY
from ..config import ViTConfig
from ..jsonio import parse_json
from ..preprocessing.recipe import MAX_IMAGE_SIDE, Preprocessing
from ..verified import Loaded
from .description import (
    DESCRIPTION_KINDS,
    EXPORT_KINDS,
    FILE_HASHES,
    Description,
    package_versions,
    write_config,
)
from .folder import (
    LOADED_ONCE,
    Bundle,
    ModelFile,
    checked_files,
    read_bundle,
    read_description,
    read_model,
    staged_bundle,
)
from .names import (
    AOTI_FILE,
    AOTI_PRECISIONS,
    BATCH_DIM,
    CONFIG_FILE,
    E2E_FILE,
    E2E_INPUT_NAME,
    FORMAT,
    FORMAT_VERSION,
    HEIGHT_DIM,
    INPUT_NAME,
    MAX_EXPORT_BATCH,
    MODEL_FILES,
    ONNX_DATA_FILE,
    ONNX_FILE,
    PARITY_FILE,
    PERFORMANCE_FILE,
    PT2_FILE,
    TS_FILE,
    WEIGHTS_FILE,
    WIDTH_DIM,
    io_names,
    plain_name,
)
from .onnxfiles import (
    OnnxModel,
    external_data,
    external_tensors,
    onnx_model,
    parse_onnx,
    read_onnx,
    read_onnx_file,
    share_weights,
)
from .weights import (
    INTEGER_BUFFERS,
    SAFETENSORS_NAMES,
    WEIGHT_DTYPES,
    load_eager,
    parameter_count,
    safetensors_dtype,
    weight_problem,
    weight_spans,
    write_weights,
)
from .writes import (
    atomic_write_bytes,
    atomic_write_chunks,
    atomic_write_json,
    atomic_write_text,
    output_target,
    refuse_overwriting,
    sha256_file,
    staged_folder,
)

__all__ = [
    "AOTI_FILE",
    "AOTI_PRECISIONS",
    "BATCH_DIM",
    "CONFIG_FILE",
    "DESCRIPTION_KINDS",
    "E2E_FILE",
    "E2E_INPUT_NAME",
    "EXPORT_KINDS",
    "FILE_HASHES",
    "FORMAT",
    "FORMAT_VERSION",
    "HEIGHT_DIM",
    "INPUT_NAME",
    "INTEGER_BUFFERS",
    "LOADED_ONCE",
    "MAX_EXPORT_BATCH",
    "MAX_IMAGE_SIDE",
    "METADATA_KEY",
    "MODEL_FILES",
    "ONNX_DATA_FILE",
    "ONNX_FILE",
    "PARITY_FILE",
    "PERFORMANCE_FILE",
    "PT2_FILE",
    "SAFETENSORS_NAMES",
    "TS_FILE",
    "WEIGHTS_FILE",
    "WEIGHT_DTYPES",
    "WIDTH_DIM",
    "Bundle",
    "Description",
    "Loaded",
    "ModelFile",
    "OnnxModel",
    "Preprocessing",
    "ViTConfig",
    "atomic_write_bytes",
    "atomic_write_chunks",
    "atomic_write_json",
    "atomic_write_text",
    "checked_files",
    "external_data",
    "external_tensors",
    "io_names",
    "load_eager",
    "onnx_model",
    "output_target",
    "package_versions",
    "parameter_count",
    "parse_json",
    "parse_onnx",
    "plain_name",
    "read_bundle",
    "read_description",
    "read_model",
    "read_onnx",
    "read_onnx_file",
    "refuse_overwriting",
    "safetensors_dtype",
    "sha256_file",
    "share_weights",
    "staged_bundle",
    "staged_folder",
    "weight_problem",
    "weight_spans",
    "write_config",
    "write_weights",
]


def __getattr__(name: str):
    """The names that need torch, loaded when first asked for, so importing the package
    loads none: the model class, and the torch dtype -> safetensors name table."""
    if name == "VisionTransformer":
        from ..model import VisionTransformer

        return VisionTransformer
    if name == "SAFETENSORS_DTYPES":
        import torch

        return {getattr(torch, dtype): code for dtype, code in SAFETENSORS_NAMES.items()}
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
