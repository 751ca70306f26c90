"""From a model and inputs to answers: top-k labels with probabilities, or embeddings.

One path for every way of asking: `infer` in one process, the Ray Serve deployment and the
Ray Data pipeline all build a `Classifier` and call it on batches, so the same input gives
the same answer, to the last digit, whichever of them ran it.
"""
from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any, Optional

import numpy as np

from .. import bundle as B
from .. import runtime as rt
from ..choosing import resolve_runner
from ..errors import InputError, OptionError, VitExportError, param, within
from ..images import iter_inputs, load_image_bytes, resize_cost


def refuse_non_finite(array: np.ndarray, names: Sequence[str], what: str) -> None:
    """NaN or infinity in an input or in the model's output is an error, never an answer."""
    bad = [name for name, row in zip(names, array) if not np.isfinite(row).all()]
    if bad:
        more = f" and {len(bad) - 1} more" if len(bad) > 1 else ""
        raise InputError(f"{bad[0]}{more}: non-finite values in the model's {what}")


# model.e2e.onnx takes images as they are, photos of millions of pixels among them, and its
# graph makes a float copy four times their size to resize: so at most this much of them
# (uint8, each counted at the larger of itself and its resize: a 1x1 image costs as much as
# its resize square) runs at once, whatever the batch size, or one image where one is
# larger. Four photos of 6000x5000 in one run of infer peaked at 3.46 GB; a run each, at
# 1.82 GB.
RAW_RUN_BYTES = 64 << 20


class _Opened:
    """A model opened once (sha256s checked, provider verified), asked many times; one of
    its outputs must be `kind` ("logits" or "embedding", config.output_names)."""
    kind = ""

    def __init__(self, model: str | os.PathLike | B.Bundle | B.ModelFile,
                 provider: str = rt.DEFAULT_PROVIDER, runtime: Optional[str] = None,
                 threads: Optional[int] = None, batch_size: int = 1):
        """`model`: a path, read here, or what `bundle.read_model` read already (the
        bundle is read once per process). `runtime`: a runner name
        (`runtime.runner_names`); None, model.onnx on ONNX Runtime (a model file: what it
        is); "auto", `choosing.choose_runner` for batches of `batch_size`, with the reason in
        `chosen_by` (`choosing.resolve_runner`)."""
        opened = model if isinstance(model, (B.Bundle, B.ModelFile)) else B.read_model(model)
        self.model = opened.path
        self.description = opened.description
        config = self.description.config
        if self.kind not in config.output_names:
            raise VitExportError(_mismatch(self.model, config, self.kind))
        runtime, self.chosen_by = resolve_runner(opened, runtime, provider, batch_size)
        self.runner = rt.open_runner(opened, runtime, provider, threads=threads)
        self.labels = self.description.labels
        spec = getattr(self.runner, "spec", None)
        # model.e2e.onnx: uint8 images as they are, preprocessed in its graph (on the GPU
        # where it runs there: a quarter of the float input's bytes to copy at the model's size)
        self.takes_images = bool(spec is not None and spec.images)

    def inputs(self, files: Iterable[Path]) -> Iterator[tuple[str, np.ndarray]]:
        """(name, array) of each input file as this runner takes it (`images.iter_inputs`)."""
        return iter_inputs(files, self.description.preprocessing, raw=self.takes_images)

    def decode(self, data: bytes, name: str) -> np.ndarray:
        """An encoded image held in memory as this runner takes it (`load_image_bytes`)."""
        return load_image_bytes(data, name, self.description.preprocessing,
                                raw=self.takes_images)

    def run(self, names: Sequence[str], arrays: Sequence[np.ndarray]) -> np.ndarray:
        """The model's output `kind` [N, K] for the inputs, every value finite (images of
        several sizes, for model.e2e.onnx, run in runs of one size)."""
        return np.concatenate([out for _, out in self.stream([(names, arrays)])])

    def run_encoded(self, names: Sequence[str], images: Sequence[bytes],
                    sizes: Sequence[tuple[int, int]]) -> np.ndarray:
        """`run` on encoded images, each decoded as `decode` does, `sizes` their (width,
        height) from their headers. For model.e2e.onnx, whose images are held as they are,
        they are decoded a run at a time as the model takes them (`RAW_RUN_BYTES`), so a
        request's images are never all held at once; other runners take each at the
        model's size, decoded one after another."""
        if not self.takes_images:
            return self.run(names, [self.decode(data, name) for name, data in
                                    zip(names, images)])
        runs = _runs(names, range(len(images)), RAW_RUN_BYTES, shape=lambda i: sizes[i],
                     cost=lambda i: self._held(sizes[i]))
        return np.concatenate([out for _, out in self.stream(
            ([name for name, _ in run], [self.decode(images[i], name) for name, i in run])
            for run in runs)])

    def _held(self, size: tuple[int, int]) -> int:
        """The bytes an image of `size` (width, height) is held as in model.e2e.onnx's run:
        the larger of itself and its resize, uint8, in the model's channels."""
        return resize_cost(size, self.description.preprocessing) * \
            self.description.config.in_chans

    def stream(self, chunks: Iterable[tuple[Sequence[str], Sequence[np.ndarray]]]
               ) -> Iterator[tuple[Sequence[str], np.ndarray]]:
        """(names, output `kind` [N, K]) for each (names, arrays) chunk, in order (a chunk of
        images of several sizes, for model.e2e.onnx, in runs of one size); on a runner that
        stages host input (ONNX Runtime), chunk i + 1 is read and copied while chunk i runs
        (`runtime.stream`)."""
        names_in_flight: list[Sequence[str]] = []

        def batches() -> Iterator[np.ndarray]:
            for names, arrays in chunks:
                for group in _runs(names, arrays, RAW_RUN_BYTES if self.takes_images else None,
                                   cost=lambda a: self._held((a.shape[1], a.shape[0]))):
                    x = np.stack([array for _, array in group])
                    group_names = [name for name, _ in group]
                    refuse_non_finite(x, group_names, "input")
                    names_in_flight.append(group_names)
                    yield x

        for outputs in rt.stream(self.runner, batches()):
            names = names_in_flight.pop(0)
            yield names, self._checked(outputs[self.kind], names)

    def _checked(self, out: np.ndarray, names: Sequence[str]) -> np.ndarray:
        (width,) = self.description.config.output_shape(self.kind)
        if out.shape != (len(names), width):  # a TorchScript file records no shapes to check
            raise VitExportError(f"{self.model} gives {self.kind} of shape {list(out.shape)} "
                                 f"for {len(names)} inputs; its description says "
                                 f"{len(names)} x {width}")
        refuse_non_finite(out, names, "output")
        return out

    def records(self, names: Sequence[str], arrays: Sequence[np.ndarray],
                top_k: int = 5) -> list[dict[str, Any]]:
        """One record per input, as `infer --json` prints it."""
        return self.records_of(names, self.run(names, arrays), top_k)

    def stream_records(self, chunks: Iterable[tuple[Sequence[str], Sequence[np.ndarray]]],
                       top_k: int = 5) -> Iterator[list[dict[str, Any]]]:
        """`records` of each chunk, in order, as `stream` runs them."""
        for names, out in self.stream(chunks):
            yield self.records_of(names, out, top_k)

    def records_of(self, names: Sequence[str], out: np.ndarray,
                   top_k: int) -> list[dict[str, Any]]:
        raise NotImplementedError


