"""ONNX Runtime sessions with verified providers: the runner (host input through reused
staging buffers, `staging.Staging`; IO binding for tensors on the device), the CUDA-graph
runner, where each node ran, and a graph checked against the description."""
from __future__ import annotations

import json
import logging
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import numpy as np

from ..archives import parse_description
from ..bundle import (
    BATCH_DIM,
    E2E_INPUT_NAME,
    HEIGHT_DIM,
    METADATA_KEY,
    ONNX_FILE,
    WIDTH_DIM,
    OnnxModel,
    read_onnx_file,
)
from ..errors import BundleError, InputError, ProviderError, first_line
from .base import (
    DEFAULT_PROVIDER,
    PROVIDER_CHOICES,
    PROVIDERS,
    InputSpec,
    Runtime,
    Source,
    Target,
    check_real,
    cuda_problem,
    shape_of,
)
from .staging import Staged, Staging, ort_running

log = logging.getLogger(__name__)


FP16_MAX = float(np.finfo(np.float16).max)  # 65504

# Ops that carry a ViT's arithmetic: on a CUDA session, one of these on the CPU provider means
# the model is not really computed on the GPU. Shape ops (Shape, Gather, Concat...) may be.
HEAVY_OPS = frozenset({"MatMul", "Gemm", "Conv", "Softmax", "LayerNormalization", "Attention",
                       "MultiHeadAttention", "SkipLayerNormalization", "FusedMatMul",
                       "MatMulInteger", "DynamicQuantizeMatMul", "QLinearMatMul", "BiasGelu",
                       "Gelu", "FastGelu"})


_severity = 3  # the log severity of the sessions made here: errors, until ort_log_level


def ort_log_level(level: int) -> None:
    """ONNX Runtime's log severity (0 verbose .. 3 errors, 4 fatal only), process-wide: the
    sessions that its quantization and optimizer tools open inherit it from its default
    logger, and the sessions made here take it in their options (which otherwise set their
    own: a session of severity 3 printed its "[E:onnxruntime:...]" lines whatever the
    default logger's)."""
    global _severity
    import onnxruntime as ort

    ort.set_default_logger_severity(level)
    _severity = level


