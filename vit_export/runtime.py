"""Running models: ONNX Runtime sessions with verified providers, and torch modules.

`create_session` only builds a session and checks which provider really runs it; calling a
runner only runs. onnxruntime-gpu lists CUDAExecutionProvider even on a machine without a GPU,
and a session asked for CUDA there silently runs on CPU: only `session.get_providers()` tells
the truth, so that is what we check.
"""
from __future__ import annotations

import os
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import numpy as np

from .errors import BundleError, ProviderError

PROVIDERS = {"cuda": "CUDAExecutionProvider", "cpu": "CPUExecutionProvider"}
PROVIDER_CHOICES = ("auto", "cuda", "cpu")


def set_torch_tf32(enabled: bool) -> None:
    """Parity runs compare full fp32: TF32 off on the PyTorch side."""
    import torch

    torch.backends.cuda.matmul.allow_tf32 = enabled
    torch.backends.cudnn.allow_tf32 = enabled


@dataclass
class OrtRunner:
    """An ONNX Runtime session whose provider has been verified."""
    session: Any
    requested: str  # auto | cuda | cpu
    provider: str  # the provider that really runs: cuda | cpu
    tf32: bool
    notes: list[str] = field(default_factory=list)  # why `auto` chose what it chose
    name: str = "onnxruntime"

    def cast_input(self, x: np.ndarray) -> np.ndarray:
        """float32 input, or float16 for a model whose input is fp16."""
        half = self.session.get_inputs()[0].type == "tensor(float16)"
        return np.ascontiguousarray(x, dtype=np.float16 if half else np.float32)

    def __call__(self, x: np.ndarray) -> np.ndarray:
        name = self.session.get_inputs()[0].name
        return self.session.run(None, {name: self.cast_input(x)})[0].astype(np.float32)

    @property
    def device(self) -> str:
        return self.provider


def _build(path: Path, provider: str, tf32: bool, threads: Optional[int]):
    import onnxruntime as ort

    # A CUDA provider that fails to load logs to stderr; we report it ourselves, as an error.
    ort.set_default_logger_severity(4)
    options = ort.SessionOptions()
    options.log_severity_level = 3
    if threads:  # explicit threads (benchmarks): one intra-op pool that spins between runs
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        options.add_session_config_entry("session.intra_op.allow_spinning", "1")
    chain: list[Any] = [PROVIDERS["cpu"]]
    if provider == "cuda":
        chain.insert(0, (PROVIDERS["cuda"], {"use_tf32": "1" if tf32 else "0"}))
    try:
        return ort.InferenceSession(str(path), sess_options=options, providers=chain)
    except Exception as exc:  # onnxruntime raises its own Fail/InvalidGraph/... types
        text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise BundleError(f"ONNX Runtime cannot load {path}: {text}") from None


def _actual(session) -> str:
    return "cuda" if session.get_providers()[0] == PROVIDERS["cuda"] else "cpu"


def create_session(path: str | os.PathLike, provider: str = "auto", *, tf32: bool = False,
                   threads: Optional[int] = None) -> OrtRunner:
    """Build a session on `provider` and verify it. `cuda` that runs on CPU is an error."""
    import onnxruntime as ort

    if provider not in PROVIDER_CHOICES:
        raise ProviderError(f"unknown provider {provider!r}; choose one of {PROVIDER_CHOICES}")
    path = Path(path)
    if not path.is_file():
        raise BundleError(f"{path} does not exist")
    available = ort.get_available_providers()
    notes = []
    if provider in ("cuda", "auto") and PROVIDERS["cuda"] in available:
        session = _build(path, "cuda", tf32, threads)
        actual = _actual(session)
        if actual == "cuda":
            return OrtRunner(session, provider, "cuda", tf32)
        if provider == "cuda":
            raise ProviderError(
                f"requested CUDAExecutionProvider but the session runs on "
                f"{session.get_providers()[0]} (no usable CUDA device or libraries)")
        notes.append("CUDAExecutionProvider is installed but did not start; running on CPU")
        return OrtRunner(session, provider, actual, tf32, notes)
    elif provider == "cuda":
        raise ProviderError(f"requested CUDAExecutionProvider but this onnxruntime only "
                            f"has {', '.join(available)}")
    else:
        notes.append("this onnxruntime has no CUDAExecutionProvider; running on CPU")
    session = _build(path, "cpu", tf32, threads)
    return OrtRunner(session, provider, _actual(session), tf32, notes)


@dataclass
class TorchRunner:
    """An eager or TorchScript module on one device, fed and returning numpy arrays."""
    module: Any
    device: str = "cpu"
    name: str = "torch"

    def __call__(self, x: np.ndarray) -> np.ndarray:
        import torch

        with torch.inference_mode():
            out = self.module(torch.from_numpy(np.ascontiguousarray(x, np.float32)).to(self.device))
        return out.float().cpu().numpy()


def torch_device(provider: str) -> str:
    """The torch device that matches a verified ONNX Runtime provider."""
    import torch

    return "cuda" if provider == "cuda" and torch.cuda.is_available() else "cpu"


def load_torchscript(path: str | os.PathLike, device: str = "cpu") -> TorchRunner:
    import torch

    path = Path(path)
    if not path.is_file():
        raise BundleError(f"{path} does not exist")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)  # torch.jit's deprecation notice
            module = torch.jit.load(str(path), map_location=device)
    except Exception as exc:  # torch raises RuntimeError subclasses of many kinds
        raise BundleError(f"cannot load TorchScript {path}: {str(exc).splitlines()[0]}") from None
    return TorchRunner(module.eval(), device, name="torchscript")
