"""The front door: each command of `vit-export` as one function, with the command's names.

    import vit_export

    report = vit_export.export("vit_small_patch16_224", "out/small", precision="fp16")
    report = vit_export.validate("out/small", batch_sizes=[1, 8])
    runner = vit_export.open("out/small")              # runner(x) -> logits
    answers = vit_export.infer("out/small", ["photos/"], top_k=3)
    result = vit_export.bench("out/small", batch_sizes=[1, 8])
    vit_export.serve("out/small", port=8000)            # until Ctrl-C or SIGTERM

Every keyword is the command's flag (`precision=` is `--precision`, `pt2=` is `--pt2`,
`runtimes=` is `--runtimes`), and an error names it as the caller spells it: a Python
caller reads `fp16_io needs precision='fp16'`, the command's user `--fp16-io needs
--precision fp16`, from one message (`errors.param`). Each function returns data (a
`ParityReport`, a runner, records, a `BenchResult`) or raises one of `errors`; none prints,
none exits. The command line is these functions, parsing before and printing after.
"""
from __future__ import annotations

import builtins
import dataclasses
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

from .errors import Note, OptionError, param, within

if TYPE_CHECKING:
    from .checkpoints.files import CheckpointFiles
    from .parity import ParityReport

KINDS = ("bundle", "checkpoint", "preset", "hub")  # where a model comes from
Progress = Optional[Callable[[str], None]]


@dataclasses.dataclass
class Model:
    """A model to export: ours (`model.VisionTransformer`), what its bundle will say
    about it, and the checkpoint files it was imported from, read once (what the source
    framework's model is built from for source parity), or None."""
    model: Any
    description: Any
    files: Optional[CheckpointFiles] = None


def source_kind(source: Any) -> str:
    """What `source` names: a bundle folder, a checkpoint file or folder, a preset, or a
    Hugging Face Hub model (or timm name) — a local path first, as the Hub's own loaders
    look."""
    from .bundle import CONFIG_FILE, WEIGHTS_FILE
    from .config import PRESETS

    path = Path(source)
    if path.is_dir() and (path / CONFIG_FILE).is_file() and (path / WEIGHTS_FILE).is_file():
        return "bundle"
    if path.exists():
        return "checkpoint"
    return "preset" if str(source) in PRESETS else "hub"


def load(source: Any, *, kind: Optional[str] = None, preset: Optional[str] = None,
         fmt: Optional[str] = None, overrides: Optional[Mapping[str, Any]] = None,
         timm_name: Optional[str] = None, torchvision_weights: Optional[str] = None,
         seed: int = 0, progress_bars: bool = False, road: str = "auto") -> Model:
    """The model `source` names, ready to export: a bundle folder (`kind="bundle"`, what
    `--from` reads), a checkpoint file or folder (`"checkpoint"`; `preset`, `fmt`,
    `timm_name`, `torchvision_weights` and `overrides` refine it), a preset with random
    weights seeded by `seed` (`"preset"`, or `source=None` with `preset=`), a Hub model
    or timm name (`"hub"`), or our own `VisionTransformer`. `kind` None: `source_kind`.
    `road`: how a checkpoint is built: "auto" (our rebuild where vit-export has one, else the
    framework's own module), "native" or "framework"."""
    from .checkpoints import load_model, read_checkpoint

    if source is None and preset is not None:
        source, kind = preset, "preset"
    if hasattr(source, "config") and hasattr(source, "forward"):  # our model, in hand
        from . import bundle as B

        return Model(source.eval(), B.Description(
            source.config, B.Preprocessing.default_for(source.config)))
    kind = kind or source_kind(source)
    if kind not in KINDS:
        raise OptionError(f"{param('kind', kind)}: choose one of {', '.join(KINDS)}")
    refined = bool(overrides or timm_name or torchvision_weights or fmt)
    if kind == "hub":
        if refined and (fmt or timm_name or torchvision_weights):
            raise OptionError(f"{param('fmt')}, {param('timm_name')} and "
                              f"{param('torchvision_weights')} apply to a checkpoint; a Hub "
                              f"model's are read off its repo")
        from .hub import load_named

        return Model(*load_named(str(source), dict(overrides or {}), progress_bars))
    if fmt and kind != "checkpoint":
        raise OptionError(f"{param('fmt')} applies to a checkpoint only")
    if road != "auto" and kind != "checkpoint":
        raise OptionError(f"{param('road', road)} applies to a checkpoint only")
    if kind == "bundle" and (refined or preset):
        raise OptionError(f"{param('overrides')}, {param('preset')}, {param('timm_name')} "
                          f"and {param('torchvision_weights')} apply to a checkpoint or a "
                          f"preset, not a bundle")
    files = read_checkpoint(source) if kind == "checkpoint" else None
    model, description = load_model(
        source if kind == "bundle" else None, str(source) if kind == "preset" else preset,
        files, fmt, {k: str(v) for k, v in (overrides or {}).items()}, seed, timm_name,
        torchvision_weights, road)
    return Model(model, description, files)


