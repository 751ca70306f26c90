"""A run kept on disk (`validate --save-outputs FILE`): an .npz of plain arrays, described by
one JSON text stored as a string array (`run.json`), read back by `load_run` with pickling
off and every field and array checked at the boundary. A saved run is data: loading one
never runs anything.

run.json: `format` "vit-export-run", `format_version` 1; the bundle's path and the sha256 of
its files; the provider requested and the device the runners ran on, TF32, the seed, the
threads, the batch and image sizes, the export batch, the model's outputs, versions and
notes; `runners`, each runner's name, device, profile and reference (null: a reference);
`sets` (tensors) and `image_sets` (model.e2e.onnx's uint8 images), each set's name, whether
it is real data, its sha256 (`runs.input_digest`), the keys of its input arrays and labels,
and `outputs`: runner -> output name -> the key of its array.
"""
from __future__ import annotations

import io
import json
import os
from pathlib import Path
from typing import Any, Optional

import numpy as np

from .. import bundle as B
from ..errors import SavedRunError, first_line, shown
from ..images import not_an_npz
from ..runtime import DEVICES
from ..schema import (
    BOOLEAN,
    INTEGER,
    OBJECT,
    STRING,
    check_fields,
    integer,
    list_of,
    object_of,
    one_of,
)
from .inputs import ImageSet, InputSet
from .runs import Outputs, RunnerRecord, RunResult, set_digest
from .tolerance import PROFILES

FORMAT = "vit-export-run"
FORMAT_VERSION = 1
META = "run.json"  # the entry holding the description: a 0-d unicode array
# The most bytes run.json's entry may take decompressed: 16 Mi characters at numpy's 4 bytes
# each, where it holds a key per array and the bundle's sha256s, some KiB (100 sets of 20
# runners' 3 outputs: 0.2 MiB); read whole, so a bigger one is refused before it is
META_BYTES = 64 << 20

KEYS = object_of(object_of(STRING).named("an object of array keys"))
RUNNER_KINDS = {"name": STRING, "device": one_of(*DEVICES), "profile": one_of(*PROFILES),
                "reference": STRING.or_null()}
SET_KINDS = {"name": STRING, "real": BOOLEAN, "sha256": STRING,
             "inputs": list_of(STRING, 1), "labels": STRING.or_null(),
             "outputs": KEYS.named("an object of runner -> output -> array key")}
RUN_KINDS = {
    "format": one_of(FORMAT), "format_version": one_of(FORMAT_VERSION), "bundle": STRING,
    "files": object_of(STRING).named("an object mapping file names to sha256 strings"),
    "provider_requested": STRING, "device": one_of(*DEVICES), "tf32": BOOLEAN,
    "seed": INTEGER, "threads": integer(1).or_null(), "batch_sizes": list_of(integer(1)),
    "image_sizes": list_of(list_of(integer(1), 2, 2)), "export_batch": integer(1),
    "output_names": list_of(STRING, 1), "runners": list_of(OBJECT, 1),
    "sets": list_of(OBJECT), "image_sets": list_of(OBJECT),
    "notes": list_of(STRING), "versions": object_of(STRING)}


def refuse_bundle_files(path: str | os.PathLike, bundle: str | os.PathLike) -> None:
    """A saved run goes beside a bundle, never over one of its files (nor inside it)."""
    target = Path(os.path.abspath(path)).resolve()
    folder = Path(os.path.abspath(bundle)).resolve()
    if target == folder or folder in target.parents:
        raise SavedRunError(f"{path} is in the bundle {bundle}: a saved run would overwrite "
                            f"or add to the bundle's own files")


def save_run(run: RunResult, path: str | os.PathLike) -> None:
    """`run` as an .npz at `path` (np.savez: arrays, and run.json as a string array), written
    to a temporary file and renamed into place; never into the bundle's folder."""
    refuse_bundle_files(path, run.bundle)
    arrays: dict[str, np.ndarray] = {}

    def key(prefix: str, array: np.ndarray) -> str:
        name = f"{prefix}{len(arrays)}"
        arrays[name] = np.asarray(array)
        return name

    def entry(s: InputSet | ImageSet, row: dict[str, dict[str, np.ndarray]]) -> dict[str, Any]:
        inputs = [s.x] if isinstance(s, InputSet) else s.images
        return {"name": s.name, "real": s.real, "sha256": set_digest(s),
                "inputs": [key("input", a) for a in inputs],
                "labels": None if s.labels is None else key("labels", s.labels),
                "outputs": {runner: {output: key("output", values)
                                     for output, values in by_output.items()}
                            for runner, by_output in row.items()}}

    meta = {"format": FORMAT, "format_version": FORMAT_VERSION, "bundle": run.bundle,
            "files": run.files, "provider_requested": run.provider_requested,
            "device": run.device, "tf32": run.tf32, "seed": run.seed, "threads": run.threads,
            "batch_sizes": run.batch_sizes, "image_sizes": run.image_sizes,
            "export_batch": run.export_batch, "output_names": run.output_names,
            "runners": [{"name": r.name, "device": r.device, "profile": r.profile,
                         "reference": r.reference} for r in run.runners],
            "sets": [entry(s, row) for s, row in zip(run.sets, run.outputs)],
            "image_sets": [entry(s, row) for s, row in zip(run.image_sets, run.image_outputs)],
            "notes": run.notes, "versions": run.versions}
    arrays[META] = np.array(json.dumps(meta, allow_nan=False))
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    B.atomic_write_bytes(path, buffer.getbuffer())


