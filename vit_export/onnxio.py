"""ONNX files written the one way export, its variants and the preprocessing graph share:
the opset and IR version, saving as one file or with external data, then checking; where a
node sits in the model (its scopes); and third-party tools' chatter captured while they run
(and the signals they lose, kept)."""
from __future__ import annotations

import ast
import contextlib
import io
import logging
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Optional

import onnx

from .errors import ExportError, first_line, signals_kept

DEFAULT_OPSET = 18  # >= 17 keeps LayerNormalization one op
MAX_IR_VERSION = 10  # onnxruntime 1.17+ reads it; newer IR buys this model nothing
PROTOBUF_LIMIT = 2 ** 31 - 1
SINGLE_FILE_BUDGET = PROTOBUF_LIMIT - (64 << 20)  # weights + graph must fit one protobuf

log = logging.getLogger(__name__)


class _ToDebug(logging.Handler):
    """A third-party logger's records, logged by us at debug level."""

    def __init__(self, what: str):
        super().__init__()
        self.what = what

    def emit(self, record: logging.LogRecord) -> None:
        if not record.name.startswith("vit_export"):  # ours reach the root's handlers too
            log.debug("%s: %s: %s", self.what, record.name, record.getMessage())


_QUIET_LOGGERS = ("torch.onnx", "torch.utils.cpp_extension", "torch._inductor")


@contextlib.contextmanager
def captured(what: str) -> Iterator[None]:
    """torch.onnx, torch.jit and ONNX Runtime's tools print progress and raise warnings while
    they work; a library's callers should not see them on their stdout. Both are captured for
    the block (and restored after it) and logged at debug level, so `--verbose` shows them.
    A signal such a tool lost or reported as its own error stops the block as itself
    (`signals_kept`): the dynamo exporter wrapped SIGTERM in its "Next steps" failure."""
    out = io.StringIO()
    # torch.onnx logs to a stderr handler of its own that does not propagate (e.g. "torchvision
    # is not installed. Skipping torchvision::nms" on every export): forward it to debug too.
    # AOTInductor's C++ builder logs "No CUDA runtime is found" through torch's own handler.
    loggers = [logging.getLogger(name) for name in _QUIET_LOGGERS]
    saved = [(logger.handlers[:], logger.propagate) for logger in loggers]
    for logger in loggers:
        logger.handlers, logger.propagate = [_ToDebug(what)], False
    # ONNX Runtime's quantizer warns through the root logger itself (logging.warning), which
    # gives a root without handlers a stderr handler for good (basicConfig): where the
    # caller has set up none, one of ours holds its place for the block
    root = logging.getLogger()
    held = None if root.handlers else _ToDebug(what)
    if held is not None:
        root.addHandler(held)
    with warnings.catch_warnings(record=True) as caught, contextlib.redirect_stdout(out), \
            signals_kept():
        warnings.simplefilter("always")
        try:
            yield
        finally:
            for logger, (handlers, propagate) in zip(loggers, saved):
                logger.handlers, logger.propagate = handlers, propagate
            if held is not None:
                root.removeHandler(held)
            for w in caught:
                log.debug("%s: %s: %s", what, w.category.__name__, w.message)
            for line in out.getvalue().splitlines():
                if line.strip():
                    log.debug("%s: %s", what, line)


def initializer_bytes(proto: onnx.ModelProto) -> int:
    total = 0
    for t in proto.graph.initializer:
        if t.raw_data:
            total += len(t.raw_data)
        else:  # typed fields: count elements times element size
            count = 1
            for d in t.dims:
                count *= d
            total += count * onnx.helper.tensor_dtype_to_np_dtype(t.data_type).itemsize
    return total


def save_onnx(proto: onnx.ModelProto, path: Path,
              external_data: Optional[bool] = None) -> tuple[int, bool]:
    """Save as one file, or with weights in `<path>.data` when too big or asked; then check."""
    size = initializer_bytes(proto)
    if external_data is None:
        external_data = size > SINGLE_FILE_BUDGET
    if not external_data and size > SINGLE_FILE_BUDGET:
        raise ExportError(f"weights take {size / 2**30:.2f} GiB, more than one ONNX file holds; "
                          f"allow external data")
    if not external_data:  # checked in memory: the file written is not read back
        check_onnx(path, proto)
    onnx.save_model(proto, str(path), save_as_external_data=external_data,
                    all_tensors_to_one_file=True, location=path.name + ".data",
                    size_threshold=1024)
    if external_data:
        check_onnx(path)
    return size, bool(external_data)


def check_onnx(path: Path, proto: Optional[onnx.ModelProto] = None) -> None:
    """onnx.checker's verdict on the graph at `path`, or on `proto` (what is written there)
    where it is in memory whole."""
    try:  # by path, external data is not loaded
        onnx.checker.check_model(proto if proto is not None else str(path))
    except onnx.checker.ValidationError as exc:
        raise ExportError(f"onnx.checker rejects {path.name}: "
                          f"{first_line(exc)}") from None


def graph_only(proto: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of `proto` whose external weights are graph inputs of their type and shape:
    what onnx.checker checks in memory (every node, type and name) without the files, which
    it would look for beside the working directory."""
    copy = onnx.ModelProto()
    copy.CopyFrom(proto)
    graph = copy.graph
    external = [t for t in graph.initializer if t.data_location == onnx.TensorProto.EXTERNAL]
    kept = [t for t in graph.initializer if t.data_location != onnx.TensorProto.EXTERNAL]
    del graph.initializer[:]
    graph.initializer.extend(kept)
    graph.input.extend(onnx.helper.make_tensor_value_info(t.name, t.data_type, list(t.dims))
                       for t in external)
    return copy


def node_scopes(node) -> list[str]:
    """Module paths a node sits in, from the exporter's metadata (dynamo) or name (TorchScript)."""
    for prop in node.metadata_props:
        if prop.key == "pkg.torch.onnx.name_scopes":
            try:
                return [s for s in ast.literal_eval(prop.value)[:-1] if s]
            except (ValueError, SyntaxError):
                return []
    if node.name.startswith("/"):
        parts = node.name.split("/")[1:-1]
        return [".".join(parts[:i + 1]) for i in range(len(parts))]
    return []
