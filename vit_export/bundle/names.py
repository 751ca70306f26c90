"""The names every file of a bundle uses: the format, the file names, the input's and the
symbolic axes' names, the largest export batch. Nothing here imports the rest of the package
beyond a constant of archives, so any module (the preprocessing graph among them) may take
these names without importing what reads or writes a bundle."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..archives import METADATA_KEY

if TYPE_CHECKING:
    from ..config import ViTConfig

__all__ = ["METADATA_KEY"]  # the description's key in every file, re-exported with the names

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


MODEL_FILES = (ONNX_FILE, TS_FILE, WEIGHTS_FILE)


def plain_name(name: str) -> bool:
    """A file of the folder itself: no path parts, not hidden, not empty."""
    return bool(name) and name not in (".", "..") and "/" not in name and "\\" not in name \
        and not name.startswith(".") and "\0" not in name