def load_run(path: str | os.PathLike) -> RunResult:
    """A run `save_run` wrote, checked: run.json's every field, each array named there (its
    kind and shape), each set's sha256, and which runners each set's outputs hold. Anything
    else is SavedRunError, one line; nothing is unpickled."""
    path = Path(path)
    where = str(path)
    if not path.is_file():  # a FIFO would block np.load forever
        raise SavedRunError(f"{where} does not exist" if not path.exists() else
                            f"{where} is not a regular file")
    try:
        what = not_an_npz(path)
    except OSError as exc:
        raise SavedRunError(f"cannot read {where}: {exc.strerror}") from None
    if what:  # np.load would take it for a .npy or a pickle (refused, unread)
        raise SavedRunError(f"{where} is not a saved run: {what} (a saved run is an .npz, "
                            f"read without unpickling)")
    try:
        with np.load(path, allow_pickle=False) as data:
            return _parse(_Arrays(data, where), where)
    except SavedRunError:
        raise
    except Exception as exc:  # zipfile, zlib, numpy's format errors; object arrays refused
        raise SavedRunError(f"{where} is not a saved run: cannot read it as .npz: "
                            f"{type(exc).__name__}: {first_line(exc, 'damaged')}") from None


class _Arrays:
    """An open .npz's arrays, each read when first asked for: only those run.json names are
    ever decompressed (an unnamed one of 1 MB could inflate to 1 GB)."""

    def __init__(self, data, where: str) -> None:
        self.data, self.where, self.read = data, where, {}
        self.names = set(data.files)

    def __contains__(self, key: str) -> bool:
        return key in self.names

    def size(self, key: str) -> int:
        """The bytes the array `key` takes once decompressed, as its zip entry declares them
        (zipfile reads no more than that)."""
        entries = self.data.zip  # numpy's NpzFile keeps its zipfile.ZipFile here
        member = key if key in entries.namelist() else f"{key}.npy"
        return entries.getinfo(member).file_size

    def __getitem__(self, key: str) -> np.ndarray:
        if key not in self.read:
            try:
                self.read[key] = self.data[key]
            except Exception as exc:  # a damaged member, an object array (refused)
                raise SavedRunError(f"{self.where} is not a saved run: cannot read its array "
                                    f"{shown(key[:40])}: {type(exc).__name__}: "
                                    f"{first_line(exc, 'damaged')}") from None
        return self.read[key]


def _printable(value: Any) -> Any:
    """A saved run's texts (names, notes, versions, file names) as they may be printed: a
    line break or control character in one would forge a line or break JUnit's XML."""
    if isinstance(value, str):
        return shown(value)
    if isinstance(value, list):
        return [_printable(v) for v in value]
    if isinstance(value, dict):
        return {_printable(k): _printable(v) for k, v in value.items()}
    return value


def _parse(arrays: _Arrays, where: str) -> RunResult:
    """The RunResult an open saved run holds (load_run)."""
    if META not in arrays:
        raise SavedRunError(f"{where} is not a saved run: it has no {META} text")
    if arrays.size(META) > META_BYTES:
        raise SavedRunError(f"{where} is not a saved run: its {META} takes "
                            f"{arrays.size(META)} bytes, more than {META_BYTES}")
    meta = arrays[META]
    if meta.dtype.kind != "U" or meta.ndim != 0:
        raise SavedRunError(f"{where} is not a saved run: it has no {META} text")
    values = B.parse_json(str(meta), f"{where}: {META}", SavedRunError)
    check_fields(values, RUN_KINDS, f"{where}: {META}", SavedRunError,
                 required=list(RUN_KINDS))
    values = _printable(values)
    runners = [_runner(r, where) for r in values["runners"]]
    names = [r.name for r in runners]
    if len(set(names)) != len(names):
        raise SavedRunError(f"{where}: {META} names a runner twice")
    by_name = {r.name: r for r in runners}
    for r in runners:
        if r.reference is not None and (r.reference not in by_name
                                        or by_name[r.reference].reference is not None):
            raise SavedRunError(f"{where}: runner {r.name} is judged against "
                                f"{r.reference!r}, which is no reference of this run")
    sets, outputs = _sets(values["sets"], arrays, by_name, where, images=False)
    image_sets, image_outputs = _sets(values["image_sets"], arrays, by_name, where,
                                      images=True)
    if not sets:
        raise SavedRunError(f"{where}: {META} lists no input sets")
    unnamed = sorted(arrays.names - set(arrays.read))
    if unnamed:  # never read: refused, not decompressed
        raise SavedRunError(f"{where} is not a saved run: it holds arrays {META} does not "
                            f"name ({', '.join(shown(n[:40]) for n in unnamed[:3])})")
    return RunResult(
        bundle=values["bundle"], files=values["files"],
        provider_requested=values["provider_requested"], device=values["device"],
        tf32=values["tf32"], seed=values["seed"], threads=values["threads"],
        batch_sizes=values["batch_sizes"], image_sizes=values["image_sizes"],
        export_batch=values["export_batch"], output_names=values["output_names"],
        runners=runners, sets=sets, outputs=outputs, image_sets=image_sets,
        image_outputs=image_outputs, notes=values["notes"], versions=values["versions"])