@dataclass
class OrtRunner:
    """An ONNX Runtime session whose provider has been verified. Host input (numpy) goes
    through `staging` where the model's output sizes are known from the batch: reused (on
    CUDA pinned) buffers, IO binding, and on CUDA the session's own compute `stream`."""
    session: Any
    name: str
    device: str  # the provider that really runs: cuda | cpu
    requested: str  # auto | cuda | cpu
    tf32: bool
    notes: list[str] = field(default_factory=list)  # why `auto` chose what it chose
    spec: Optional[InputSpec] = None  # checked on every call; None for a foreign model
    stream: Any = None  # on CUDA: the torch stream the session computes on
    _staging: Any = field(default=None, repr=False)  # a Staging, False: not staged here

    @property
    def input(self):
        return self.session.get_inputs()[0]

    @property
    def half_input(self) -> bool:
        return self.input.type == "tensor(float16)"

    def cast_input(self, x: np.ndarray) -> np.ndarray:
        """float32 input, float16 for a model whose input is fp16, uint8 for images."""
        if self.input.type == "tensor(uint8)":
            if x.dtype != np.uint8:
                raise InputError(f"{self.name} takes uint8 images, got {x.dtype}")
            return np.ascontiguousarray(x)
        return np.ascontiguousarray(x, dtype=np.float16 if self.half_input else np.float32)

    @property
    def staging(self) -> Optional[Staging]:
        """The staging buffers host input goes through, made at the first batch; None where
        an output's size is not known from the batch, or on CUDA without torch's CUDA."""
        if self._staging is None:
            staged = Staging.fits(self.session) and (self.device == "cpu"
                                                     or self.stream is not None)
            self._staging = Staging(self.session, self.device, self.stream) if staged else False
        return self._staging or None

    def submit(self, x: np.ndarray) -> Staged:
        """Queue one host batch; `.result()` of what it returns gives every output by name,
        float32. On CUDA the batch after it can be submitted before that is read, and its
        copy overlaps this one's run (`staging.stream` does so over many batches)."""
        if self.spec is not None:
            self.spec.check(shape_of(x))
        check_real(x)
        if self.input.type == "tensor(uint8)" and x.dtype != np.uint8:
            raise InputError(f"{self.name} takes uint8 images, got {x.dtype}")
        if self.half_input and x.size and float(np.abs(x).max()) > FP16_MAX:
            raise InputError(f"{self.name} takes fp16 input, and this input holds values "
                             f"beyond fp16's range (+-{FP16_MAX:g}): they would be infinite")
        staging = self.staging
        if staging is None:
            return Staged.ready(self.run_unstaged(self.cast_input(x)))
        return staging.submit(x)  # cast as it is copied in

    def check_tensor(self, x) -> None:
        """A torch tensor held to what numpy input is held to (`submit`): its shape, real
        numbers (a complex tensor was cut to its real part), uint8 for a model of images."""
        if self.spec is not None:
            self.spec.check(shape_of(x))
        check_real(x)
        if self.input.type == "tensor(uint8)" and str(x.dtype) != "torch.uint8":
            raise InputError(f"{self.name} takes uint8 images, got {x.dtype}")

    def __call__(self, x: Any) -> Any:
        if isinstance(x, np.ndarray):
            return next(iter(self.submit(x).result().values()))
        self.check_tensor(x)
        if self.input.type == "tensor(uint8)":  # images: through the host, as numpy
            return self(x.detach().cpu().numpy())
        return self.run_bound(x)

    def run_all(self, x: Any) -> dict[str, Any]:
        """Every output by its name in the graph, float32; tensors in give tensors out."""
        if isinstance(x, np.ndarray):
            return self.submit(x).result()
        self.check_tensor(x)
        import torch

        values = self.run_unstaged(self.cast_input(x.detach().cpu().numpy()))
        return {n: torch.from_numpy(v).to(x.device) for n, v in values.items()}

    def run_unstaged(self, x: np.ndarray) -> dict[str, np.ndarray]:
        """ONNX Runtime's own run: it allocates the outputs and copies them to the host."""
        with ort_running():
            values = self.session.run(None, {self.input.name: x})
        return {o.name: v.astype(np.float32)
                for o, v in zip(self.session.get_outputs(), values)}

    def run_bound(self, x):
        """Run on a torch tensor through IO binding: input read and output written on the
        runner's device, no host copy. Returns a float32 tensor on that device."""
        import torch

        dtype = torch.float16 if self.half_input else torch.float32
        x = x.to(device=self.device, dtype=dtype).contiguous()
        out_meta = self.session.get_outputs()[0]
        if not all(isinstance(d, int) for d in out_meta.shape[1:]):  # tokens of any size
            return torch.from_numpy(self(x.cpu().numpy())).to(self.device)
        out_dtype = torch.float16 if out_meta.type == "tensor(float16)" else torch.float32
        rows = int(x.shape[0])
        out_shape = (rows,) + tuple(int(d) for d in out_meta.shape[1:])
        out = torch.empty(out_shape, dtype=out_dtype, device=self.device)
        index = x.device.index or 0
        binding = self.session.io_binding()
        binding.bind_input(self.input.name, self.device, index, _np_dtype(dtype),
                           tuple(x.shape), x.data_ptr())
        binding.bind_output(out_meta.name, self.device, index, _np_dtype(out_dtype),
                            out_shape, out.data_ptr())
        if self.stream is not None:  # the session's stream waits for x, made on torch's
            self.stream.wait_stream(torch.cuda.current_stream(x.device))
        else:  # ONNX Runtime's own stream: a device-wide wait
            binding.synchronize_inputs()
        with ort_running():
            self.session.run_with_iobinding(binding)  # synchronised at its end: out is ready
        return out.float()


