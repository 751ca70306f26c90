"""What every runner shares: the Runner protocol, what a model takes (InputSpec), the
providers and devices, process-wide state set and restored (TF32, threads), whether CUDA
loads, memory released between big models, and a set of runners opened on one device."""
from __future__ import annotations

import contextlib
import ctypes
import gc
import logging
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, Protocol

from ..errors import InputError, param

log = logging.getLogger(__name__)
PROVIDERS = {"cuda": "CUDAExecutionProvider", "cpu": "CPUExecutionProvider"}
DEVICES = ("cuda", "cpu")
PROVIDER_CHOICES = ("auto",) + DEVICES
DEFAULT_PROVIDER = "auto"
# The most intra-op threads a run takes: more than any machine's cores, fewer than the
# thread count that kept a server from ever becoming ready (100,000)
MAX_THREADS = 1024


# torch's boolean and integer dtypes, as str(dtype) names them: real numbers to a runner, as
# its floating point ones are
TORCH_INTEGERS = frozenset(f"torch.{name}" for name in (
    "bool", "uint8", "int8", "int16", "int32", "int64", "uint16", "uint32", "uint64"))


def shape_of(x: Any) -> tuple:
    """A runner's input's shape: a numpy array's or a torch tensor's (anything with a shape
    and a dtype), else InputError naming what was given."""
    if not (hasattr(x, "shape") and hasattr(x, "dtype")):
        raise InputError(f"input of type {type(x).__name__}: expected a numpy array or a "
                         f"torch tensor")
    return tuple(x.shape)


def check_real(x: Any) -> None:
    """A runner's input holds real numbers: booleans, integers or floats (a numpy array's
    kinds b, i, u, f; a torch tensor's own), else InputError naming its dtype. Every other
    kind failed its own way on its way to a model: a complex array was cut to its real part,
    an object or string array converted element by element, a timedelta64 array a TypeError
    of numpy's.

    Raises:
        InputError: the input is no array, or its dtype is not one of real numbers.
    """
    shape_of(x)  # an array or a tensor at all: also where no description checks its shape
    dtype = x.dtype
    kind = getattr(dtype, "kind", None)  # numpy's dtypes say their kind; torch's do not
    if kind is not None:
        real = kind in "biuf"
    else:
        real = not x.is_complex() and (x.is_floating_point() or str(dtype) in TORCH_INTEGERS)
    if not real:
        raise InputError(f"input of dtype {dtype}: expected real numbers")


class Runner(Protocol):
    """Runs one model: `runner(x)` gives its first output, `runner.run_all(x)` every output
    by name (logits, embedding, tokens: a bundle's outputs, in the order it declares)."""
    name: str
    device: str  # where it really runs: "cuda" or "cpu"

    def __call__(self, x: Any) -> Any: ...

    def run_all(self, x: Any) -> dict[str, Any]: ...


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
        if len(shape) == 4 and shape[0] == 0:
            raise InputError(f"input of shape {list(shape)}: an empty batch (no inputs)")
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
                             f"{self.size} only (export {param('dynamic_size', True)} for other sizes)")


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


def torch_cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def torch_device(provider: str) -> str:
    """The torch device for a provider request: cuda only when PyTorch sees a GPU."""
    return "cuda" if provider in ("cuda", "auto") and torch_cuda() else "cpu"


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


def freeze_imports() -> None:
    """For a command that owns its process, before its work: what the imports made (modules,
    classes, functions: some 400,000 objects once torch, ONNX and the exporters are loaded)
    is collected once, then put out of the garbage collector's reach for good (`gc.freeze`),
    so a collection (`release_memory`) walks only what the work made: 0.23 s each with them,
    microseconds without (measured). Never from the library, nor from a command run inside
    another program (a test's CliRunner): it would freeze its host's objects too."""
    import onnx  # noqa: F401 (imported for what they make)
    import onnxruntime  # noqa: F401
    import onnxscript  # noqa: F401 (the dynamo exporter's)
    import torch.export  # noqa: F401

    gc.collect()
    gc.freeze()


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


@dataclass(frozen=True)
class Target:
    """One runner a bundle or a model file has, as its runtime opens it: the file it runs
    (None: eager, the bundle's weights) and the runtime's own word for how (`how`: the
    precision OpenVINO's CPU plugin is asked for). `compute`: the precision it computes in
    where that is not its file's (reports judge it by that). `optional`: a runner this
    machine may be unable to run (bf16 on a CPU without bf16 instructions): left out with
    a note unless it is named."""
    file: Optional[str]
    how: Optional[str] = None
    compute: Optional[str] = None
    optional: bool = False


@dataclass(frozen=True)
class Source:
    """Where a runner's files come from, each read once and checked: a bundle's (against the
    sha256 config.json lists) or one model file's that the user named."""
    onnx_model: Callable[[str], Any]  # an ONNX file by name -> OnnxModel
    read_file: Callable[[str], Any]  # any other file by name -> verified.Loaded
    load_eager: Callable[[], Any]  # the eager module (a bundle's weights)
    spec: InputSpec
    io_shapes: tuple  # Description.io_shapes: what every graph must take and give


@dataclass(frozen=True)
class Runtime:
    """A runtime as the registry (`runtime.registry`) knows it: everything choosing,
    listing and opening a runner asks of it. A runtime module declares one of these, and
    the registry lists it once; nothing else names the runtime.

    `pattern` is the regular expression of the runner names it answers; `files` maps a
    model file's suffix to the runners that run such a file (the first is the file's
    default); `code` are the runners whose file can carry code (run only when named or
    trusted, never chosen by auto). `extra` is the module it needs that the package does
    not install, and `install` how to install it; an `opt_in` runtime's runners are opened
    with a bundle's others only when asked for. `cpu_only`: it runs on the CPU alone.
    `defer`: its runners may be opened at their first call (`Deferred`). `absent` says,
    for a runner name a bundle lacks, what would have made it.

    `runners(bundle)` are a bundle's runners: name -> Target, in the order reports list
    them; `file_runners(path)` a model file's; `open(name, target, source, provider,
    threads, tf32)` opens one on `provider` ("auto", "cuda" or "cpu": for a set of
    runners, the device its first ONNX Runtime session really got)."""
    name: str
    title: str
    pattern: str
    files: dict[str, tuple[str, ...]]
    runners: Callable[[Any], dict[str, Target]]
    file_runners: Callable[[Path], dict[str, Target]]
    open: Callable[..., Runner]
    code: tuple[str, ...] = ()
    extra: Optional[str] = None
    install: Optional[str] = None
    opt_in: bool = False
    cpu_only: bool = False
    defer: bool = True
    absent: dict[str, str] = field(default_factory=dict)

    def installed(self) -> bool:
        """Whether the module it needs is installed (found, not imported: no cost)."""
        import importlib.util

        return self.extra is None or importlib.util.find_spec(self.extra) is not None
