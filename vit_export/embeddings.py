"""Embeddings written for what reads them next: NumPy (an [N, D] array, the input order in a
JSON list beside it) or Parquet (columns `input` and `embedding`, the table a vector store or
Ray Data loads). Each file is written whole, under a temporary name, then renamed.
"""
from __future__ import annotations

import io
import json
import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from . import bundle as B
from .errors import VitExportError, param

FORMATS = (".npy", ".parquet")
PARQUET_NEEDS = "pip install pyarrow (or vit-export[serve], which has it)"


def check_format(path: Path) -> None:
    """One line for an --output whose suffix we do not write."""
    if path.suffix.lower() not in FORMATS:
        raise VitExportError(f"{param('output', str(path))}: embeddings are "
                             f"written as FILE.npy or "
                             f"FILE.parquet")
    if path.suffix.lower() == ".parquet":
        _pyarrow()


def inputs_path(path: Path) -> Path:
    """Where FILE.npy's input order goes: FILE.inputs.json."""
    return path.with_name(path.name[: -len(path.suffix)] + ".inputs.json")


def written_files(path: Path) -> list[Path]:
    """The files `write` makes for `path`: FILE.npy with FILE.inputs.json, or FILE.parquet."""
    return [path, inputs_path(path)] if path.suffix.lower() == ".npy" else [path]


def write(path: Path, names: Sequence[str], embeddings: np.ndarray) -> list[Path]:
    """The embeddings [N, D] (float32) of the inputs `names`, in their order; the files
    written."""
    embeddings = np.ascontiguousarray(embeddings, dtype=np.float32)
    if path.suffix.lower() == ".npy":
        return _write_pair(path, names, embeddings)
    pa, pq = _pyarrow()
    width = embeddings.shape[1]
    column = pa.FixedSizeListArray.from_arrays(pa.array(embeddings.reshape(-1)), width)
    table = pa.table({"input": pa.array(list(names), pa.string()), "embedding": column})
    buffer = io.BytesIO()
    pq.write_table(table, buffer)
    B.atomic_write_bytes(path, buffer.getvalue())
    return [path]


def _write_pair(path: Path, names: Sequence[str], embeddings: np.ndarray) -> list[Path]:
    """FILE.npy and FILE.inputs.json, both staged whole beside them first; then the old
    FILE.npy goes, the order is renamed into place, and FILE.npy last: a FILE.npy that is
    there belongs to the FILE.inputs.json beside it."""
    # each followed where it is a symlink (the link stays), a folder or device refused, all
    # before anything on disk changes
    (path, through), (order, order_through) = (B.output_target(p)
                                               for p in (path, inputs_path(path)))
    if through or order_through:
        raise VitExportError(f"{path if through else order} is a device or FIFO; FILE.npy and "
                             f"FILE.inputs.json are written as files")
    buffer = io.BytesIO()
    np.save(buffer, embeddings, allow_pickle=False)
    staged = [path.with_name(f".{p.name}.vx-staged") for p in (order, path)]
    try:
        B.atomic_write_json(staged[0], list(names))
        B.atomic_write_bytes(staged[1], buffer.getvalue())
        path.unlink(missing_ok=True)
        os.replace(staged[0], order)
        os.replace(staged[1], path)
    finally:
        for file in staged:
            file.unlink(missing_ok=True)
    return [path, order]


def read(path: str | os.PathLike) -> tuple[list[str], np.ndarray]:
    """The inputs and embeddings a `write` left at `path` (for tests and for users)."""
    path = Path(path)
    if path.suffix.lower() == ".npy":
        names = json.loads(inputs_path(path).read_text(encoding="utf-8"))
        return names, np.load(path, allow_pickle=False)
    pa, pq = _pyarrow()
    table = pq.read_table(path)
    column = table.column("embedding").combine_chunks()
    if not pa.types.is_fixed_size_list(column.type):
        raise ValueError(f"its embedding column is {column.type}, not fixed-size lists")
    width = column.type.list_size
    values = column.flatten().to_numpy(zero_copy_only=False).astype(np.float32)
    return table.column("input").to_pylist(), values.reshape(-1, width)


def _pyarrow():
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        raise VitExportError(f"writing Parquet needs pyarrow: {PARQUET_NEEDS}") from None
    return pa, pq
