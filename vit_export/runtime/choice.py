"""Which runners a command opens: every runner of a bundle on one device (validate, bench)
and one runner by its name (infer, serve, Ray Data), each runtime's from the registry.
`--runtime auto`'s choice reads what bench and validation wrote, so it lives above them
(vit_export/choosing.py)."""
from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Optional

from ..archives import is_package
from ..bundle import (
    WEIGHTS_FILE,
    Bundle,
    ModelFile,
    read_model,
    read_onnx_file,
)
from ..errors import BundleError, ConfigError, FrameworkMissing, ProviderError, param
from ..verified import held_to, read_once
from . import registry
from .base import (
    DEFAULT_PROVIDER,
    RELEASE_ABOVE,
    Deferred,
    InputSpec,
    Runner,
    RunnerSet,
    Runtime,
    Source,
    Target,
    torch_cuda,
)
from .registry import CODE_RUNNERS, FILE_RUNNERS, RUNNER_NAME

AUTO = "auto"  # infer/serve --runtime auto: choosing.choose_runner says which runner
DEFAULT_RUNNER = "onnxruntime"  # model.onnx on ONNX Runtime
ON_CPU, ON_CUDA = (param("provider", d) for d in ("cpu", "cuda"))

__all__ = ["AUTO", "CODE_RUNNERS", "DEFAULT_RUNNER", "FILE_RUNNERS", "RUNNER_NAME",
           "bundle_source", "file_runner", "open_runner", "open_runners", "runner_names"]


def bundle_source(bundle: Bundle) -> Source:
    """A bundle's files for its runners, each read once and checked against config.json."""
    return Source(bundle.onnx_model, bundle.read_file, bundle.load_eager,
                  InputSpec.from_description(bundle.description.to_dict()), bundle.io_shapes)


def _file_source(model: ModelFile) -> Source:
    """A model file the user named: read once here, its checks run on the bytes it loads
    (held to `model.sha256` where it is given: the copy a Ray driver checked)."""
    path, expected = model.path, model.sha256

    def no_weights():
        raise ConfigError(f"{path} is a model file: eager needs a bundle's weights")

    return Source(lambda _: read_onnx_file(path, expected),
                  lambda _: held_to(read_once(path), expected), no_weights,
                  InputSpec.from_description(model.description.to_dict()), model.io_shapes)


