"""The dispatcher: a checkpoint file or folder -> our model and its description, through the
family its keys show (`formats`); and `load_model`, where export and bench start."""
from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any, Optional

import torch

from .. import bundle as B
from ..config import ViTConfig, preset_config
from ..errors import CheckpointError, ConfigError, first_line, param
from ..errors import raw as raw_message
from ..frameworks import (
    HF_MODULE_TYPES,
    ROADS,
    TORCHVISION_BUILDERS,
    build_module,
    framework_builds,
    framework_model,
    io_config,
    module_name,
)
from ..model import VisionTransformer, create_model, resample_pos_embed
from ..preprocessing import hf_preprocessing, resolve_preprocessing, split_overrides
from ..preprocessing.sources import timm_knows, torchvision_preprocessing
from .family import set_option
from .files import CheckpointFiles, read_checkpoint
from .formats import FAMILIES, convert, detect_format
from .framework import hf_record, timm_record, torchvision_record
from .hf import HF_MODEL_TYPES, HF_RESAMPLED, hf_labels
from .infer import NOT_IN_WEIGHTS, infer_config, unknown_architecture
from .state import read_state_dict
from .timm import timm_named, timm_sizes
from .torchvision import torchvision_architecture, torchvision_sizes


def named_architecture(timm_name: Optional[str] = None,
                       torchvision_weights: Optional[str] = None) -> dict[str, Any]:
    """num_heads and norm_eps (and, for timm, every field its module shows) of the model a
    --timm-name or --torchvision-weights names, read off the framework's own module built on
    the meta device (no weights, no download)."""
    if timm_name:
        return timm_named(timm_name)
    if torchvision_weights:
        return torchvision_architecture(torchvision_weights)
    return {}


def named_sizes(timm_name: Optional[str] = None,
                torchvision_weights: Optional[str] = None) -> dict[str, int]:
    """The width (embed_dim) and depth of the model a --timm-name or --torchvision-weights
    names, off the framework's module built on the meta device: what its heads are meant
    for, so weights of another width or depth contradict the name."""
    try:
        if timm_name:
            return timm_sizes(timm_name)
        if torchvision_weights:
            return torchvision_sizes(torchvision_weights)
    except Exception:  # named_architecture has said what is wrong with the name already
        return {}
    return {}


def fit_report(model: VisionTransformer, state: dict[str, torch.Tensor]) -> Optional[str]:
    """One line on what does not fit, or None when every key fits."""
    ours = model.state_dict()
    missing = [k for k in ours if k not in state]
    unexpected = [k for k in state if k not in ours]
    wrong = [f"{k} {list(state[k].shape)} vs model {list(ours[k].shape)}"
             for k in ours if k in state and state[k].shape != ours[k].shape]
    if not (missing or unexpected or wrong):
        return None

    def few(items):
        return f" ({', '.join(items[:3])}{', ...' if len(items) > 3 else ''})" if items else ""

    return (f"checkpoint does not fit the model: {len(missing)} missing{few(missing)}, "
            f"{len(unexpected)} unexpected{few(unexpected)}, "
            f"{len(wrong)} wrong shape{few(wrong)}")


def _place_table(config: ViTConfig, state: dict[str, torch.Tensor],
                 fmt: str) -> tuple[ViTConfig, list[str]]:
    """Where the checkpoint's position table goes when its grid is not img_size's, as the
    source framework places it: Hugging Face keeps the table it ships and resamples it in
    every forward (pos_embed_grid; bicubic, antialiased only where its model does); timm
    resamples it once as it loads (checkpoint_filter_fn: bicubic, antialiased); torchvision
    too (interpolate_embeddings: bicubic, align_corners, no antialias)."""
    if config.pos_embed != "learn" or "pos_embed" not in state:
        return config, []
    embedded_prefix = 0 if config.no_embed_class else config.num_prefix_tokens
    source_grid = math.isqrt(state["pos_embed"].shape[1] - embedded_prefix)
    if source_grid == config.table_grid:
        return config, []
    if fmt == "hf":
        how = ("bilinear, antialiased" if config.pos_embed_interpolation == "bilinear"
               else "bicubic, antialiased" if config.pos_embed_antialias
               else "bicubic, not antialiased")
        note = (f"position table kept at its {source_grid}x{source_grid} patch grid and "
                f"resampled in the model to the input's ({how}), as Hugging Face's forward does")
        return config.replace(pos_embed_grid=source_grid), [note]
    torchvision = fmt == "torchvision"
    state["pos_embed"] = resample_pos_embed(
        state["pos_embed"], config.grid_size, embedded_prefix,
        antialias=config.pos_embed_antialias and not torchvision,
        mode=config.pos_embed_interpolation, align_corners=torchvision)
    how = ("bicubic, align_corners, as torchvision's interpolate_embeddings" if torchvision
           else "bilinear, antialiased, as SigLIP2" if config.pos_embed_interpolation == "bilinear"
           else "bicubic, antialiased, as timm" if config.pos_embed_antialias
           else "bicubic, not antialiased")
    note = (f"position embedding resampled ({how}) from a {source_grid}x{source_grid} to a "
            f"{config.grid_size}x{config.grid_size} patch grid for img_size {config.img_size}")
    return config, [note]


