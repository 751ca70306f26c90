"""Runners: everything that turns an input batch into logits, behind one protocol.

A runner has a `name` ("eager", "torchscript", "pt2", "aoti", "onnxruntime",
"onnxruntime[model.int8.onnx]", "openvino", "openvino-bf16"), the `device` it really runs on ("cuda" or "cpu") and `__call__`: a numpy array in gives a
numpy array out; a torch tensor in gives a torch tensor out on the runner's device, without a
host copy when the tensor is already there (ONNX Runtime through IO binding).

`open_runners(bundle, provider)` builds every runner of a bundle on one device: the device
the ONNX Runtime sessions really run on, so eager PyTorch runs there too. onnxruntime-gpu
lists CUDAExecutionProvider even on a machine without a GPU, and a session asked for CUDA
there silently runs on CPU: only `session.get_providers()` tells the truth, so that is what
we check. This module knows nothing of the model; a bundle hands it its eager module.
"""
from __future__ import annotations

import contextlib
import ctypes
import gc
import json
import logging
import os
import tempfile
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional, Protocol

import numpy as np

from .cpu import isa as cpu_isa
from .errors import BundleError, ConfigError, InputError, ProviderError, first_line, shown

if TYPE_CHECKING:
    from .bundle import Bundle

log = logging.getLogger(__name__)

PROVIDERS = {"cuda": "CUDAExecutionProvider", "cpu": "CPUExecutionProvider"}
DEVICES = ("cuda", "cpu")
PROVIDER_CHOICES = ("auto",) + DEVICES
DEFAULT_PROVIDER = "auto"
# Ops that carry a ViT's arithmetic: on a CUDA session, one of these on the CPU provider means
# the model is not really computed on the GPU. Shape ops (Shape, Gather, Concat...) may be.
HEAVY_OPS = frozenset({"MatMul", "Gemm", "Conv", "Softmax", "LayerNormalization", "Attention",
                       "MultiHeadAttention", "SkipLayerNormalization", "FusedMatMul",
                       "MatMulInteger", "DynamicQuantizeMatMul", "QLinearMatMul", "BiasGelu",
                       "Gelu", "FastGelu"})


class Runner(Protocol):
    """Runs one model: `runner(x)` gives its first output, `runner.run_all(x)` every output
    by name (logits, embedding, tokens: a bundle's outputs, in the order it declares)."""
    name: str
    device: str  # where it really runs: "cuda" or "cpu"

    def __call__(self, x: Any) -> Any: ...

    def run_all(self, x: Any) -> dict[str, Any]: ...


# ---------------------------------------------------------------- what a model takes


@dataclass(frozen=True)
class InputSpec:
    """The input a model takes, read from the description it carries, and checked at the
    runner's boundary so a wrong size is one line, not ONNX Runtime's message or, worse, a
    silent answer (a traced or exported graph does not keep the model's own checks).

    Pixel values: float [batch, channels, H, W], H = W = size, or for a dynamic-size model
    any H and W that are multiples of `patch`. Images (model.e2e.onnx): uint8
    [batch, H, W, channels] of any size.
    """
    channels: int
    size: int
    patch: int
    dynamic: bool = False
    images: bool = False
    outputs: tuple[str, ...] = ("logits",)  # the names of what it gives, in order

    @classmethod
    def from_description(cls, values: Any, images: bool = False) -> Optional["InputSpec"]:
        """From a description's dict (config.json's, or what a model file carries); None
        for a foreign model that carries none."""
        model = values.get("model") if isinstance(values, dict) else None
        io = values.get("io") if isinstance(values, dict) else None
        io = io if isinstance(io, dict) else {}
        outputs = io.get("outputs", [io.get("output", "logits")])  # "output": older bundles
        try:
            return cls(int(model["in_chans"]), int(model["img_size"]),
                       int(model["patch_size"]), bool(model.get("dynamic_img_size", False)),
                       images, tuple(str(name) for name in outputs))
        except (KeyError, TypeError, ValueError):
            return None

    def example_shape(self) -> tuple[int, ...]:
        """One input of the model's native size."""
        if self.images:
            return (1, self.size, self.size, self.channels)
        return (1, self.channels, self.size, self.size)

    def check(self, shape: Sequence[int]) -> None:
        shape = tuple(int(d) for d in shape)
        if self.images:
            if len(shape) != 4 or shape[3] != self.channels or min(shape) < 1:
                raise InputError(f"input of shape {list(shape)}: expected uint8 images "
                                 f"[batch, height, width, {self.channels}]")
            return
        expected = "height, width" if self.dynamic else f"{self.size}, {self.size}"
        if len(shape) != 4 or shape[1] != self.channels or min(shape) < 1:
            raise InputError(f"input of shape {list(shape)}: expected "
                             f"[batch, {self.channels}, {expected}]")
        height, width = shape[2:]
        if self.dynamic and (height % self.patch or width % self.patch):
            raise InputError(f"a {height}x{width} input: height and width must be multiples "
                             f"of the patch size {self.patch}")
        if not self.dynamic and (height, width) != (self.size, self.size):
            raise InputError(f"a {height}x{width} input: this model takes {self.size}x"
                             f"{self.size} only (export --dynamic-size for other sizes)")