def open_runners(bundle: Bundle, provider: str = DEFAULT_PROVIDER, *, tf32: bool = False,
                 threads: Optional[int] = None, runners: Optional[Sequence[str]] = None,
                 deferred: bool = False, trust_code: bool = False,
                 runtimes: Sequence[str] = ()) -> RunnerSet:
    """Eager, the PyTorch artifacts (TorchScript, torch.export program, AOTInductor package)
    and every ONNX model of `bundle` on each runtime of the registry, all on the device that
    ONNX Runtime really runs on for `provider` (an AOTInductor package compiled for another
    device is an error). `runners` keeps eager plus the named runners. `runtimes` names the
    opt-in runtimes to add ("openvino"): OpenVINO's runners
    need the CPU, and the bf16 one a CPU with bf16 instructions (elsewhere it is left out,
    and a note says so, unless `runners` names it: then that is an error). `tf32` lets ONNX
    Runtime's CUDA provider compute fp32 MatMuls and convolutions in TF32 (eager, the
    reference, stays in full fp32). `deferred`: every runner but eager (and OpenVINO's) is
    a `Deferred` one, opened at its first call (the first ONNX model is open already: it
    tells the device); each is checked as it opens. The files that can carry code
    (`CODE_RUNNERS`) open only where `runners` names them or with `trust_code`; else a
    note says they were not run."""
    offered = registry.bundle_runners(bundle, registry.asked(runtimes))
    wanted = _wanted(bundle, offered, runners)
    main = bundle.runner_name(bundle.main_onnx)
    if main not in offered:  # config.json lists no model.onnx: refused as reading it is
        bundle.read_file(bundle.main_onnx)
    source = bundle_source(bundle)
    first = _open(main, offered[main], source, provider, threads, tf32)
    if first.device == "cuda" and not torch_cuda():
        raise ProviderError(f"ONNX Runtime runs on CUDA but PyTorch sees no CUDA device, and "
                            f"eager PyTorch must run where ONNX Runtime does: install a CUDA "
                            f"build of torch, or use {ON_CPU}")
    device = first.device  # the openers below hold this, never `first` (its weights)
    untrusted = [] if trust_code or runners is not None else \
        [name for name in offered if name in wanted and name in CODE_RUNNERS]
    chosen = {name: found for name, found in offered.items()
              if (name in wanted and name not in untrusted) or name == main}
    _check_device(chosen, device)
    big = deferred and bundle.file(WEIGHTS_FILE).stat().st_size > RELEASE_ABOVE
    notes, computes, opened, onnx_files = list(first.notes), {}, [], {}
    if untrusted:
        notes.append(f"{', '.join(offered[n][1].file for n in untrusted)} not run: a file "
                     f"that can carry code runs only with --trust-code (or named, as "
                     f"--runtime does)")
    for name, (runtime, target) in chosen.items():
        if name == main:
            runner = Deferred(name, device, lambda: _open(main, offered[main], source, device,
                                                          threads, tf32), first, big) \
                if deferred else first
        elif deferred and runtime.defer and name != "eager":
            runner = Deferred(name, device, lambda n=name: _open(n, offered[n], source, device,
                                                                 threads, tf32), collect=big)
        else:
            runner = _open_now(name, (runtime, target), source, (device, threads, tf32),
                               runners, main, notes)
            if runner is None:
                continue
        onnx_files |= {name: target.file} if (target.file or "").endswith(".onnx") else {}
        computes |= {name: target.compute} if target.compute else {}
        opened += [runner] if name in wanted or name == main else []
    return RunnerSet(device, provider, notes, _reference_first(opened, main, wanted),
                     onnx_files, computes)


def _open_now(name: str, found: tuple[Runtime, Target], source: Source, where: tuple,
              runners: Optional[Sequence[str]], main: str, notes: list[str]
              ) -> Optional[Runner]:
    """The runner opened now (`where`: device, threads, tf32), or None and a note where it
    may be left out: an optional one this machine cannot run, or eager where its framework
    is not installed (the others run, judged by the main ONNX model)."""
    try:
        return _open(name, found, source, *where)
    except ProviderError as exc:
        if not found[1].optional or runners is not None:
            raise
        notes.append(f"{name} left out: {exc}")
    except FrameworkMissing as exc:
        if runners is not None and name in runners:
            raise
        notes.append(f"eager not run: {exc}; the others are compared with {main}, which "
                     f"parity.json records as proved against it at export")
    return None


def _reference_first(opened: list[Runner], main: str, wanted: set[str]) -> list[Runner]:
    """The runners with the reference first: eager, or where eager could not be built (its
    framework is not installed) the main ONNX model; the main one is listed only where it
    was wanted or is the reference."""
    if opened and opened[0].name == "eager":
        return [r for r in opened if r.name in wanted]
    return sorted(opened, key=lambda r: r.name != main)


def _check_device(chosen: dict[str, tuple[Runtime, Target]], device: str) -> None:
    """Every runner runs where ONNX Runtime does: a runtime that runs on the CPU alone
    cannot join a set on CUDA."""
    cpu_only = next((r for r, _ in chosen.values() if r.cpu_only), None)
    if cpu_only is not None and device != "cpu":
        raise ProviderError(f"{cpu_only.title} runs on the CPU, and every runner must run where "
                            f"ONNX Runtime does: use {ON_CPU} with {cpu_only.title}")


def _open(name: str, found: tuple[Runtime, Target], source: Source, provider: str,
          threads: Optional[int], tf32: bool) -> Runner:
    runtime, target = found
    return runtime.open(name, target, source, provider, threads, tf32)