def export(source: Any, out: str | os.PathLike, *, kind: Optional[str] = None,
           preset: Optional[str] = None, fmt: Optional[str] = None,
           overrides: Optional[Mapping[str, Any]] = None, timm_name: Optional[str] = None,
           torchvision_weights: Optional[str] = None, road: str = "auto", seed: int = 0,
           batch_sizes: Optional[Sequence[int]] = None, provider: str = "auto",
           runtimes: Sequence[str] = (), progress: Progress = None,
           notes: Optional[Callable[[str], None]] = None, progress_bars: bool = False,
           **options: Any) -> ParityReport:
    """Export the model `source` names to a bundle folder `out`, validated against eager
    PyTorch before anything is written: `vit-export export`. `kind`, `preset`, `fmt`,
    `overrides`, `timm_name`, `torchvision_weights` and `road` say where it comes from and
    how it is built, as `load` takes them.

    Args:
        source: A bundle folder, a checkpoint file or folder, a preset name, a Hub model or
            timm name, or our `VisionTransformer` (`load`, `kind` says which).
        out: The bundle folder to write (atomically: all of it or nothing).
        seed: A preset's weights, the validation's inputs, the calibration sample.
        batch_sizes: The validation's batch sizes (validate's).
        provider: Where the validation runs ("auto", "cuda", "cpu").
        runtimes: Opt-in runtimes the validation runs too ("openvino").
        progress: Told each step as it starts.
        notes: Told what the import notes (how a checkpoint's config was read).
        progress_bars: A download's progress bars on stderr.
        **options: `ExportOptions`' fields, the command's flags: `precision="fp16"`,
            `optimize=True`, `quantize="int8"|"static"`, `calibrate=PATH`, `max_drop=`,
            `pt2=True`, `aoti=True`, `aoti_precision=`, `dynamic_size=True`,
            `outputs="embedding"`, `normalize=True`, `embed_preprocessing=True`,
            `real_data=FILE.npz`, `exporter=`, `opset=`, `export_batch_size=`,
            `external_data=`, `fp16_io=`, `force=True`, ...

    Returns:
        The validation report, also written to the bundle as parity.json.

    Raises:
        ParityError: An artifact does not match eager PyTorch (nothing written).
        OptionError: Options that do not go together, refused before any work.
    """
    from .exporting import export_bundle

    chosen = _export_options(options, dict(batch_sizes=batch_sizes, provider=provider,
                                           seed=seed, runtimes=_names(runtimes)))
    _refuse_overwriting({"out": out}, _export_reads(source, kind, chosen))
    training = getattr(source, "training", False)  # a model in hand's mode, given back
    if progress:
        progress("loading the model")
    loaded = load(source, kind=kind, preset=preset, fmt=fmt, overrides=overrides,
                  timm_name=timm_name, torchvision_weights=torchvision_weights, seed=seed,
                  progress_bars=progress_bars, road=road)
    chosen = _loaded(loaded, chosen, notes)
    held = loaded.model is source  # the caller's: kept as it was; one built here is released
    try:
        return export_bundle(loaded.model, out, loaded.description, chosen,
                             release_model=not held, progress=progress)
    finally:
        if held:
            source.train(training)
        if loaded.files is not None:
            loaded.files.close()


