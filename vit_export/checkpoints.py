"""Foreign checkpoints (timm, Hugging Face, torchvision) -> our names, config and labels.

Each format is a list of key renames (plus, for Hugging Face, fusing separate q/k/v into
qkv). The config is read off the renamed weights' shapes, then the checkpoint's own config
file, a preset and explicit overrides win, in that order. Nothing is dropped silently: a key
that does not fit is reported with the counts of missing, unexpected and wrong-shape keys.
"""
from __future__ import annotations

import json
import math
import os
import re
from pathlib import Path
from typing import Any, Optional

import torch

from . import bundle as B
from .errors import CheckpointError
from .model import VisionTransformer, ViTConfig, preset_config, resample_pos_embed

FORMATS = ("timm", "hf", "torchvision")
WRAPPER_KEYS = ("state_dict", "model", "model_state_dict", "module")
IMAGENET_MEAN, IMAGENET_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)

_L = r"(?:encoder\.layer|layers)\.(\d+)\."  # Hugging Face transformers 4.x | 5.x
RENAMES: dict[str, list[tuple[str, str]]] = {
    "timm": [],
    "hf": [
        (r"^vit\.", ""),
        (r"^embeddings\.cls_token$", "cls_token"),
        (r"^embeddings\.distillation_token$", "dist_token"),
        (r"^embeddings\.position_embeddings$", "pos_embed"),
        (r"^embeddings\.patch_embeddings\.projection\.", "patch_embed.proj."),
        (rf"^{_L}layernorm_before\.", r"blocks.\1.norm1."),
        (rf"^{_L}layernorm_after\.", r"blocks.\1.norm2."),
        (rf"^{_L}attention\.(?:attention\.query|q_proj)\.", r"blocks.\1.attn.q."),
        (rf"^{_L}attention\.(?:attention\.key|k_proj)\.", r"blocks.\1.attn.k."),
        (rf"^{_L}attention\.(?:attention\.value|v_proj)\.", r"blocks.\1.attn.v."),
        (rf"^{_L}attention\.(?:output\.dense|o_proj)\.", r"blocks.\1.attn.proj."),
        (rf"^{_L}(?:intermediate\.dense|mlp\.fc1)\.", r"blocks.\1.mlp.fc1."),
        (rf"^{_L}(?:output\.dense|mlp\.fc2)\.", r"blocks.\1.mlp.fc2."),
        (r"^layernorm\.", "norm."),
        (r"^pooler\.dense\.", "pre_logits.fc."),
        (r"^classifier\.", "head."),
    ],
    "torchvision": [
        (r"^class_token$", "cls_token"),
        (r"^conv_proj\.", "patch_embed.proj."),
        (r"^encoder\.pos_embedding$", "pos_embed"),
        (r"^encoder\.layers\.encoder_layer_(\d+)\.ln_1\.", r"blocks.\1.norm1."),
        (r"^encoder\.layers\.encoder_layer_(\d+)\.ln_2\.", r"blocks.\1.norm2."),
        (r"^encoder\.layers\.encoder_layer_(\d+)\.self_attention\.in_proj_(weight|bias)$",
         r"blocks.\1.attn.qkv.\2"),
        (r"^encoder\.layers\.encoder_layer_(\d+)\.self_attention\.out_proj\.",
         r"blocks.\1.attn.proj."),
        (r"^encoder\.layers\.encoder_layer_(\d+)\.mlp\.(?:0|linear_1)\.", r"blocks.\1.mlp.fc1."),
        (r"^encoder\.layers\.encoder_layer_(\d+)\.mlp\.(?:3|linear_2)\.", r"blocks.\1.mlp.fc2."),
        (r"^encoder\.ln\.", "norm."),
        (r"^heads\.pre_logits\.", "pre_logits.fc."),
        (r"^heads\.head\.", "head."),
    ],
}
# Standard head counts of the ViT family by width; anything else needs --set num_heads.
HEADS_BY_WIDTH = {192: 3, 384: 6, 768: 12, 1024: 16, 1280: 16}


