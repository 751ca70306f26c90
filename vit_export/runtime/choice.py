"""Which runners a command opens: every runner of a bundle on one device (validate, bench),
one runner by its name (infer, serve, Ray Data), and `--runtime auto`'s choice from
performance.json and parity.json, the one policy for it."""
from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Optional

from ..archives import is_package
from ..bundle import (
    HEIGHT_DIM,
    ONNX_FILE,
    PERFORMANCE_FILE,
    WEIGHTS_FILE,
    WIDTH_DIM,
    Bundle,
    ModelFile,
    read_bundle,
    read_model,
    read_onnx_file,
    read_performance,
    validated_device,
    validated_runners,
)
from ..cpu import isa as cpu_isa
from ..errors import BundleError, ConfigError, ProviderError, shown
from ..verified import read_once
from .base import (
    DEFAULT_PROVIDER,
    RELEASE_ABOVE,
    Deferred,
    InputSpec,
    Runner,
    RunnerSet,
    cuda_problem,
    torch_cuda,
    torch_device,
)
from .ort import OrtRunner, check_fits, ort_runner
from .ov import OpenVinoRunner, openvino_runners
from .pytorch import TorchRunner, load_torch_file

AUTO = "auto"  # infer/serve --runtime auto: what `bench --record` measured fastest, validated


# Runners whose file can carry code: TorchScript runs its program, a torch.export graph may
# call any ATen op (torch.from_file maps a file), a package is a native library. They run
# only when named (--runtime, a file path) or trusted (--trust-code); never by auto.
CODE_RUNNERS = ("torchscript", "pt2", "aoti")


# The shape of a runner name (which ones a bundle has is `runner_names`)
RUNNER_NAME = r"eager|torchscript|pt2|aoti|openvino-bf16|(onnxruntime|openvino)(\[[^\]/]+\])?"
DEFAULT_RUNNER = "onnxruntime"  # model.onnx on ONNX Runtime


# What a model file (not a bundle) can run on, by its suffix; the first is its default.
FILE_RUNNERS = {".onnx": ("onnxruntime", "openvino", "openvino-bf16"), ".ts": ("torchscript",),
                ".pt2": ("pt2", "aoti")}


def open_runners(bundle: Bundle, provider: str = DEFAULT_PROVIDER, *, tf32: bool = False,
                 threads: Optional[int] = None, include: Optional[Sequence[str]] = None,
                 openvino: bool = False, deferred: bool = False, trust_code: bool = False) -> RunnerSet:
    """Eager, the PyTorch artifacts (TorchScript, torch.export program, AOTInductor package)
    and every ONNX model of `bundle`, all on the device that ONNX Runtime really runs on for
    `provider` (an AOTInductor package compiled for another device is an error). `include` keeps eager plus the named runners.
    `openvino` adds OpenVINO's CPU runners (`openvino_runners`); they need the CPU, and the
    bf16 one a CPU with bf16 instructions (elsewhere it is left out, and a note says so,
    unless `include` names it: then that is an error). `tf32` lets ONNX Runtime's CUDA provider compute fp32 MatMuls and convolutions in TF32
    (eager, the reference, stays in full fp32). `deferred`: every runner but eager is a
    `Deferred` one, opened at its first call (the first ONNX model is open already: it tells
    the device); each is checked as it opens. The files that can carry code (TorchScript,
    the program, the package: `CODE_RUNNERS`) open only where `include` names them or with
    `trust_code`; else a note says they were not run."""
    models = bundle.onnx_models
    names = {file: bundle.runner_name(file) for file in models}
    ov_runners = openvino_runners(bundle) if openvino else {}
    torch_files = bundle.torch_files
    known = ["eager"] + list(torch_files) + list(names.values()) + list(ov_runners)
    wanted = set(known if include is None else include)
    unknown = sorted(wanted - set(known))
    if unknown and not openvino and unknown[0] in openvino_runners(bundle):
        raise ConfigError(f"runtime {unknown[0]} is OpenVINO's: add --openvino")
    if unknown:
        raise ConfigError(f"no runtime {unknown[0]!r} in this bundle; it has "
                            f"{', '.join(known)}")
    main = bundle.main_onnx
    first = ort_runner(bundle.onnx_model(main), provider, tf32=tf32, threads=threads,
                       name=names[main])
    if first.device == "cuda" and not torch_cuda():
        raise ProviderError("ONNX Runtime runs on CUDA but PyTorch sees no CUDA device, and "
                            "eager PyTorch must run where ONNX Runtime does: install a CUDA "
                            "build of torch, or use --provider cpu")
    device = first.device  # the closures below hold this, never `first` (its weights)

    def session(file: str) -> OrtRunner:
        # every other ONNX model on the provider the first really got: no mixed devices
        opened = ort_runner(bundle.onnx_model(file), device, tf32=tf32, threads=threads,
                            name=names[file])
        check_fits(opened, bundle.io_shapes, file)
        return opened

    check_fits(first, bundle.io_shapes, main)
    others = [file for file in models if file != main and names[file] in wanted]
    torch_names = [name for name in torch_files if name in wanted]
    untrusted = [] if trust_code or include is not None else torch_names
    torch_names = [name for name in torch_names if name not in untrusted]
    runners: list[Runner] = [TorchRunner(
        bundle.load_eager().to(device), "eager", device,
        InputSpec.from_description(bundle.description.to_dict()))]
    if deferred:
        def torch_file(name: str) -> Callable[[], Runner]:
            return lambda: load_torch_file(name, bundle.read_file(torch_files[name]), device)


        big = bundle.file(WEIGHTS_FILE).stat().st_size > RELEASE_ABOVE
        runners += [Deferred(name, device, torch_file(name), collect=big)
                    for name in torch_names]
        sessions = {main: Deferred(first.name, device, lambda: session(main), first, big)}
        sessions |= {file: Deferred(names[file], device, lambda file=file: session(file),
                                    collect=big) for file in others}
    else:
        runners += [load_torch_file(name, bundle.read_file(torch_files[name]), device)
                    for name in torch_names]
        sessions = {main: first} | {file: session(file) for file in others}
    runners += [s for file, s in sessions.items() if s.name in wanted]
    onnx_files = {s.name: file for file, s in sessions.items()}
    notes, computes = list(first.notes), {}
    if untrusted:
        notes.append(f"{', '.join(torch_files[n] for n in untrusted)} not run: a file that "
                     f"can carry code runs only with --trust-code (or named, as --runtime "
                     f"does)")
    wanted_ov = {name: v for name, v in ov_runners.items() if name in wanted}
    if wanted_ov and first.device != "cpu":
        raise ProviderError("OpenVINO runs on the CPU, and every runner must run where ONNX "
                            "Runtime does: use --provider cpu with OpenVINO")
    spec = InputSpec.from_description(bundle.description.to_dict())
    for name, (file, hint) in wanted_ov.items():
        try:
            runner = OpenVinoRunner(bundle.onnx_model(file), name, hint, threads, spec)
        except ProviderError as exc:
            if hint == "f32" or include is not None:
                raise
            notes.append(f"{name} left out: {exc}")
            continue
        runners.append(runner)
        onnx_files[name] = file
        if hint != "f32":
            computes[name] = hint
    return RunnerSet(first.device, provider, notes, runners, onnx_files, computes)
