"""`validate`: open every runner of a bundle, run them all on the same inputs (the run stage,
`run_bundle`: a RunResult), compare (pure, over that data), check, and gather it all into one
ParityReport."""
from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Optional

import numpy as np

from .. import bundle as B
from .. import runtime
from ..checkpoints.files import CheckpointFiles, read_recorded
from ..errors import (
    OptionError,
    ParityError,
    RunError,
    VitExportError,
    first_line,
    param,
    raw,
    within,
)
from ..model import random_input
from .ahead import SourceAhead, SourceRunFailed
from .budget import STATIC_FILE, budget_check, measure
from .checks import judged_profiles, placement_check, scan_graph, scan_program, unseen_batch_check
from .compare import MIN_NEIGHBOUR_IMAGES, compare_run, compare_runs
from .e2e import E2E_REFERENCE, e2e_images, pipeline_check, run_e2e
from .inputs import ImageSet, InputSet, default_batch_sizes, input_sets, validation_sizes
from .report import Check, ParityReport
from .runs import RunnerRecord, RunResult
from .saved import refuse_bundle_files, save_run
from .source import (
    Source,
    SourceSkipped,
    build_source,
    recorded_files,
    run_failed,
    source_rows,
    source_sizes,
)
from .stages import compare_stages, first_divergence, run_stages
from .tolerance import PROFILES, profile_tolerance


def run_stage(runners: Sequence[runtime.Runner], sets: Sequence[InputSet],
              progress: Optional[Callable[[str], None]] = None
              ) -> list[dict[str, dict[str, np.ndarray]]]:
    """Every output of every runner on every input set: [set index] -> runner -> output
    name -> values, e.g. [N, K] logits.

    One runner at a time on every set: those open already first, then each deferred one
    (runtime.Deferred) is opened, run and released, so no two candidates' weights are held
    at once. The first runner, the reference, is kept."""
    outputs: list[dict[str, dict[str, np.ndarray]]] = [{} for _ in sets]
    waiting = [i > 0 and not getattr(r, "opened", True) for i, r in enumerate(runners)]
    order = [r for r, w in zip(runners, waiting) if not w] + \
        [r for r, w in zip(runners, waiting) if w]
    for runner in order:
        for s, row in zip(sets, outputs):
            step = s.chunk or len(s.x)
            if progress:
                progress(f"running {runner.name} on {s.name}, {len(s.x)} input(s)")
            try:
                chunks = [runner.run_all(s.x[i:i + step]) for i in range(0, len(s.x), step)]
            except RunError as exc:  # the runtime's own error, said by the runner
                raise ParityError(f"{runner.name} on {runner.device} failed on {s.name}: "
                                  f"{raw(exc)}") from None
            except VitExportError:
                raise
            except Exception as exc:  # PyTorch and ONNX Runtime raise many error types
                raise ParityError(f"{runner.name} on {runner.device} failed on {s.name}: "
                                  f"{type(exc).__name__}: {first_line(exc)}") from None
            row[runner.name] = {name: np.concatenate([c[name] for c in chunks])
                                for name in chunks[0]}
        if runner is not runners[0] and hasattr(runner, "release"):
            runner.release()
    return outputs


# what validate's tolerance overrides may be: (lowest, highest)
TOLERANCE_RANGES = {"atol": (0, 1e6), "rtol": (0, 1e6), "min_cosine": (-1, 1),
                    "min_neighbours": (0, 1)}
SEED_MAX = 2 ** 32 - 1  # numpy's seeds


