"""The runtimes, one registration each. Choosing a runner, listing a bundle's, checking a
`--runtime` name and timing them all ask this module, never a runtime by name.

A runtime module (ort.py, pytorch.py, ov.py) declares a `base.Runtime`: the runner names it
answers, the model files it runs, which of them can carry code, the extra it needs and how
to open one; a new runtime is that module and one line in RUNTIMES."""
from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Optional

from ..errors import ConfigError
from . import ort, ov, pytorch
from .base import Runtime, Target

# In the order a bundle's runners are listed: eager and PyTorch's first, the reference
RUNTIMES: tuple[Runtime, ...] = (pytorch.RUNTIME, ort.RUNTIME, ov.RUNTIME)

# The shape of a runner name (which ones a bundle has is `bundle_runners`)
RUNNER_NAME = "|".join(f"(?:{runtime.pattern})" for runtime in RUNTIMES)

# Runners whose file can carry code: they run only when named (--runtime, a file path) or
# trusted (--trust-code); never by auto
CODE_RUNNERS = tuple(name for runtime in RUNTIMES for name in runtime.code)


def _file_runners() -> dict[str, tuple[str, ...]]:
    merged: dict[str, tuple[str, ...]] = {}
    for runtime in RUNTIMES:
        for suffix, names in runtime.files.items():
            merged[suffix] = merged.get(suffix, ()) + names
    return merged


# What a model file (not a bundle) can run on, by its suffix; the first is its default
FILE_RUNNERS = _file_runners()


def by_name(name: str) -> Runtime:
    """The runtime called `name` ("onnxruntime", "openvino", "pytorch")."""
    for runtime in RUNTIMES:
        if runtime.name == name:
            return runtime
    raise ConfigError(f"unknown runtime {name!r}; choose from "
                      f"{', '.join(r.name for r in RUNTIMES)}")


def parse(runner: str) -> Optional[Runtime]:
    """The runtime that answers the runner name `runner`, or None where none does."""
    return next((r for r in RUNTIMES if re.fullmatch(r.pattern, runner)), None)


def check_runtimes(names: Iterable[str]) -> dict[str, str]:
    """`names` checked as runtimes ("onnxruntime", "openvino", ...; ConfigError for one that
    is not); returns, for each whose extra is not installed, runtime name -> how to install
    it (empty: every one can run)."""
    wanted = [by_name(name) for name in names]
    return {r.name: _install(r) for r in wanted if not r.installed()}


def asked(runtimes: Iterable[str] = ()) -> tuple[Runtime, ...]:
    """The runtimes a set of runners holds: every one that is not opt-in, and the opt-in
    ones named in `runtimes`."""
    named = {by_name(name).name for name in runtimes}
    return tuple(r for r in RUNTIMES if not r.opt_in or r.name in named)


def bundle_runners(bundle: Any, runtimes: Optional[Iterable[Runtime]] = None
                   ) -> dict[str, tuple[Runtime, Target]]:
    """Every runner of `bundle` on `runtimes` (None: every one registered), in the order
    reports list them."""
    return {name: (runtime, target) for runtime in (RUNTIMES if runtimes is None else runtimes)
            for name, target in runtime.runners(bundle).items()}


def file_runners(path: Path) -> dict[str, tuple[Runtime, Target]]:
    """Every runner a model file can run on, by its suffix; the first is its default."""
    return {name: (runtime, target) for runtime in RUNTIMES
            for name, target in runtime.file_runners(path).items()}


def absent(name: str) -> str:
    """For a runner name a bundle lacks: what would have made it, or ""."""
    return next((r.absent[name] for r in RUNTIMES if name in r.absent), "")


def missing_extra(runner: str) -> Optional[str]:
    """For a runner name whose runtime needs an extra that is not installed, how to install
    it ("pip install 'vit-export[openvino]'"); None where it can run (or no runtime answers
    the name: `parse` says that)."""
    runtime = parse(runner)
    return None if runtime is None or runtime.installed() else _install(runtime)


def _install(runtime: Runtime) -> str:
    return runtime.install or f"pip install {runtime.extra}"