def _runner(values: Any, where: str) -> RunnerRecord:
    check_fields(values, RUNNER_KINDS, f"{where}: {META}", SavedRunError, "runners[]",
                 required=list(RUNNER_KINDS))
    return RunnerRecord(values["name"], values["device"], values["profile"],
                        values["reference"])


# what each array may be: its dtype kinds (numpy's letters) and its ranks
ARRAYS = {"input": ("f", (4,), "4-d floats"), "image": ("u", (3,), "uint8 [H, W, C]"),
          "labels": ("iu", (1,), "1-d integers"),
          "output": ("f", (2, 3), "2-d or 3-d floats")}


def _array(arrays: _Arrays, key: str, where: str, what: str, kind: str,
           length: Optional[int] = None) -> np.ndarray:
    """The array `key` names, of its ARRAYS `kind` and, given one, `length` rows."""
    if key not in arrays:
        raise SavedRunError(f"{where}: {what}: no array {key[:40]!r} in the file")
    array = arrays[key]
    dtypes, ranks, shown = ARRAYS[kind]
    if array.dtype.kind not in dtypes or (kind == "image" and array.dtype != np.uint8) or \
            array.ndim not in ranks or (length is not None and len(array) != length):
        rows = f" of {length} rows" if length is not None else ""
        raise SavedRunError(f"{where}: {what} must be {shown}{rows}, got {array.dtype} "
                            f"{tuple(array.shape)}")
    if kind != "labels" and 0 in array.shape:  # no rows, classes or pixels to compare
        raise SavedRunError(f"{where}: {what} is empty: shape {tuple(array.shape)}")
    return array


def _sets(entries: list, arrays: _Arrays, runners: dict[str, RunnerRecord],
          where: str, images: bool) -> tuple[list, Outputs]:
    """The input sets of one kind (tensors, or model.e2e.onnx's images) and their outputs."""
    sets: list[InputSet | ImageSet] = []
    outputs: Outputs = []
    kind = "image_sets" if images else "sets"
    reference = None
    for i, values in enumerate(entries):
        what = f"{kind}[{i}]"
        check_fields(values, SET_KINDS, f"{where}: {META}", SavedRunError, what,
                     required=list(SET_KINDS))
        if images:
            pixels = [_array(arrays, k, where, f"{what} image", "image")
                      for k in values["inputs"]]
            n = len(pixels)
        else:
            if len(values["inputs"]) != 1:
                raise SavedRunError(f"{where}: {what}: one input array, got "
                                    f"{len(values['inputs'])}")
            x = _array(arrays, values["inputs"][0], where, f"{what} input", "input")
            n = len(x)
        labels = (None if values["labels"] is None else
                  _array(arrays, values["labels"], where, f"{what} labels", "labels", n))
        s = (ImageSet(values["name"], pixels, labels, values["real"]) if images else
             InputSet(values["name"], x, labels, real=values["real"]))
        if set_digest(s) != values["sha256"]:
            raise SavedRunError(f"{where}: {what} ({values['name']}): the inputs do not match "
                                f"their sha256 (damaged or modified)")
        row = {}
        for runner, by_output in values["outputs"].items():
            if runner not in runners:
                raise SavedRunError(f"{where}: {what}: outputs of {runner!r}, which is no "
                                    f"runner of this run")
            row[runner] = {output: _array(arrays, k, where, f"{what} {runner} {output}",
                                          "output", n) for output, k in by_output.items()}
        references = [r for r in row if runners[r].reference is None]
        if len(references) != 1 or (reference or references[0]) != references[0]:
            raise SavedRunError(f"{where}: {what}: its outputs must hold one reference, the "
                                f"same in every set of {kind}")
        reference = references[0]
        expected = {reference} | {r.name for r in runners.values() if r.reference == reference}
        if set(row) != expected:
            missing = sorted(expected ^ set(row))
            raise SavedRunError(f"{where}: {what}: the outputs of {', '.join(missing)} are "
                                f"missing or out of place")
        if not row[reference]:
            raise SavedRunError(f"{where}: {what}: the reference {reference} has no outputs")
        sets.append(s)
        outputs.append(row)
    return sets, outputs