@dataclass(frozen=True)
class ValidateOptions:
    """What `validate` runs, on what, and how it judges; the defaults are those of `vit-export
    validate`. Every runner is built on one device: the one ONNX Runtime really runs on for
    `provider` (eager PyTorch runs there too)."""
    # of the random inputs [default: 1, the export batch + 1 and 7, so the batch axis must
    # really be dynamic]
    batch_sizes: Optional[Sequence[int]] = None
    provider: str = runtime.DEFAULT_PROVIDER  # "auto", "cuda" or "cpu"
    seed: int = 0  # of the random inputs and of model.e2e.onnx's pictures
    # tolerance fields (atol, rtol, min_cosine, min_neighbours) replaced in every profile; a
    # None value keeps the profile's
    overrides: Optional[dict[str, Optional[float]]] = None
    # name -> (preprocessed [N, C, H, W] array, labels [N] or None), e.g. held-out images;
    # each set is judged whole, and with labels the report gives every runner's accuracy
    real_inputs: Optional[dict[str, tuple[np.ndarray, Optional[np.ndarray]]]] = None
    # also compare each stage of each ONNX model and of model.pt2, at the smallest batch size
    layers: bool = False
    require_provider: Optional[str] = None  # "cuda" or "cpu": fail when another one ran
    # judge the ONNX models of this profile's precision by it, not by their own (e.g. "tf32")
    profile: Optional[str] = None
    # (H, W) a dynamic-size bundle is also run at on random inputs [default:
    # validation_sizes]; its graph scan proves no size was baked in
    image_sizes: Optional[Sequence[tuple[int, int]]] = None
    # model.e2e.onnx's inputs beside the seeded pictures (e2e_images): name -> (uint8
    # [H, W, C] images, labels or None), judged against our Python pipeline + eager under
    # the "e2e" profile
    raw_images: Optional[dict[str, tuple[list[np.ndarray], Optional[np.ndarray]]]] = None
    # image files run through our preprocessing and the source framework's (pipeline_check)
    image_files: Optional[Sequence[str | os.PathLike]] = None
    # the opt-in runtimes to run too, by name (runtime.registry): "openvino" adds OpenVINO's
    # CPU runners of the ONNX models, each judged by its file's profile, and its bf16 runner
    # by the bf16 profile. The runtimes that are not opt-in (ONNX Runtime, PyTorch) always run
    runtimes: Sequence[str] = ()
    # also run the files that can carry code (model.ts, model.pt2, model.aoti.pt2): what
    # export validates it made itself; a bundle from elsewhere only with --trust-code
    trust_code: bool = False
    # intra-op threads of PyTorch and ONNX Runtime for the run [default: each one's own]
    threads: Optional[int] = None
    # keep the run (inputs, every runner's outputs, where each ran) in this .npz (save_run)
    save_outputs: Optional[str | os.PathLike] = None
    # for a bundle imported from a checkpoint or the Hub, also run the source framework's
    # own model (transformers, timm, torchvision) against eager and model.onnx
    # (source_parity), built from the files the import read: found in the checkpoint file or
    # folder named here (each must hash to the import record's sha256), or given as read
    # already (checkpoints.CheckpointFiles: what export read), or computed already from
    # those by a second process (SourceAhead: export's). None: not compared, and the
    # report says how to ask for it. A path a bundle records is never opened.
    source: Optional[str | os.PathLike | CheckpointFiles | SourceAhead] = None

    def __post_init__(self) -> None:
        from ..runtime.registry import by_name

        runtimes = (self.runtimes,) if isinstance(self.runtimes, str) else self.runtimes
        names = tuple(dict.fromkeys(by_name(n).name for n in runtimes))  # ConfigError
        object.__setattr__(self, "runtimes", names)
        self._check_values()

    def _check_values(self) -> None:
        """The ranges validate's flags hold their values to, for every caller: a tolerance
        that is NaN, infinite or out of range would judge nothing, or fail what passes."""
        if isinstance(self.batch_sizes, (str, bytes)):
            raise OptionError(f"{param('batch_sizes', self.batch_sizes)}: give a list of "
                              f"integers")
        for size in self.batch_sizes or ():
            within("batch_sizes", size, 1, whole=True)
        if self.batch_sizes is not None and not self.batch_sizes:
            raise OptionError(f"{param('batch_sizes', [])}: give one batch size or more")
        within("seed", self.seed, 0, SEED_MAX, whole=True)
        if self.threads is not None:
            within("threads", self.threads, 1, runtime.MAX_THREADS, whole=True)
        if self.profile is not None and self.profile not in PROFILES:
            raise OptionError(f"{param('profile', self.profile)}: choose one of "
                              f"{', '.join(PROFILES)}")
        for name, value in (self.overrides or {}).items():
            if name not in TOLERANCE_RANGES:
                raise OptionError(f"unknown tolerance {name!r}; the overrides are "
                                  f"{', '.join(TOLERANCE_RANGES)}")
            if value is not None:
                within(name, value, *TOLERANCE_RANGES[name])


