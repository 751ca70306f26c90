"""OpenVINO's CPU runners (an extra): each ONNX model of a bundle, and model.onnx and each
int8 model with bf16 for what is not int8."""
from __future__ import annotations

import logging
import os
from typing import Any, Optional

import numpy as np

from ..bundle import ONNX_FILE, Bundle, OnnxModel, parse_onnx, read_onnx_file
from ..cpu import isa as cpu_isa
from ..errors import ProviderError, first_line
from . import ov_rows
from .base import InputSpec, Runtime, Source, Target, check_real, shape_of

log = logging.getLogger(__name__)

OPENVINO_EXTRA = "pip install 'vit-export[openvino]'"
OPENVINO_NAME = r"openvino(-bf16)?(\[[^\]/]+\])?"  # the runner names it answers
OPENVINO_PRECISIONS = ("f32", "bf16")  # what its CPU plugin is asked to compute in


class OpenVinoRunner:
    """One of a bundle's ONNX models compiled by OpenVINO's CPU plugin (the `openvino` extra).

    Like an ONNX Runtime provider, a precision hint is not taken on trust. Asked for bf16,
    the CPU plugin computes in f32 on a CPU without AVX-512, and on one with AVX-512 but no
    bf16 instructions it says bf16 and emulates it, slower than f32 (its
    `hasHardwareSupport(bf16)` is `mayiuse(avx512_core)`). So bf16 needs the CPU's own bf16
    instructions (`cpu.isa().bf16`) and the compiled model's word that it computes in bf16.
    Input shapes are compiled as they come (static shapes, as OpenVINO deploys fastest),
    the last few kept; numpy in, numpy out, and a torch tensor in gives a CPU tensor out.
    A static int8 model's GEMMs get each image's tokens in whole row blocks where that is
    faster (`ov_rows`; `cut_rows=False` compiles the graph as it is).
    """
    device = "cpu"
    KEEP_COMPILED = 4  # input shapes kept compiled (a validation runs 3-4 batch sizes)

    def __init__(self, model: str | os.PathLike | OnnxModel, name: str, hint: str = "f32",
                 threads: Optional[int] = None, spec: Optional[InputSpec] = None,
                 cut_rows: bool = True):
        try:
            import openvino
        except ImportError:
            raise ProviderError(f"OpenVINO is not installed; it comes with the openvino "
                                f"extra: {OPENVINO_EXTRA}") from None
        if hint not in OPENVINO_PRECISIONS:
            raise ProviderError(f"unknown OpenVINO precision {hint!r}; choose one of "
                                f"{', '.join(OPENVINO_PRECISIONS)}")
        model = model if isinstance(model, OnnxModel) else read_onnx_file(model)
        self.path, self.name, self.hint, self.spec = model.path, name, hint, spec
        self.data = _single_file(model)  # read once: every compile reads these bytes
        self.core = openvino.Core()
        self.config = {"PERFORMANCE_HINT": "LATENCY", "INFERENCE_PRECISION_HINT": hint}
        if threads:
            self.config["INFERENCE_NUM_THREADS"] = int(threads)
        if hint == "bf16" and not cpu_isa().bf16:
            raise ProviderError(f"asked OpenVINO's CPU plugin for bf16 on {self.path.name}, "
                                f"but this CPU has no bf16 instructions ({cpu_isa().summary}): "
                                f"it would compute in f32 or emulate bf16")
        self._compiled: dict[Optional[tuple[int, ...]], Any] = {}
        self.rows_split: dict[tuple[int, ...], int] = {}  # shape -> MatMuls cut (ov_rows)
        self._may_cut = cut_rows and self._static_int8_here()
        self._threads: Optional[int] = None  # the plugin's, asked once where a cut may apply
        self.precision = self._ran(self._compile(tuple(spec.example_shape()) if spec else None))
        if self.precision != hint:
            raise ProviderError(f"asked OpenVINO's CPU plugin for {hint} on {self.path.name} "
                                f"but it computes in {self.precision}")

    def _compile(self, shape: Optional[tuple[int, ...]]):
        if shape in self._compiled:
            self._compiled[shape] = self._compiled.pop(shape)  # most recently used last
            return self._compiled[shape]
        while len(self._compiled) >= self.KEEP_COMPILED:
            del self._compiled[next(iter(self._compiled))]
        compiled = None
        if (cut := self._cut(shape)) is not None:
            try:
                compiled = self._compile_bytes(cut[0], shape)
                self.rows_split[shape] = cut[1]
            except Exception as exc:  # the cut graph is an optimization: the whole one runs
                log.warning("OpenVINO could not compile %s with its rows cut for an input of "
                            "shape %s (%s): compiled as it is", self.path.name, list(shape),
                            ov_cause(exc))
        if compiled is None:
            try:
                compiled = self._compile_bytes(self.data, shape)
            except Exception as exc:  # OpenVINO raises RuntimeError with a C++ report
                raise ProviderError(f"OpenVINO cannot compile {self.path.name}: "
                                    f"{ov_cause(exc)}") from None
        self._compiled[shape] = compiled
        return compiled

    def _compile_bytes(self, data: bytes, shape: Optional[tuple[int, ...]]):
        model = self.core.read_model(data)
        if shape is not None:
            model.reshape({model.inputs[0].any_name: list(shape)})
        return self.core.compile_model(model, "CPU", self.config)

    def _static_int8_here(self) -> bool:
        """Whether `ov_rows` may cut this model's int8 GEMMs' rows: a static int8 model, on a
        CPU whose OpenVINO kernel was measured."""
        if not ov_rows.applies(cpu_isa().flags) or b"QuantizeLinear" not in self.data:
            return False
        import onnx

        try:
            return ov_rows.has_static_int8(onnx.load_from_string(self.data))
        except Exception as exc:  # onnx's parse errors differ by version; compile says more
            log.warning("%s: not read as ONNX to cut its rows (%s)", self.path.name,
                        first_line(exc))
            return False

    def _cut(self, shape: Optional[tuple[int, ...]]) -> Optional[tuple[bytes, int]]:
        """The model's bytes for an input of `shape` with its int8 GEMMs' rows cut in whole
        blocks (ov_rows), and how many MatMuls were cut; None where no cut applies. The
        graph is parsed again for each shape rather than kept: a compiled shape is kept."""
        if not self._may_cut or shape is None:
            return None
        import onnx

        try:
            if self._threads is None:
                self._threads = int(self.config.get("INFERENCE_NUM_THREADS")
                                    or _threads(self.core, self.config))
            model, count = ov_rows.split_rows(onnx.load_from_string(self.data), shape,
                                              self._threads)
            return (model.SerializeToString(), count) if model is not None else None
        except Exception as exc:  # a graph this rewrite cannot follow runs whole
            log.warning("%s: its rows not cut for an input of shape %s (%s)", self.path.name,
                        list(shape), first_line(exc))
            return None

    def _name(self, port) -> str:
        """An output's name in the ONNX graph. A port has several names (the graph output's
        and its producer's: the fp16 model's Cast), and `get_any_name` may give either."""
        names = port.get_names()
        wanted = [n for n in (self.spec.outputs if self.spec else ()) if n in names]
        return wanted[0] if wanted else port.get_any_name()

    @staticmethod
    def _ran(compiled) -> str:
        ran = compiled.get_property("INFERENCE_PRECISION_HINT")  # an openvino.Type
        return ran.get_type_name() if hasattr(ran, "get_type_name") else str(ran)

    def __call__(self, x: Any) -> Any:
        return next(iter(self.run_all(x).values()))

    def run_all(self, x: Any) -> dict[str, Any]:
        """Every output by its name in the graph; a torch tensor in gives CPU tensors out."""
        if self.spec is not None:
            self.spec.check(shape_of(x))
        check_real(x)
        host = isinstance(x, np.ndarray)
        array = np.ascontiguousarray(x if host else x.detach().cpu().numpy(), np.float32)
        compiled = self._compile(array.shape)
        try:
            result = compiled([array])
            outs = {self._name(port): np.array(result[port], np.float32)  # copies: the
                    for port in compiled.outputs}  # request reuses its buffers
        except Exception as exc:  # OpenVINO's RuntimeError carries a C++ report
            raise ProviderError(f"OpenVINO failed to run {self.path.name} on an input of "
                                f"shape {list(array.shape)}: {ov_cause(exc)}") from None
        if host:
            return outs
        import torch

        return {name: torch.from_numpy(out) for name, out in outs.items()}