def runner_names(bundle: Bundle) -> list[str]:
    """Every runner a bundle can open, as reports and `bench` name them: eager (its weights),
    its PyTorch artifacts, each ONNX model on ONNX Runtime and on OpenVINO, model.e2e.onnx
    (uint8 images in) on ONNX Runtime, and model.onnx on OpenVINO in bf16."""
    return ["eager", *bundle.torch_files, *_ort_files(bundle), *openvino_runners(bundle)]


def _ort_files(bundle: Bundle) -> dict[str, str]:
    """Runner name -> file, for each ONNX model of the bundle on ONNX Runtime, model.e2e.onnx
    (uint8 images in) last."""
    files = [*bundle.onnx_models, *([bundle.e2e_model] if bundle.e2e_model else [])]
    return {bundle.runner_name(file): file for file in files}


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
    description, shapes = model.description, model.io_shapes
    if isinstance(model, Bundle):
        bundle = model
        onnx = _ort_files(bundle)
        openvino = {n: (file, hint) for n, (file, hint) in openvino_runners(bundle).items()}
        torch_files = dict(bundle.torch_files)
        if name not in ("eager", *torch_files, *onnx, *openvino):
            flag = {"pt2": " (export --pt2)", "aoti": " (export --aoti)",
                    f"onnxruntime[{ONNX_FILE}]": " (model.onnx's runner is onnxruntime)",
                    f"openvino[{ONNX_FILE}]": " (model.onnx's runner is openvino)"}.get(name, "")
            raise BundleError(f"{bundle.path} has no runner {name} (it has "
                              f"{', '.join(runner_names(bundle))}){flag}")
        load_onnx, load_file = bundle.onnx_model, bundle.read_file  # read once, checked
    else:
        path = model.path
        fits = FILE_RUNNERS.get(path.suffix, ())
        if name not in fits:
            raise ConfigError(f"runner {name} cannot run {path}: a {path.suffix or 'plain'} "
                              f"file runs on {' or '.join(fits) or 'nothing we know'} (or "
                              f"give the bundle folder)")
        onnx = {"onnxruntime": path.name}
        openvino = {n: (path.name, hint) for n, hint in (("openvino", "f32"),
                                                         ("openvino-bf16", "bf16"))}
        torch_files = {name: path.name} if path.suffix in (".ts", ".pt2") else {}
        # a file the user named: read once here, its checks run on the bytes it loads
        load_onnx, load_file = (lambda _: read_onnx_file(path)), (lambda _: read_once(path))
    spec = InputSpec.from_description(description.to_dict())
    if name in openvino:  # an ONNX file on OpenVINO's CPU plugin
        if provider == "cuda":
            raise ProviderError(f"--runtime {name} runs on the CPU; --provider cuda cannot be "
                                f"honoured")
        file, hint = openvino[name]
        return OpenVinoRunner(load_onnx(file), name, hint, threads, spec)
    if name in onnx:
        session = ort_runner(load_onnx(onnx[name]), provider, threads=threads, name=name)
        if session.spec is not None and session.spec.images:  # model.e2e.onnx: images in
            shapes = ((HEIGHT_DIM, WIDTH_DIM, shapes[0][0]), shapes[1])
        check_fits(session, shapes, Path(onnx[name]).name)
        return session
    device = "cuda" if provider == "cuda" else torch_device(provider)  # cuda, no GPU: error
    if name == "eager":
        return TorchRunner(model.load_eager().to(device), "eager", device, spec)
    return load_torch_file(name, load_file(torch_files[name]), device)


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
    record = read_performance(path)
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
