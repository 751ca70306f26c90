"""Source parity: the model the user brought, run by its own framework, against our eager
rebuild and model.onnx. Every other row of a report compares the bundle with our rebuild;
these rows compare the rebuild with the checkpoint's own framework (transformers, timm or
torchvision), so an import that differs from the source cannot pass.

The source is rebuilt from the files the import read (their sha256 recorded in config.json's
`import` record, or the Hub's record for `--model`), by that framework's own loading code:
transformers' `from_pretrained` (safetensors only, no remote code), timm's
`checkpoint_filter_fn` (which resamples the position table as timm does), torchvision's
`interpolate_embeddings`. Where the framework is missing, the files are gone or changed, or
the framework has no way to give an output, the record says skipped and why: never passed.
"""
from __future__ import annotations

import contextlib
import inspect
import io
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import numpy as np

from .. import bundle as B
from ..checkpoints.state import read_state_dict
from ..errors import VitExportError, first_line

# The batch sizes at the export size, and the batch at each other size.
SOURCE_BATCHES = (1, 3)
OTHER_SIZE_BATCH = 2
# Hugging Face model types whose last_hidden_state is the tokens after the final norm, as
# our "tokens" output (CLIP and SigLIP norm only the pooled token; MAE shuffles patches).
HF_NORMED_TOKENS = ("vit", "dinov2", "dinov2_with_registers", "dinov3_vit", "deit")
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
    files: dict[str, str]  # the files it was built from -> sha256
    native: int  # the image side the source itself is built for
    outputs: dict[str, Callable[[Any], Any]]  # what it gives, each from a batch tensor
    notes: list[str] = field(default_factory=list)

    def run(self, x: np.ndarray) -> dict[str, np.ndarray]:
        import torch

        with torch.no_grad():
            t = torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32))
            return {name: get(t).float().numpy() for name, get in self.outputs.items()}

    def record(self) -> dict[str, Any]:
        return {"framework": self.framework, "version": self.version, "model": self.model,
                "files": dict(self.files), "native_size": self.native}


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


def _located(description: B.Description) -> tuple[Path, dict[str, str]]:
    """Where the import's files are now, checked against the sha256 recorded at import."""
    imported = description.extra.get("import") or {}
    hub = description.extra.get("hub")
    if isinstance(hub, dict):
        folder = _hub_folder(hub)
        recorded = {k: v for k, v in (hub.get("files") or {}).items()
                    if k != "preprocessor_config.json"}
    else:
        checkpoint = imported.get("checkpoint")
        if not isinstance(checkpoint, str):
            raise SourceSkipped("the bundle records no checkpoint it was imported from")
        folder = Path(checkpoint)
        recorded = imported.get("files")
        if not isinstance(recorded, dict) or not recorded:
            raise SourceSkipped("the import record holds no sha256 of its files (a bundle "
                                "written before they were recorded)")
    base = folder if folder.is_dir() else folder.parent
    for name, digest in recorded.items():
        file = base / name
        if not file.is_file():
            raise SourceSkipped(f"the source file {file} is not here")
        if B.sha256_file(file) != digest:
            raise SourceSkipped(f"the source file {file} changed since export (sha256 differs)")
    return folder, dict(recorded)


def _hub_folder(hub: dict[str, Any]) -> Path:
    """The Hub snapshot a `--model` bundle was fetched from, in this machine's cache: the
    folder holding the files the record names at its commit."""
    repo, commit, files = hub.get("repo"), hub.get("commit"), hub.get("files")
    if not isinstance(repo, str) or not isinstance(commit, str) or not isinstance(files, dict):
        raise SourceSkipped("the Hub record names no repo, commit and files")
    from huggingface_hub import try_to_load_from_cache

    folders = set()
    for name in files:
        try:
            found = try_to_load_from_cache(repo, name, revision=commit)
        except Exception as exc:  # a name the client refuses
            raise SourceSkipped(f"{repo}@{commit[:12]}: {first_line(exc)}") from None
        if not isinstance(found, str):
            raise SourceSkipped(f"{name} of {repo}@{commit[:12]} is not in this machine's Hub "
                                f"cache")
        folders.add(Path(found).parent)
    if len(folders) != 1:
        raise SourceSkipped(f"{repo}@{commit[:12]}'s files are not in one snapshot folder")
    return folders.pop()


def open_source(description: B.Description) -> Source:
    """The source framework's model of a bundle imported from a checkpoint or the Hub, built
    from the same files by the framework's own code. SourceSkipped says why it cannot be."""
    imported = description.extra.get("import")
    if not isinstance(imported, dict):
        raise SourceSkipped("not imported from a framework (a preset or a model folder)")
    folder, files = _located(description)
    fmt = imported.get("format")
    config = description.config
    if fmt == "hf":
        source = _transformers(folder, config, files)
    elif fmt == "timm":
        source = _timm(_weights(folder, files), config, imported.get("timm_name"))
    elif fmt == "torchvision":
        source = _torchvision(_weights(folder, files), config,
                              imported.get("torchvision_weights"))
    else:
        raise SourceSkipped(f"no source framework for the {fmt!r} format")
    source.files = files
    return source