def _wanted(bundle: Bundle, offered: dict[str, tuple[Runtime, Target]],
            runners: Optional[Sequence[str]]) -> set[str]:
    """The runners named (None: every one offered), each checked: one of an opt-in
    runtime that was not asked for says how to ask; one the bundle lacks, what it has."""
    known = [name for name, (_, target) in offered.items()  # model.e2e.onnx runs apart
             if bundle.e2e_model is None or target.file != bundle.e2e_model]
    wanted = set(known if runners is None else runners)
    unknown = sorted(wanted - set(known))
    if unknown:
        every = registry.bundle_runners(bundle)
        runtime = every[unknown[0]][0] if unknown[0] in every else None
        if runtime is not None and runtime.opt_in:
            raise ConfigError(f"runtime {unknown[0]} is {runtime.title}'s: add "
                              f"{param('runtimes', runtime.name)}")
        raise ConfigError(f"no runtime {unknown[0]!r} in this bundle; it has "
                          f"{', '.join(known)}")
    return wanted | {"eager"}  # the reference, always


def runner_names(bundle: Bundle) -> list[str]:
    """Every runner a bundle can open, as reports and `bench` name them: eager (its weights),
    its PyTorch artifacts, each ONNX model on ONNX Runtime and on OpenVINO, model.e2e.onnx
    (uint8 images in) on ONNX Runtime, and model.onnx on OpenVINO in bf16: each runtime of
    the registry in turn."""
    return list(registry.bundle_runners(bundle))


def file_runner(path: Path) -> str:
    """The default runner of a model file: its suffix says, and a .pt2 file whether it is an
    AOTInductor package or a torch.export program."""
    fits = FILE_RUNNERS.get(path.suffix, ("torchscript",))
    if path.suffix == ".pt2" and path.is_file():
        return "aoti" if is_package(path) else "pt2"
    return fits[0]


def open_runner(model: Bundle | ModelFile | str | os.PathLike, name: str = DEFAULT_RUNNER,
                provider: str = DEFAULT_PROVIDER, *, threads: Optional[int] = None) -> Runner:
    """Open one runner by its name: the one way infer, serve and Ray Data open a model.

    Every ONNX graph must take and give what the description says (a foreign model.onnx is
    refused), and the provider that really runs is checked.

    Args:
        model: A bundle or a model file as `bundle.read_model` read it, or a path (read
            here).
        name: A runner name (`runner_names`: "eager", "onnxruntime",
            "onnxruntime[model.int8.onnx]", "openvino", "torchscript", ...), or, for a model
            file, one of `FILE_RUNNERS`.
        provider: "auto", "cuda" or "cpu".
        threads: The size of ONNX Runtime's (or OpenVINO's) thread pool, where several
            workers share cores; None: the runtime's default.

    Returns:
        A `Runner`: its `name`, the `device` it really runs on, `__call__` (numpy or torch
        in, the first output out) and `run_all` (every output by name).

    Raises:
        ConfigError: The bundle or file has no runner of that name.
        ProviderError: The provider asked for is not the one that runs.
        BundleError: The model is missing, damaged, or not what its description says.
    """
    if not isinstance(model, (Bundle, ModelFile)):
        model = read_model(model)
    if isinstance(model, Bundle):
        offered, source = registry.bundle_runners(model), bundle_source(model)
        if name not in offered:
            raise BundleError(f"{model.path} has no runner {name} (it has "
                              f"{', '.join(offered)}){registry.absent(name)}")
    else:
        path = model.path
        offered, source = registry.file_runners(path), _file_source(model)
        if name not in offered:
            fits = FILE_RUNNERS.get(path.suffix, ())
            raise ConfigError(f"runner {name} cannot run {path}: a {path.suffix or 'plain'} "
                              f"file runs on {' or '.join(fits) or 'nothing we know'} (or "
                              f"give the bundle folder)")
    runtime = offered[name][0]
    if runtime.cpu_only and provider == "cuda":
        raise ProviderError(f"{param('runtime', name)} runs "
                            f"on the CPU; {ON_CUDA} cannot "
                            f"be honoured")
    return _open(name, offered[name], source, provider, threads, False)