class OrtCudaGraphRunner:
    """An ONNX model on the CUDA provider with CUDA graphs (`enable_cuda_graph`): after
    warm-up, each run replays one captured graph, so batch-1 latency is not a chain of kernel
    launches. A graph is captured for one input shape at fixed buffer addresses, so each
    batch size gets its own session, its `batch` dimension made concrete (free dimension
    override: shape computations then fold away and every node can run on CUDA, which
    capture requires), and its own input and output buffers, bound once. The output is
    copied out of the graph's buffer on every call."""
    device = "cuda"

    def __init__(self, model: str | os.PathLike | OnnxModel, name: str,
                 spec: Optional[InputSpec] = None):
        self.model = _as_model(model)  # read once: every session is built from these bytes
        self.path, self.name, self.spec = self.model.path, name, spec
        self._graphs: dict[tuple[int, ...], tuple[Any, Any, Any, Any]] = {}

    def _graph(self, shape: tuple[int, ...]):
        if shape in self._graphs:
            return self._graphs[shape]
        if self.spec is not None and self.spec.dynamic:
            raise ProviderError(f"{self.name}: CUDA graphs capture one image size; a "
                                f"dynamic-size model is not timed with them")
        import torch


        options = _session_options(None)
        options.add_free_dimension_override_by_name(BATCH_DIM, int(shape[0]))
        chain = [(PROVIDERS["cuda"], {"enable_cuda_graph": "1", "use_tf32": "0"})]
        try:
            session = _session(self.model, options, chain)
        except Exception as exc:  # onnxruntime raises its own Fail/InvalidGraph/... types
            raise ProviderError(f"{self.name}: ONNX Runtime cannot capture CUDA graphs of "
                                f"{self.path.name}: {first_line(exc)}") from None
        if session.get_providers()[0] != PROVIDERS["cuda"]:
            raise ProviderError(f"{self.name}: requested CUDAExecutionProvider but the "
                                f"session runs on {session.get_providers()[0]}")
        meta_in, meta_out = session.get_inputs()[0], session.get_outputs()[0]
        half = {"tensor(float16)": torch.float16}
        index = torch.cuda.current_device()
        x = torch.zeros(shape, dtype=half.get(meta_in.type, torch.float32), device=index)
        out_shape = (int(shape[0]),) + tuple(int(d) for d in meta_out.shape[1:])
        out = torch.empty(out_shape, dtype=half.get(meta_out.type, torch.float32),
                          device=index)
        binding = session.io_binding()
        binding.bind_input(meta_in.name, "cuda", index, _np_dtype(x.dtype), tuple(x.shape),
                           x.data_ptr())
        binding.bind_output(meta_out.name, "cuda", index, _np_dtype(out.dtype), out_shape,
                            out.data_ptr())
        self._graphs[shape] = session, binding, x, out
        return self._graphs[shape]

    def __call__(self, x: Any) -> Any:
        import torch

        if self.spec is not None:
            self.spec.check(shape_of(x))
        check_real(x)
        host = isinstance(x, np.ndarray)
        session, binding, buffer, out = self._graph(tuple(int(d) for d in x.shape))
        buffer.copy_(torch.from_numpy(np.ascontiguousarray(x)) if host else x)
        binding.synchronize_inputs()  # the copy ran on torch's stream, the graph on ORT's
        with ort_running():
            session.run_with_iobinding(binding)
        result = out.float().clone()
        return result.cpu().numpy() if host else result

    def run_all(self, x: Any) -> dict[str, Any]:
        """The first output only: a graph is captured with that one bound (a peer timed by
        bench, compared on it)."""
        name = self.spec.outputs[0] if self.spec is not None else "output"
        return {name: self(x)}


def _np_dtype(dtype) -> type:
    import torch

    return np.float16 if dtype == torch.float16 else np.float32


def _session_options(threads: Optional[int], profile_dir: Optional[str] = None):
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = _severity  # ort_log_level's: a session's own would win
    if threads:  # explicit threads (benchmarks): one intra-op pool that spins between runs
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        options.add_session_config_entry("session.intra_op.allow_spinning", "1")
    if profile_dir:
        options.enable_profiling = True
        options.profile_file_prefix = str(Path(profile_dir) / "ort-profile")
    return options


def _as_model(model: str | os.PathLike | OnnxModel) -> OnnxModel:
    """A model as it is loaded: a path (a file the caller named) is read once here."""
    return model if isinstance(model, OnnxModel) else read_onnx_file(model)