def _sizes(bundle: B.Bundle, options: ValidateOptions
           ) -> tuple[int, list[int], list[tuple[int, int]]]:
    """The export batch, the batch sizes and the image sizes a run feeds, checked."""
    export_batch = int(bundle.description.export.get("export_batch", 2))
    sizes = (sorted(set(options.batch_sizes)) if options.batch_sizes
             else default_batch_sizes(export_batch))
    config = bundle.config
    sizes_hw = ([tuple(s) for s in options.image_sizes] if options.image_sizes
                else validation_sizes(config))
    if not config.dynamic_img_size and sizes_hw != [(config.img_size, config.img_size)]:
        raise ParityError(f"{bundle.path} takes {config.img_size}x{config.img_size} images only; "
                          f"other sizes need a dynamic-size bundle (export "
                          f"{param('dynamic_size', True)})")
    bad = [f"{h}x{w}" for h, w in sizes_hw
           if h < 1 or w < 1 or h % config.patch_size or w % config.patch_size]
    if bad:
        raise ParityError(f"image size {bad[0]} is not a multiple of the patch size "
                          f"{config.patch_size}")
    return export_batch, sizes, sizes_hw


def _open(bundle: B.Bundle, options: ValidateOptions) -> runtime.RunnerSet:
    """Every runner of the bundle on one device, as `options` say."""
    # --profile tf32 judges ONNX Runtime computing in TF32 (CUDA's use_tf32) against eager
    # in full fp32: the reference never computes in reduced precision
    tf32 = options.profile == "tf32"
    runners = runtime.open_runners(bundle, options.provider, runtimes=options.runtimes,
                                   tf32=tf32, threads=options.threads, deferred=True,
                                   trust_code=options.trust_code)
    if tf32 and runners.device != "cuda":
        how = param("profile", "tf32")
        raise ParityError(f"{how} judges TF32 compute, which ONNX Runtime has on "
                          f"CUDA only, and this run is on {runners.device}")
    return runners


def _run(bundle: B.Bundle, runners: runtime.RunnerSet, models: dict[str, str],
         options: ValidateOptions, sizes: list[int], sizes_hw: list[tuple[int, int]],
         export_batch: int, progress: Optional[Callable[[str], None]]) -> RunResult:
    """The run stage: every runner on every input set, then model.e2e.onnx and its
    reference (our Pillow pipeline + eager) on uint8 images, gathered as data."""
    config, seed, device = bundle.config, options.seed, runners.device
    torch_profiles = bundle.torch_profiles  # the package in fp16 by the fp16 profile
    judged = {r.name: (runners.computes.get(r.name) or models[runners.onnx_files[r.name]])
              if r.name in runners.onnx_files else torch_profiles.get(r.name, "fp32")
              for r in runners.candidates}
    reference = runners.reference.name
    records = [RunnerRecord(reference, runners.reference.device, "fp32")] + [
        RunnerRecord(r.name, r.device, judged[r.name], reference) for r in runners.candidates]
    sets = input_sets(config, sizes, seed, options.real_inputs, sizes_hw)
    outputs = run_stage(runners.runners, sets, progress)
    image_sets, image_outputs = [], []
    if bundle.e2e_model:
        if progress:
            progress(f"running {bundle.e2e_model} on uint8 images")
        e2e = runtime.ort_runner(bundle.onnx_model(bundle.e2e_model), device,
                                 threads=options.threads,
                                 name=bundle.runner_name(bundle.e2e_model))
        image_sets = [ImageSet(f"pictures(seed={seed})", e2e_images(config, seed))] + [
            ImageSet(name, list(images), labels, real=True)
            for name, (images, labels) in (options.raw_images or {}).items()]
        image_outputs = run_e2e(runners.reference, e2e, bundle.description.preprocessing,
                                image_sets)
        records += [RunnerRecord(E2E_REFERENCE, runners.reference.device, "fp32"),
                    RunnerRecord(e2e.name, e2e.device, "e2e", E2E_REFERENCE)]
    return RunResult(
        bundle=str(bundle.path), files=dict(bundle.hashes),
        provider_requested=options.provider, device=device, tf32=options.profile == "tf32",
        seed=seed, threads=options.threads, batch_sizes=sizes,
        image_sizes=[list(s) for s in sizes_hw], export_batch=export_batch,
        output_names=list(config.output_names), runners=records, sets=sets, outputs=outputs,
        image_sets=image_sets, image_outputs=image_outputs, notes=list(runners.notes),
        versions=B.package_versions())