def _carried_description(text: Optional[str]) -> Any:
    try:
        return json.loads(text) if text else None
    except ValueError:
        return None


# ---------------------------------------------------------------- global state, restored


@contextlib.contextmanager
def tf32(enabled: bool) -> Iterator[None]:
    """PyTorch's TF32 switches for the block; parity runs compare full fp32 (TF32 off)."""
    import torch

    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = enabled
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


@contextlib.contextmanager
def torch_threads(threads: Optional[int]) -> Iterator[None]:
    """torch's intra-op thread count for the block (None leaves it as it is)."""
    import torch

    saved = torch.get_num_threads()
    if threads:
        torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(saved)


def ort_log_level(level: int) -> None:
    """ONNX Runtime's process-wide log severity (0 verbose .. 3 errors only): the sessions
    that its quantization and optimizer tools open inherit it."""
    import onnxruntime as ort

    ort.set_default_logger_severity(level)


# ---------------------------------------------------------------- CUDA libraries


def cuda_problem() -> Optional[str]:
    """Why ONNX Runtime's CUDA provider cannot load here, or None when its libraries load.

    CUDA and cuDNN usually come from PyTorch's NVIDIA wheels rather than a system install;
    `onnxruntime.preload_dlls()` loads them from there. Loading the provider library with
    ctypes then names the first library still missing (e.g. libcuda.so.1: no driver).
    """
    import onnxruntime as ort

    if PROVIDERS["cuda"] not in ort.get_available_providers():
        return "this onnxruntime has no CUDAExecutionProvider (install onnxruntime-gpu)"
    if hasattr(ort, "preload_dlls"):  # onnxruntime >= 1.21
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                ort.preload_dlls(msvc=False)
        except Exception as exc:  # it raises whatever the loader raised
            log.debug("onnxruntime.preload_dlls failed: %s", exc)
    else:
        with contextlib.suppress(ImportError):
            import torch  # noqa: F401  loads the CUDA libraries of its NVIDIA wheels
    library = Path(ort.__file__).parent / "capi" / "libonnxruntime_providers_cuda.so"
    if not library.is_file():  # Windows and other layouts: let the session say
        return None
    try:
        ctypes.CDLL(str(library))
    except OSError as exc:
        missing = str(exc).split(":")[0]
        return f"the CUDA provider cannot load {missing}" + (
            " (no NVIDIA driver)" if missing.startswith("libcuda.so") else "")
    return None


# ---------------------------------------------------------------- ONNX Runtime


@dataclass
class OrtRunner:
    """An ONNX Runtime session whose provider has been verified."""
    session: Any
    name: str
    device: str  # the provider that really runs: cuda | cpu
    requested: str  # auto | cuda | cpu
    tf32: bool
    notes: list[str] = field(default_factory=list)  # why `auto` chose what it chose
    spec: Optional[InputSpec] = None  # checked on every call; None for a foreign model

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

    def __call__(self, x: Any) -> Any:
        if self.spec is not None:
            self.spec.check(x.shape)
        if isinstance(x, np.ndarray):
            out = self.session.run(None, {self.input.name: self.cast_input(x)})[0]
            return out.astype(np.float32)
        return self.run_bound(x)

    def run_all(self, x: Any) -> dict[str, Any]:
        """Every output by its name in the graph, float32; tensors in give tensors out."""
        if self.spec is not None:
            self.spec.check(x.shape)
        host = isinstance(x, np.ndarray)
        array = x if host else x.detach().cpu().numpy()
        values = self.session.run(None, {self.input.name: self.cast_input(array)})
        names = [o.name for o in self.session.get_outputs()]
        if host:
            return {n: v.astype(np.float32) for n, v in zip(names, values)}
        import torch

        return {n: torch.from_numpy(v.astype(np.float32)).to(x.device)
                for n, v in zip(names, values)}

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
        binding.synchronize_inputs()  # ONNX Runtime runs on its own stream, not torch's
        self.session.run_with_iobinding(binding)
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

    def __init__(self, path: str | os.PathLike, name: str, spec: Optional[InputSpec] = None):
        self.path, self.name, self.spec = Path(path), name, spec
        self._graphs: dict[tuple[int, ...], tuple[Any, Any, Any, Any]] = {}

    def _graph(self, shape: tuple[int, ...]):
        if shape in self._graphs:
            return self._graphs[shape]
        if self.spec is not None and self.spec.dynamic:
            raise ProviderError(f"{self.name}: CUDA graphs capture one image size; a "
                                f"dynamic-size model is not timed with them")
        import onnxruntime as ort
        import torch

        from .bundle import BATCH_DIM

        options = _session_options(None)
        options.add_free_dimension_override_by_name(BATCH_DIM, int(shape[0]))
        chain = [(PROVIDERS["cuda"], {"enable_cuda_graph": "1", "use_tf32": "0"})]
        try:
            session = ort.InferenceSession(str(self.path), sess_options=options,
                                           providers=chain)
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
            self.spec.check(x.shape)
        host = isinstance(x, np.ndarray)
        session, binding, buffer, out = self._graph(tuple(int(d) for d in x.shape))
        buffer.copy_(torch.from_numpy(np.ascontiguousarray(x)) if host else x)
        binding.synchronize_inputs()  # the copy ran on torch's stream, the graph on ORT's
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
    options.log_severity_level = 3  # this session's warnings are ours to report, not print
    if threads:  # explicit threads (benchmarks): one intra-op pool that spins between runs
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        options.add_session_config_entry("session.intra_op.allow_spinning", "1")
    if profile_dir:
        options.enable_profiling = True
        options.profile_file_prefix = str(Path(profile_dir) / "ort-profile")
    return options