def _export_options(options: dict[str, Any], validation: dict[str, Any]):
    """ExportOptions from export's keywords, before anything is loaded; `validation` is
    made from its own keywords, never given whole."""
    from .exporting.options import ExportOptions, check_package_precision

    if "validation" in options:
        raise OptionError(f"{param('validation')}: give {param('batch_sizes')}, "
                          f"{param('provider')}, {param('seed')} and {param('runtimes')}")
    chosen = _made(ExportOptions, dict(options, validation=validation))
    check_package_precision(chosen.package_precision, validation["provider"])
    return chosen


def _export_reads(source: Any, kind: Optional[str], chosen) -> list:
    """What an export reads from disk: the source where it names files (a bundle folder, a
    checkpoint; a preset's or a Hub model's name is no path, even where a folder of that
    name is the output), the labelled data and the calibration set."""
    named = isinstance(source, (str, os.PathLike)) and \
        (kind or source_kind(source)) in ("bundle", "checkpoint")
    return [source if named else None, chosen.real_data, chosen.calibrate]


def _available_memory() -> Optional[int]:
    """Bytes the kernel could hand out now without swapping (Linux's MemAvailable)."""
    try:
        with builtins.open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def check_memory(config, batch_sizes: Optional[Sequence[int]], name: str = "batch_sizes"
                 ) -> None:
    """OptionError, before allocating, where the largest of `batch_sizes` (the parameter
    `name`) needs more memory for one forward pass than is available: a usage error, not an
    out-of-memory kill minutes later. `config` None: no estimate (a framework's module)."""
    available = _available_memory()
    if not batch_sizes or available is None or config is None:
        return
    largest = max(batch_sizes)
    needed = config.forward_bytes(largest)
    if needed > available:
        raise OptionError(f"{param(name)}: batch {largest} needs about {needed / 2**30:.1f} "
                          f"GiB for one forward pass, {available / 2**30:.1f} GiB is "
                          f"available")


def _loaded(loaded: Model, chosen, notes: Optional[Callable[[str], None]]):
    """After loading, before any work: what the import notes, said; the batches held to
    the memory there is; the options with the source framework's files (what the import
    read) for the validation."""
    imported = loaded.description.extra.get("import")
    for note in imported.get("notes", []) if isinstance(imported, dict) else []:
        (notes or (lambda _: None))(str(note))
    # the estimate reads a ViT's shape, which a framework's own module's config is not
    config = None if loaded.description.module is not None else loaded.model.config
    check_memory(config, chosen.validation.batch_sizes)
    check_memory(config, [chosen.export_batch_size + 1], "export_batch_size")  # its probe
    return dataclasses.replace(chosen, validation=dataclasses.replace(
        chosen.validation, source=loaded.files))


def _made(cls: type, values: dict[str, Any]) -> Any:
    """`cls(**values)`, a keyword it does not take said as the front door's one line."""
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(values) - names)
    if unknown:
        raise OptionError(f"unknown keyword {unknown[0]!r}; the options are "
                          f"{', '.join(sorted(names))}")
    return cls(**values)


