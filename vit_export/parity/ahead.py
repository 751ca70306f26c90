"""The source framework's outputs computed in a second process while the export works on.

Building transformers', timm's or torchvision's model and running it on the source rows'
inputs takes seconds and needs none of the bundle's files, while the export's own steps
before validation (the TorchScript trace, the ONNX exporter) are Python on one core. So
export starts a Python running `main` below at its beginning, hands it the files the
import read (the config files' bytes, the weights file as the open file that was hashed,
each with its sha256), the description and the seed, and goes on. The child builds the
source exactly as validation would (`build_source`, on one thread, at a lower priority
than the export's), runs it on `source_inputs` and answers with the outputs: one JSON line,
then an .npz read back with pickling off. Validation's source rows then compare those
outputs (`Answered`) as they would the source's own run. Where the child gives no answer
(it could not start, died, hung, or was given another description), the source is built
in the export's own process, as `validate --source` builds it. The child ends with the
export, however the export ends (`end_with_parent`).
"""
from __future__ import annotations

import base64
import io
import json
import logging
import os
import signal
import subprocess
import sys
import tempfile
import time
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import numpy as np

from .. import bundle as B
from ..checkpoints.files import CheckpointFiles, Opened
from ..errors import VitExportError, first_line
from ..verified import Loaded
from .source import (
    Source,
    SourceSkipped,
    build_source,
    run_failed,
    source_inputs,
    source_sizes,
)

log = logging.getLogger(__name__)

# What the child holds beside the export: the state dict and the framework's model (the
# weights twice) and the framework itself.
MEMORY_PER_WEIGHT_BYTE = 3
MEMORY_BESIDE = 2 << 30
# The child's program: its import path given (`_import_path`, never the working directory
# first, as `python -c` would have it), its stdout kept for the answer alone (a library's
# prints go to stderr), then `main`.
CHILD = ("import sys; sys.path[:] = sys.argv[1:]; import os; answer = os.dup(1); "
         "os.dup2(2, 1); from vit_export.parity.ahead import main; main(answer)")
PR_SET_PDEATHSIG = 1  # prctl's option (linux/prctl.h)
# How long the answer is waited for before the child is ended and the source built here
# instead: as long again as the child has run by then, and at least WAIT_AT_LEAST seconds.
# A child that hangs costs the export at most that.
PATIENCE = 1.0
WAIT_AT_LEAST = 60.0


class SourceRunFailed(Exception):
    """The source framework's forward raised in the child; the message is the record's
    reason (`run_failed`)."""


@dataclass
class Answered(Source):
    """A source whose outputs were computed by the child: `run(x)` answers each input of
    `source_inputs` with what the framework gave for it there."""
    answers: list[tuple[np.ndarray, dict[str, np.ndarray]]] = field(default_factory=list)
    failed: Optional[str] = None  # the child's forward raised on the next input: why

    def run(self, x: np.ndarray) -> dict[str, np.ndarray]:
        for given, outputs in self.answers:
            if given.shape == x.shape and np.array_equal(given, x):
                return outputs
        if self.failed is not None:
            raise SourceRunFailed(self.failed)
        raise VitExportError("the source framework's outputs were computed for other inputs "
                             "than the source rows compare")


def _same_model(a: B.Description, b: B.Description) -> bool:
    """Whether `open_source` builds the same source from both descriptions."""
    return (a.config, a.module, a.extra.get("import")) == \
        (b.config, b.module, b.extra.get("import"))


def _room_for(files: CheckpointFiles) -> bool:
    """Whether this machine's free memory holds the child beside the export."""
    weights = sum(os.fstat(f.file.fileno()).st_size for f in files.files.values()
                  if isinstance(f, Opened))
    try:
        with open("/proc/meminfo") as f:
            fields = dict(line.split(":", 1) for line in f)
        available = int(fields["MemAvailable"].split()[0]) * 1024
    except (OSError, KeyError, ValueError):
        return False
    return available >= MEMORY_PER_WEIGHT_BYTE * weights + MEMORY_BESIDE