def _said_first(extras: dict[str, Any], timm_name: Optional[str],
                torchvision_weights: Optional[str]) -> None:
    """What the checkpoint's own files or the names given say it is, refused by that name
    before its keys are read: a config.json whose model_type is not one we rebuild (BEiT's
    keys are not "a format we cannot tell"), a --timm-name or --torchvision-weights we do
    not import."""
    from .hf import hf_architecture

    document = extras.get("config.json")
    if isinstance(document, dict) and "model_type" in document:
        hf_architecture(document)
    if timm_name or torchvision_weights:
        named_architecture(timm_name, torchvision_weights)


def _arch_name(fmt: str, extras: dict[str, Any], named: tuple, preset: Optional[str],
               notes: list[str]) -> Optional[str]:
    """The timm name a timm checkpoint's own `arch` key (timm's train.py) gives, where
    nothing else names the model and timm knows it."""
    arch = extras.get("arch")
    if fmt == "timm" and not (any(named) or preset) and arch and timm_knows(arch):
        notes.append(f"architecture {arch!r} from the checkpoint's arch key (timm's train.py)")
        return arch
    return named[0]


def _check_sizes(path, inferred: dict[str, Any], overrides: dict[str, Any],
                 timm_name: Optional[str], torchvision_weights: Optional[str]) -> None:
    """Refuse weights of another width or depth than the model they are named as: its heads
    and norms would be another model's."""
    sizes = named_sizes(timm_name, torchvision_weights)
    named_as = timm_name or torchvision_weights
    wrong = [f"{field} {inferred[field]} in the weights, {value} in {named_as}"
             for field, value in sizes.items()
             if field in inferred and field not in overrides and inferred[field] != value]
    if wrong and "num_heads" not in overrides:  # --set num_heads says what the name cannot
        raise CheckpointError(f"{path} does not fit the model it is named as "
                              f"({'; '.join(wrong)}): its heads and norms would be guessed "
                              f"from another model; name the right one, or "
                              f"{set_option('num_heads', 'N')}")


def _hf_values(values: dict[str, Any], raw: dict, extras: dict[str, Any],
               hf_type: Optional[str], preset: Optional[str], overrides: dict[str, Any],
               notes: list[str]) -> None:
    """What a Hugging Face model's type says beyond its config.json, into `values` in place:
    CLIP's projection head, and the size a resampling model runs at (its processor's)."""
    if "visual_projection.weight" in raw and "projection_head" not in overrides:
        values["projection_head"] = True  # CLIP's image_embeds: an embedding, whatever preset
    if hf_type == "siglip2_vision_model":
        notes.append("SigLIP2's NaFlex processor keeps each image's aspect ratio (a grid of at "
                     "most max_num_patches); vit-export squashes every image to the square grid, "
                     "the same pixels for square images; export --dynamic-size runs any grid")
    if hf_type in HF_RESAMPLED:
        processor = extras.get("preprocessor_config.json")
        if processor is not None and not preset and "img_size" not in overrides:
            values["img_size"] = hf_preprocessing(processor).img_size
            how = "computing its rotary table" if hf_type == "dinov3_vit" else \
                "resampling its position table"
            notes.append(f"img_size {values['img_size']} from preprocessor_config.json: {hf_type} "
                         f"runs at its processor's crop, {how}")


def _fitted(config: ViTConfig, state: dict[str, torch.Tensor]) -> VisionTransformer:
    """The model of `config` holding a copy of each of the checkpoint's tensors, in the
    model's dtype, contiguous (the copy load_state_dict makes): built on the meta device, so
    no random init is drawn only to be overwritten (0.6 s for a ViT-B). A copy, never the
    tensor itself: a safetensors checkpoint's tensors can be pages of the user's file, and
    two weights can be views of one packed tensor."""
    with torch.device("meta"):
        model = VisionTransformer(config)
    problem = fit_report(model, state)
    if problem:
        raise CheckpointError(problem)
    ours = model.state_dict()
    model.load_state_dict({k: v.to(ours[k].dtype, memory_format=torch.contiguous_format,
                                   copy=True) for k, v in state.items()},
                          strict=True, assign=True)
    return model.eval()