def validate(bundle: str | os.PathLike, *, batch_sizes: Optional[Sequence[int]] = None,
             provider: str = "auto", runtimes: Sequence[str] = (),
             require_provider: Optional[str] = None, seed: int = 0,
             real_data: Optional[str | os.PathLike] = None,
             images: Sequence[str | os.PathLike] = (), layers: bool = False,
             profile: Optional[str] = None, atol: Optional[float] = None,
             rtol: Optional[float] = None, min_cosine: Optional[float] = None,
             min_neighbours: Optional[float] = None,
             source: Optional[str | os.PathLike] = None, trust_code: bool = False,
             threads: Optional[int] = None, save_outputs: Optional[str | os.PathLike] = None,
             progress: Progress = None) -> ParityReport:
    """Compare eager PyTorch with every model of `bundle`, on random inputs at
    `batch_sizes` and on `real_data` (a labelled .npz) and `images` (files or folders):
    `vit-export validate`. A mismatch is a report whose `passed` is False; `source` names
    the checkpoint the bundle was imported from, to compare it with its own framework.
    See `parity.ValidateOptions` for each keyword."""
    from . import bundle as B
    from . import parity

    _refuse_overwriting({"save_outputs": save_outputs},
                        [bundle, real_data, source, *_paths(images)])
    found = B.read_bundle(bundle)  # read and verified once, handed down
    check_memory(found.config if found.description.module is None else None, batch_sizes)
    given = parity.inputs_from_files(found, _paths(images), real_data)
    files = _source_files(found, source)  # before any work: a wrong source is said first
    try:
        options = parity.ValidateOptions(
            batch_sizes=batch_sizes, provider=provider, seed=seed, runtimes=_names(runtimes),
            overrides=dict(atol=atol, rtol=rtol, min_cosine=min_cosine,
                           min_neighbours=min_neighbours),
            real_inputs=given.real_inputs, layers=layers, require_provider=require_provider,
            profile=profile, raw_images=given.raw_images, image_files=given.image_files,
            trust_code=trust_code, threads=threads, save_outputs=save_outputs, source=files)
        return parity.validate(found, options, progress=progress)
    finally:
        if files is not None:
            files.close()


def _paths(given: Any) -> list:
    """One path, or several: a lone string is one path, never its characters."""
    return [given] if isinstance(given, (str, os.PathLike)) else list(given or ())


def _names(given: Any) -> tuple:
    """One name, or several: a lone string is one name, never its characters."""
    return (given,) if isinstance(given, str) else tuple(given or ())


def _refuse_overwriting(outputs: dict[str, Any], inputs: Sequence[Any]) -> None:
    """`bundle.refuse_overwriting`, each output named as its keyword and value, and the
    inputs that are paths (a calibration set already read is none)."""
    from . import bundle as B

    B.refuse_overwriting(outputs, [i for i in inputs if isinstance(i, (str, os.PathLike))],
                         shown=lambda name, out: param(name, str(out)))


def _source_files(found, source: Optional[str | os.PathLike]):
    """The checkpoint files `source` names for a bundle imported from them, read and checked
    against the bundle's import record (checkpoints.read_recorded), or None."""
    if source is None:
        return None
    from .checkpoints import read_recorded
    from .parity.source import recorded_files

    if not isinstance(found.description.extra.get("import"), dict):
        raise OptionError(f"{param('source')}: {found.path} was not imported from a "
                          f"checkpoint (a preset or a model folder): it has no source to "
                          f"compare")
    return read_recorded(source, recorded_files(found.description))


def open(model: str | os.PathLike, runtime: str = "auto", provider: str = "auto", *,
         batch_size: int = 1, threads: Optional[int] = None):
    """A runner of `model` (a bundle folder or a model file): `runner(x)` gives the model's
    first output, `runner.run_all(x)` all of them, for a batch of preprocessed pixels
    [N, C, H, W]. `runtime`: a runner name (`onnxruntime`, `openvino-bf16`,
    `onnxruntime[model.int8.onnx]`, ...) or auto (the fastest validated one performance.json
    names for `batch_size`, else model.onnx); `runner.name` and `runner.device` say what
    runs where. A file that can carry code runs only when named."""
    from . import bundle as B
    from . import runtime as rt
    from .choosing import resolve_runner

    within("batch_size", batch_size, 1, whole=True)
    if threads is not None:
        within("threads", threads, 1, rt.MAX_THREADS, whole=True)
    opened = B.read_model(model)
    name, _ = resolve_runner(opened, runtime, provider, batch_size)
    return rt.open_runner(opened, name, provider, threads=threads)


