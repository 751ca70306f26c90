"""weights.safetensors: written tensor by tensor through atomic writes, and read back into
the eager model (load_eager) with every weight checked to be a dense, finite float. torch
is imported where a weight is written or read, so naming a bundle's files loads none."""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

from .. import verified
from ..errors import BundleError, first_line
from .names import WEIGHTS_FILE
from .writes import atomic_write_chunks

if TYPE_CHECKING:
    from ..model import VisionTransformer

# torch dtype name -> safetensors' name for it
SAFETENSORS_NAMES = {"float32": "F32", "float16": "F16", "bfloat16": "BF16", "float64": "F64",
                     "int64": "I64", "int32": "I32", "uint8": "U8", "bool": "BOOL"}


def safetensors_dtype(dtype) -> str:
    """safetensors' name for a torch dtype."""
    return SAFETENSORS_NAMES[str(dtype).removeprefix("torch.")]


def _layout(model: "VisionTransformer") -> tuple[dict, list[str], bytes, dict]:
    """The state dict, its names in safetensors' order (larger elements first, then by
    name), the header as written (padded to 8 bytes) and the header's entries."""
    state = {k: v.detach().contiguous().cpu() for k, v in model.state_dict().items()}
    names = sorted(state, key=lambda k: (-state[k].element_size(), k))
    header, offset = {}, 0
    for name in names:
        tensor = state[name]
        size = tensor.numel() * tensor.element_size()
        header[name] = {"dtype": safetensors_dtype(tensor.dtype),
                        "shape": list(tensor.shape), "data_offsets": [offset, offset + size]}
        offset += size
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    return state, names, text, header


def _tensor_bytes(tensor) -> memoryview:
    import torch

    return memoryview(tensor.reshape(-1).view(torch.uint8).numpy())


def write_weights(model: "VisionTransformer", path: Path) -> None:
    """weights.safetensors, streamed tensor by tensor through Python's file I/O (a full disk
    is an OSError; the old file stays): safetensors' own `save` returns the file as bytes and
    copies them once more on the way (two copies of the weights beside the model, 8.5 GB for
    a ViT-g, measured), and `save_file` writes from Rust, where a full disk is its own error.
    The same bytes as `safetensors.torch.save` (a test compares them)."""
    state, names, text, _ = _layout(model)
    chunks = [len(text).to_bytes(8, "little"), text] + [_tensor_bytes(state[n]) for n in names]
    atomic_write_chunks(path, chunks)


def weight_spans(model: "VisionTransformer", smallest: int = 1024
                 ) -> dict[bytes, tuple[int, memoryview]]:
    """Where each weight of at least `smallest` bytes lies in the weights.safetensors that
    `write_weights` writes for `model`: the sha256 of its bytes -> (its offset in the file,
    its bytes), computed from the model, not read back."""
    import hashlib

    state, names, text, header = _layout(model)
    base = 8 + len(text)
    spans = {}
    for name in names:
        data = _tensor_bytes(state[name])
        if data.nbytes >= smallest:
            spans.setdefault(hashlib.sha256(data).digest(),
                             (base + header[name]["data_offsets"][0], data))
    return spans


# What a weight may be stored as: the model takes these as they are (float64 rounds to
# float32, as a trained model's fp64 copy would). Anything else is refused, not taken as
# numbers: an int8 head holds quantized values, complex weights would lose their imaginary
# part, bool is a mask, float8 needs a scale the state dict does not carry. Integer
# buffers that are no weight (position ids, BatchNorm's counter, a window attention's
# relative position index, an attention bias's indices: the framework road checks each
# against what its module computes) pass.
WEIGHT_DTYPES = ("float32", "float16", "bfloat16", "float64")
INTEGER_BUFFERS = ("position_ids", "num_batches_tracked", "relative_position_index",
                   "attention_bias_idxs")


def weight_problem(key: str, value) -> Optional[str]:
    """Why a state dict entry (a torch tensor) cannot be taken as a weight, or None."""
    import torch

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