def _runs(names: Sequence[str], arrays: Iterable[Any], most_bytes: Optional[int] = None,
          shape: Callable[[Any], Any] = np.shape,
          cost: Callable[[Any], int] = lambda array: array.nbytes
          ) -> Iterator[list[tuple[str, Any]]]:
    """The (name, array) pairs in runs of consecutive arrays of one `shape` (images of
    several sizes, for model.e2e.onnx, run apart); where `most_bytes` is given, a run of one
    shape whose arrays `cost` more is cut into the fewest runs within it (one array at
    least), as even as can be: 10 of 18 MB in 64 MiB are runs of 3, 3, 2, 2. The arrays may
    stand for images not decoded yet, with their `shape` and `cost` from their headers."""
    group: list[tuple[str, Any]] = []
    for name, array in zip(names, arrays):
        if group and shape(group[0][1]) != shape(array):
            yield from _even(group, most_bytes, cost)
            group = []
        group.append((name, array))
    if group:
        yield from _even(group, most_bytes, cost)


def _even(group: list[tuple[str, Any]], most_bytes: Optional[int], cost: Callable[[Any], int]
          ) -> Iterator[list[tuple[str, Any]]]:
    each = 0 if most_bytes is None else cost(group[0][1])
    fit = max(1, most_bytes // each) if each else len(group)
    runs = -(-len(group) // fit)
    start = 0
    for i in range(runs):
        end = start + len(group) // runs + (i < len(group) % runs)
        yield group[start:end]
        start = end


def _mismatch(model: Path, config, wanted: str) -> str:
    names = config.output_names
    if wanted == "logits" and "embedding" in names:
        return (f"{model} gives an embedding ({config.embedding_width} wide), not classes: "
                f"use {param('embed', True)}")
    if wanted == "embedding" and "logits" in names:
        return (f"{model} gives logits, not an embedding: export it with "
                f"{param('outputs', 'embedding')} "
                f"(the pooled features before its head), or logits,embedding for both")
    return (f"{model} gives {', '.join(names)}, not "
            f"{'classes' if wanted == 'logits' else 'an embedding'}")


@dataclasses.dataclass(frozen=True)
class InferOptions:
    """What `vit_export.infer` (`vit-export infer`) runs and where its answers go, by the
    command's names, checked when made (OptionError: the flags that go together only); the
    run is driven by it, here or on Ray Data. The defaults are the command's."""
    runtime: str = rt.AUTO  # a runner name, or auto
    provider: str = rt.DEFAULT_PROVIDER
    batch_size: int = 8
    top_k: int = 5
    embed: bool = False  # each input's embedding instead of classes
    output: Optional[Path] = None  # --embed's file, or --ray's records
    force: bool = False  # replace `output`
    ray: bool = False  # on Ray Data, resumable
    workers: int = 1  # Ray Data workers
    resume: bool = False  # continue an earlier run of the same records
    address: Optional[str] = None  # a Ray cluster to join

    def __post_init__(self) -> None:
        for name in ("batch_size", "top_k", "workers"):  # the flags' ranges
            within(name, getattr(self, name), 1, whole=True)
        if self.output is not None:
            object.__setattr__(self, "output", Path(self.output))
        self._check_ray_only()
        if self.force and self.output is None:
            raise OptionError(f"{param('force')} replaces {param('output')}; "
                              f"there is none")
        if self.force and self.resume:
            raise OptionError(f"{param('force')} starts over and {param('resume')} "
                              f"continues: give one")
        if self.ray and self.output is None:
            raise OptionError(f"{param('ray')} needs {param('output', 'FILE.jsonl')} for its "
                              f"records")
        if self.output is not None:
            self._check_output(self.output, self.output.suffix.lower())

    def _check_ray_only(self) -> None:
        """Options that apply to a run on Ray Data only."""
        ray_only = [flag for flag, given in (
            (param("output"), self.output and not self.embed),
            (param("resume"), self.resume), (param("workers"), self.workers != 1),
            (param("address"), self.address)) if given]
        if ray_only and not self.ray:
            raise OptionError(f"{ray_only[0]} applies to {param('ray')} only")

    def _check_output(self, output: Path, suffix: str) -> None:
        """The file kinds each run writes."""
        where = param("output", str(output))
        ray = param("ray", True)
        if self.ray and self.embed and suffix not in (".parquet", ".jsonl"):
            raise OptionError(f"{where}: {ray} {param('embed', True)} writes FILE.parquet "
                              f"(or JSON lines to FILE.jsonl)")
        if self.ray and not self.embed and suffix in (".parquet", ".npy"):
            raise OptionError(f"{where}: {ray} writes classes as JSON lines (FILE.jsonl); "
                              f"Parquet is for {param('embed', True)}")
        if not self.ray and suffix not in (".npy", ".parquet"):
            raise OptionError(f"{where}: embeddings are written as FILE.npy or FILE.parquet")


def open_model(model: str | os.PathLike, provider: str = rt.DEFAULT_PROVIDER,
               runtime: Optional[str] = None, threads: Optional[int] = None,
               batch_size: int = 1) -> "_Opened":
    """A Classifier where the model gives logits, else an Embedder (its embedding)."""
    opened = model if isinstance(model, (B.Bundle, B.ModelFile)) else B.read_model(model)
    names = opened.config.output_names
    return (Classifier if "logits" in names else Embedder)(opened, provider, runtime,
                                                           threads, batch_size)


def batched(items: Iterable[Any], size: int) -> Iterator[list[Any]]:
    """`items` in lists of `size` (the last may be shorter), as they come."""
    batch = []
    for item in items:
        batch.append(item)
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch


class Embedder(_Opened):
    """The embedding of each input, [N, D] float32 (normalised where the bundle says)."""
    kind = "embedding"

    def __call__(self, names: Sequence[str], arrays: Sequence[np.ndarray]) -> np.ndarray:
        return self.run(names, arrays).astype(np.float32, copy=False)

    def records_of(self, names: Sequence[str], out: np.ndarray,
                   top_k: int = 0) -> list[dict[str, Any]]:
        """{"input", "embedding"} per input."""
        return [{"input": name, "embedding": row.astype(np.float32, copy=False).tolist()}
                for name, row in zip(names, out)]


class Classifier(_Opened):
    """Top-k classes with probabilities."""
    kind = "logits"

    def __call__(self, names: Sequence[str], arrays: Sequence[np.ndarray],
                 top_k: int) -> list[dict[str, Any]]:
        """One result per input: {"input": name, "top": [{"class", "label", "prob"}, ...]},
        the k most probable classes first."""
        return self.records(names, arrays, top_k)

    def records_of(self, names: Sequence[str], logits: np.ndarray,
                   top_k: int = 5) -> list[dict[str, Any]]:
        z = logits - logits.max(axis=1, keepdims=True)
        probs = np.exp(z) / np.exp(z).sum(axis=1, keepdims=True)
        results = []
        for name, p in zip(names, probs):
            top = np.argsort(-p)[:top_k]
            results.append({"input": name, "top": [
                {"class": int(i), "label": self.labels[i] if self.labels else str(int(i)),
                 "prob": float(p[i])} for i in top]})
        return results