@dataclasses.dataclass
class Inferred:
    """What `infer` answered: a record per input (`{"input", "top": [...]}` or
    `{"input", "embedding": [...]}`), the runner that ran and where (on Ray Data, the
    provider asked for), why auto chose it, notes, and the files written (embeddings'
    `output`); on Ray Data, the counts of the run instead of the records."""
    records: list[dict[str, Any]]
    runtime: str
    device: str
    chosen_by: Optional[str] = None
    notes: list[str] = dataclasses.field(default_factory=list)
    counts: Optional[dict[str, Any]] = None
    written: list[Path] = dataclasses.field(default_factory=list)


def infer(model: str | os.PathLike, inputs: Sequence[str | os.PathLike], *, top_k: int = 5,
          batch_size: int = 8, runtime: str = "auto", provider: str = "auto",
          embed: bool = False, ray: bool = False, output: Optional[str | os.PathLike] = None,
          force: bool = False, workers: int = 1, resume: bool = False,
          address: Optional[str] = None,
          progress: Optional[Callable[[int, int], None]] = None) -> Inferred:
    """Classify (or `embed`) image files, folders or .npy arrays with `model` (a bundle
    folder or a model file): `vit-export infer`. With `ray`, on Ray Data into `output`
    (JSON lines, or Parquet for `embed`; `resume` continues an earlier run, `address` joins
    a cluster). `progress(done, total)` is told once the inputs are counted (0 done), then
    as they are answered."""
    from .deploy.classify import InferOptions
    from .images import expand_inputs

    options = InferOptions(runtime=runtime, provider=provider, batch_size=batch_size,
                           top_k=top_k, embed=embed, output=output, force=force, ray=ray,
                           workers=workers, resume=resume, address=address)
    names = [str(i) for i in _paths(inputs)]
    _refuse_overwriting({"output": output}, [model, *names])
    tell = progress or (lambda done, total: None)
    if ray:
        from .deploy.ray.data import infer_on_ray, refuse_existing

        refuse_existing(Path(options.output), resume, force)  # before anything is shown
        files = expand_inputs(names)
        tell(0, len(files))
        counts = infer_on_ray(Path(model), files, options, progress=tell)
        return Inferred([], counts["runtime"], provider, counts["chosen_by"], counts=counts)
    return _infer_here(Path(model), names, options, tell)


def _infer_here(model: Path, names: list[str], options, tell) -> Inferred:
    from .deploy.classify import Classifier, Embedder, batched
    from .embeddings import check_format, write, written_files
    from .errors import VitExportError
    from .exporting.variants import batch_dependence
    from .images import expand_inputs

    if options.output is not None:  # embeddings' file: refused before any work
        check_format(options.output)
        there = next((f for f in written_files(options.output) if f.exists()), None)
        if there is not None and not options.force:
            raise VitExportError(f"{there} exists; use {param('force')} to replace it")

    classify = (Embedder if options.embed else Classifier)(  # what the model gives: said first
        model, options.provider, options.runtime, batch_size=options.batch_size)
    files = expand_inputs(names)
    tell(0, len(files))
    records: list = []
    chunks = (tuple(zip(*chunk)) for chunk in batched(classify.inputs(files),
                                                      options.batch_size))
    for answered in classify.stream_records(chunks, options.top_k):  # the next read overlaps
        records += answered
        tell(len(records), len(files))
    runner = classify.runner
    note = batch_dependence(runner.name)
    notes = [Note(f"{note}; {param('batch_size', 1)} answers each image alone")] \
        if note and options.batch_size > 1 and len(files) > 1 else []
    written = write(options.output, [r["input"] for r in records],
                    [r["embedding"] for r in records]) if options.output is not None else []
    return Inferred(records, runner.name, runner.device, classify.chosen_by, notes,
                    written=written)