def _import_path() -> list[str]:
    """The child's import path: this process's, without the working directory (a folder
    of checkpoints may hold .py files), with this vit_export's folder where it is not on it."""
    paths = [p for p in sys.path if p]
    where = str(Path(__file__).resolve().parents[2])
    return paths + ([where] if where not in paths else [])


class SourceAhead:
    """The child computing the source's outputs for a bundle of `description` on the
    inputs `seed` makes; `files` are what the import read. `answered` waits for it;
    `close` ends it where it still runs."""

    def __init__(self, description: B.Description, files: CheckpointFiles, seed: int):
        self.description, self.files, self.seed = description, files, seed
        self._child: Optional[subprocess.Popen] = None
        self._started = time.monotonic()
        request, fds = self._request()
        self._errors = tempfile.TemporaryFile()  # noqa: SIM115 (closed by close())
        try:
            with tempfile.TemporaryFile() as given:  # a file: never waits on the child
                given.write(request)
                given.seek(0)
                self._child = subprocess.Popen(
                    [sys.executable, "-c", CHILD, *_import_path()], stdin=given,
                    stdout=subprocess.PIPE, stderr=self._errors, pass_fds=fds)
        except OSError as exc:  # no interpreter to start
            log.debug("the source's process did not start: %s", exc)
            self.close()

    @classmethod
    def start(cls, description: B.Description, files: CheckpointFiles, seed: int
              ) -> Optional["SourceAhead"]:
        """The child started, or None where it cannot run here (no /proc to reopen the
        weights file through, or too little free memory beside the export)."""
        if not Path("/proc/self/fd").is_dir() or not _room_for(files):
            return None
        ahead = cls(description, files, seed)
        return ahead if ahead._child is not None else None

    def _request(self) -> tuple[bytes, tuple[int, ...]]:
        entries, fds = [], []
        for name, held in self.files.files.items():
            entry: dict[str, Any] = {"name": name, "path": str(held.path),
                                     "sha256": held.sha256}
            if isinstance(held, Opened):
                entry["fd"] = held.file.fileno()
                fds.append(entry["fd"])
            else:
                entry["data"] = base64.b64encode(held.data).decode("ascii")
            entries.append(entry)
        request = {"description": self.description.to_dict(), "seed": self.seed,
                   "where": str(self.files.where), "files": entries, "parent": os.getpid()}
        return json.dumps(request).encode(), tuple(fds)

    def answered(self, description: B.Description, seed: int) -> Optional[Source]:
        """The source as the child built and ran it, for a bundle of `description` judged
        on `seed`'s inputs; None where the child gave no answer for them.

        Raises:
            SourceSkipped: the child could not build the source, and says why.
        """
        child = self._child
        if child is None or seed != self.seed or not _same_model(description,
                                                                 self.description):
            self.close()
            return None
        waited = PATIENCE * (time.monotonic() - self._started)
        try:
            out, _ = child.communicate(timeout=max(waited, WAIT_AT_LEAST))
        except subprocess.TimeoutExpired:
            log.debug("the source's process did not answer in time")
            self.close()
            return None
        self._child = None
        line, _, data = out.partition(b"\n")
        try:
            answer = json.loads(line) if child.returncode == 0 else {}
            if answer.get("status") == "skipped":
                raise SourceSkipped(str(answer["reason"]))
            return self._source(answer, data, description.config)
        except (ValueError, KeyError, TypeError, AttributeError, IndexError, OSError,
                zipfile.BadZipFile) as exc:  # no answer, or not one it gives
            self._errors.seek(max(0, self._errors.seek(0, os.SEEK_END) - 2000))
            log.debug("the source's process gave no answer (exit %s, %s): %s",
                      child.returncode, first_line(exc),
                      self._errors.read().decode(errors="replace"))
            return None

    def _source(self, answer: dict, data: bytes, config) -> Answered:
        if answer["status"] != "built":
            raise ValueError(f"status {answer['status']!r}")
        made = answer["source"]
        with np.load(io.BytesIO(data), allow_pickle=False) as arrays:
            ran = {key: arrays[key] for key in arrays.files}
        inputs = source_inputs(config, self.seed, source_sizes(config, made["native"]))
        answers = [(x, {name: ran[f"{i}/{name}"] for name in made["outputs"]})
                   for i, (_, x) in enumerate(inputs) if f"{i}/{made['outputs'][0]}" in ran]
        return Answered(made["framework"], made["version"], made["model"], made["files"],
                        made["native"], {name: None for name in made["outputs"]},
                        made["notes"], answers=answers, failed=answer.get("failed"))

    def close(self) -> None:
        """End the child where it still runs, and forget it."""
        if self._child is not None:
            self._child.kill()
            self._child.communicate()
            self._child = None
        self._errors.close()