def _first_line(exc: Exception) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def read_state_dict(path: str | os.PathLike) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """Tensors of a .pth/.pt/.bin/.safetensors file or a Hugging Face folder, plus its config
    files (`config.json`, `preprocessor_config.json`) when it is a folder."""
    path = Path(path)
    extras: dict[str, Any] = {}
    if path.is_dir():
        for name in ("config.json", "preprocessor_config.json"):
            if (path / name).is_file():
                try:
                    extras[name] = json.loads((path / name).read_text(encoding="utf-8"))
                except (UnicodeDecodeError, json.JSONDecodeError) as exc:
                    raise CheckpointError(f"{path / name} is not valid JSON: {exc}") from None
        weights = [path / n for n in ("model.safetensors", "pytorch_model.bin")
                   if (path / n).is_file()]
        if not weights:
            raise CheckpointError(f"{path} has no model.safetensors or pytorch_model.bin")
        path = weights[0]
    if not path.is_file():
        raise CheckpointError(f"{path} does not exist")
    try:
        if path.suffix == ".safetensors":
            from safetensors.torch import load_file

            state: Any = load_file(str(path))
        elif path.suffix in (".pth", ".pt", ".bin", ".ckpt"):
            state = torch.load(str(path), map_location="cpu", weights_only=True)
        else:
            raise CheckpointError(f"{path}: expected .pth, .pt, .bin, .safetensors or a "
                                  f"Hugging Face folder")
    except CheckpointError:
        raise
    except Exception as exc:  # pickle, zip and safetensors errors of many kinds
        raise CheckpointError(f"cannot read checkpoint {path}: {_first_line(exc)}") from None
    for key in WRAPPER_KEYS:  # {"model": state_dict}, {"state_dict": ...}
        if isinstance(state, dict) and isinstance(state.get(key), dict):
            state = state[key]
            break
    if not isinstance(state, dict) or not state or \
            not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise CheckpointError(f"{path} holds no state dict of tensors")
    if all(k.startswith("module.") for k in state):  # saved from DataParallel / DDP
        state = {k[len("module."):]: v for k, v in state.items()}
    return state, extras


def detect_format(keys) -> str:
    keys = set(keys)
    if "cls_token" in keys and any(k.startswith("blocks.0.") for k in keys):
        return "timm"
    if any(k.startswith(("vit.embeddings.", "embeddings.patch_embeddings.")) for k in keys):
        return "hf"
    if "conv_proj.weight" in keys or "encoder.pos_embedding" in keys:
        return "torchvision"
    raise CheckpointError(f"cannot tell the checkpoint format from its keys "
                          f"({', '.join(sorted(keys)[:3])}, ...); pass --format")


def convert(state: dict[str, torch.Tensor], fmt: str) -> dict[str, torch.Tensor]:
    """Rename keys to ours; fuse Hugging Face's separate q, k, v into one qkv."""
    rules = [(re.compile(p), r) for p, r in RENAMES[fmt]]
    out: dict[str, torch.Tensor] = {}
    for key, value in state.items():
        for pattern, replacement in rules:
            key = pattern.sub(replacement, key)
        out[key] = value
    for key in [k for k in out if re.fullmatch(r"blocks\.\d+\.attn\.q\.(weight|bias)", k)]:
        prefix, kind = key.rsplit(".q.", 1)
        parts = [out.pop(f"{prefix}.{p}.{kind}", None) for p in "qkv"]
        if any(p is None for p in parts):
            raise CheckpointError(f"{prefix}: query/key/value {kind} are not all present")
        out[f"{prefix}.qkv.{kind}"] = torch.cat(parts, dim=0)
    return out


