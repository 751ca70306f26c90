"""The Open Inference Protocol (KServe's v2 REST protocol, as Triton and KServe speak it) for
the one model a server holds: routes, metadata, and infer requests and answers as data.

    GET  /v2                          server metadata: name, version, extensions
    GET  /v2/health/live, /ready      {"live": true}, {"ready": true}
    GET  /v2/models/NAME              model metadata: inputs and outputs, -1 for any size
    GET  /v2/models/NAME/ready        {"name", "ready": true}
    POST /v2/models/NAME/infer        {"inputs": [ONE input], "outputs"?, "parameters"?}
    (each /v2/models/NAME route also as /v2/models/NAME/versions/1/...)

The model takes one input per request, either of two:
  the tensor the runner takes    pixel_values FP32 [-1, C, H, W] (preprocessed), or for
                                 model.e2e.onnx images UINT8 [-1, -1, -1, C]
  image BYTES [-1]               encoded image files, as POST /predict takes one; in JSON
                                 each element is base64 text
and gives its output, logits or embedding, FP32 [-1, K]. Tensor data comes as JSON `data`
(flat or nested, row-major) or, with Triton's binary tensor extension, after the JSON header
(`Inference-Header-Content-Length`; each input's `parameters.binary_data_size`); outputs go
back in binary where the request asks (`binary_data_output`, or an output's `binary_data`),
else as JSON `data`. What a request gets wrong is a ProtocolError: a status and one line.

What a request may cost is known before anything in it is decoded or run, and a request over
it is refused (`Model.max_batch`, `Model.check_images`):
  inputs                at most the server's max batch size per request (413), as Triton
                        refuses a request over a model's max_batch_size
  images                each encoded image's size read from its header, each uint8 image's
                        from its shape: each held to the resize budget an image file is held
                        to (400, the file's line); all of them together, each counted at the
                        larger of itself and its resize, to max batch size images at that
                        budget (413)
  pixel values          count x height x width within max batch size inputs at the model's
                        size (413: a dynamic-size model's)

Nothing here runs a model or speaks HTTP: serve's replicas do both, and call this.
"""
from __future__ import annotations

import base64
import binascii
import json
import math
import struct
from dataclasses import dataclass
from typing import Any, Optional

import numpy as np

from .. import __version__
from ..bundle import E2E_INPUT_NAME, INPUT_NAME
from ..errors import InputError
from ..images import image_size, resize_cost
from ..preprocessing import Preprocessing
from ..preprocessing.pipeline import resize_allowance
from . import DEFAULT_MAX_BATCH_SIZE

SERVER = "vit-export"
VERSION = "1"  # the one version of the one model a server holds
IMAGE_INPUT = "image"  # encoded image files, one per element
HEADER_LENGTH = "Inference-Header-Content-Length"  # Triton's binary tensor extension
EXTENSIONS = ("binary_tensor_data",)
DATATYPES = {"FP32": np.dtype("<f4"), "UINT8": np.dtype("u1")}  # tensor inputs we take