def _session(model: OnnxModel, options, providers):
    """An InferenceSession over the bytes that were read (and checked), never a path: each
    external tensor is given from its checked bytes (`add_external_initializers`), so ONNX
    Runtime opens no file of its own. The arrays stay with the session (it may not copy)."""
    import onnxruntime as ort

    if model.external:
        names = list(model.external)
        values = [ort.OrtValue.ortvalue_from_numpy(model.external[n]) for n in names]
        options.add_external_initializers(names, values)
    session = ort.InferenceSession(model.loaded.data, sess_options=options,
                                   providers=providers)
    session._vx_external = model.external  # the memory its initializers may point into
    return session


def _build(model: OnnxModel, device: str, tf32: bool, options) -> tuple[Any, Any]:
    """The session, and on CUDA the torch stream it computes on (`user_compute_stream`: a
    stream of ours, so that staged copies and runs are ordered by events on it; None where
    torch has no CUDA, and ONNX Runtime then takes a stream of its own)."""

    chain: list[Any] = [PROVIDERS["cpu"]]
    stream = None
    if device == "cuda":
        cuda = {"use_tf32": "1" if tf32 else "0"}
        import torch

        if torch.cuda.is_available():
            stream = torch.cuda.Stream()
            cuda |= {"device_id": str(stream.device.index or 0),
                     "user_compute_stream": str(stream.cuda_stream)}
        chain.insert(0, (PROVIDERS["cuda"], cuda))
    try:
        return _session(model, options, chain), stream
    except Exception as exc:  # onnxruntime raises its own Fail/InvalidGraph/... types
        text = first_line(exc)
        raise BundleError(f"ONNX Runtime cannot load {model.path}: {text}") from None


def ort_runner(model: str | os.PathLike | OnnxModel, provider: str = DEFAULT_PROVIDER, *,
               tf32: bool = False, threads: Optional[int] = None,
               name: str = "onnxruntime") -> OrtRunner:
    """Build a session on `provider` and verify it. `cuda` that runs on CPU is an error;
    `auto` takes CUDA when a session really runs there, else CPU, and notes why.

    Args:
        model: the model as read once and checked (`Bundle.onnx_model`), or the path of a
            file the caller named, read once here (`bundle.read_onnx_file`).
    """
    if provider not in PROVIDER_CHOICES:
        raise ProviderError(f"unknown provider {provider!r}; choose one of "
                            f"{', '.join(PROVIDER_CHOICES)}")
    model = _as_model(model)
    path = model.path
    notes = []
    if provider in ("cuda", "auto"):
        problem = cuda_problem()
        if problem is None:
            session, stream = _build(model, "cuda", tf32, _session_options(threads))
            actual = session.get_providers()[0]
            if actual == PROVIDERS["cuda"]:
                return OrtRunner(session, name, "cuda", provider, tf32,
                                 spec=_session_spec(session), stream=stream)
            problem = f"the session runs on {actual} (no usable CUDA device)"
        if provider == "cuda":
            raise ProviderError(f"requested CUDAExecutionProvider but {problem}")
        notes.append(f"CUDA not used: {problem}; running on CPU")
        log.info("%s: %s", path.name, notes[-1])
    session, _ = _build(model, "cpu", tf32, _session_options(threads))
    return OrtRunner(session, name, "cpu", provider, tf32, notes, spec=_session_spec(session))


def _session_spec(session) -> Optional[InputSpec]:
    """What the model's input must be, from the description the model file carries."""

    values = parse_description(
        session.get_modelmeta().custom_metadata_map.get(METADATA_KEY))
    return InputSpec.from_description(values, session.get_inputs()[0].name == E2E_INPUT_NAME)