def _build(path: Path, device: str, tf32: bool, options):
    import onnxruntime as ort

    chain: list[Any] = [PROVIDERS["cpu"]]
    if device == "cuda":
        chain.insert(0, (PROVIDERS["cuda"], {"use_tf32": "1" if tf32 else "0"}))
    try:
        return ort.InferenceSession(str(path), sess_options=options, providers=chain)
    except Exception as exc:  # onnxruntime raises its own Fail/InvalidGraph/... types
        text = first_line(exc)
        raise BundleError(f"ONNX Runtime cannot load {path}: {text}") from None


def ort_runner(path: str | os.PathLike, provider: str = DEFAULT_PROVIDER, *,
               tf32: bool = False, threads: Optional[int] = None,
               name: str = "onnxruntime") -> OrtRunner:
    """Build a session on `provider` and verify it. `cuda` that runs on CPU is an error;
    `auto` takes CUDA when a session really runs there, else CPU, and notes why."""
    if provider not in PROVIDER_CHOICES:
        raise ProviderError(f"unknown provider {provider!r}; choose one of "
                            f"{', '.join(PROVIDER_CHOICES)}")
    path = Path(path)
    if not path.is_file():
        raise BundleError(f"{path} does not exist")
    notes = []
    if provider in ("cuda", "auto"):
        problem = cuda_problem()
        if problem is None:
            session = _build(path, "cuda", tf32, _session_options(threads))
            actual = session.get_providers()[0]
            if actual == PROVIDERS["cuda"]:
                return OrtRunner(session, name, "cuda", provider, tf32,
                                 spec=_session_spec(session))
            problem = f"the session runs on {actual} (no usable CUDA device)"
        if provider == "cuda":
            raise ProviderError(f"requested CUDAExecutionProvider but {problem}")
        notes.append(f"CUDA not used: {problem}; running on CPU")
        log.info("%s: %s", path.name, notes[-1])
    session = _build(path, "cpu", tf32, _session_options(threads))
    return OrtRunner(session, name, "cpu", provider, tf32, notes, spec=_session_spec(session))


def _session_spec(session) -> Optional[InputSpec]:
    """What the model's input must be, from the description the model file carries."""
    from .bundle import E2E_INPUT_NAME, METADATA_KEY

    values = _carried_description(
        session.get_modelmeta().custom_metadata_map.get(METADATA_KEY))
    return InputSpec.from_description(values, session.get_inputs()[0].name == E2E_INPUT_NAME)


def node_placement(path: str | os.PathLike, device: str, x: np.ndarray) -> dict[str, dict[str, int]]:
    """Which provider ran each node: op type -> {provider: node count}.

    Read from ONNX Runtime's own profile of one run on `x` in a separate profiling session
    (the node events carry the provider that executed them).
    """
    with tempfile.TemporaryDirectory(prefix="vit-export-profile-") as tmp:
        session = _build(Path(path), device, False, _session_options(None, tmp))
        runner = OrtRunner(session, "profile", device, device, False)
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


# ---------------------------------------------------------------- PyTorch


