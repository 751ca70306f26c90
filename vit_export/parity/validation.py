"""`validate`: open every runner of a bundle, run them all on the same inputs (the run stage),
compare, check, and gather it all into one ParityReport."""
from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import numpy as np

from .. import bundle as B
from .. import runtime
from ..errors import ParityError, VitExportError, first_line
from ..model import random_input
from .checks import judged_profiles, placement_check, scan_graph, scan_program, unseen_batch_check
from .compare import MIN_NEIGHBOUR_IMAGES, compare_sets
from .e2e import ImageSet, compare_e2e, e2e_images, pipeline_check, run_e2e
from .inputs import InputSet, default_batch_sizes, input_sets, validation_sizes
from .report import Check, ParityReport
from .stages import compare_stages, first_divergence, run_stages
from .tolerance import profile_tolerance


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
    # also OpenVINO's CPU runners of the ONNX models (runtime.openvino_runners), each judged
    # by its file's profile, and its bf16 runner by the bf16 profile
    openvino: bool = False
    # also run the files that can carry code (model.ts, model.pt2, model.aoti.pt2): what
    # export validates it made itself; a bundle from elsewhere only with --trust-code
    trust_code: bool = False


def validate(path: str | os.PathLike, options: ValidateOptions = ValidateOptions(),
             progress: Optional[Callable[[str], None]] = None) -> ParityReport:
    """Compare eager PyTorch with TorchScript, the torch.export program, the AOTInductor
    package and every ONNX model of the bundle at `path`, as `options` say. `progress` is
    told each step as it starts.
    """
    provider, seed, profile, overrides = (options.provider, options.seed, options.profile,
                                          options.overrides)
    bundle = B.read_bundle(path)
    export_batch = int(bundle.description.export.get("export_batch", 2))
    sizes = (sorted(set(options.batch_sizes)) if options.batch_sizes
             else default_batch_sizes(export_batch))
    if any(b < 1 for b in sizes):
        raise ParityError(f"batch sizes must be >= 1, got {sizes}")
    config = bundle.config
    sizes_hw = ([tuple(s) for s in options.image_sizes] if options.image_sizes
                else validation_sizes(config))
    if not config.dynamic_img_size and sizes_hw != [(config.img_size, config.img_size)]:
        raise ParityError(f"{path} takes {config.img_size}x{config.img_size} images only; "
                          f"other sizes need a dynamic-size bundle (export --dynamic-size)")
    bad = [f"{h}x{w}" for h, w in sizes_hw
           if h < 1 or w < 1 or h % config.patch_size or w % config.patch_size]
    if bad:
        raise ParityError(f"image size {bad[0]} is not a multiple of the patch size "
                          f"{config.patch_size}")
    export_size = bundle.description.export.get("export_size")
    models, precision_checks = judged_profiles(bundle, profile)
    # --profile tf32 judges ONNX Runtime computing in TF32 (CUDA's use_tf32) against eager
    # in full fp32: the reference never computes in reduced precision
    tf32 = profile == "tf32"
    with runtime.tf32(False):
        runners = runtime.open_runners(bundle, provider, openvino=options.openvino, tf32=tf32,
                                       deferred=True, trust_code=options.trust_code)
        if tf32 and runners.device != "cuda":
            raise ParityError(f"--profile tf32 judges TF32 compute, which ONNX Runtime has on "
                              f"CUDA only, and this run is on {runners.device}")
        judged = {r.name: (runners.computes.get(r.name) or models[runners.onnx_files[r.name]])
                  if r.name in runners.onnx_files else "fp32" for r in runners.candidates}
        tolerances = {p: profile_tolerance(p, overrides) for p in set(judged.values()) | {"fp32"}}
        sets = input_sets(config, sizes, seed, options.real_inputs, sizes_hw)
        outputs = run_stage(runners.runners, sets, progress)
        results = compare_sets(sets, outputs, runners.reference.name, judged, tolerances)
        if bundle.e2e_model:
            if progress:
                progress(f"running {bundle.e2e_model} on uint8 images")
            e2e = runtime.ort_runner(bundle.file(bundle.e2e_model), runners.device,
                                     name=bundle.runner_name(bundle.e2e_model))
            image_sets = [ImageSet(f"pictures(seed={seed})", e2e_images(config, seed))] + [
                ImageSet(name, list(images), labels, real=True)
                for name, (images, labels) in (options.raw_images or {}).items()]
            tolerances["e2e"] = profile_tolerance("e2e", overrides)
            results += compare_e2e(image_sets, run_e2e(
                runners.reference, e2e, bundle.description.preprocessing, image_sets),
                e2e.name, tolerances["e2e"])
        checks = precision_checks + [
            c for name in models
            for c in scan_graph(bundle.file(name), export_batch, config, export_size)]
        ran = {r.name for r in runners.runners}  # what the run stage opened
        torch_files = {n: f for n, f in bundle.torch_files.items() if n in ran}
        if "pt2" in torch_files:
            checks += scan_program(bundle.file(torch_files["pt2"]), config)
        if "aoti" in torch_files:
            checks.append(unseen_batch_check("aoti", results, export_batch))
        if options.require_provider:
            checks.append(Check(f"provider is {options.require_provider}",
                                runners.device == options.require_provider,
                                f"{runners.device} ran (requested {provider})"))
        placement = {}
        if runners.device == "cuda":
            x = random_input(bundle.config, 1, seed).numpy()
            for name in models:
                placement[name] = runtime.node_placement(bundle.file(name), "cuda", x)
                checks.append(placement_check(name, placement[name], options.require_provider))
        stages, first = [], {}
        if options.layers:
            x = random_input(bundle.config, min(sizes), seed).numpy()
            eager_model = runners.reference.module
            staged = dict(models) | ({B.PT2_FILE: "fp32"} if "pt2" in torch_files else {})
            for name, model_profile in staged.items():
                if progress:
                    progress(f"comparing the stages of {name}")
                tol = tolerances[model_profile]
                file = bundle.file(name)
                ours, theirs = run_stages(eager_model, file, x, runners.device, tf32)
                rows = compare_stages(file.name, eager_model.config, ours, theirs, len(x), tol)
                stages += rows
                diverged = first_divergence(rows, tol)
                if diverged:
                    first[name] = diverged
        notes = list(runners.notes)
        few = sorted({s.name for s in sets if s.real and len(s.x) < MIN_NEIGHBOUR_IMAGES})
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
    passed = all(r.passed for r in results) and all(c.passed for c in checks) \
        and all(s.passed for s in stages)
    return ParityReport(
        bundle=str(Path(path)), passed=passed, provider_requested=provider,
        provider_used=runners.device, torch_device=runners.device, tf32=tf32, seed=seed,
        batch_sizes=sizes, image_sizes=[list(s) for s in sizes_hw], export_batch=export_batch,
        profiles=tolerances, results=results,
        checks=checks, stages=stages, first_divergence=first, placement=placement,
        notes=notes, versions=B.package_versions(), outputs=list(config.output_names),
        files=dict(bundle.hashes))