def node_placement(path: str | os.PathLike | OnnxModel, device: str, x: np.ndarray) -> dict[str, dict[str, int]]:
    """Which provider ran each node: op type -> {provider: node count}.

    Read from ONNX Runtime's own profile of one run on `x` in a separate profiling session
    (the node events carry the provider that executed them).
    """
    with tempfile.TemporaryDirectory(prefix="vit-export-profile-") as tmp:
        session, stream = _build(_as_model(path), device, False, _session_options(None, tmp))
        runner = OrtRunner(session, "profile", device, device, False, stream=stream)
        runner(x)
        events = json.loads(Path(session.end_profiling()).read_text())
    placed: dict[str, dict[str, set[str]]] = {}
    for event in events:
        args = event.get("args") or {}
        if event.get("cat") == "Node" and "provider" in args and "op_name" in args:
            node = event["name"].rsplit("_kernel_time", 1)[0]
            placed.setdefault(args["op_name"], {}).setdefault(args["provider"], set()).add(node)
    return {op: {p: len(nodes) for p, nodes in by.items()} for op, by in sorted(placed.items())}


def heavy_ops_on_cpu(placement: dict[str, dict[str, int]]) -> dict[str, int]:
    """The arithmetic-carrying ops that ran on the CPU provider: op type -> count."""
    return {op: by[PROVIDERS["cpu"]] for op, by in placement.items()
            if op in HEAVY_OPS and by.get(PROVIDERS["cpu"])}


def check_fits(runner: OrtRunner,
               shapes: tuple[tuple[int | str, ...], dict[str, tuple[int | str, ...]]],
               file: str) -> None:
    """The ONNX graph's input [batch, C, H, W] and its outputs (logits [batch, K], ...) are
    what config.json says, by name and in order, checked before anything runs (a swapped or
    foreign model.onnx is caught here). A symbolic size in config.json ("height" in a
    dynamic-size bundle) must be symbolic in the graph too, and a fixed one fixed."""
    graph_outputs = runner.session.get_outputs()
    names = [o.name for o in graph_outputs]
    if names != list(shapes[1]):
        raise BundleError(f"{file}: outputs {names}, but config.json describes "
                          f"{list(shapes[1])}")
    for what, meta, expected in [("input", runner.input, shapes[0])] + [
            ("output", o, shapes[1][o.name]) for o in graph_outputs]:
        dims = tuple(meta.shape)
        if len(dims) != len(expected) + 1 or any(
                isinstance(d, int) != isinstance(e, int) or (isinstance(d, int) and d != e)
                for d, e in zip(dims[1:], expected)):
            raise BundleError(f"{file}: {what} {meta.name} has shape {list(dims)}, but "
                              f"config.json describes [batch, {', '.join(map(str, expected))}]")


def _open(name: str, target: Target, source: Source, provider: str, threads: Optional[int],
          tf32: bool) -> OrtRunner:
    """One ONNX Runtime runner: a session of its file as the source read it, its provider
    checked, and its graph checked against the description (model.e2e.onnx takes images:
    [height, width, channels] of uint8)."""
    session = ort_runner(source.onnx_model(target.file), provider, tf32=tf32, threads=threads,
                         name=name)
    shapes = source.io_shapes
    if session.spec is not None and session.spec.images:
        shapes = ((HEIGHT_DIM, WIDTH_DIM, shapes[0][0]), shapes[1])
    check_fits(session, shapes, Path(target.file).name)
    return session


def _bundle_runners(bundle) -> dict[str, Target]:
    """Each ONNX model of a bundle on ONNX Runtime, model.onnx first and model.e2e.onnx
    (uint8 images in) last."""
    files = sorted(bundle.onnx_models, key=lambda file: file != bundle.main_onnx)
    files += [bundle.e2e_model] if bundle.e2e_model else []
    return {bundle.runner_name(file): Target(file) for file in files}


def _file_runners(path: Path) -> dict[str, Target]:
    return {"onnxruntime": Target(path.name)} if path.suffix == ".onnx" else {}


RUNTIME = Runtime(
    name="onnxruntime", title="ONNX Runtime", pattern=r"onnxruntime(\[[^\]/]+\])?",
    files={".onnx": ("onnxruntime",)}, runners=_bundle_runners, file_runners=_file_runners,
    open=_open, absent={f"onnxruntime[{ONNX_FILE}]": f" ({ONNX_FILE}'s runner is onnxruntime)"})
