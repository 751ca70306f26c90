"""What a parity.json proves, read back: the report validation writes (export into the
bundle, `validate --report`), checked as it is read, and what it proves of a bundle that
holds it: which runners agreed with eager, on which device, and only while the bundle still
holds the files it judged."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Optional

from ..bundle import CONFIG_FILE, FILE_HASHES, PARITY_FILE, Bundle
from ..errors import BundleError
from ..jsonio import read_json
from ..schema import BOOLEAN, check_fields

PARITY_KINDS = {"passed": BOOLEAN, "files": FILE_HASHES}  # what is read; the rest is shown
# The most a parity.json may hold: a row per runner, batch size and input set (about 170
# bytes: 10 runners at 10 batch sizes on 10 sets is 0.2 MiB) and, with --layers, a few
# hundred bytes per block and runner
PARITY_BYTES = 16 << 20


def read_parity(path: str | os.PathLike, inside: Optional[str | os.PathLike] = None
                ) -> dict[str, Any]:
    """A parity.json (`validate --report`, or the one export writes into the bundle): an
    object with a boolean `passed`, or BundleError in one line. The one reader of it.
    `inside`: the bundle folder whose own report it is (a link out of it is refused)."""
    path = Path(path)
    report = read_json(path, PARITY_BYTES, inside=inside)
    check_fields(report, PARITY_KINDS, str(path), BundleError, required=("passed",))
    return report


def passed_runners(report: dict[str, Any]) -> set[str]:
    """The runners a parity report found in agreement with eager at every row it judged:
    none when the report as a whole failed."""
    results = report.get("results") if report.get("passed") is True else []
    rows = [r for r in results if isinstance(r, dict)] if isinstance(results, list) else []
    failed = {str(r.get("candidate")) for r in rows if r.get("passed") is not True}
    return {str(r.get("candidate")) for r in rows if r.get("passed") is True} - failed


def read_proof(bundle: Bundle) -> tuple[Optional[dict[str, Any]], Optional[str]]:
    """The bundle's parity.json (written by a passing export, or `validate --report` into the
    folder) where it judged the files the bundle holds now, else None; and why not. A
    verdict is tied to the sha256s it records (`files`): a model swapped in after it, even
    with config.json re-hashed, is not what it judged."""
    try:
        report = read_parity(bundle.file(PARITY_FILE), inside=bundle.path)
    except BundleError as exc:
        return None, str(exc)
    if report.get("files") != bundle.hashes:
        return None, (f"{PARITY_FILE} judged other files than the bundle holds now (the "
                      f"sha256s it records differ from {CONFIG_FILE}'s)")
    return report, None


def validated_runners(bundle: Bundle) -> set[str]:
    """The runners the bundle's parity.json (`read_proof`) found in agreement with eager,
    plus eager itself. No report that judged these files: eager only."""
    report, _ = read_proof(bundle)
    return {"eager"} | (passed_runners(report) if report else set())


def validated_device(bundle: Bundle) -> Optional[str]:
    """The device the bundle's parity.json (`read_proof`) compared on (its provider_used),
    or None. A model proved on one device is not proved on another: other kernels round
    otherwise (an fp16 graph most of all: ONNX Runtime's CPU provider runs much of it in
    fp32)."""
    report, _ = read_proof(bundle)
    used = report.get("provider_used") if report else None
    return used if isinstance(used, str) else None


def labelled_accuracy(report: Optional[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Each runner's top-1 accuracy on the labelled images a parity report measured (export
    or validate with --real-data), beside eager's on the same images: runner -> {inputs,
    images, accuracy, eager_accuracy, drop (eager minus the runner, in top-1 points)}. The
    largest labelled set a runner was judged on counts; eager is the reference. Empty where
    no labelled images were measured or the report is not one this bundle's files passed."""
    found: dict[str, dict[str, Any]] = {}
    rows = report.get("results") if report else None
    for row in rows if isinstance(rows, list) else []:
        if not isinstance(row, dict) or row.get("reference") != "eager":
            continue
        ours, theirs = row.get("accuracy"), row.get("reference_accuracy")
        images = row.get("batch")
        if not all(isinstance(v, (int, float)) and not isinstance(v, bool)
                   for v in (ours, theirs, images)):
            continue
        name = str(row.get("candidate"))
        if name in found and found[name]["images"] >= images:
            continue
        found[name] = {"inputs": str(row.get("inputs")), "images": int(images),
                       "accuracy": float(ours), "eager_accuracy": float(theirs),
                       "drop": round(100 * (float(theirs) - float(ours)), 4)}
    return found