def _files(request: dict) -> CheckpointFiles:
    """The files the parent read, as it holds them: the weights through its open file
    (reopened here, so the two processes' reads never share an offset)."""
    files: dict[str, Loaded | Opened] = {}
    for entry in request["files"]:
        path = Path(entry["path"])
        if "fd" in entry:
            fd = os.open(f"/proc/self/fd/{entry['fd']}", os.O_RDONLY)
            os.close(entry["fd"])
            files[entry["name"]] = Opened(path, entry["sha256"], os.fdopen(fd, "rb"))
        else:
            files[entry["name"]] = Loaded(path, base64.b64decode(entry["data"]),
                                          entry["sha256"])
    return CheckpointFiles(Path(request["where"]), files)


def _answer(request: dict) -> tuple[dict, dict[str, np.ndarray]]:
    """The child's work: the source built and run on `source_inputs`, one thread."""
    import torch

    torch.set_num_threads(1)  # the export's own steps run beside it
    description = B.Description.from_dict(request["description"])
    try:
        source = build_source(description, _files(request))
    except SourceSkipped as exc:
        return {"status": "skipped", "reason": str(exc)}, {}
    config, arrays = description.config, {}
    answer: dict[str, Any] = {"status": "built", "source": {
        "framework": source.framework, "version": source.version, "model": source.model,
        "files": source.files, "native": source.native, "notes": list(source.notes),
        "outputs": list(source.outputs)}}
    inputs = source_inputs(config, request["seed"], source_sizes(config, source.native))
    for i, (_, x) in enumerate(inputs):
        try:
            outputs = source.run(x)
        except Exception as exc:  # the framework's own forward
            answer["failed"] = run_failed(source, exc)
            break
        arrays.update({f"{i}/{name}": value for name, value in outputs.items()})
    return answer, arrays


def end_with_parent(parent: int) -> None:
    """Have the kernel end this process (SIGKILL) when the export's ends, however it ends
    (Linux's PR_SET_PDEATHSIG), so a child still building or hung never outlives it; where
    the export `parent` has ended already, end now. (The kernel watches the thread that
    started the child; export starts it and waits for it or ends it in one.) Elsewhere
    nothing: the export's `close` still ends the child whenever the export gets that far."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):  # no prctl (not Linux)
        return
    if os.getppid() != parent:  # ended before the kernel was told
        os._exit(1)


def main(out: int) -> None:
    """The child: the request read from stdin, the answer written to the file `out`."""
    request = json.loads(sys.stdin.buffer.read())
    end_with_parent(request["parent"])
    os.nice(10)  # the export's own steps first where both want the cores
    try:  # where memory runs out, this process is the one ended: the export goes on
        with open("/proc/self/oom_score_adj", "w") as f:
            f.write("1000")
    except OSError:
        pass
    answer, arrays = _answer(request)
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    with os.fdopen(out, "wb") as f:
        f.write(json.dumps(answer).encode() + b"\n" + buffer.getvalue())