def _ran_already(run: Optional[RunResult], name: str, runner: Callable) -> Callable:
    """`runner`, answering an input the run fed it already (the same array, bit for bit)
    with what it gave then."""
    def answer(x: np.ndarray) -> dict[str, np.ndarray]:
        for s, row in zip(run.sets if run else (), run.outputs if run else ()):
            if name in row and s.x.shape == x.shape and np.array_equal(s.x, x):
                return row[name]
        return runner(x)
    return answer


def source_parity(bundle: B.Bundle, runners: runtime.RunnerSet, options: ValidateOptions,
                  tol, progress: Optional[Callable[[str], None]] = None,
                  run: Optional[RunResult] = None) -> tuple[dict, list, list[str]]:
    """The source framework's model of an imported bundle against eager and model.onnx
    (source.source_rows): its record for parity.json, the rows, and notes. Inputs `run`
    fed eager and model.onnx already are answered with their outputs there, not run twice.
    A source that cannot be built or run here is recorded as skipped, with why."""
    try:
        source = _source(bundle, options, progress)
    except SourceSkipped as exc:
        return {"status": "skipped", "reason": str(exc)}, [], []
    config = bundle.config
    sizes = source_sizes(config, source.native)
    name = bundle.runner_name(B.ONNX_FILE)
    made: list = []  # model.onnx's session, made only if an input did not run already

    def onnx(x: np.ndarray) -> dict[str, np.ndarray]:
        if not made:
            made.append(runtime.ort_runner(bundle.onnx_model(B.ONNX_FILE), runners.device,
                                           threads=options.threads, name=name))
        return made[0].run_all(x)

    eager = runners.reference
    if progress:
        progress(f"running {source.framework}'s {source.model} against eager and "
                 f"{B.ONNX_FILE} at {', '.join(f'{h}x{w}' for h, w in sizes)}")
    try:
        rows = source_rows(source, [(eager.name, _ran_already(run, eager.name, eager.run_all)),
                                    (name, _ran_already(run, name, onnx))],
                           config, options.seed, tol, sizes)
    except SourceRunFailed as exc:  # in the process that ran it ahead
        return {**source.record(), "status": "skipped", "reason": str(exc)}, [], []
    except VitExportError:
        raise
    except Exception as exc:  # the framework's own forward
        return {**source.record(), "status": "skipped", "reason": run_failed(source, exc)}, \
            [], []
    record = {**source.record(), "status": "passed" if all(r.passed for r in rows)
              else "failed", "sizes": [list(s) for s in sizes]}
    return record, rows, list(source.notes)


def _source(bundle: B.Bundle, options: ValidateOptions,
            progress: Optional[Callable[[str], None]]) -> Source:
    """The source framework's model: as the process export started for it built and ran
    it (`SourceAhead`), else built here from the files `options.source` gives. SourceSkipped
    says why there is none."""
    given = options.source
    if isinstance(given, SourceAhead):
        if progress:
            progress("the source framework's outputs, computed beside the export")
        answered = given.answered(bundle.description, options.seed)
        if answered is not None:
            return answered
        given = given.files
    if progress:
        progress("building the source framework's model from the files it was imported from")
    files = source_files(bundle, given)  # CheckpointError: not what was named
    return build_source(bundle.description, files)