def bench(target: str | os.PathLike, *, batch_sizes: Sequence[int] = (1, 8, 32),
          runtimes: Sequence[str] = (), runners: Optional[Sequence[str]] = None,
          threads: Optional[int] = None, provider: str = "auto", trust_code: bool = False,
          variants: Sequence[str] = ("optimized", "int8"), seed: int = 0,
          min_seconds: float = 2.0, min_runs: int = 5, warmup: int = 2,
          peers: Sequence[str] = (), progress: Progress = None):
    """Time eager PyTorch and every model of the bundle `target` (or of a preset, exported
    first with `variants` to a temporary folder): `vit-export bench`. `runners` keeps eager
    and the runners named; `runtimes` adds opt-in runtimes (openvino); `peers` also times
    PyTorch's own fast paths. Returns a `BenchResult`."""
    import tempfile

    from . import benchmarking as timing
    from . import bundle as B
    from .config import PRESETS, preset_config

    is_preset = not Path(target).exists() and str(target) in PRESETS
    found = None if is_preset else B.read_bundle(target)  # read once, handed to bench
    check_memory(preset_config(str(target)) if is_preset else
                 found.config if found.description.module is None else None, batch_sizes)
    options = timing.BenchOptions(
        batch_sizes=list(batch_sizes), threads=threads, provider=provider, warmup=warmup,
        min_runs=min_runs, min_seconds=min_seconds, seed=seed,
        runners=None if runners is None else list(_names(runners)),
        runtimes=_names(runtimes), peers=list(_names(peers)),
        trust_code=trust_code or is_preset)
    if found is not None:
        return timing.bench(found, options=options, progress=progress)
    flags = variant_flags(_names(variants))
    with tempfile.TemporaryDirectory(prefix="vit-export-bench-") as tmp:
        out = Path(tmp) / str(target)
        export(str(target), out, kind="preset", seed=seed, provider=provider,
               runtimes=runtimes, progress=progress, **flags)
        return timing.bench(B.read_bundle(out), options=options, progress=progress)


def variant_flags(variants: Sequence[str]) -> dict[str, Any]:
    """The export flags that make the ONNX variants named (variants.VARIANTS but static):
    fp16 -> precision fp16, optimized -> optimize, optimized-fp16 -> both, int8 -> quantize."""
    from .exporting.variants import VARIANTS

    unknown = [v for v in variants if v not in VARIANTS or v == "static"]
    if unknown:
        raise OptionError(f"{param('variants', ','.join(variants))}: {unknown[0]!r} is not "
                          f"one of fp16, optimized, optimized-fp16, int8")
    fp16 = any(v in ("fp16", "optimized-fp16") for v in variants)
    return {"precision": "fp16" if fp16 else "fp32",
            "optimize": any(v.startswith("optimized") for v in variants),
            "quantize": ("int8",) if "int8" in variants else ()}


def serve(bundle: str | os.PathLike, *, host: str = "127.0.0.1", port: int = 8000,
          replicas: int = 1, autoscale: Optional[tuple[int, int]] = None,
          max_batch_size: int = 16, batch_wait_ms: float = 5.0,
          max_request_bytes: Optional[int] = None, top_k: int = 5, runtime: str = "auto",
          provider: str = "auto", threads: Optional[int] = None,
          address: Optional[str] = None, started: Optional[Callable[..., None]] = None,
          notes: Optional[Callable[[str], None]] = None) -> None:
    """Serve `bundle` over HTTP on Ray Serve (/predict or /embed, /healthz, and the Open
    Inference Protocol under /v2) until stopped: `vit-export serve`. Starts Ray here, or
    joins the cluster at `address`; `notes` is told what the choice of runner means before
    Ray starts, and `started(url, replicas, serving)` once it answers (`serving`: the
    route, the runner and why auto chose it). Returns by
    raising the stop (KeyboardInterrupt or `errors.Signalled`) once Ctrl-C or SIGTERM has
    drained it; it never exits the process."""
    from .deploy.ray.serve import serve_bundle, serve_options

    serving = serve_options(
        bundle, host=host, port=port, replicas=replicas, autoscale=autoscale,
        max_batch_size=max_batch_size, batch_wait_ms=batch_wait_ms,
        max_request_bytes=max_request_bytes, top_k=top_k, runtime=runtime,
        provider=provider, threads=threads, address=address)
    for note in serving.notes:
        (notes or (lambda _: None))(note)
    told = started or (lambda url, count, serving: None)
    serve_bundle(str(bundle), serving.options, address,
                 lambda url, count: told(url, count, serving))