class ProtocolError(Exception):
    """A request answered with `status` and {"error": message}."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class Tensor:
    """One input or output as metadata names it."""
    name: str
    datatype: str  # FP32, UINT8 or BYTES
    shape: tuple[int, ...]  # -1 where any size goes (the batch, at least)

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "datatype": self.datatype, "shape": list(self.shape)}


@dataclass(frozen=True)
class Model:
    """The model a server holds, as the protocol describes it, and what one request to it
    may cost."""
    name: str
    platform: str  # the runner that answers, as infer and /healthz name it
    inputs: tuple[Tensor, ...]  # a request sends one of them
    outputs: tuple[Tensor, ...]
    prep: Preprocessing  # how an image becomes its input: the resize budget each is held to
    max_batch: int = DEFAULT_MAX_BATCH_SIZE  # the most inputs one request may hold

    @classmethod
    def of(cls, name: str, runner_name: str, config, images: bool, output: str,
           prep: Preprocessing, max_batch: int = DEFAULT_MAX_BATCH_SIZE) -> "Model":
        """From the model's config (model.ViTConfig), whether its runner takes uint8 images
        (model.e2e.onnx), the output it answers with, its preprocessing and the server's max
        batch size."""
        if images:  # model.e2e.onnx: uint8 images of any size
            tensor = Tensor(E2E_INPUT_NAME, "UINT8", (-1, -1, -1, config.in_chans))
        else:
            side = -1 if config.dynamic_img_size else config.img_size
            tensor = Tensor(INPUT_NAME, "FP32", (-1, config.in_chans, side, side))
        (width,) = config.output_shape(output)
        return cls(name, runner_name, (tensor, Tensor(IMAGE_INPUT, "BYTES", (-1,))),
                   (Tensor(output, "FP32", (-1, width)),), prep, max_batch)

    def check_batch(self, name: str, shape: list[int]) -> None:
        """ProtocolError 413 where an input holds more than `max_batch` inputs."""
        if shape[0] > self.max_batch:
            raise ProtocolError(413, f"input {name} of shape {shape} holds {shape[0]} inputs, "
                                     f"over the {self.max_batch} one request may hold (the "
                                     f"server's max batch size): send at most "
                                     f"{self.max_batch} per request")

    def check_images(self, names: list[str], sizes: list[tuple[int, int]]) -> None:
        """Images of `sizes` (width, height), before any is decoded: ProtocolError 400 for
        one whose resize is over the budget an image file is held to, with the file's line;
        413 where all of them, each counted at the larger of itself and its resize, are
        more than `max_batch` images at that budget (a request of one image is within it
        wherever Pillow opens the image and `max_batch` is 11 or more)."""
        total = 0
        for name, size in zip(names, sizes):
            try:
                total += resize_cost(size, self.prep)
            except InputError as exc:
                raise ProtocolError(400, f"{name}: {exc}") from None
        most = self.max_batch * resize_allowance(self.prep)
        if total > most:
            raise ProtocolError(413, f"{len(sizes)} image(s) would take {total / 1e6:.0f} M "
                                     f"pixels to decode and resize, over the {most / 1e6:.0f} "
                                     f"M one request may take ({self.max_batch} images of "
                                     f"{resize_allowance(self.prep) / 1e6:.0f} M): send fewer "
                                     f"or smaller images per request")

    def check_pixel_values(self, name: str, shape: list[int]) -> None:
        """ProtocolError 413 where pixel values [N, C, H, W] hold more pixels than
        `max_batch` inputs at the model's size (a dynamic-size model runs at any size)."""
        side = self.prep.img_size
        if shape[0] * shape[2] * shape[3] > self.max_batch * side * side:
            raise ProtocolError(413, f"input {name} of shape {shape} holds "
                                     f"{shape[0] * shape[2] * shape[3]} pixels, over the "
                                     f"{self.max_batch * side * side} one request may hold "
                                     f"({self.max_batch} inputs of {side}x{side}): send fewer "
                                     f"or smaller inputs per request")

    def metadata(self) -> dict[str, Any]:
        return {"name": self.name, "versions": [VERSION], "platform": self.platform,
                "inputs": [t.to_dict() for t in self.inputs],
                "outputs": [t.to_dict() for t in self.outputs]}


def server_metadata() -> dict[str, Any]:
    return {"name": SERVER, "version": __version__, "extensions": list(EXTENSIONS)}


def route(model: Model, method: str, path: str) -> str:
    """What a /v2 request asks: server, live, ready, model, model_ready or infer.
    ProtocolError 404 for a route, model or version not here, 405 for a wrong method."""
    parts = path.rstrip("/").split("/")[2:]  # after "", "v2"
    what = {(): "server", ("health", "live"): "live", ("health", "ready"): "ready"}.get(
        tuple(parts))
    if what is None and parts[:1] == ["models"] and len(parts) >= 2:
        name, rest = parts[1], parts[2:]
        if name != model.name:
            raise ProtocolError(404, f"no model {name!r}: this server holds {model.name!r}")
        if rest[:1] == ["versions"]:
            if len(rest) < 2 or rest[1] != VERSION:
                raise ProtocolError(404, f"no version {'/'.join(rest[1:2]) or '(none)'} of "
                                         f"{model.name!r}: it has version {VERSION}")
            rest = rest[2:]
        what = {(): "model", ("ready",): "model_ready", ("infer",): "infer"}.get(tuple(rest))
    if what is None:
        raise ProtocolError(404, f"no route {path} in the Open Inference Protocol: GET /v2, "
                                 f"/v2/health/ready, /v2/models/{model.name}; POST "
                                 f"/v2/models/{model.name}/infer")
    wanted = "POST" if what == "infer" else "GET"
    if method != wanted:
        raise ProtocolError(405, f"use {wanted} {path}")
    return what