def source_files(bundle: B.Bundle, given) -> CheckpointFiles:
    """The files a bundle's import read, as `ValidateOptions.source` gives them: read from
    the file or folder it names (each hashed against the import record), or as read already.
    SourceSkipped where none is given; CheckpointError where what is named is not them."""
    recorded = recorded_files(bundle.description)
    if given is None:
        raise SourceSkipped(f"the checkpoint it was imported from ({', '.join(recorded)}) "
                            f"was not named (validate --source PATH)")
    return given if isinstance(given, CheckpointFiles) else read_recorded(given, recorded)


def static_budget_check(bundle: B.Bundle, run: RunResult) -> Optional[Check]:
    """model.int8-static.onnx against the accuracy budget it was exported within: measured
    on the first labelled real set it ran on, else as config.json records the export's
    measurement. None for a bundle without one."""
    static = bundle.description.export.get("static_int8")
    record = static.get("budget") if isinstance(static, dict) else None
    if record is None:
        return None
    name, reference = bundle.runner_name(STATIC_FILE), run.runners[0].name
    for s, row in zip(run.sets, run.outputs):
        if s.real and s.labels is not None and "logits" in row.get(name, {}):
            return budget_check(record, measure(row[reference]["logits"], row[name]["logits"],
                                                s.labels), s.name)
    return budget_check(record, None)


def run_bundle(path: B.Bundle | str | os.PathLike, options: ValidateOptions = ValidateOptions(),
               progress: Optional[Callable[[str], None]] = None) -> RunResult:
    """`validate`'s run stage alone: every runner of the bundle (a Bundle read already, or
    its folder, read and verified here: once per command) on the inputs
    `options` give, their whole outputs and where each ran, compared with nothing
    (`compare_run` judges them as validate does, `compare_runs` against another run)."""
    bundle = path if isinstance(path, B.Bundle) else B.read_bundle(path)  # read once
    export_batch, sizes, sizes_hw = _sizes(bundle, options)
    models, _ = judged_profiles(bundle, options.profile)
    with runtime.tf32(False), runtime.torch_threads(options.threads):
        runners = _open(bundle, options)
        return _run(bundle, runners, models, options, sizes, sizes_hw, export_batch, progress)


def validate(path: B.Bundle | str | os.PathLike, options: ValidateOptions = ValidateOptions(),
             progress: Optional[Callable[[str], None]] = None) -> ParityReport:
    """Compare eager PyTorch with every model of a bundle; return the verdict as data.

    Runs eager PyTorch, TorchScript, the torch.export program, the AOTInductor package and
    every ONNX model of the bundle, as `options` say (`run_bundle`), compares each with eager
    under the profile of its precision (`compare_run`), then checks the artifacts themselves
    (symbolic batch axis, no baked batch, declared precision, CUDA placement). The files
    that can carry code run only where `options` name them or trust them.

    Args:
        path: A bundle folder (read; each file's sha256 checked as it is read, the files
            nothing ran checked at the end), or a `Bundle` read already.
        options: What to run, on what, and how to judge (the defaults: `vit-export
            validate`'s); with `options.save_outputs`, the run is kept there (`save_run`).
        progress: Told each step as it starts.

    Returns:
        The report: `passed`, `failures`, one row per runner, batch size, input set and
        output, the static checks, and where each runner really ran. A mismatch is a report
        whose `passed` is False, not an exception.

    Raises:
        BundleError: The bundle is missing, damaged, or a file differs from its sha256.
        ProviderError: The provider asked for is not the one ONNX Runtime runs on.
        ParityError: `options.profile` names a precision the bundle has no model of.
    """
    bundle = path if isinstance(path, B.Bundle) else B.read_bundle(path)  # read once
    _refuse_first(bundle, options)
    export_batch, sizes, sizes_hw = _sizes(bundle, options)
    models, precision_checks = judged_profiles(bundle, options.profile)
    with runtime.tf32(False), runtime.torch_threads(options.threads):
        runners = _open(bundle, options)
        run = _run(bundle, runners, models, options, sizes, sizes_hw, export_batch, progress)
        tolerances = _tolerances(run, runners, options)
        results = compare_run(run, tolerances)
        checks, placement, torch_files = _artifact_checks(bundle, runners, run, results,
                                                          models, options, export_batch)
        stages, first = _stages(bundle, runners, run, models, torch_files, tolerances, options,
                                min(sizes), progress) if options.layers else ([], {})
        notes, extra_checks = _notes(bundle, runners, run, tolerances, options, progress)
        checks = precision_checks + checks + extra_checks
        source, rows, source_notes = source_parity(bundle, runners, options,
                                                   tolerances["fp32"], progress, run) \
            if isinstance(bundle.description.extra.get("import"), dict) else ({}, [], [])
        results, notes = results + rows, notes + source_notes
    bundle.check_unread()  # a verdict on the bundle covers the files no runner opened
    report = ParityReport(
        bundle=str(bundle.path), passed=all(x.passed for x in [*results, *checks, *stages]),
        provider_requested=options.provider,
        provider_used=run.device, torch_device=run.device, tf32=run.tf32, seed=options.seed,
        batch_sizes=sizes, image_sizes=run.image_sizes, export_batch=export_batch,
        profiles=tolerances, results=results, checks=checks, stages=stages,
        first_divergence=first, placement=placement, notes=notes, versions=run.versions,
        outputs=run.output_names, files=dict(bundle.hashes), source=source)
    if options.save_outputs is not None:
        save_run(run, options.save_outputs)
    return report