@dataclass
class TorchRunner:
    """An eager, TorchScript or torch.compile'd module on one device; with `autocast`, run
    under torch.autocast in that dtype ("float16": mixed precision, as AMP serves)."""
    module: Any
    name: str
    device: str = "cpu"
    spec: Optional[InputSpec] = None  # checked on every call
    autocast: Optional[str] = None  # None: fp32 throughout
    compiled: bool = False  # a torch.compile'd module (on CUDA: CUDA graph steps)

    def __call__(self, x: Any) -> Any:
        return self._run(x)[0]

    def run_all(self, x: Any) -> dict[str, Any]:
        names = self.spec.outputs if self.spec is not None else ("output",)
        values = self._run(x)
        if len(values) != len(names):
            raise BundleError(f"{self.name} gives {len(values)} output(s), and its "
                              f"description names {len(names)}: {', '.join(names)}")
        return dict(zip(names, values))

    def _run(self, x: Any) -> tuple:
        """Every output, as a tuple (a model with one output gives one)."""
        import torch

        if self.spec is not None:
            self.spec.check(x.shape)
        host = isinstance(x, np.ndarray)
        if host:
            x = torch.from_numpy(np.ascontiguousarray(x, np.float32))
        amp = (torch.autocast(self.device, dtype=getattr(torch, self.autocast))
               if self.autocast else contextlib.nullcontext())
        if self.compiled and self.device == "cuda":
            # max-autotune replays CUDA graphs whose outputs the next replay overwrites:
            # mark the step, and copy the output out (.clone below) before it is reused
            torch.compiler.cudagraph_mark_step_begin()
        # one graph per input shape: more shapes than dynamo's default limit of 8 must fail
        # (bench leaves the peer out) rather than fall back to eager under the peer's name
        compile_limits = (torch._dynamo.config.patch(recompile_limit=COMPILE_SHAPES,
                                                     fail_on_recompile_limit_hit=True)
                          if self.compiled else contextlib.nullcontext())
        with torch.inference_mode(), amp, compile_limits:
            outs = self.module(x.to(self.device, torch.float32))
        from .model import as_tuple

        outs = tuple(o.float().clone() if self.compiled else o.float() for o in as_tuple(outs))
        return tuple(o.cpu().numpy() for o in outs) if host else outs


def torch_cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def torch_device(provider: str) -> str:
    """The torch device for a provider request: cuda only when PyTorch sees a GPU."""
    return "cuda" if provider in ("cuda", "auto") and torch_cuda() else "cpu"


def load_torchscript(path: str | os.PathLike, device: str = "cpu") -> TorchRunner:
    import torch

    path = Path(path)
    _check_torch_file(path, device, "TorchScript")
    from .bundle import METADATA_KEY

    extra = {f"{METADATA_KEY}.json": ""}
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)  # torch.jit's deprecation notice
            module = torch.jit.load(str(path), map_location=device, _extra_files=extra)
    except Exception as exc:  # torch raises RuntimeError subclasses of many kinds
        raise BundleError(f"cannot load TorchScript {path}: {first_line(exc)}") from None
    spec = InputSpec.from_description(_carried_description(extra[f"{METADATA_KEY}.json"]))
    return TorchRunner(module.eval(), "torchscript", device, spec)


def load_torch_file(name: str, path: str | os.PathLike, device: str = "cpu") -> TorchRunner:
    """A bundle's PyTorch artifact by its runner name: "torchscript" (model.ts), "pt2" (a
    torch.export program) or "aoti" (an AOTInductor package)."""
    if name == "torchscript":
        return load_torchscript(path, device)
    from . import pt2

    _check_torch_file(Path(path), device, Path(path).name)
    return pt2.load_program(path, device) if name == "pt2" else pt2.load_package(path, device)


def _check_torch_file(path: Path, device: str, what: str) -> None:
    """What every PyTorch artifact needs before it is loaded: the file, and CUDA in PyTorch
    when it is to run there."""
    if not path.is_file():
        raise BundleError(f"{path} does not exist")
    if device == "cuda" and not torch_cuda():
        raise ProviderError(f"requested CUDA for {what} but PyTorch sees no CUDA device")


# ---------------------------------------------------------------- OpenVINO (an extra)