def answer(model: Model, what: str) -> dict[str, Any]:
    """The JSON answer of a GET route (`route`'s what, any but infer)."""
    return {"server": server_metadata, "live": lambda: {"live": True},
            "ready": lambda: {"ready": True}, "model": model.metadata,
            "model_ready": lambda: {"name": model.name, "ready": True}}[what]()


@dataclass(frozen=True)
class Request:
    """An infer request, checked against the model: its one input's values, and how each
    output it asks for goes back."""
    id: Optional[str]
    input: Tensor  # the model's input it sent, with the request's shape
    values: Any  # numpy array of that shape (a tensor), or a list of bytes (BYTES)
    outputs: tuple[tuple[str, bool], ...]  # (name, in binary)
    sizes: tuple[tuple[int, int], ...] = ()  # BYTES: each image's (width, height), its header's


def parse_infer(model: Model, body: bytes, header_length: Optional[str] = None) -> Request:
    """An infer request's body (JSON, or with `header_length` a JSON header and binary
    tensor data after it) checked against `model`, and what it would cost against what one
    request may (`Model.check_batch`, `check_images`, `check_pixel_values`), before any of
    its data is converted or decoded. ProtocolError 400 for anything wrong, 413 for a
    request over what it may cost."""
    binary = memoryview(b"")  # the binary data, not copied: a request refused never is
    if header_length is not None:
        length = length_within(header_length, len(body))
        if length is None:
            shown = header_length if len(header_length) <= 40 else \
                f"{header_length[:20]}...({len(header_length)} characters)"
            raise ProtocolError(400, f"{HEADER_LENGTH} {shown!r} is not a length within the "
                                     f"body's {len(body)} bytes")
        view = memoryview(body)
        body, binary = bytes(view[:length]), view[length:]
    try:
        document = json.loads(body)
    except (UnicodeDecodeError, ValueError) as exc:
        raise ProtocolError(400, f"infer request is not JSON: {exc}") from None
    except RecursionError:
        raise ProtocolError(400, "infer request is not JSON we read: nested too deep") from None
    if not isinstance(document, dict):
        raise ProtocolError(400, "infer request is not a JSON object")
    inputs = document.get("inputs")
    accepted = " or ".join(f"{t.name} ({t.datatype} {list(t.shape)})" for t in model.inputs)
    if not isinstance(inputs, list) or len(inputs) != 1 or not isinstance(inputs[0], dict):
        raise ProtocolError(400, f"send one input: {accepted}")
    tensor, values, sizes, used = _input(model, inputs[0], binary, accepted)
    if used != len(binary):
        raise ProtocolError(400, f"{len(binary) - used} bytes of binary data after the input's")
    request_id = document.get("id")
    if request_id is not None and not isinstance(request_id, str):
        raise ProtocolError(400, "id must be a string")
    return Request(request_id, tensor, values, _outputs(model, document), sizes)


def length_within(text: str, most: int) -> Optional[int]:
    """A length of ASCII digits no larger than `most`, else None (int() of thousands of
    digits is refused by Python, and never needed)."""
    digits = text.lstrip("0") or "0"
    if not (text.isascii() and text.isdigit()) or len(digits) > len(str(most)) or \
            int(digits) > most:
        return None
    return int(digits)


