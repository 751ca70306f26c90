"""JSON out and in. Out: the one writer of the JSON this package makes (reports, --json,
config.json, performance.json, embeddings' order, Ray Data's records). Two spaces of indent,
or one line for JSON lines; NaN and the infinities, which JSON lacks (Python would write
`NaN`, which our own reader and most others refuse), are an error that names where they sit.
In: the one reader of a JSON file a command reads (`read_json`), held to a size its caller
states and read once, then parsed strictly (`parse_json`).
"""
from __future__ import annotations

import json
import math
import os
from typing import Any, Optional

from .errors import BundleError, NotJSONError, raw
from .verified import read_once

INDENT = 2


def dumps(data: Any, *, line: bool = False, what: Optional[str] = None) -> str:
    """`data` as JSON text: indented, or with `line` on one line (a record of JSON lines).
    A NaN or an infinity is a NotJSONError, one line naming `what` (the file) and where in
    `data` it is."""
    try:
        return json.dumps(data, indent=None if line else INDENT, allow_nan=False)
    except ValueError:
        found = _non_finite(data)
        if found is None:  # not ours to explain (a circular reference)
            raise
        where, value = found
        raise NotJSONError(f"cannot write {what or 'JSON'}: {where or 'the value'} is "
                           f"{value!r}, and JSON has no NaN or infinity") from None


def _non_finite(data: Any, where: str = "") -> Optional[tuple[str, float]]:
    """The first NaN or infinity in `data` and its place (`results[0].top[1].prob`)."""
    if isinstance(data, float):
        return None if math.isfinite(data) else (where, data)
    if isinstance(data, dict):
        items: Any = ((f"{where}.{key}" if where else str(key), value)
                      for key, value in data.items())
    elif isinstance(data, (list, tuple)):
        items = ((f"{where}[{i}]", value) for i, value in enumerate(data))
    else:
        return None
    return next((found for place, value in items
                 if (found := _non_finite(value, place)) is not None), None)


def _no_constant(name: str):
    raise ValueError(f"{name} is not JSON")


def _once_each(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """An object whose keys are each given once (json.loads' object_pairs_hook)."""
    found = dict(pairs)
    if len(found) != len(pairs):
        seen: set[str] = set()
        twice = next(key for key, _ in pairs if key in seen or seen.add(key))
        raise ValueError(f"the key {twice!r} is given twice in one object")
    return found


def parse_json(text: str | bytes, where: str, error: type[Exception] = BundleError,
               unique_keys: bool = True) -> Any:
    """Strict JSON from a file we read: NaN and Infinity (Python's extension) are refused, and
    so is nesting too deep to parse, each as one line naming `where`; with `unique_keys`, a
    key given twice in one object too (readers differ on which one counts: Python's takes
    the last). A framework's own file (a checkpoint's config.json) keeps Python's reading,
    which its framework shares: `unique_keys=False`."""
    try:
        return json.loads(text, parse_constant=_no_constant,
                          object_pairs_hook=_once_each if unique_keys else None)
    except RecursionError:
        raise error(f"{where} is nested too deeply to be a description") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise error(f"{where} is not valid JSON: {exc}") from None


def read_json(path: str | os.PathLike, limit: int, *, inside: Optional[str | os.PathLike] = None,
              error: type[Exception] = BundleError) -> Any:
    """The JSON file at `path`, parsed strictly (`parse_json`): a regular file of a fixed
    size of at most `limit` bytes, read once and never past `limit` + 1 bytes
    (`verified.read_once`). A FIFO or device that would never end, a file of /proc that
    says 0 bytes and reads on, and a file of gigabytes are refused before they are parsed.

    Args:
        path: the file (a symlink is followed).
        limit: the most bytes a file of its kind holds (each reader states its own).
        inside: a folder the file must really lie in: a bundle's own JSON files are its
            own, so one that is a link out of the folder is refused.
        error: the error class raised (BundleError, CheckpointError, ...).

    Returns:
        The parsed value.

    Raises:
        `error`: in one line naming the file.
    """
    try:
        loaded = read_once(path, limit=limit, inside=inside)
    except BundleError as exc:
        if error is BundleError:
            raise
        raise error(raw(exc)) from None
    return parse_json(loaded.data, str(path), error)