def _threads(core, config: dict) -> int:
    """How many threads OpenVINO's CPU plugin runs a model on with `config`: a one-op model
    compiled with it says (the plugin picks them where the config does not)."""
    import openvino
    try:
        from openvino import opset13 as ops
    except ImportError:  # before OpenVINO 2025.0 the opsets were under openvino.runtime only
        from openvino.runtime import opset13 as ops

    x = ops.parameter([1], openvino.Type.f32)
    probe = openvino.Model([ops.relu(x)], [x], "threads")
    return int(core.compile_model(probe, "CPU", config).get_property("INFERENCE_NUM_THREADS"))


def ov_cause(exc: BaseException) -> str:
    """The cause in an OpenVINO error: its C++ report starts with where it was thrown
    ("Exception from src/inference/src/cpp/core.cpp:84:", "Check 'false' failed at ...")
    and says what went wrong below that; the last lines that say something, joined."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    said = [line.lstrip("- ") for line in lines
            if not line.startswith(("Exception from ", "Check '")) and not line.endswith(":")
            and "://" not in line]  # where it was thrown, headings, documentation links
    return " ".join(said[-2:]) if said else first_line(exc)


def _single_file(model: OnnxModel) -> bytes:
    """The model's bytes with its external tensors (read once and checked) put inside: given
    bytes, OpenVINO would look for external data by the names the graph holds, from the
    working folder. Refused where they cannot fit one protobuf."""
    if not model.external:
        return model.loaded.data
    import onnx

    from ..onnxio import PROTOBUF_LIMIT  # onnx: loaded where a model is merged

    proto = parse_onnx(model.loaded)
    for tensor in proto.graph.initializer:
        if tensor.name in model.external:
            tensor.raw_data = model.external[tensor.name].tobytes()
            del tensor.external_data[:]
            tensor.data_location = onnx.TensorProto.DEFAULT
    if proto.ByteSize() > PROTOBUF_LIMIT:
        raise ProviderError(f"{model.path.name} with its external data is too large for one "
                            f"protobuf, which is how OpenVINO is given the checked bytes")
    return proto.SerializeToString()


def openvino_runners(bundle: Bundle) -> dict[str, tuple[str, str]]:
    """The OpenVINO runners a bundle has: name -> (ONNX file, precision hint). Each ONNX
    model as its file is (f32 compute; an int8 file runs its int8 ops), model.onnx in bf16
    (`openvino-bf16`), and each int8 model with bf16 for the ops it leaves in float
    (`openvino-bf16[model.int8-static.onnx]`): attention, LayerNorm, GELU and the
    quantizing run at twice the rate, and the int8 GEMMs are as they were. Each is judged by
    its file's profile (model.onnx in bf16 by bf16's)."""

    runners = {}
    for file, profile in bundle.onnx_models.items():
        f32 = bundle.runner_name(file).replace("onnxruntime", "openvino", 1)
        runners[f32] = (file, "f32")
        if file == ONNX_FILE or profile.startswith("int8"):
            runners[f32.replace("openvino", "openvino-bf16", 1)] = (file, "bf16")
    return runners


def _open(name: str, target: Target, source: Source, provider: str, threads: Optional[int],
          tf32: bool) -> OpenVinoRunner:
    """One OpenVINO runner: its ONNX file as the source read it, on the CPU plugin."""
    return OpenVinoRunner(source.onnx_model(target.file), name, target.how or "f32", threads,
                          source.spec)


def _bundle_runners(bundle: Bundle) -> dict[str, Target]:
    """`openvino_runners` as targets: bf16 needs the CPU's own bf16, and model.onnx in bf16
    computes in bf16 (an int8 model's bf16 runner is judged as int8, by its file)."""
    return {name: Target(file, hint, "bf16" if hint == "bf16" and file == ONNX_FILE else None,
                         hint != "f32")
            for name, (file, hint) in openvino_runners(bundle).items()}


def _file_runners(path) -> dict[str, Target]:
    """An ONNX file the user named, on OpenVINO in f32 and in bf16."""
    if path.suffix != ".onnx":
        return {}
    return {"openvino": Target(path.name, "f32"),
            "openvino-bf16": Target(path.name, "bf16", "bf16", True)}


RUNTIME = Runtime(
    name="openvino", title="OpenVINO", pattern=OPENVINO_NAME,
    files={".onnx": ("openvino", "openvino-bf16")}, runners=_bundle_runners,
    file_runners=_file_runners, open=_open, extra="openvino", install=OPENVINO_EXTRA,
    opt_in=True, cpu_only=True, defer=False,  # compiled at once: bf16 may be left out
    absent={f"openvino[{ONNX_FILE}]": f" ({ONNX_FILE}'s runner is openvino)",
            f"openvino-bf16[{ONNX_FILE}]": f" ({ONNX_FILE}'s bf16 runner is openvino-bf16)"})
