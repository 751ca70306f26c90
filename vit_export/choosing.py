"""`--runtime auto`'s one policy, and what `--runtime` means for a model: the runner `bench
--record` measured fastest (performance.json), taken only while parity.json still shows it
validated, on this device, for the files the bundle holds now. It reads what bench and
validation wrote, so it sits above both; infer, serve and Ray Data ask it."""
from __future__ import annotations

from pathlib import Path
from typing import Optional

from .bundle import PERFORMANCE_FILE, Bundle, ModelFile, read_bundle
from .cpu import isa as cpu_isa
from .errors import shown
from .parity.proof import validated_device, validated_runners
from .performance import read_performance
from .runtime import (
    AUTO,
    CODE_RUNNERS,
    DEFAULT_RUNNER,
    FILE_RUNNERS,
    cuda_problem,
    file_runner,
    runner_names,
)

__all__ = ["AUTO", "choose_runner", "resolve_runner"]


def resolve_runner(model: Bundle | ModelFile | Path, name: Optional[str], provider: str,
                   batch_size: int) -> tuple[str, Optional[str]]:
    """What `--runtime` means for `model`, as `bundle.read_model` read it (or a path, for a
    model on a cluster this process may not read: a bundle folder is read here only when
    auto needs its performance.json): a runner name stays itself; None is model.onnx on
    ONNX Runtime (a model file: what it is); auto is `choose_runner`. Returns (runner name,
    why, where performance.json said anything)."""
    if not isinstance(model, (Bundle, ModelFile)):
        model = Path(model)
        if name not in (AUTO, None):
            return name, None
        if name is None:
            return (DEFAULT_RUNNER if model.is_dir() else file_runner(model)), None
        if not model.is_dir():
            return (file_runner(model) if model.suffix in FILE_RUNNERS
                    else DEFAULT_RUNNER), None
        model = read_bundle(model)
    if name == AUTO:
        return choose_runner(model, provider, batch_size)
    if name is None:
        return (DEFAULT_RUNNER if isinstance(model, Bundle) else file_runner(model.path)), None
    return name, None


def choose_runner(model: Bundle | ModelFile, provider: str, batch_size: int
                  ) -> tuple[str, Optional[str]]:
    """`--runtime auto`: the runner `bench --record` measured fastest at the recorded batch
    size nearest `batch_size` (the largest not above it, else the smallest), when it is still
    validated by parity.json on this device and was measured on this device and CPU; else
    model.onnx on ONNX Runtime. Returns (runner name, why: None where no performance.json
    says anything)."""
    if not isinstance(model, Bundle):  # a model file is what it is
        return file_runner(model.path), None
    bundle = model
    path = bundle.file(PERFORMANCE_FILE)
    if not path.exists() and not path.is_symlink():  # a dangling link: read, and said
        return DEFAULT_RUNNER, None
    record = read_performance(path, inside=bundle.path)
    fastest = record["fastest_validated"]
    batches = sorted(fastest)
    if not batches:
        return DEFAULT_RUNNER, f"{PERFORMANCE_FILE} recommends nothing"
    batch = max((b for b in batches if b <= batch_size), default=batches[0])
    chosen = fastest[batch]["backend"]
    device = "cuda" if provider == "cuda" or (provider == "auto" and cuda_problem() is None) \
        else "cpu"
    here = cpu_isa().model
    problem = None
    if record["device"] != device:
        problem = f"it was measured on {record['device']} and this run is on {device}"
    elif device == "cpu" and record["cpu"] != here:
        problem = f"it was measured on {record['cpu']}, and this CPU is {here}"
    elif record.get("files") != bundle.hashes:
        problem = "it timed other files than the bundle holds now"
    elif chosen in CODE_RUNNERS:
        problem = (f"{chosen} runs a file that can carry code, which auto never picks "
                   f"(--runtime {chosen} runs it)")
    elif chosen not in runner_names(bundle):
        problem = f"the bundle has no {chosen} now"
    elif chosen not in validated_runners(bundle):
        problem = f"parity.json does not show {chosen} validated"
    elif chosen != "eager" and (proved := validated_device(bundle)) != device:
        problem = (f"parity.json proved the bundle on {proved or 'no device it names'} and "
                   f"this run is on {device} (export it with --provider {device})")
    if problem:
        # the record's own texts (backend, device, cpu) are in the problem too: escaped
        return DEFAULT_RUNNER, f"{PERFORMANCE_FILE} names {shown(chosen)}, but {shown(problem)}"
    return chosen, f"{PERFORMANCE_FILE}'s fastest validated at batch {batch}"
