"""From a model and inputs to answers: top-k labels with probabilities, or embeddings.

One path for every way of asking: `infer` in one process, the Ray Serve deployment and the
Ray Data pipeline all build a `Classifier` and call it on batches, so the same input gives
the same answer, to the last digit, whichever of them ran it.
"""
from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Optional

import numpy as np

from . import bundle as B
from . import runtime
from .errors import BundleError, InputError, ProviderError, VitExportError


def refuse_non_finite(array: np.ndarray, names: Sequence[str], what: str) -> None:
    """NaN or infinity in an input or in the model's output is an error, never an answer."""
    bad = [name for name, row in zip(names, array) if not np.isfinite(row).all()]
    if bad:
        more = f" and {len(bad) - 1} more" if len(bad) > 1 else ""
        raise InputError(f"{bad[0]}{more}: non-finite values in the model's {what}")


# What `infer --runtime` can run: a bundle's model.onnx (or the ONNX file given) on ONNX
# Runtime or on OpenVINO (f32, or bf16 compute), or one of its PyTorch files: TorchScript,
# the torch.export program, the AOTInductor package.
OPENVINO_RUNTIMES = {"openvino": "f32", "openvino-bf16": "bf16"}
TORCH_RUNTIMES = {"torchscript": B.TS_FILE, "pt2": B.PT2_FILE, "aoti": B.AOTI_FILE}
RUNTIMES = ("onnx", *TORCH_RUNTIMES, *OPENVINO_RUNTIMES)


def open_runner(model: Path, provider: str, runtime_name: str, description: B.Description,
                threads: Optional[int] = None):
    """A bundle's ONNX or PyTorch model (`runtime_name`), or a model file. An ONNX graph must take and give
    what the description says (a foreign model.onnx is refused). `threads` sizes ONNX
    Runtime's (or OpenVINO's) pool (several workers on one machine share its cores)."""
    if model.is_dir():
        found = B.read_bundle(model)
        model = found.file(TORCH_RUNTIMES.get(runtime_name, B.ONNX_FILE))
        if not model.is_file():
            flag = {"torchscript": "", "pt2": " (export --pt2)", "aoti": " (export --aoti)"}
            raise BundleError(f"{found.path} has no {model.name}"
                                f"{flag.get(runtime_name, '')}")
    if runtime_name in OPENVINO_RUNTIMES:  # an ONNX file on OpenVINO's CPU plugin
        if provider == "cuda":
            raise ProviderError(f"--runtime {runtime_name} runs on the CPU; --provider cuda "
                                f"cannot be honoured")
        spec = runtime.InputSpec.from_description(description.to_dict())
        return runtime.OpenVinoRunner(model, runtime_name, OPENVINO_RUNTIMES[runtime_name],
                                      threads, spec)
    if model.suffix == ".onnx":
        session = runtime.create_session(model, provider, threads=threads)
        runtime.check_fits(session, description.io_shapes, model.name)
        return session
    device = "cuda" if provider == "cuda" else runtime.torch_device(provider)
    # cuda without a GPU: an error
    return runtime.load_torch_file(runtime_name if runtime_name in TORCH_RUNTIMES
                                   else "torchscript", model, device)


class _Opened:
    """A model opened once (sha256s checked, provider verified), asked many times; one of
    its outputs must be `kind` ("logits" or "embedding", config.output_names)."""
    kind = ""

    def __init__(self, model: str | os.PathLike, provider: str = runtime.DEFAULT_PROVIDER,
                 runtime_name: str = "onnx", threads: Optional[int] = None):
        self.model = Path(model)
        self.description = B.read_description(self.model)
        config = self.description.config
        if self.kind not in config.output_names:
            raise VitExportError(_mismatch(self.model, config, self.kind))
        self.runner = open_runner(self.model, provider, runtime_name, self.description, threads)
        self.labels = self.description.labels

    def run(self, names: Sequence[str], arrays: Sequence[np.ndarray]) -> np.ndarray:
        """The model's output `kind` [N, K] for the inputs, every value finite."""
        x = np.stack(arrays)
        refuse_non_finite(x, names, "input")
        out = self.runner.run_all(x)[self.kind]
        (width,) = self.description.config.output_shape(self.kind)
        if out.shape != (len(x), width):  # a TorchScript file records no shapes to check
            raise VitExportError(f"{self.model} gives {self.kind} of shape {list(out.shape)} "
                                 f"for {len(x)} inputs; its description says {len(x)} x "
                                 f"{width}")
        refuse_non_finite(out, names, "output")
        return out


def _mismatch(model: Path, config, wanted: str) -> str:
    names = config.output_names
    if wanted == "logits" and "embedding" in names:
        return (f"{model} gives an embedding ({config.embedding_width} wide), not classes: "
                f"use infer --embed")
    if wanted == "embedding" and "logits" in names:
        return (f"{model} gives logits, not an embedding: export it with --outputs embedding "
                f"(the pooled features before its head), or logits,embedding for both")
    return (f"{model} gives {', '.join(names)}, not "
            f"{'classes' if wanted == 'logits' else 'an embedding'}")


def open_model(model: str | os.PathLike, provider: str = runtime.DEFAULT_PROVIDER,
               runtime_name: str = "onnx", threads: Optional[int] = None) -> "_Opened":
    """A Classifier where the model gives logits, else an Embedder (its embedding)."""
    names = B.read_description(Path(model)).config.output_names
    return (Classifier if "logits" in names else Embedder)(model, provider, runtime_name,
                                                           threads)


class Embedder(_Opened):
    """The embedding of each input, [N, D] float32 (normalised where the bundle says)."""
    kind = "embedding"

    def __call__(self, names: Sequence[str], arrays: Sequence[np.ndarray]) -> np.ndarray:
        return self.run(names, arrays).astype(np.float32, copy=False)


class Classifier(_Opened):
    """Top-k classes with probabilities."""
    kind = "logits"

    def __call__(self, names: Sequence[str], arrays: Sequence[np.ndarray],
                 top_k: int) -> list[dict[str, Any]]:
        """One result per input: {"input": name, "top": [{"class", "label", "prob"}, ...]},
        the k most probable classes first."""
        logits = self.run(names, arrays)
        z = logits - logits.max(axis=1, keepdims=True)
        probs = np.exp(z) / np.exp(z).sum(axis=1, keepdims=True)
        results = []
        for name, p in zip(names, probs):
            top = np.argsort(-p)[:top_k]
            results.append({"input": name, "top": [
                {"class": int(i), "label": self.labels[i] if self.labels else str(int(i)),
                 "prob": float(p[i])} for i in top]})
        return results
