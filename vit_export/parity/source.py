"""Source parity: the model the user brought, run by its own framework, against our eager
rebuild and model.onnx. Every other row of a report compares the bundle with our rebuild;
these rows compare the rebuild with the checkpoint's own framework (transformers, timm or
torchvision), so an import that differs from the source cannot pass.

The source is built from the files the import read (`CheckpointFiles`: the bytes export
read, or those `validate --source PATH` reads from where the user says, each hashing to the
sha256 in config.json's `import` record), never from a path the bundle names, and by that
framework's own code, handed those bytes: transformers' `from_pretrained` given the config
and state dict (a model type and class transformers itself defines, no remote code, no
file opened), timm's `create_model` (a registered name, no pretrained weights) and its
`checkpoint_filter_fn` (which resamples the position table as timm does), torchvision's
`interpolate_embeddings`. Where the framework is missing or has no way to give an output,
the record says skipped and why: never passed.
"""
from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Optional

import numpy as np

from .. import bundle as B
from ..checkpoints.files import CheckpointFiles
from ..checkpoints.state import read_state_dict
from ..errors import VitExportError, first_line
from ..frameworks import quiet as _quiet
from ..frameworks import without_code

# The batch sizes at the export size, and the batch at each other size.
SOURCE_BATCHES = (1, 3)
OTHER_SIZE_BATCH = 2
# Hugging Face model types whose last_hidden_state is the tokens after the final norm, as
# our "tokens" output (SigLIP's post_layernorm is on every token; CLIP norms only the pooled
# one; MAE shuffles patches).
HF_NORMED_TOKENS = ("vit", "dinov2", "dinov2_with_registers", "dinov3_vit", "deit",
                    "siglip_vision_model")
# ... and those whose embedding, saved without a pooler, is the class token after that norm
HF_CLASS_TOKEN = ("vit", "dinov2", "dinov2_with_registers", "dinov3_vit", "deit")
# The transformers classes a config.json's `architectures` may name: image models and their
# heads, never another kind of class
HF_CLASS_ENDINGS = ("Model", "ModelWithProjection", "ForImageClassification",
                    "ForImageClassificationWithTeacher")
class SourceSkipped(VitExportError):
    """The source framework's model cannot be built or run here; the message says why."""


@dataclass
class Source:
    """The source framework's model, ready to run: `run(x)` -> output name -> [B, ...]."""
    framework: str  # "transformers", "timm" or "torchvision"
    version: str
    model: str  # the class (transformers, torchvision) or the model name (timm)
    files: dict[str, str]  # the files it was built from -> sha256 of the bytes it read
    native: int  # the image side the source itself is built for
    outputs: dict[str, Callable[[Any], Any]]  # what it gives, each from a batch tensor
    notes: list[str] = field(default_factory=list)

    def run(self, x: np.ndarray) -> dict[str, np.ndarray]:
        import torch

        with torch.no_grad():
            t = torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32))
            return {name: get(t).float().numpy() for name, get in self.outputs.items()}

    def record(self) -> dict[str, Any]:
        """What the source is and what it proved: the outputs compared, and those not
        (with why, from `notes`)."""
        return {"framework": self.framework, "version": self.version, "model": self.model,
                "files": dict(self.files), "native_size": self.native,
                "compared": list(self.outputs), "not_compared": list(self.notes)}


