"""JSON out: the one writer of the JSON this package makes (reports, --json, config.json,
performance.json, embeddings' order, Ray Data's records). Two spaces of indent,
or one line for JSON lines; NaN and the infinities, which JSON lacks (Python would write
`NaN`, which our own reader and most others refuse), are an error that names where they sit.
"""
from __future__ import annotations

import json
import math
from typing import Any, Optional

from .errors import NotJSONError

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