def _input(model: Model, entry: dict, binary: memoryview, accepted: str
           ) -> tuple[Tensor, Any, tuple[tuple[int, int], ...], int]:
    """(the input with the request's shape, its values, each image's size (BYTES), binary
    bytes used)."""
    name, datatype, shape = entry.get("name"), entry.get("datatype"), entry.get("shape")
    known = {t.name: t for t in model.inputs}
    if name not in known:
        raise ProtocolError(400, f"no input {name!r}: send {accepted}")
    want = known[name]
    if datatype != want.datatype:
        raise ProtocolError(400, f"input {name} is {want.datatype}, not {datatype!r}")
    if not isinstance(shape, list) or not all(isinstance(d, int) and not isinstance(d, bool)
                                              and d >= 0 for d in shape):
        raise ProtocolError(400, f"input {name}'s shape must be a list of sizes, not {shape!r}")
    if len(shape) != len(want.shape) or any(w not in (-1, d) for w, d in zip(want.shape, shape)):
        raise ProtocolError(400, f"input {name} of shape {shape}: expected {list(want.shape)} "
                                 f"(-1: any size)")
    if shape[0] == 0:
        raise ProtocolError(400, f"input {name} of shape {shape}: an empty batch")
    if 0 in shape:
        raise ProtocolError(400, f"input {name} of shape {shape}: images of no pixels")
    model.check_batch(name, shape)  # what it costs, before its data is read
    if datatype == "UINT8":  # images, each of the same size
        model.check_images([f"{name}[{i}]" for i in range(shape[0])],
                           [(shape[2], shape[1])] * shape[0])
    elif datatype == "FP32":
        model.check_pixel_values(name, shape)
    count = math.prod(shape)
    parameters = entry.get("parameters") or {}
    size = parameters.get("binary_data_size") if isinstance(parameters, dict) else None
    if size is not None:
        if not isinstance(size, int) or isinstance(size, bool) or not 0 <= size <= len(binary):
            raise ProtocolError(400, f"input {name}'s binary_data_size {size!r} is not within "
                                     f"the {len(binary)} bytes after the JSON header")
        data, used = binary[:size], size
    elif "data" in entry:
        data, used = entry["data"], 0
    else:
        raise ProtocolError(400, f"input {name} has neither data nor binary_data_size")
    tensor = Tensor(name, datatype, tuple(shape))
    if datatype == "BYTES":
        items = _bytes(name, data, count)
        return tensor, items, _sizes(model, name, items), used
    return tensor, _numbers(name, data, DATATYPES[datatype], shape), (), used


def _sizes(model: Model, name: str, items: list[bytes]) -> tuple[tuple[int, int], ...]:
    """Each encoded image's (width, height), read from its header, all of them held to what
    a request may cost (`Model.check_images`) before any is decoded."""
    names = [f"{name}[{i}]" for i in range(len(items))]
    try:
        sizes = tuple(image_size(item, n) for n, item in zip(names, items))
    except InputError as exc:
        raise ProtocolError(400, str(exc)) from None
    model.check_images(names, list(sizes))
    return sizes


def _numbers(name: str, data: Any, dtype: np.dtype, shape: list[int]) -> np.ndarray:
    """A tensor's values from binary data or a JSON list of numbers, in `shape`."""
    count = math.prod(shape)
    if isinstance(data, memoryview):
        if len(data) != count * dtype.itemsize:
            raise ProtocolError(400, f"input {name} of shape {shape} needs "
                                     f"{count * dtype.itemsize} bytes of {dtype.name}, got "
                                     f"{len(data)}")
        return np.frombuffer(data, dtype).reshape(shape).astype(dtype.newbyteorder("="))
    flat = _flatten(data)
    if flat is None:
        raise ProtocolError(400, f"input {name}'s data must be a list of numbers")
    if len(flat) != count:
        raise ProtocolError(400, f"input {name} of shape {shape} needs {count} values, got "
                                 f"{len(flat)}")
    try:
        values = np.asarray(flat, np.float64)
    except OverflowError:  # a whole number beyond any float
        raise ProtocolError(400, f"input {name}'s data holds a number beyond float64") from None
    if dtype.kind == "u" and not (np.all(values == np.round(values)) and values.min() >= 0
                                  and values.max() <= np.iinfo(dtype).max):
        raise ProtocolError(400, f"input {name}'s data must be whole numbers 0-"
                                 f"{np.iinfo(dtype).max}")
    with np.errstate(over="ignore"):  # beyond fp32: infinite, refused as the model's input
        return values.astype(dtype.newbyteorder("=")).reshape(shape)