def _hf_loaded(transformers, folder: Path):
    """transformers' own model of the folder, as its config.json names the class, in eval
    mode; its model_type, and whether it has no pooler (or only the pooler's weights are
    missing). Skipped where transformers would fill missing weights at random."""
    hf_config = transformers.AutoConfig.from_pretrained(str(folder), local_files_only=True)
    names = list(getattr(hf_config, "architectures", None) or [])
    model_type = hf_config.model_type
    cls = getattr(transformers, names[0], None) if names else None
    if cls is None or not names[0].endswith(HF_CLASS_ENDINGS):
        cls = transformers.AutoModel
    if model_type == "siglip2" or "Siglip2" in getattr(cls, "__name__", ""):
        raise SourceSkipped("SigLIP2 takes patch sequences, not images: compared in the "
                            "test suite at square grids")
    # MAE masks patches at random in training; at mask_ratio 0 it sees every patch
    extra = {"mask_ratio": 0.0} if model_type == "vit_mae" else {}
    with _quiet():
        model, info = cls.from_pretrained(str(folder), local_files_only=True,
                                          use_safetensors=True, trust_remote_code=False,
                                          output_loading_info=True, **extra)
    model = model.eval().float()
    missing = list(info.get("missing_keys") or [])
    no_pooler = getattr(model, "pooler", None) is None or (
        bool(missing) and all(".pooler." in f".{k}" for k in missing))
    if missing and not no_pooler:
        raise SourceSkipped(f"transformers would fill weights the checkpoint lacks with random "
                            f"values ({', '.join(missing[:3])})")
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
    if cls_name == "ViTMAEModel" or (no_pooler and model_type in HF_NORMED_TOKENS
                                     and not classifies):
        # the class token after the final norm (a checkpoint saved without its pooler,
        # as DINO's are, is imported without one)
        return lambda x: forward(x).last_hidden_state[:, 0]
    if not classifies:
        return lambda x: forward(x).pooler_output
    return None


def _transformers(folder: Path, config, files: dict[str, str]) -> Source:
    transformers = _import("transformers")
    if not {"config.json", "model.safetensors"} <= set(files):
        raise SourceSkipped("transformers reads a folder's config.json and model.safetensors, "
                            "and the import did not read both (pickled weights are never "
                            "run)")
    model, model_type, no_pooler = _hf_loaded(transformers, folder)
    vision = getattr(model.config, "vision_config", None)
    native = int((vision or model.config).image_size)
    takes_flag = "interpolate_pos_encoding" in inspect.signature(model.forward).parameters

    def forward(x):
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


def _weights(folder: Path, files: dict[str, str]) -> Path:
    """The weights file the import read (a file, or in a folder the one its record names):
    never another file a folder may hold now."""
    if not folder.is_dir():
        return folder
    named = [n for n in files if n.endswith((".safetensors", ".bin", ".pth", ".pt", ".ckpt"))]
    if len(named) != 1:
        raise SourceSkipped("the import record names no single weights file")
    return folder / named[0]


def _timm(folder: Path, config, name: Optional[str]) -> Source:
    timm = _import("timm")
    if not name:
        raise SourceSkipped("no timm model name recorded (export with --timm-name NAME)")
    state, _ = read_state_dict(folder)
    import sys

    kwargs = dict(pretrained=False, num_classes=config.num_classes, img_size=config.img_size,
                  depth=config.depth, embed_dim=config.embed_dim, num_heads=config.num_heads)
    if config.dynamic_img_size:
        kwargs["dynamic_img_size"] = True
    try:
        with _quiet():
            model = timm.create_model(name.split(".")[0], **kwargs)
    except Exception as exc:
        raise SourceSkipped(f"timm cannot build {name}: {first_line(exc)}") from None
    module = sys.modules[type(model).__module__]
    filter_fn = getattr(module, "checkpoint_filter_fn", None)
    with _quiet():
        state = filter_fn(state, model) if filter_fn else state
        model.load_state_dict(state, strict=True)
    model = model.eval().float()
    native = int(model.patch_embed.img_size[0])
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


def _torchvision(folder: Path, config, weights: Optional[str]) -> Source:
    _import("torchvision")
    state, _ = read_state_dict(folder)
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


@contextlib.contextmanager
def _quiet():
    """Frameworks' own warnings and progress bars stay out of a report."""
    import logging
    import warnings

    before = logging.root.manager.disable
    logging.disable(logging.WARNING)  # transformers' load report, timm's notes
    try:
        with warnings.catch_warnings(), contextlib.redirect_stderr(io.StringIO()):
            warnings.simplefilter("ignore")
            yield
    finally:
        logging.disable(before)


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


def source_rows(source: Source, candidates: Sequence[tuple[str, Callable]], config,
                seed: int, tol, sizes: Sequence[tuple[int, int]]) -> list:
    """The source's outputs against each candidate's (name, run(x) -> outputs) at two batch
    sizes at the export size and one batch at each other size, as PairResults whose
    reference is the source framework."""
    from ..model import random_input
    from .compare import compare_pair

    rows = []
    own = (config.img_size, config.img_size)
    for size in sizes:
        for batch in (SOURCE_BATCHES if size == own else (OTHER_SIZE_BATCH,)):
            x = random_input(config, batch, seed, size=None if size == own else size).numpy()
            label = f"random(seed={seed})" + ("" if size == own else f" {size[0]}x{size[1]}")
            expected = source.run(x)
            for name, run in candidates:
                got = run(x)
                for output, ref in expected.items():
                    rows.append(compare_pair(source.framework, name, "fp32", label, None,
                                             output, ref, got.get(output), tol, False))
    return rows