def _road(road: str, extras: dict[str, Any], timm_name: Optional[str],
          torchvision_weights: Optional[str], preset: Optional[str]) -> Optional[str]:
    """None where the checkpoint is rebuilt natively, else why it takes the framework road:
    asked for (`road` "framework"), or what the rebuild refuses ("auto", where the
    framework's own module can be built)."""
    if road not in ROADS:
        raise ConfigError(f"{param('road', road)} is not one of {', '.join(ROADS)}")
    if road == "framework":
        if preset:
            raise ConfigError(f"{param('road', 'framework')} builds the framework's model, "
                              f"not {param('preset')}")
        if not framework_builds(extras, timm_name, torchvision_weights):
            raise CheckpointError("the framework road builds a transformers checkpoint whose "
                                  "config.json names its model_type, a timm checkpoint named "
                                  f"with {param('timm_name')}, or a torchvision one named with "
                                  f"{param('torchvision_weights')} (of "
                                  f"{', '.join(TORCHVISION_BUILDERS)})")
        return "asked for"
    document = extras.get("config.json")
    if road == "auto" and not preset and isinstance(document, dict) and \
            document.get("model_type") in HF_MODULE_TYPES and \
            document.get("model_type") not in HF_MODEL_TYPES:
        return f"vit-export does not rebuild model_type {document['model_type']!r}"
    try:
        _said_first(extras, timm_name, torchvision_weights)
    except ConfigError as exc:  # a timm name's architecture (its module, not the file)
        if road == "native" or preset or document is not None or \
                not framework_builds(extras, timm_name, torchvision_weights):
            raise
        return f"vit-export's rebuild does not cover it: {raw_message(exc).split('; ')[0]}"
    return None


def _framework_checkpoint(files: CheckpointFiles, state: dict, extras: dict[str, Any],
                          named: tuple[Optional[str], Optional[str]],
                          overrides: dict[str, Any], prep_overrides: dict[str, Any], why: str):
    """The framework's own module of the checkpoint (`module`), its weights loaded as the
    framework loads them, and the description of where they came from. `named`: the
    --timm-name and --torchvision-weights given."""
    timm_name, torchvision_weights = named
    document = extras.get("config.json")
    side = None
    if torchvision_weights:
        if overrides:
            raise ConfigError(f"{param('overrides', overrides)}: a torchvision model is built "
                              f"as its builder builds it")
        record, fmt = torchvision_record(torchvision_weights, state), "torchvision"
        side = torchvision_preprocessing(torchvision_weights).img_size
    elif isinstance(document, dict) and "model_type" in document:
        record, fmt = hf_record(document, overrides), "hf"
    else:
        record, fmt = timm_record(timm_name, state, overrides), "timm"
    built = module_name(record)
    try:
        module = build_module(record, state, from_checkpoint=True)
        config = io_config(record, module, side)
    except (CheckpointError, ConfigError):
        raise
    except Exception as exc:  # the framework's own building and forward: many error types
        raise CheckpointError(f"{record['framework']} cannot build {built} from "
                              f"{files.where.name}: {type(exc).__name__}: "
                              f"{first_line(exc)}") from None
    model = framework_model(module, record, config)
    preprocessing, prep_notes = resolve_preprocessing(
        config, fmt, extras, timm_name, torchvision_weights, None, prep_overrides)
    notes = [f"exported as {record['framework']} builds it ({built}): {why}"] + prep_notes
    import_record = {"checkpoint": files.where.name, "format": fmt, "road": "framework",
                     "notes": notes, **({"timm_name": timm_name} if timm_name else {}),
                     **({"torchvision_weights": torchvision_weights}
                        if torchvision_weights else {}),
                     "files": files.digests()}
    description = B.Description(
        config, preprocessing, name=Path(files.where).stem,
        labels=hf_labels(extras, config.num_classes) if fmt == "hf" else None,
        extra={"import": import_record}, module=record)
    return model, description