def _refuse_first(bundle: B.Bundle, options: ValidateOptions) -> None:
    """What this bundle cannot be validated with, refused before any work."""
    if options.layers and bundle.description.module is not None:
        raise ParityError(f"{param('layers', True)} compares vit-export's rebuilt blocks; "
                          f"{bundle.path} holds {bundle.description.module['framework']}'s "
                          f"own module")
    if options.save_outputs is not None:
        refuse_bundle_files(options.save_outputs, bundle.path)


def _tolerances(run: RunResult, runners: runtime.RunnerSet, options: ValidateOptions
                ) -> dict:
    """The tolerance of each profile the run is judged by (fp32 always, e2e for images)."""
    judged = run.judged(runners.reference.name)
    profiles = [*(set(judged.values()) | {"fp32"}), *(["e2e"] if run.image_sets else [])]
    return {p: profile_tolerance(p, options.overrides) for p in profiles}


def _artifact_checks(bundle: B.Bundle, runners: runtime.RunnerSet, run: RunResult,
                     results: list, models: dict[str, str], options: ValidateOptions,
                     export_batch: int) -> tuple[list[Check], dict, dict[str, str]]:
    """The checks of the artifacts themselves: each ONNX graph (symbolic batch, nothing
    baked), the torch.export program, AOTInductor at an unseen batch, the static int8
    budget, the provider asked for, and CUDA placement; with the placement found and the
    PyTorch files the run stage opened."""
    config = bundle.config
    export_size = bundle.description.export.get("export_size")
    checks = [c for name in models  # each graph as parsed once for its session
              for c in scan_graph(bundle.onnx_model(name), export_batch, config, export_size)]
    ran = {r.name for r in runners.runners}  # what the run stage opened
    torch_files = {n: f for n, f in bundle.torch_files.items() if n in ran}
    if "pt2" in torch_files:
        checks += scan_program(bundle.read_file(torch_files["pt2"]), config)
    if "aoti" in torch_files:
        checks.append(unseen_batch_check("aoti", results, export_batch))
    budget = static_budget_check(bundle, run)
    checks += [budget] if budget else []
    if options.require_provider:
        checks.append(Check(f"provider is {options.require_provider}",
                            runners.device == options.require_provider,
                            f"{runners.device} ran (requested {options.provider})"))
    placement = {}
    if runners.device == "cuda":
        x = random_input(config, 1, options.seed).numpy()
        for name in models:
            placement[name] = runtime.node_placement(bundle.onnx_model(name), "cuda", x)
            checks.append(placement_check(name, placement[name], options.require_provider))
    return checks, placement, torch_files


