"""PyTorch runners: eager, TorchScript, a torch.export program and an AOTInductor package
(pt2 loads those two), each on one device. torch is imported where a runner is made or run,
so that naming or listing runners (the registry) does not load it."""
from __future__ import annotations

import contextlib
import io
import os
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import numpy as np

from ..archives import open_zip, parse_description
from ..bundle import METADATA_KEY
from ..errors import BundleError, ProviderError, first_line, param
from ..verified import Loaded, read_once
from .base import (
    InputSpec,
    Runtime,
    Source,
    Target,
    check_real,
    shape_of,
    torch_cuda,
    torch_device,
)

COMPILE_SHAPES = 64  # input shapes one torch.compile'd peer may compile



@dataclass
class TorchRunner:
    """An eager, TorchScript or torch.compile'd module on one device; with `autocast`, run
    under torch.autocast in that dtype ("float16": mixed precision, as AMP serves); with
    `half`, a module in fp16 fed fp16 (as `.half()` serves). Outputs are fp32."""
    module: Any
    name: str
    device: str = "cpu"
    spec: Optional[InputSpec] = None  # checked on every call
    autocast: Optional[str] = None  # None: fp32 throughout
    compiled: bool = False  # a torch.compile'd module (on CUDA: CUDA graph steps)
    half: bool = False  # a module in fp16 (.half()): its input is cast to fp16

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

        from ..model import as_tuple

        if self.spec is not None:
            self.spec.check(shape_of(x))
        check_real(x)
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
            outs = self.module(x.to(self.device, torch.float16 if self.half else torch.float32))

        outs = tuple(o.float().clone() if self.compiled else o.float() for o in as_tuple(outs))
        return tuple(o.cpu().numpy() for o in outs) if host else outs


def load_torchscript(source: str | os.PathLike | Loaded, device: str = "cpu") -> TorchRunner:
    """model.ts as a runner on `device`, loaded from its bytes as read once (`source`: a
    bundle's file as `Bundle.read_file` checked it, or a path the caller named, read here)."""
    import torch

    loaded = _loaded(source, device, "TorchScript")
    path = loaded.path
    open_zip(loaded).close()  # laid out to be read one way by torch too, its sizes in budget
    extra = {f"{METADATA_KEY}.json": ""}
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)  # torch.jit's deprecation notice
            module = torch.jit.load(io.BytesIO(loaded.data), map_location=device,
                                    _extra_files=extra)
    except Exception as exc:  # torch raises RuntimeError subclasses of many kinds
        raise BundleError(f"cannot load TorchScript {path}: {first_line(exc)}") from None
    spec = InputSpec.from_description(parse_description(extra[f"{METADATA_KEY}.json"]))
    return TorchRunner(module.eval(), "torchscript", device, spec)


def load_torch_file(name: str, source: str | os.PathLike | Loaded, device: str = "cpu"
                    ) -> TorchRunner:
    """A bundle's PyTorch artifact by its runner name: "torchscript" (model.ts), "pt2" (a
    torch.export program) or "aoti" (an AOTInductor package; one compiled in fp16 is fed
    fp16, as its description says, and gives fp32). `source` is the file's bytes as read
    once (`Bundle.read_file`), or a path the caller named, read once here: every check and
    the loader read those bytes, never the path again."""
    if name == "torchscript":
        return load_torchscript(source, device)

    from .. import pt2  # torch: loaded where a program or package is

    loaded = _loaded(source, device, Path(getattr(source, "path", source)).name)
    if name == "pt2":
        module, description = pt2.load_program(loaded, device)
        return TorchRunner(module, name, device, InputSpec.from_description(description))
    module, description = pt2.load_package(loaded, device)
    return TorchRunner(module, name, device, InputSpec.from_description(description),
                       half=pt2.package_precision(description) == "fp16")


def _loaded(source: str | os.PathLike | Loaded, device: str, what: str) -> Loaded:
    """What every PyTorch artifact needs before it is loaded: its bytes, read once (a path
    is read here), and CUDA in PyTorch when it is to run there."""
    if device == "cuda" and not torch_cuda():
        raise ProviderError(f"requested CUDA for {what} but PyTorch sees no CUDA device")
    return source if isinstance(source, Loaded) else read_once(source)


def _open(name: str, target: Target, source: Source, provider: str, threads: Optional[int],
          tf32: bool) -> TorchRunner:
    """One PyTorch runner on the device for `provider` (cuda without a GPU: an error):
    eager from the source's weights, or an artifact from its bytes as the source read them."""
    device = "cuda" if provider == "cuda" else torch_device(provider)
    if name == "eager":
        return TorchRunner(source.load_eager().to(device), "eager", device, source.spec)
    return load_torch_file(name, source.read_file(target.file), device)


def _bundle_runners(bundle) -> dict[str, Target]:
    """Eager (the bundle's weights) first, then its artifacts: TorchScript, the torch.export
    program, the AOTInductor package."""
    return {"eager": Target(None)} | {name: Target(file)
                                      for name, file in bundle.torch_files.items()}


def _file_runners(path: Path) -> dict[str, Target]:
    return {name: Target(path.name) for name in FILES.get(path.suffix, ())}


# What a model file runs as, by its suffix (a .pt2 file: a program or a package)
FILES = {".ts": ("torchscript",), ".pt2": ("pt2", "aoti")}

RUNTIME = Runtime(
    name="pytorch", title="PyTorch", pattern=r"eager|torchscript|pt2|aoti", files=FILES,
    runners=_bundle_runners, file_runners=_file_runners, open=_open,
    # TorchScript runs its program, a torch.export graph may call any ATen op
    # (torch.from_file maps a file), a package is a native library
    code=("torchscript", "pt2", "aoti"),
    absent={"pt2": f" (export {param('pt2', True)})",
            "aoti": f" (export {param('aoti', True)})"})