def _version(package: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(package)
    except PackageNotFoundError:
        raise SourceSkipped(f"{package} is not installed") from None


def _import(package: str):
    _version(package)
    import importlib

    return importlib.import_module(package)


def recorded_files(description: B.Description) -> dict[str, str]:
    """The files the bundle's import read, name -> sha256, as its record lists them."""
    imported = description.extra.get("import")
    if not isinstance(imported, dict):
        raise SourceSkipped("not imported from a framework (a preset or a model folder)")
    recorded = imported.get("files")
    if not isinstance(recorded, dict) or not recorded or \
            not all(isinstance(v, str) for v in recorded.values()):
        raise SourceSkipped("the import record holds no sha256 of its files (a bundle "
                            "written before they were recorded)")
    return dict(recorded)


def open_source(description: B.Description, files: CheckpointFiles) -> Source:
    """The source framework's model of a bundle imported from a checkpoint or the Hub, built
    by the framework's own code from `files`: the bytes the import read, which must be the
    files its record lists. SourceSkipped says why it cannot be."""
    recorded = recorded_files(description)
    if files.digests() != recorded:
        raise SourceSkipped(f"the files given ({', '.join(files.files)}) are not the ones the "
                            f"bundle was imported from ({', '.join(recorded)})")
    imported = description.extra["import"]
    fmt = imported.get("format")
    config = description.config
    if description.module is not None:
        source = _framework(description, files)
    elif fmt == "hf":
        source = _transformers(files, config)
    elif fmt == "timm":
        source = _timm(files, config, imported.get("timm_name"))
    elif fmt == "torchvision":
        source = _torchvision(files, config, imported.get("torchvision_weights"))
    else:
        raise SourceSkipped(f"no source framework for the {fmt!r} format")
    source.files = files.digests()
    return source


def build_source(description: B.Description, files: CheckpointFiles) -> Source:
    """`open_source`, where any failure of the framework's own loading code is a
    SourceSkipped saying so; our own errors (files that are not the recorded ones) are
    raised as they are."""
    try:
        return open_source(description, files)
    except VitExportError:
        raise
    except Exception as exc:  # the framework's own loading code: many error types
        raise SourceSkipped(f"the source framework could not load it: "
                            f"{type(exc).__name__}: {first_line(exc)}") from None


def run_failed(source: Source, exc: BaseException) -> str:
    """Why the source's record says skipped when its framework's forward raised `exc`."""
    return f"{source.framework}'s {source.model} failed to run: {type(exc).__name__}: " \
           f"{first_line(exc)}"


def _hf_config(transformers, files: CheckpointFiles):
    """transformers' config of the checkpoint's config.json, as data: a model type
    transformers itself defines, without the keys that would name code or files."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    values = files.json("config.json")
    if not isinstance(values, dict):
        raise SourceSkipped("transformers reads a folder's config.json, and the import read "
                            "none")
    model_type = values.get("model_type")
    if not isinstance(model_type, str) or model_type not in CONFIG_MAPPING:
        raise SourceSkipped(f"config.json's model_type {model_type!r} is not one transformers "
                            f"{transformers.__version__} defines (code from a checkpoint "
                            f"is never run)")
    values = without_code(values)
    if model_type == "vit_mae":  # MAE masks patches at random in training; at 0 it sees all
        values["mask_ratio"] = 0.0
    return CONFIG_MAPPING[model_type].from_dict(values), model_type, values


def _hf_class(transformers, hf_config, values: dict):
    """The class config.json's `architectures` names where transformers defines it and it
    is an image model or head of this config's kind; else the model type's base model."""
    from transformers.models.auto.modeling_auto import MODEL_MAPPING

    names = values.get("architectures") or []
    name = names[0] if isinstance(names, list) and names and isinstance(names[0], str) \
        else ""
    cls = getattr(transformers, name, None) if name.endswith(HF_CLASS_ENDINGS) else None
    if isinstance(cls, type) and issubclass(cls, transformers.PreTrainedModel) and \
            cls.__module__.startswith("transformers.") and \
            isinstance(hf_config, cls.config_class):
        return cls
    try:
        return MODEL_MAPPING[type(hf_config)]
    except KeyError:
        raise SourceSkipped(f"transformers has no model class for {type(hf_config).__name__}") \
            from None


def _hf_loaded(transformers, files: CheckpointFiles):
    """transformers' own model of the checkpoint, in eval mode, built by `from_pretrained`
    from the config and state dict read (no path); its model_type, and whether it has no
    pooler (or only the pooler's weights are missing). Skipped where transformers would
    fill missing weights at random."""
    hf_config, model_type, values = _hf_config(transformers, files)
    cls = _hf_class(transformers, hf_config, values)
    state, _ = read_state_dict(files)  # safetensors, or a pickle through the safe load only
    with _quiet():
        model, info = cls.from_pretrained(None, config=hf_config, state_dict=state,
                                          output_loading_info=True,
                                          attn_implementation="eager",
                                          trust_remote_code=False)
    model = model.eval().float()
    missing = list(info.get("missing_keys") or [])
    no_pooler = getattr(model, "pooler", None) is None or (
        bool(missing) and all(".pooler." in f".{k}" for k in missing))
    if missing and not no_pooler:
        raise SourceSkipped(f"transformers would fill weights the checkpoint lacks with random "
                            f"values ({', '.join(sorted(missing)[:3])})")
    return model, model_type, no_pooler


def _hf_embedding(model, model_type: str, no_pooler: bool, classifies: bool, native: int,
                  forward: Callable) -> Optional[Callable]:
    """The function giving transformers' image embedding as our `embedding` output is
    defined, or None where the model gives none as such."""
    cls_name = type(model).__name__
    if cls_name in ("CLIPModel", "SiglipModel"):
        def image_features(x):
            kwargs = {"interpolate_pos_encoding": True} \
                if tuple(x.shape[-2:]) != (native, native) else {}
            out = model.get_image_features(pixel_values=x, **kwargs)
            return getattr(out, "pooler_output", out)
        return image_features
    if cls_name == "CLIPVisionModelWithProjection":
        return lambda x: forward(x).image_embeds
    if cls_name == "ViTMAEModel" or (no_pooler and model_type in HF_CLASS_TOKEN
                                     and not classifies):
        # the class token after the final norm (a checkpoint saved without its pooler,
        # as DINO's are, is imported without one)
        return lambda x: forward(x).last_hidden_state[:, 0]
    if not classifies:
        return lambda x: forward(x).pooler_output
    return None


def _transformers(files: CheckpointFiles, config) -> Source:
    transformers = _import("transformers")
    model, model_type, no_pooler = _hf_loaded(transformers, files)
    vision = getattr(model.config, "vision_config", None)
    own = vision or model.config
    native = int(getattr(own, "image_size", 0) or  # SigLIP2: its table's grid
                 math.isqrt(own.num_patches) * own.patch_size)
    takes_flag = "interpolate_pos_encoding" in inspect.signature(model.forward).parameters

    def forward(x):
        if "spatial_shapes" in inspect.signature(model.forward).parameters:
            return model(**naflex_inputs(x, vision.patch_size if vision else
                                         model.config.patch_size))
        kwargs = {}
        if takes_flag and tuple(x.shape[-2:]) != (native, native):
            kwargs["interpolate_pos_encoding"] = True
        return model(pixel_values=x, **kwargs)

    outputs: dict[str, Callable] = {}
    names_out = config.output_names
    cls_name = type(model).__name__
    prefix = config.num_prefix_tokens
    classifies = any(hasattr(model, n) for n in ("classifier", "cls_classifier"))
    if "logits" in names_out and classifies:
        outputs["logits"] = lambda x: forward(x).logits
    embedding = _hf_embedding(model, model_type, no_pooler, classifies, native, forward) \
        if "embedding" in names_out else None
    if embedding is not None and config.normalize:
        import torch.nn.functional as F

        outputs["embedding"] = lambda x, raw=embedding: F.normalize(raw(x), dim=-1)
    elif embedding is not None:
        outputs["embedding"] = embedding
    if "tokens" in names_out and model_type in HF_NORMED_TOKENS and not classifies:
        outputs["tokens"] = lambda x: forward(x).last_hidden_state[:, prefix:]
    if not outputs:
        raise SourceSkipped(f"transformers' {cls_name} gives none of {', '.join(names_out)} "
                            f"as such")
    notes = [f"{name} not compared: transformers' {cls_name} does not give it as such"
             for name in names_out if name not in outputs]
    return Source("transformers", _version("transformers"), cls_name, {}, native, outputs,
                  notes)


def naflex_inputs(x, patch: int) -> dict[str, Any]:
    """Images [B, C, H, W] as SigLIP2's NaFlex processor gives them to its model: patches in
    (row, column, channel) order, every one valid, each image's grid in spatial_shapes."""
    import torch

    B, C, H, W = x.shape
    h, w = H // patch, W // patch
    patches = x.reshape(B, C, h, patch, w, patch).permute(0, 2, 4, 3, 5, 1)
    return {"pixel_values": patches.reshape(B, h * w, C * patch * patch),
            "spatial_shapes": torch.tensor([[h, w]] * B),
            "pixel_attention_mask": torch.ones(B, h * w, dtype=torch.long)}


def _timm(files: CheckpointFiles, config, name: Optional[str]) -> Source:
    timm = _import("timm")
    if not isinstance(name, str) or not name:
        raise SourceSkipped("no timm model name recorded (export with --timm-name NAME)")
    if not timm.is_model(name.split(".")[0]):
        raise SourceSkipped(f"timm {_version('timm')} has no model {name!r}")
    state, _ = read_state_dict(files)
    import sys

    kwargs = dict(pretrained=False, num_classes=config.num_classes, img_size=config.img_size,
                  patch_size=config.patch_size, depth=config.depth,
                  embed_dim=config.embed_dim, num_heads=config.num_heads)
    if config.dynamic_img_size:
        kwargs["dynamic_img_size"] = True
    try:
        with _quiet():
            model = timm.create_model(name.split(".")[0], **kwargs)
    except Exception as exc:
        raise SourceSkipped(f"timm cannot build {name}: {first_line(exc)}") from None
    module = sys.modules[type(model).__module__]
    filter_fn = getattr(module, "checkpoint_filter_fn", None)
    native = _timm_native(timm, name, model, state, config)
    with _quiet():
        state = filter_fn(state, model) if filter_fn else state
        model.load_state_dict(state, strict=True)
    model = model.eval().float()
    prefix = model.num_prefix_tokens
    outputs: dict[str, Callable] = {}
    if "logits" in config.output_names:
        outputs["logits"] = lambda x: model(x)
    if "embedding" in config.output_names:  # the head's output where it projects
        pre = not config.projection_head
        outputs["embedding"] = lambda x: model.forward_head(model.forward_features(x),
                                                            pre_logits=pre)
        if config.normalize:
            import torch.nn.functional as F

            raw = outputs["embedding"]
            outputs["embedding"] = lambda x, raw=raw: F.normalize(raw(x), dim=-1)
    if "tokens" in config.output_names:
        outputs["tokens"] = lambda x: model.forward_features(x)[:, prefix:]
    return Source("timm", _version("timm"), name, {}, native, outputs)


def _framework(description: B.Description, files: CheckpointFiles) -> Source:
    """The framework's own module of a framework-road bundle, built anew from the
    checkpoint's files (through timm's checkpoint filter, or transformers' from_pretrained),
    not from the bundle's weights: the rows prove the bundle holds the checkpoint's model."""
    from ..checkpoints.framework import hf_record
    from ..frameworks import build_module, framework_model, module_name, output_names

    record = description.module
    _import(record["framework"])
    if record["framework"] == "transformers":  # the checkpoint's own config, not the record
        document = files.json("config.json")
        if not isinstance(document, dict):
            raise SourceSkipped("transformers reads a folder's config.json, and the import "
                                "read none")
        record = hf_record(document, {})
    state, _ = read_state_dict(files)
    module = build_module(record, state, from_checkpoint=True)
    model = framework_model(module, record, description.config)
    outputs = {name: (lambda x, i=i: model(x)[i])
               for i, name in enumerate(output_names(record, module))}
    return Source(record["framework"], _version(record["framework"]),
                  module_name(record), {}, description.config.img_size,
                  outputs)


def _timm_native(timm, name: str, model, state: dict, config) -> int:
    """The side a timm checkpoint was trained at: its position table's grid (before timm's
    filter resamples it to the export size), else the pretrained config's input size, else
    the export size."""
    table = state.get("pos_embed")
    if table is not None and table.dim() == 3:
        embedded = 0 if getattr(model, "no_embed_class", False) else model.num_prefix_tokens
        grid = math.isqrt(max(table.shape[1] - embedded, 0))
        if grid * grid == table.shape[1] - embedded and grid:
            return grid * config.patch_size
    try:
        return int(timm.models.get_pretrained_cfg(name).input_size[-1])
    except Exception:  # no pretrained config for the name: the export size is all there is
        return config.img_size


def _torchvision(files: CheckpointFiles, config, weights: Optional[str]) -> Source:
    _import("torchvision")
    state, _ = read_state_dict(files)
    if config.dynamic_img_size:
        raise SourceSkipped("torchvision's VisionTransformer runs at its image_size only")
    if "logits" not in config.output_names or config.num_classes == 0:
        raise SourceSkipped("torchvision's VisionTransformer gives logits only")
    hidden = state["conv_proj.weight"].shape[0]
    mlp = state["encoder.layers.encoder_layer_0.mlp.0.weight"].shape[0]
    layers = 1 + max(int(k.split(".")[2].rsplit("_", 1)[1]) for k in state
                     if k.startswith("encoder.layers.encoder_layer_"))
    patch = state["conv_proj.weight"].shape[-1]
    grid = math.isqrt(state["encoder.pos_embedding"].shape[1] - 1)
    from torchvision.models.vision_transformer import VisionTransformer, interpolate_embeddings

    if grid * patch != config.img_size:
        state = interpolate_embeddings(config.img_size, patch, state)
    model = VisionTransformer(config.img_size, patch, layers, config.num_heads, hidden, mlp,
                              num_classes=config.num_classes)
    model.load_state_dict(state, strict=True)
    model = model.eval().float()
    return Source("torchvision", _version("torchvision"), weights or "VisionTransformer", {},
                  grid * patch, {"logits": lambda x: model(x)})


def source_sizes(config, native: int) -> list[tuple[int, int]]:
    """Where the source is compared: the export size; for a dynamic-size bundle, also the
    source's native size where it differs, and two more, one of them not square."""
    own = (config.img_size, config.img_size)
    if not config.dynamic_img_size:
        return [own]
    P = config.patch_size
    smaller = max(P, round(config.img_size * 5 / 7 / P) * P)
    larger = max(P, round(config.img_size * 9 / 7 / P) * P)
    sizes = [own, (native, native), (smaller, smaller), (larger, smaller)]
    return list(dict.fromkeys(s for s in sizes if s[0] % P == 0 and s[1] % P == 0))


def source_inputs(config, seed: int, sizes: Sequence[tuple[int, int]]
                  ) -> list[tuple[str, np.ndarray]]:
    """What the source is compared on, as (label, [B, C, H, W] input): two batch sizes at
    the export size and one batch at each other size, seeded."""
    from ..model import random_input

    own = (config.img_size, config.img_size)
    return [(f"random(seed={seed})" + ("" if size == own else f" {size[0]}x{size[1]}"),
             random_input(config, batch, seed, size=None if size == own else size).numpy())
            for size in sizes
            for batch in (SOURCE_BATCHES if size == own else (OTHER_SIZE_BATCH,))]


def source_rows(source: Source, candidates: Sequence[tuple[str, Callable]], config,
                seed: int, tol, sizes: Sequence[tuple[int, int]]) -> list:
    """The source's outputs against each candidate's (name, run(x) -> outputs) on
    `source_inputs`, as PairResults whose reference is the source framework."""
    from .compare import compare_pair

    rows = []
    for label, x in source_inputs(config, seed, sizes):
        expected = source.run(x)
        for name, run in candidates:
            got = run(x)
            for output, ref in expected.items():
                rows.append(compare_pair(source.framework, name, "fp32", label, None,
                                         output, ref, got.get(output), tol, False))
    return rows
