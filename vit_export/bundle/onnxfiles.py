"""ONNX files as they are loaded: the graph parsed from bytes read once, the external data
it names found by walking the parsed graph, and each external tensor read once and checked
(OnnxModel), so a session is built from bytes, never by opening a path again."""
from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from .. import verified
from ..errors import BundleError, first_line
from ..verified import Loaded
from .names import plain_name


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
    parsed: Any = field(default=None, compare=False, repr=False)  # the ModelProto, once parsed

    @property
    def path(self) -> Path:
        return self.loaded.path

    @property
    def proto(self):
        """The graph's ModelProto without its external data, parsed from `loaded` once: the
        static checks, the stage scans and OpenVINO read this one, never the file again.
        Read it, never change it: every use shares it."""
        if self.parsed is None:
            object.__setattr__(self, "parsed", parse_onnx(self.loaded))
        return self.parsed


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
        return OnnxModel(loaded, parsed=proto)
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
    return OnnxModel(loaded, arrays, proto)


def read_onnx_file(path: str | os.PathLike, expected: Optional[str] = None) -> OnnxModel:
    """An ONNX file the user named, read once (`onnx_model`): its external data may only be
    files beside it, named plainly. With `expected`, its bytes must hash to it (the copy a
    Ray driver checked: `verified.held_to`)."""
    loaded = verified.held_to(verified.read_once(path), expected)

    def beside(location: str) -> Loaded:
        if not plain_name(location):
            raise BundleError(f"{loaded.path} names external data {location!r}, which is not "
                              f"a file beside it")
        return verified.read_once(loaded.path.parent / location)

    return onnx_model(loaded, beside)


def read_onnx(path: str | os.PathLike):
    """An ONNX model's protobuf without its external weights, or one line on why not."""
    import onnx

    try:
        return onnx.load(str(path), load_external_data=False)
    except Exception as exc:  # protobuf's DecodeError and friends
        raise BundleError(f"cannot read ONNX model {path}: {type(exc).__name__}: "
                          f"{first_line(exc, 'truncated?')}") from None


def _point_at(tensor, location: str, offset: int, length: int) -> None:
    import onnx

    tensor.ClearField("raw_data")
    del tensor.external_data[:]
    for key, value in (("location", location), ("offset", str(offset)),
                       ("length", str(length))):
        tensor.external_data.add(key=key, value=value)
    tensor.data_location = onnx.TensorProto.EXTERNAL


def _found(spans: dict, data: bytes):
    """The offset of `data` in the weights file, if `spans` (`weight_spans`) holds it."""
    import hashlib

    spot = spans.get(hashlib.sha256(data).digest())
    return spot[0] if spot is not None and spot[1] == data else None


def share_weights(proto, location: str, spans: dict,
                  data_dir: Optional[Path | Mapping[str, Any]] = None) -> int:
    """Point each initializer of `proto` whose numbers the weights file `location` beside it
    already holds at that file (ONNX external data at the tensor's byte offset, `spans` from
    `weight_spans`) instead of keeping them a second time. An initializer the exporter
    stored transposed (a Linear's weight, folded for MatMul) becomes the weight as the file
    holds it and a Transpose node, which runtimes fold when the session is made.

    The initializers are held whole in `proto`, or (with `data_dir`) as external data:
    in the files the exporter wrote in that folder, or, where `data_dir` is a mapping, in
    the exporter's own tensors by the location each names (`tobytes()`, one at a time).
    Those the weights file does not hold are taken into the graph, so the model written
    needs no file but `location`. Returns the bytes no longer kept in the graph."""
    import numpy as np

    smallest = min((len(data) for _, data in spans.values()), default=0)
    inputs = {i.name for i in proto.graph.input}
    taken = {t.name for t in proto.graph.initializer} | {
        o for node in proto.graph.node for o in node.output} | inputs
    moved, transposes = 0, []
    with _ExternalBytes(data_dir) as stored:
        for tensor in proto.graph.initializer:
            raw = stored.bytes_of(tensor)
            if raw is None:
                continue
            held = bool(spans) and len(raw) >= smallest  # a size the weights file may hold
            offset = _found(spans, raw) if held else None
            if offset is None and held and len(tensor.dims) == 2 and tensor.name not in inputs:
                offset = _found(spans, np.ascontiguousarray(np.frombuffer(
                    raw, _numpy_dtype(tensor)).reshape(tuple(tensor.dims)).T).tobytes())
                if offset is not None:
                    transposes.append(_transposed(tensor, taken))
            if offset is not None:
                moved += len(raw)
                _point_at(tensor, location, offset, len(raw))
            elif len(tensor.external_data):
                _take_in(tensor, raw)
    if transposes:  # before every use: the nodes stay in topological order
        nodes = transposes + list(proto.graph.node)
        del proto.graph.node[:]
        proto.graph.node.extend(nodes)
    return moved


def _numpy_dtype(tensor):
    from onnx import helper

    return helper.tensor_dtype_to_np_dtype(tensor.data_type)


def _transposed(tensor, taken: set):
    """`tensor` renamed and reshaped to hold its transpose; the node that gives the old name
    its old numbers back."""
    from onnx import helper

    name = f"{tensor.name}.T"
    while name in taken:
        name += "_"
    taken.add(name)
    node = helper.make_node("Transpose", [name], [tensor.name], perm=[1, 0],
                            name=f"{name}.transpose")
    tensor.name = name
    tensor.dims[:] = list(reversed(tensor.dims))
    return node


def _take_in(tensor, raw) -> None:
    """An external tensor's bytes into the graph itself."""
    import onnx

    del tensor.external_data[:]
    tensor.data_location = onnx.TensorProto.DEFAULT
    tensor.raw_data = bytes(raw)


class _ExternalBytes:
    """An initializer's bytes: its raw_data, or, where it is external data, read one tensor
    at a time from the file an exporter wrote in `folder`, or, where `folder` is a mapping
    (location -> a tensor with `tobytes()`: the exporter's own, never written), from that
    tensor. A tensor whose numbers are in typed fields (small constants) gives None: it
    stays as it is."""

    def __init__(self, folder: Optional[Path | Mapping[str, Any]]):
        self.folder, self.files, self.open = folder, {}, contextlib.ExitStack()

    def __enter__(self) -> "_ExternalBytes":
        return self

    def __exit__(self, *exc) -> None:
        self.open.close()

    def bytes_of(self, tensor) -> Optional[bytes]:
        import numpy as np

        if not len(tensor.external_data):
            return tensor.raw_data or None
        if self.folder is None:
            return None
        info = {e.key: e.value for e in tensor.external_data}
        location = info.get("location", "")
        if not plain_name(location):
            raise BundleError(f"{tensor.name}'s external data is at {location!r}, not a file "
                              f"beside the model")
        count = int(np.prod(tensor.dims, dtype=np.int64))
        length = int(info.get("length", count * _numpy_dtype(tensor).itemsize))
        if isinstance(self.folder, Mapping):
            data = self.folder[location].tobytes()
            if len(data) != length:
                raise BundleError(f"{tensor.name}'s bytes are {len(data)}, not {length}")
            return data
        if location not in self.files:
            file = open(self.folder / location, "rb")  # noqa: SIM115 (closed on exit)
            self.files[location] = self.open.enter_context(file)
        file = self.files[location]
        file.seek(int(info.get("offset", 0)))
        data = file.read(length)
        if len(data) != length:
            raise BundleError(f"{location} ends before {tensor.name}'s bytes")
        return data
