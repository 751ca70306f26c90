"""performance.json, what `bench --record` writes into a bundle, read back: the device and
CPU it was measured on, the sha256s of the files it timed, and the fastest validated runner
at each batch size; checked as it is read, for `--runtime auto` (choosing.py)."""
from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any, Optional

from .bundle import FILE_HASHES
from .errors import BundleError
from .jsonio import read_json
from .schema import STRING, Kind, check_fields

BENCH_RECORD = Kind("an object with a string `backend`", lambda v: isinstance(v, dict)
                    and STRING.test(v.get("backend")) and v["backend"] != "")
PERFORMANCE_KINDS = {  # what infer and serve read of a performance.json
    "device": STRING, "cpu": STRING, "files": FILE_HASHES,
    "fastest_validated": Kind(
        "an object of batch sizes (1 to 1048576) -> {\"backend\": runner name}",
        lambda v: isinstance(v, dict) and all(
            re.fullmatch(r"[1-9][0-9]{0,6}", k) and int(k) <= 1 << 20 and BENCH_RECORD.test(r)
            for k, r in v.items()))}


# The most a performance.json may hold: the machine, the peaks and a record per batch size
# benched (about 60 bytes each), a few KiB
PERFORMANCE_BYTES = 1 << 20


def read_performance(path: str | os.PathLike, inside: Optional[str | os.PathLike] = None
                     ) -> dict[str, Any]:
    """A performance.json (`bench --record`): the device and CPU it was measured on, and
    `fastest_validated` as batch size (int) -> {"backend": runner name, ...}; or
    BundleError in one line. The one reader of it. `inside`: the bundle folder whose own
    record it is (a link out of it is refused)."""
    path = Path(path)
    record = read_json(path, PERFORMANCE_BYTES, inside=inside)
    check_fields(record, PERFORMANCE_KINDS, str(path), BundleError,
                 required=("device", "cpu", "fastest_validated"))
    return record | {"fastest_validated": {int(k): v for k, v
                                           in record["fastest_validated"].items()}}