def infer_config(state: dict[str, torch.Tensor], hf_config: Optional[dict] = None,
                 notes: Optional[list[str]] = None) -> dict[str, Any]:
    """Config fields read off the (renamed) weights; a Hugging Face config.json refines them."""
    notes = notes if notes is not None else []
    try:
        D = state["cls_token"].shape[-1]
        proj = state["patch_embed.proj.weight"]  # [D, C, P, P]
        pos = state["pos_embed"]  # [1, prefix + N, D]
    except KeyError as exc:
        raise CheckpointError(f"checkpoint has no {exc.args[0]}; is it a ViT?") from None
    blocks = {int(m.group(1)) for k in state if (m := re.match(r"blocks\.(\d+)\.", k))}
    distilled = "dist_token" in state
    patch = proj.shape[-1]
    grid = math.isqrt(pos.shape[1] - (2 if distilled else 1))
    values: dict[str, Any] = dict(
        img_size=grid * patch, patch_size=patch, in_chans=proj.shape[1], embed_dim=D,
        depth=max(blocks) + 1 if blocks else 0, distilled=distilled,
        qkv_bias="blocks.0.attn.qkv.bias" in state,
        patch_norm="patch_embed.norm.weight" in state,
        num_classes=state["head.weight"].shape[0] if "head.weight" in state else 0)
    if "blocks.0.mlp.fc1.weight" in state:
        values["mlp_ratio"] = state["blocks.0.mlp.fc1.weight"].shape[0] / D
    if "pre_logits.fc.weight" in state:
        values["representation_size"] = state["pre_logits.fc.weight"].shape[0]
    if hf_config:
        values.update({k: hf_config[h] for h, k in (
            ("num_attention_heads", "num_heads"), ("layer_norm_eps", "norm_eps"),
            ("image_size", "img_size"), ("qkv_bias", "qkv_bias")) if h in hf_config})
        if hf_config.get("hidden_act", "gelu") != "gelu":
            raise CheckpointError(f"hidden_act {hf_config['hidden_act']!r} is not supported "
                                  f"(only exact gelu)")
    if "num_heads" not in values:
        if D in HEADS_BY_WIDTH:
            values["num_heads"] = HEADS_BY_WIDTH[D]
        elif D % 64 == 0:
            values["num_heads"] = D // 64
        else:
            raise CheckpointError(f"cannot infer num_heads for embed_dim {D}; "
                                  f"pass --set num_heads=N")
        notes.append(f"num_heads={values['num_heads']} assumed for width {D} (the ViT "
                     f"standard); the weights cannot tell, --set num_heads=N overrides")
    return values


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


def _preprocessing(fmt: str, config: ViTConfig, extras: dict[str, Any]) -> B.Preprocessing:
    hf = extras.get("preprocessor_config.json")
    if hf and config.in_chans == len(hf.get("image_mean", ())):
        resample = {0: "nearest", 2: "bilinear", 3: "bicubic"}.get(hf.get("resample"), "bilinear")
        return B.Preprocessing(config.img_size, config.img_size, tuple(hf["image_mean"]),
                               tuple(hf["image_std"]), resample)
    if fmt == "torchvision" and config.in_chans == 3:
        return B.Preprocessing(config.img_size, round(config.img_size * 256 / 224),
                               IMAGENET_MEAN, IMAGENET_STD, "bilinear")
    return B.Preprocessing.default_for(config)


def _labels(extras: dict[str, Any], num_classes: int) -> Optional[list[str]]:
    id2label = (extras.get("config.json") or {}).get("id2label")
    if not id2label or len(id2label) != num_classes:
        return None
    return [str(id2label.get(str(i), id2label.get(i, i))) for i in range(num_classes)]


def load_checkpoint(path: str | os.PathLike, fmt: Optional[str] = None,
                    preset: Optional[str] = None, overrides: Optional[dict[str, Any]] = None,
                    ) -> tuple[VisionTransformer, B.Description]:
    """Our model with the checkpoint's weights, and the description of where they came from."""
    raw, extras = read_state_dict(path)
    if fmt is not None and fmt not in FORMATS:
        raise CheckpointError(f"unknown format {fmt!r}; choose one of {FORMATS}")
    fmt = fmt or detect_format(raw)
    state = convert(raw, fmt)
    notes: list[str] = []
    inferred = infer_config(state, extras.get("config.json") if fmt == "hf" else None, notes)
    chosen = preset_config(preset).to_dict() if preset else {}  # the whole preset, defaults too
    values = {**inferred, **chosen, **(overrides or {})}
    config = ViTConfig.from_dict(values)
    source_grid = math.isqrt(state["pos_embed"].shape[1] - config.num_prefix_tokens)
    if source_grid != config.grid_size:
        state["pos_embed"] = resample_pos_embed(state["pos_embed"], config.grid_size,
                                                config.num_prefix_tokens)
        notes.append(f"position embedding resampled (bicubic) from a {source_grid}x"
                     f"{source_grid} to a {config.grid_size}x{config.grid_size} patch grid "
                     f"for img_size {config.img_size}")
    model = VisionTransformer(config)
    problem = fit_report(model, state)
    if problem:
        raise CheckpointError(problem)
    model.load_state_dict(state, strict=True)
    description = B.Description(
        config, _preprocessing(fmt, config, extras), labels=_labels(extras, config.num_classes),
        name=Path(path).stem,
        extra={"import": {"checkpoint": str(path), "format": fmt, "notes": notes}})
    return model.eval(), description