def _stages(bundle: B.Bundle, runners: runtime.RunnerSet, run: RunResult,
            models: dict[str, str], torch_files: dict[str, str], tolerances: dict,
            options: ValidateOptions, batch: int,
            progress: Optional[Callable[[str], None]]) -> tuple[list, dict]:
    """Per-stage divergence (--layers) of each ONNX model and the torch.export program
    against eager: the rows, and where each first diverged."""
    x = random_input(bundle.config, batch, options.seed).numpy()
    eager_model = runners.reference.module
    staged = dict(models) | ({B.PT2_FILE: "fp32"} if "pt2" in torch_files else {})
    stages, first = [], {}
    for name, model_profile in staged.items():
        if progress:
            progress(f"comparing the stages of {name}")
        tol = tolerances[model_profile]
        file = (bundle.read_file(name) if name == B.PT2_FILE  # read once, checked
                else bundle.onnx_model(name))
        ours, theirs = run_stages(eager_model, file, x, runners.device, run.tf32)
        rows = compare_stages(name, eager_model.config, ours, theirs, len(x), tol,
                              model_profile)
        stages += rows
        diverged = first_divergence(rows, tol)
        if diverged:
            first[name] = diverged
    return stages, first


def _notes(bundle: B.Bundle, runners: runtime.RunnerSet, run: RunResult, tolerances: dict,
           options: ValidateOptions, progress: Optional[Callable[[str], None]]
           ) -> tuple[list[str], list[Check]]:
    """The run's notes, what could not be judged, and the source framework's preprocessing
    of the user's images against ours (a check, or a note on why not)."""
    config = bundle.config
    notes, checks = list(run.notes), []
    few = sorted({s.name for s in run.sets if s.real and len(s.x) < MIN_NEIGHBOUR_IMAGES})
    if "embedding" in config.output_names and few:
        notes.append(f"neighbours not judged on {', '.join(few)}: fewer than "
                     f"{MIN_NEIGHBOUR_IMAGES} images")
    if options.image_files:
        if progress:
            progress("running the source framework's preprocessing on the images")
        check, note = pipeline_check(runners.reference, bundle.description.preprocessing,
                                     options.image_files, tolerances["fp32"].atol,
                                     config.output_names[0])
        checks += [check] if check else []
        notes += [note] if note else []
    return notes, checks


def _where(run: RunResult) -> str:
    """Where a run ran, for people: device, threads and the versions that computed."""
    ort = run.versions.get("onnxruntime-gpu") or run.versions.get("onnxruntime", "?")
    return (f"bundle {run.bundle}, requested {run.provider_requested}, ran on {run.device}, "
            f"threads {run.threads or 'default'}, seed {run.seed}, torch "
            f"{run.versions.get('torch', '?')}, onnxruntime {ort}")


def judge_runs(a: RunResult, b: RunResult, names: tuple[str, str] = ("A", "B"),
               tags: tuple[str, str] = ("A", "B")) -> ParityReport:
    """Saved run `a`'s reference against every runner of saved run `b` (`compare_runs`),
    each under the profile `b` judged it by, as a ParityReport whose provider fields are
    `b`'s (the candidates') and whose notes say where each run ran (`names`: their files).
    Runs of different bundles or inputs: SavedRunError."""
    profiles = dict.fromkeys(["fp32"] + [r.profile for r in b.runners])
    tolerances = {p: profile_tolerance(p) for p in profiles}
    results = compare_runs(a, b, tolerances, tags, names)
    notes = [f"reference: {tags[0]} = {names[0]}: {_where(a)}",
             f"candidates: every runner of {tags[1]} = {names[1]}: {_where(b)}"]
    notes += [f"{tag}: {note}" for tag, run in zip(tags, (a, b)) for note in run.notes]
    return ParityReport(
        bundle=b.bundle, passed=all(r.passed for r in results),
        provider_requested=b.provider_requested, provider_used=b.device,
        torch_device=b.device, tf32=b.tf32, seed=b.seed, batch_sizes=b.batch_sizes,
        image_sizes=b.image_sizes, export_batch=b.export_batch, profiles=tolerances,
        results=results, checks=[], stages=[], first_divergence={}, placement={},
        notes=notes, versions={f"{tag} {k}": v for tag, run in zip(tags, (a, b))
                               for k, v in run.versions.items()},
        outputs=b.output_names, files=dict(b.files))