def _flatten(data: Any) -> Optional[list]:
    """A nested JSON list of numbers flattened in row-major order; None if it is not one."""
    out: list = []
    stack = [iter([data])]
    while stack:
        for item in stack[-1]:
            if isinstance(item, list):
                stack.append(iter(item))
                break
            if isinstance(item, bool) or not isinstance(item, (int, float)):
                return None
            out.append(item)
        else:
            stack.pop()
    return out


def _bytes(name: str, data: Any, count: int) -> list[bytes]:
    """BYTES elements: length-prefixed in binary data, base64 text in JSON; no more of them
    are read than the shape says."""
    held = f"input {name} of shape [{count}] holds"
    if isinstance(data, memoryview):
        items, at = [], 0
        while at < len(data):
            if len(items) == count:
                raise ProtocolError(400, f"{held} more than {count} elements")
            if at + 4 > len(data):
                raise ProtocolError(400, f"input {name}'s binary data ends inside an element's "
                                         f"length")
            (length,) = struct.unpack_from("<I", data, at)
            if at + 4 + length > len(data):
                raise ProtocolError(400, f"input {name}'s element {len(items)} is cut short")
            items.append(bytes(data[at + 4:at + 4 + length]))
            at += 4 + length
    else:
        if not isinstance(data, list) or not all(isinstance(d, str) for d in data):
            raise ProtocolError(400, f"input {name}'s data must be a list of base64 strings")
        if len(data) != count:
            raise ProtocolError(400, f"{held} {len(data)} elements")
        try:
            items = [base64.b64decode(d, validate=True) for d in data]
        except (binascii.Error, ValueError) as exc:
            raise ProtocolError(400, f"input {name}'s data is not base64: {exc}") from None
    if len(items) != count:
        raise ProtocolError(400, f"{held} {len(items)} elements")
    return items


def _outputs(model: Model, document: dict) -> tuple[tuple[str, bool], ...]:
    """(name, binary) of each output asked for: all of them where none is named."""
    parameters = document.get("parameters") or {}
    if not isinstance(parameters, dict):
        raise ProtocolError(400, "parameters must be an object")
    binary = parameters.get("binary_data_output", False) is True
    asked = document.get("outputs")
    if asked is None:
        return tuple((t.name, binary) for t in model.outputs)
    names = [t.name for t in model.outputs]
    found = []
    for entry in asked if isinstance(asked, list) else [None]:
        if not isinstance(entry, dict) or entry.get("name") not in names:
            name = entry.get("name") if isinstance(entry, dict) else entry
            raise ProtocolError(400, f"no output {name!r}: this model gives "
                                     f"{', '.join(names)}")
        options = entry.get("parameters") or {}
        if not isinstance(options, dict):
            raise ProtocolError(400, f"output {entry['name']}'s parameters must be an object")
        if options.get("class_count", 0):
            raise ProtocolError(400, "class_count (classification) is not served here: ask "
                                     "for the output, or POST /predict?top_k=K")
        found.append((entry["name"], options.get("binary_data", binary) is True))
    return tuple(found)


def infer_answer(model: Model, request: Request, values: dict[str, np.ndarray]
                 ) -> tuple[bytes, dict[str, str]]:
    """The answer's body and headers: the outputs asked for, JSON data or binary after the
    JSON header (whose length `HEADER_LENGTH` says)."""
    outputs, chunks = [], []
    for name, binary in request.outputs:
        array = np.ascontiguousarray(values[name], dtype="<f4")
        entry: dict[str, Any] = {"name": name, "datatype": "FP32", "shape": list(array.shape)}
        if binary:
            entry["parameters"] = {"binary_data_size": array.nbytes}
            chunks.append(array.tobytes())
        else:
            entry["data"] = array.ravel().tolist()
        outputs.append(entry)
    document: dict[str, Any] = {"model_name": model.name, "model_version": VERSION}
    if request.id is not None:
        document["id"] = request.id
    document["outputs"] = outputs
    header = json.dumps(document).encode()
    if not chunks:
        return header, {"content-type": "application/json"}
    return header + b"".join(chunks), {"content-type": "application/octet-stream",
                                       HEADER_LENGTH: str(len(header))}