def load_eager(bundle) -> "VisionTransformer":
    """Rebuild the eager PyTorch model of a Bundle from weights.safetensors + config.json:
    our model, or on the framework road the framework's own module (`module`). The weights
    are hashed and read through one open file (`verified.open_checked`): one renamed over
    weights.safetensors after config.json's check is not read."""
    import torch

    from ..model import VisionTransformer

    state = _bundle_state(bundle)
    framework = bundle.description.module is not None
    problems = [p for p in (weight_problem(k, v) for k, v in state.items()
                            if not (framework and not v.is_floating_point())) if p]
    if problems:
        raise BundleError(f"{bundle.file(WEIGHTS_FILE)}: {problems[0]}")
    if framework:  # integer buffers: checked against what the framework computes
        from ..frameworks import load_framework_eager

        return load_framework_eager(bundle.description, state)
    with torch.device("meta"):  # no weights of its own: the file's are assigned below
        model = VisionTransformer(bundle.config)
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


def _bundle_state(bundle) -> dict[str, Any]:
    """weights.safetensors' tensors, read through the one open file its hash was of; or,
    where model.onnx reads its weights from this file too (export's `weights_in`), from the
    bytes the bundle read once for both (`Bundle.read_file`)."""
    if bundle.description.export.get("weights_in") == WEIGHTS_FILE:
        loaded = bundle.read_file(WEIGHTS_FILE)
        return _state_from_bytes(loaded.path, loaded.data)
    opened = bundle.opened.pop(WEIGHTS_FILE, None)  # a bundle being made: hashed when opened
    if opened is not None:
        with opened:
            state = _read_weights(bundle.file(WEIGHTS_FILE),
                                  verified.fd_path(opened, bundle.file(WEIGHTS_FILE)))
    else:
        with verified.open_checked(bundle.file(WEIGHTS_FILE),
                                   bundle.hashes.get(WEIGHTS_FILE)) as path:
            state = _read_weights(bundle.file(WEIGHTS_FILE), path)
    bundle.checked.add(WEIGHTS_FILE)
    return state


TORCH_DTYPES = {name: torch_name for torch_name, name in SAFETENSORS_NAMES.items()}


def _state_from_bytes(named: Path, data: bytes) -> dict[str, Any]:
    """Every tensor of a safetensors file's bytes, each copied into torch's own memory
    (as `_read_weights` does); `named` in messages."""
    import warnings

    import torch

    try:
        size = int.from_bytes(data[:8], "little")
        if size > min(MAX_HEADER_BYTES, len(data) - 8):
            raise ValueError(f"a header of {size} bytes")
        header, base = json.loads(data[8:8 + size]), 8 + size
        state = {}
        with warnings.catch_warnings():  # read-only bytes: copied before anything writes
            warnings.simplefilter("ignore", UserWarning)
            for key, entry in header.items():
                if key == "__metadata__":
                    continue
                dtype = getattr(torch, TORCH_DTYPES[entry["dtype"]])
                start, end = entry["data_offsets"]
                count = (end - start) // dtype.itemsize
                if not 0 <= start <= end <= len(data) - base or \
                        count != math.prod(entry["shape"]):
                    raise ValueError(f"{key}: {entry['shape']} at {start}..{end}")
                flat = torch.frombuffer(data, dtype=dtype, count=count, offset=base + start) \
                    if count else torch.empty(0, dtype=dtype)
                state[key] = _own_copy(flat.reshape(entry["shape"]))
    except (ValueError, KeyError, TypeError, AttributeError, RuntimeError) as exc:
        raise BundleError(f"cannot read {named}: {first_line(exc)}") from None
    return state


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


MAX_HEADER_BYTES = 100 << 20  # safetensors' own limit on its JSON header


def parameter_count(path: str | Path) -> int:
    """How many numbers weights.safetensors holds, from its JSON header alone (8 bytes of
    length, then the header; no tensor is read and no torch is loaded): the model's parameter
    count, since the model keeps no buffers. For `info`, which describes and runs nothing."""
    path = Path(path)
    with open(path, "rb") as f:
        size = int.from_bytes(f.read(8), "little")
        if size > MAX_HEADER_BYTES:
            raise BundleError(f"{path}: its safetensors header claims {size} bytes; not a "
                              f"safetensors file")
        try:
            header = json.loads(f.read(size))
            return sum(_numel(v["shape"]) for k, v in header.items() if k != "__metadata__")
        except (ValueError, TypeError, KeyError, AttributeError):
            raise BundleError(f"{path}: not a safetensors header") from None


def _numel(shape: Any) -> int:
    if not isinstance(shape, list) or not all(isinstance(d, int) and d >= 0 for d in shape):
        raise ValueError("not a shape")
    count = 1
    for d in shape:
        count *= d
    return count