OPENVINO_EXTRA = "pip install 'vit-export[openvino]'"
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
    """
    device = "cpu"
    KEEP_COMPILED = 4  # input shapes kept compiled (a validation runs 3-4 batch sizes)

    def __init__(self, path: str | os.PathLike, name: str, hint: str = "f32",
                 threads: Optional[int] = None, spec: Optional[InputSpec] = None):
        try:
            import openvino
        except ImportError:
            raise ProviderError(f"OpenVINO is not installed; it comes with the openvino "
                                f"extra: {OPENVINO_EXTRA}") from None
        if hint not in OPENVINO_PRECISIONS:
            raise ProviderError(f"unknown OpenVINO precision {hint!r}; choose one of "
                                f"{', '.join(OPENVINO_PRECISIONS)}")
        self.path, self.name, self.hint, self.spec = Path(path), name, hint, spec
        self.core = openvino.Core()
        self.config = {"PERFORMANCE_HINT": "LATENCY", "INFERENCE_PRECISION_HINT": hint}
        if threads:
            self.config["INFERENCE_NUM_THREADS"] = int(threads)
        if hint == "bf16" and not cpu_isa().bf16:
            raise ProviderError(f"asked OpenVINO's CPU plugin for bf16 on {self.path.name}, "
                                f"but this CPU has no bf16 instructions ({cpu_isa().summary}): "
                                f"it would compute in f32 or emulate bf16")
        self._compiled: dict[Optional[tuple[int, ...]], Any] = {}
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
        try:
            model = self.core.read_model(str(self.path))
            if shape is not None:
                model.reshape({model.inputs[0].any_name: list(shape)})
            compiled = self.core.compile_model(model, "CPU", self.config)
        except Exception as exc:  # OpenVINO raises RuntimeError with a C++ report
            line = first_line(exc)
            raise ProviderError(f"OpenVINO cannot compile {self.path.name}: {line}") from None
        self._compiled[shape] = compiled
        return compiled

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
            self.spec.check(x.shape)
        host = isinstance(x, np.ndarray)
        array = np.ascontiguousarray(x if host else x.detach().cpu().numpy(), np.float32)
        compiled = self._compile(array.shape)
        try:
            result = compiled([array])
            outs = {self._name(port): np.array(result[port], np.float32)  # copies: the
                    for port in compiled.outputs}  # request reuses its buffers
        except Exception as exc:  # OpenVINO's RuntimeError carries a C++ report
            line = first_line(exc)
            raise ProviderError(f"OpenVINO failed to run {self.path.name} on an input of "
                                f"shape {list(array.shape)}: {line}") from None
        if host:
            return outs
        import torch

        return {name: torch.from_numpy(out) for name, out in outs.items()}


# ---------------------------------------------------------------- every runner of a bundle


# Weights (bytes) above which a dropped copy is collected and trimmed at once: below, the
# collection (0.3 s with torch loaded) costs more than the memory it gives back.
RELEASE_ABOVE = 256 * 2**20


def release_memory() -> None:
    """Collect garbage and hand the freed heap back to the system (glibc's malloc_trim), so
    the next big allocation (the next runner's copy of the weights) reuses it rather than
    adding to the peak: measured on ViT-L, a TorchScript module loaded after ONNX Runtime's
    session was dropped grew the RSS by its whole size without the trim."""
    gc.collect()
    try:
        ctypes.CDLL(None).malloc_trim(0)
    except (OSError, AttributeError):  # not glibc: nothing to trim
        pass


class Deferred:
    """A runner opened at its first call and closed by `release()`, so that validation can
    hold eager PyTorch and one artifact at a time rather than a copy of the weights per
    artifact (a ViT-g is 4.5 GB each). `runner` is one opened already; `collect`: release
    hands the memory back to the system at once (see `release_memory`)."""

    def __init__(self, name: str, device: str, opener: Callable[[], Runner],
                 runner: Optional[Runner] = None, collect: bool = False):
        self.name, self.device, self._open, self._runner = name, device, opener, runner
        self.collect = collect

    @property
    def opened(self) -> bool:
        return self._runner is not None

    def __call__(self, x: Any) -> Any:
        return self.opened_runner()(x)

    def run_all(self, x: Any) -> dict[str, Any]:
        return self.opened_runner().run_all(x)

    def opened_runner(self) -> Runner:
        if self._runner is None:
            self._runner = self._open()
        return self._runner

    def release(self) -> None:
        self._runner = None
        if self.collect:
            release_memory()


@dataclass
class RunnerSet:
    """Every runner of a bundle, built on one device; eager PyTorch first (the reference)."""
    device: str  # where all of them run
    requested: str
    notes: list[str]
    runners: list[Runner]
    onnx_files: dict[str, str]  # runner name -> ONNX file name, for the ONNX runners
    # runners that compute in another precision than their file holds: name -> precision
    # (OpenVINO's bf16 runner of the fp32 model.onnx)
    computes: dict[str, str] = field(default_factory=dict)
    peers: list[str] = field(default_factory=list)  # names of the peer runners (last)

    @property
    def reference(self) -> Runner:
        return self.runners[0]

    @property
    def candidates(self) -> list[Runner]:
        return self.runners[1:]


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


def openvino_runners(bundle: "Bundle") -> dict[str, tuple[str, str]]:
    """The OpenVINO runners a bundle has: name -> (ONNX file, precision hint). Each ONNX
    model as its file is (f32 compute; an int8 file runs its int8 ops), and model.onnx in
    bf16 as well (`openvino-bf16`)."""
    from .bundle import ONNX_FILE

    runners = {bundle.runner_name(file).replace("onnxruntime", "openvino", 1): (file, "f32")
               for file in bundle.onnx_models}
    if ONNX_FILE in bundle.onnx_models:
        runners["openvino-bf16"] = (ONNX_FILE, "bf16")
    return runners


# Peers: ways to run the bundle's model that are not files of the bundle, timed beside it by
# `bench --peers` -> the tolerance profile they are checked against eager with.
PEERS = {"eager-amp": "fp16", "torch-compile": "fp32", "torch-compile-amp": "fp16",
         "cuda-graph": None}  # cuda-graph: every ONNX runner again, by its file's profile
CUDA_PEERS = ("eager-amp", "torch-compile-amp", "cuda-graph")
COMPILE_MODE = "max-autotune"
COMPILE_SHAPES = 64  # input shapes one torch.compile'd peer may compile
CUDA_GRAPH_SUFFIX = "+cuda-graph"


def check_peers(peers: Sequence[str]) -> None:
    """Every name one of PEERS, or ConfigError naming the first that is not."""
    unknown = [p for p in peers if p not in PEERS]
    if unknown:
        raise ConfigError(f"unknown peer {unknown[0]!r}; choose from {', '.join(PEERS)}")


def peer_runners(peers: Sequence[str], eager: TorchRunner, onnx_files: dict[str, str],
                 bundle: "Bundle") -> list[Runner]:
    """The runners of `peers` (PEERS keys) beside `eager`: autocast fp16 eager, the module
    torch.compile'd (mode max-autotune, one graph per input shape; compiled at its first
    call), and each ONNX runner in `onnx_files` again with CUDA graphs."""
    check_peers(peers)
    cuda_only = [p for p in peers if p in CUDA_PEERS]
    if cuda_only and eager.device != "cuda":
        raise ProviderError(f"peer {cuda_only[0]} needs CUDA, and this run is on "
                            f"{eager.device}")
    runners: list[Runner] = []
    for peer in peers:
        if peer == "eager-amp":
            runners.append(TorchRunner(eager.module, peer, eager.device, eager.spec, "float16"))
        elif peer.startswith("torch-compile"):
            import torch

            module = torch.compile(eager.module, mode=COMPILE_MODE, dynamic=False)
            runners.append(TorchRunner(module, peer, eager.device, eager.spec,
                                       "float16" if peer.endswith("-amp") else None, True))
        elif not onnx_files:
            raise ConfigError("peer cuda-graph runs the ONNX models, and --backends chose none")
        else:
            runners += [OrtCudaGraphRunner(bundle.file(file), name + CUDA_GRAPH_SUFFIX,
                                           eager.spec) for name, file in onnx_files.items()]
    return runners


def open_runners(bundle: "Bundle", provider: str = DEFAULT_PROVIDER, *, tf32: bool = False,
                 threads: Optional[int] = None, include: Optional[Sequence[str]] = None,
                 openvino: bool = False, peers: Sequence[str] = (),
                 deferred: bool = False, trust_code: bool = False) -> RunnerSet:
    """Eager, the PyTorch artifacts (TorchScript, torch.export program, AOTInductor package)
    and every ONNX model of `bundle`, all on the device that ONNX Runtime really runs on for
    `provider` (an AOTInductor package compiled for another device is an error). `include` keeps eager plus the named runners.
    `openvino` adds OpenVINO's CPU runners (`openvino_runners`); they need the CPU, and the
    bf16 one a CPU with bf16 instructions (elsewhere it is left out, and a note says so,
    unless `include` names it: then that is an error). `peers` adds `peer_runners` last;
    `tf32` lets ONNX Runtime's CUDA provider compute fp32 MatMuls and convolutions in TF32
    (eager, the reference, stays in full fp32). `deferred`: every runner but eager is a
    `Deferred` one, opened at its first call (the first ONNX model is open already: it tells
    the device); each is checked as it opens. The files that can carry code (TorchScript,
    the program, the package: `CODE_RUNNERS`) open only where `include` names them or with
    `trust_code`; else a note says they were not run."""
    models = bundle.onnx_models
    names = {file: bundle.runner_name(file) for file in models}
    ov_runners = openvino_runners(bundle) if openvino else {}
    torch_files = bundle.torch_files
    known = ["eager"] + list(torch_files) + list(names.values()) + list(ov_runners)
    wanted = set(known if include is None else include)
    unknown = sorted(wanted - set(known))
    if unknown and not openvino and unknown[0] in openvino_runners(bundle):
        raise ConfigError(f"runtime {unknown[0]} is OpenVINO's: add --openvino")
    if unknown:
        raise ConfigError(f"no runtime {unknown[0]!r} in this bundle; it has "
                            f"{', '.join(known)}")
    main = bundle.main_onnx
    first = ort_runner(bundle.file(main), provider, tf32=tf32, threads=threads,
                       name=names[main])
    if first.device == "cuda" and not torch_cuda():
        raise ProviderError("ONNX Runtime runs on CUDA but PyTorch sees no CUDA device, and "
                            "eager PyTorch must run where ONNX Runtime does: install a CUDA "
                            "build of torch, or use --provider cpu")
    device = first.device  # the closures below hold this, never `first` (its weights)

    def session(file: str) -> OrtRunner:
        # every other ONNX model on the provider the first really got: no mixed devices
        opened = ort_runner(bundle.file(file), device, tf32=tf32, threads=threads,
                            name=names[file])
        check_fits(opened, bundle.io_shapes, file)
        return opened

    check_fits(first, bundle.io_shapes, main)
    others = [file for file in models if file != main and names[file] in wanted]
    torch_names = [name for name in torch_files if name in wanted]
    untrusted = [] if trust_code or include is not None else torch_names
    torch_names = [name for name in torch_names if name not in untrusted]
    runners: list[Runner] = [TorchRunner(
        bundle.load_eager().to(device), "eager", device,
        InputSpec.from_description(bundle.description.to_dict()))]
    if deferred:
        def torch_file(name: str) -> Callable[[], Runner]:
            return lambda: load_torch_file(name, bundle.file(torch_files[name]), device)

        from .bundle import WEIGHTS_FILE

        big = bundle.file(WEIGHTS_FILE).stat().st_size > RELEASE_ABOVE
        runners += [Deferred(name, device, torch_file(name), collect=big)
                    for name in torch_names]
        sessions = {main: Deferred(first.name, device, lambda: session(main), first, big)}
        sessions |= {file: Deferred(names[file], device, lambda file=file: session(file),
                                    collect=big) for file in others}
    else:
        runners += [load_torch_file(name, bundle.file(torch_files[name]), device)
                    for name in torch_names]
        sessions = {main: first} | {file: session(file) for file in others}
    runners += [s for file, s in sessions.items() if s.name in wanted]
    onnx_files = {s.name: file for file, s in sessions.items()}
    notes, computes = list(first.notes), {}
    if untrusted:
        notes.append(f"{', '.join(torch_files[n] for n in untrusted)} not run: a file that "
                     f"can carry code runs only with --trust-code (or named, as --runtime "
                     f"does)")
    wanted_ov = {name: v for name, v in ov_runners.items() if name in wanted}
    if wanted_ov and first.device != "cpu":
        raise ProviderError("OpenVINO runs on the CPU, and every runner must run where ONNX "
                            "Runtime does: use --provider cpu with OpenVINO")
    spec = InputSpec.from_description(bundle.description.to_dict())
    for name, (file, hint) in wanted_ov.items():
        try:
            runner = OpenVinoRunner(bundle.file(file), name, hint, threads, spec)
        except ProviderError as exc:
            if hint == "f32" or include is not None:
                raise
            notes.append(f"{name} left out: {exc}")
            continue
        runners.append(runner)
        onnx_files[name] = file
        if hint != "f32":
            computes[name] = hint
    ort_files = {s.name: file for file, s in sessions.items() if s.name in wanted}
    added = peer_runners(peers, runners[0], ort_files, bundle)
    return RunnerSet(first.device, provider, notes, runners + added, onnx_files, computes,
                     [r.name for r in added])


# ---------------------------------------------------------------- one runner by its name

AUTO = "auto"  # infer/serve --runtime auto: what `bench --record` measured fastest, validated
# Runners whose file can carry code: TorchScript runs its program, a torch.export graph may
# call any ATen op (torch.from_file maps a file), a package is a native library. They run
# only when named (--runtime, a file path) or trusted (--trust-code); never by auto.
CODE_RUNNERS = ("torchscript", "pt2", "aoti")
# The shape of a runner name (which ones a bundle has is `runner_names`)
RUNNER_NAME = r"eager|torchscript|pt2|aoti|openvino-bf16|(onnxruntime|openvino)(\[[^\]/]+\])?"
DEFAULT_RUNNER = "onnxruntime"  # model.onnx on ONNX Runtime
# What a model file (not a bundle) can run on, by its suffix; the first is its default.
FILE_RUNNERS = {".onnx": ("onnxruntime", "openvino", "openvino-bf16"), ".ts": ("torchscript",),
                ".pt2": ("pt2", "aoti")}


def runner_names(bundle: "Bundle") -> list[str]:
    """Every runner a bundle can open, as reports and `bench` name them: eager (its weights),
    its PyTorch artifacts, each ONNX model on ONNX Runtime and on OpenVINO, and model.onnx on
    OpenVINO in bf16."""
    return (["eager", *bundle.torch_files]
            + [bundle.runner_name(file) for file in bundle.onnx_models]
            + list(openvino_runners(bundle)))


def file_runner(path: Path) -> str:
    """The default runner of a model file: its suffix says, and a .pt2 file whether it is an
    AOTInductor package or a torch.export program."""
    fits = FILE_RUNNERS.get(path.suffix, ("torchscript",))
    if path.suffix == ".pt2" and path.is_file():
        from .pt2 import is_package

        return "aoti" if is_package(path) else "pt2"
    return fits[0]


def open_runner(model: str | os.PathLike, name: str = DEFAULT_RUNNER,
                provider: str = DEFAULT_PROVIDER, *, threads: Optional[int] = None) -> Runner:
    """Open one runner by its name (`runner_names`) on a bundle folder, or a model file
    (`FILE_RUNNERS`): the one way infer, serve and Ray Data open a model. Every ONNX graph
    must take and give what the description says (a foreign model.onnx is refused).
    `threads` sizes ONNX Runtime's (or OpenVINO's) pool, where several workers share cores."""
    from .bundle import ONNX_FILE, read_bundle, read_description

    model = Path(model)
    if model.is_dir():
        bundle = read_bundle(model)
        description, shapes = bundle.description, bundle.io_shapes
        onnx = {bundle.runner_name(file): file for file in bundle.onnx_models}
        openvino = {n: (bundle.file(file), hint) for n, (file, hint)
                    in openvino_runners(bundle).items()}
        torch_files = {n: bundle.file(file) for n, file in bundle.torch_files.items()}
        if name not in ("eager", *torch_files, *onnx, *openvino):
            flag = {"pt2": " (export --pt2)", "aoti": " (export --aoti)",
                    f"onnxruntime[{ONNX_FILE}]": " (model.onnx's runner is onnxruntime)",
                    f"openvino[{ONNX_FILE}]": " (model.onnx's runner is openvino)"}.get(name, "")
            raise BundleError(f"{bundle.path} has no runner {name} (it has "
                              f"{', '.join(runner_names(bundle))}){flag}")
        onnx = {n: bundle.file(file) for n, file in onnx.items()}
    else:
        fits = FILE_RUNNERS.get(model.suffix, ())
        if name not in fits:
            raise ConfigError(f"runner {name} cannot run {model}: a {model.suffix or 'plain'} "
                              f"file runs on {' or '.join(fits) or 'nothing we know'} (or "
                              f"give the bundle folder)")
        description = read_description(model)
        shapes = description.io_shapes
        onnx = {"onnxruntime": model}
        openvino = {n: (model, hint) for n, hint in (("openvino", "f32"),
                                                     ("openvino-bf16", "bf16"))}
        torch_files = {name: model} if model.suffix in (".ts", ".pt2") else {}
    spec = InputSpec.from_description(description.to_dict())
    if name in openvino:  # an ONNX file on OpenVINO's CPU plugin
        if provider == "cuda":
            raise ProviderError(f"--runtime {name} runs on the CPU; --provider cuda cannot be "
                                f"honoured")
        path, hint = openvino[name]
        return OpenVinoRunner(path, name, hint, threads, spec)
    if name in onnx:
        session = ort_runner(onnx[name], provider, threads=threads, name=name)
        check_fits(session, shapes, onnx[name].name)
        return session
    device = "cuda" if provider == "cuda" else torch_device(provider)  # cuda, no GPU: error
    if name == "eager":
        return TorchRunner(bundle.load_eager().to(device), "eager", device, spec)
    return load_torch_file(name, torch_files[name], device)


def resolve_runner(model: str | os.PathLike, name: Optional[str], provider: str,
                   batch_size: int) -> tuple[str, Optional[str]]:
    """What `--runtime` means for `model`: a runner name stays itself; None is model.onnx on
    ONNX Runtime (a model file: what it is); auto is `choose_runner`. Returns (runner name,
    why, where performance.json said anything)."""
    if name == AUTO:
        return choose_runner(model, provider, batch_size)
    if name is None:
        model = Path(model)
        return (DEFAULT_RUNNER if model.is_dir() else file_runner(model)), None
    return name, None


def choose_runner(model: str | os.PathLike, provider: str, batch_size: int
                  ) -> tuple[str, Optional[str]]:
    """`--runtime auto`: the runner `bench --record` measured fastest at the recorded batch
    size nearest `batch_size` (the largest not above it, else the smallest), when it is still
    validated by parity.json on this device and was measured on this device and CPU; else
    model.onnx on ONNX Runtime. Returns (runner name, why: None where no performance.json
    says anything)."""
    from .bundle import (
        PERFORMANCE_FILE,
        read_bundle,
        read_performance,
        validated_device,
        validated_runners,
    )

    model = Path(model)
    if not model.is_dir():  # a model file; or a bundle on a cluster, not here to read
        return (file_runner(model) if model.suffix in FILE_RUNNERS else DEFAULT_RUNNER), None
    path = model / PERFORMANCE_FILE
    if not path.exists() and not path.is_symlink():  # a dangling link: read, and said
        return DEFAULT_RUNNER, None
    record = read_performance(path)
    fastest = record["fastest_validated"]
    batches = sorted(fastest)
    if not batches:
        return DEFAULT_RUNNER, f"{PERFORMANCE_FILE} recommends nothing"
    batch = max((b for b in batches if b <= batch_size), default=batches[0])
    chosen = fastest[batch]["backend"]
    device = "cuda" if provider == "cuda" or (provider == "auto" and cuda_problem() is None) \
        else "cpu"
    here = cpu_isa().model
    bundle = read_bundle(model)
    problem = None
    if record["device"] != device:
        problem = f"it was measured on {record['device']} and this run is on {device}"
    elif device == "cpu" and record["cpu"] != here:
        problem = f"it was measured on {record['cpu']}, and this CPU is {here}"
    elif record.get("files") != bundle.hashes:
        problem = "it timed other files than the bundle holds now"
    elif chosen in CODE_RUNNERS:
        problem = (f"{chosen} runs a file that can carry code, which auto never picks "
                   f"(--runtime {chosen} runs it)")
    elif chosen not in runner_names(bundle):
        problem = f"the bundle has no {chosen} now"
    elif chosen not in validated_runners(bundle):
        problem = f"parity.json does not show {chosen} validated"
    elif chosen != "eager" and (proved := validated_device(bundle)) != device:
        problem = (f"parity.json proved the bundle on {proved or 'no device it names'} and "
                   f"this run is on {device} (export it with --provider {device})")
    if problem:
        return DEFAULT_RUNNER, f"{PERFORMANCE_FILE} names {shown(chosen)}, but {problem}"
    return chosen, f"{PERFORMANCE_FILE}'s fastest validated at batch {batch}"