def load_checkpoint(path: str | os.PathLike | CheckpointFiles, fmt: Optional[str] = None,
                    preset: Optional[str] = None, overrides: Optional[dict[str, Any]] = None,
                    timm_name: Optional[str] = None, torchvision_weights: Optional[str] = None,
                    road: str = "auto") -> tuple[VisionTransformer, B.Description]:
    """Our model with the checkpoint's weights, and the description of where they came from.

    `overrides` are --set values: model config fields and `preprocessing.FIELD` ones. The
    family the keys show (`formats.FAMILIES`) renames them, reads its config file and says
    what its weights cannot; the config is read off the weights, then the checkpoint's
    config file, a named model, a preset and `overrides` win, in that order.

    `road` (ROADS): "auto" rebuilds the model natively where vit-export can and otherwise
    exports the framework's own module (`module`), "native" only rebuilds, "framework" always
    takes the framework's module.
    """
    files = path if isinstance(path, CheckpointFiles) else read_checkpoint(path)
    path = files.where
    raw, extras = read_state_dict(files)  # from the bytes the record's sha256s are of
    overrides, prep_overrides = split_overrides(overrides or {})
    why = _road(road, extras, timm_name, torchvision_weights, preset)
    if why is not None:
        return _framework_checkpoint(files, raw, extras, (timm_name, torchvision_weights),
                                     overrides, prep_overrides, why)
    fmt = detect_format(raw, fmt)
    family = FAMILIES[fmt]
    # an unsupported model type is said first
    hf_type, hf_config = family.config_of(extras) if family.config_of else (None, None)
    state = convert(raw, fmt, zero_key_bias=fmt == "timm" or hf_type == "dinov3_vit",
                    channels=(hf_config or {}).get("in_chans"))
    notes: list[str] = []
    timm_name = _arch_name(fmt, extras, (timm_name, torchvision_weights), preset, notes)
    named = named_architecture(timm_name, torchvision_weights)  # an unsupported one: said first
    if family.check_named:
        family.check_named(raw, {**named, **overrides})
    inferred = infer_config(state, fmt, hf_config, {**(hf_config or {}), **named, **overrides})
    _check_sizes(path, inferred, overrides, timm_name, torchvision_weights)
    chosen = preset_config(preset).to_dict() if preset else {}  # the whole preset, defaults too
    values = {**inferred, **named, **chosen, **overrides}
    if fmt == "hf":
        _hf_values(values, raw, extras, hf_type, preset, overrides, notes)
    if any(f not in values for f in NOT_IN_WEIGHTS):  # a guess never reaches a bundle
        raise CheckpointError(unknown_architecture(path, fmt, values))
    config, placed = _place_table(ViTConfig.from_dict(values), state, fmt)
    model = _fitted(config, state)
    preprocessing, prep_notes = resolve_preprocessing(
        config, fmt, extras, timm_name, torchvision_weights, preset, prep_overrides)
    record = {"checkpoint": path.name, "format": fmt,
              "notes": notes + placed + prep_notes,
              **({"timm_name": timm_name} if timm_name else {}),
              **({"torchvision_weights": torchvision_weights} if torchvision_weights else {}),
              "files": files.digests()}
    description = B.Description(
        config, preprocessing, name=Path(path).stem,
        labels=hf_labels(extras, config.num_classes) if hf_config is not None else None,
        # the files by name and sha256, never a path: `validate --source` names the place
        extra={"import": record})
    return model, description


def load_model(source: Optional[str | os.PathLike] = None, preset: Optional[str] = None,
               checkpoint: Optional[str | os.PathLike | CheckpointFiles] = None,
               fmt: Optional[str] = None,
               overrides: Optional[dict[str, str]] = None, seed: int = 0,
               timm_name: Optional[str] = None, torchvision_weights: Optional[str] = None,
               road: str = "auto") -> tuple[VisionTransformer, B.Description]:
    """The model and its description from a model folder (`source`: config.json + weights),
    a `checkpoint` (refined by `preset`), or a `preset` with random weights seeded by `seed`;
    what `export` and `bench` start from. `overrides` set config and preprocessing fields
    (a preset or a checkpoint), `timm_name` / `torchvision_weights` take the preprocessing
    from there."""
    import torch

    overrides = overrides or {}
    if source:
        found = B.read_bundle(source)
        return B.load_eager(found), found.description
    if checkpoint:
        return load_checkpoint(checkpoint, fmt=fmt, preset=preset, overrides=overrides,
                               timm_name=timm_name, torchvision_weights=torchvision_weights,
                               road=road)
    model_overrides, prep_overrides = split_overrides(overrides)
    torch.manual_seed(seed)
    model = create_model(preset, **model_overrides)
    prep, _ = resolve_preprocessing(model.config, timm_name=timm_name,
                                    torchvision_weights=torchvision_weights, preset=preset,
                                    overrides=prep_overrides)
    return model.eval(), B.Description(model.config, prep, name=preset,
                                       extra={"weights": f"random init, seed {seed}"})
