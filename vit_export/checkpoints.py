"""Foreign checkpoints (timm, Hugging Face, torchvision) -> our names, config and labels.

Each format is a list of key renames (plus, for Hugging Face, fusing separate q/k/v into
qkv). The config is read off the renamed weights' shapes, then the checkpoint's own config
file, a preset and explicit overrides win, in that order. Nothing is dropped silently: a key
that does not fit is reported with the counts of missing, unexpected and wrong-shape keys.
"""
from __future__ import annotations

import argparse
import math
import os
import re
from pathlib import Path
from typing import Any, Optional

import torch

from . import bundle as B
from .errors import CheckpointError, ConfigError, first_line
from .model import (
    POOLS,
    VisionTransformer,
    ViTConfig,
    create_model,
    preset_config,
    resample_pos_embed,
)
from .preprocessing import hf_preprocessing, resolve_preprocessing, split_overrides
from .preprocessing.sources import timm_knows
from .schema import BOOLEAN, POSITIVE_NUMBER, STRING, check_fields, integer, object_of

FORMATS = ("timm", "hf", "torchvision")
WRAPPER_KEYS = ("state_dict", "model", "model_state_dict", "module")

_L = r"(?:encoder\.layers?|layers?|model\.layer)\.(\d+)\."  # transformers 4.x | 5.x | DINOv3
_ATTN = r"(?:attention|self_attn)\."  # ViT, DeiT, DINOv2 | CLIP, SigLIP
# The base model's attribute in Hugging Face's task models (ViTForImageClassification.vit,
# CLIPVisionModelWithProjection.vision_model, ...): its weights are the backbone's.
HF_BASES = ("vit", "deit", "dinov2", "dinov2_with_registers", "vision_model", "beit")
RENAMES: dict[str, list[tuple[str, str]]] = {
    "timm": [
        (r"^blocks\.(\d+)\.gamma_([12])$", r"blocks.\1.ls\2.gamma"),  # Eva's LayerScale
        # Eva's unfused attention (EVA02 B/L): fused into qkv below
        (r"^blocks\.(\d+)\.attn\.([qkv])_proj\.", r"blocks.\1.attn.\2."),
    ],
    "hf": [
        (rf"^(?:{'|'.join(HF_BASES)})\.", ""),
        (r"^embeddings\.(?:cls_token|class_embedding)$", "cls_token"),  # ViT | CLIP
        (r"^embeddings\.distillation_token$", "dist_token"),
        (r"^embeddings\.register_tokens$", "reg_token"),  # DINOv2 with registers
        (r"^embeddings\.(?:position_embeddings|position_embedding\.weight)$", "pos_embed"),
        (r"^embeddings\.(?:patch_embeddings\.projection|patch_embeddings|patch_embedding)\.",
         "patch_embed.proj."),
        (r"^pre_layrnorm\.", "norm_pre."),  # CLIP's spelling
        (rf"^{_L}(?:layernorm_before|norm1|layer_norm1)\.", r"blocks.\1.norm1."),
        (rf"^{_L}(?:layernorm_after|norm2|layer_norm2)\.", r"blocks.\1.norm2."),
        (rf"^{_L}{_ATTN}(?:attention\.query|q_proj)\.", r"blocks.\1.attn.q."),
        (rf"^{_L}{_ATTN}(?:attention\.key|k_proj)\.", r"blocks.\1.attn.k."),
        (rf"^{_L}{_ATTN}(?:attention\.value|v_proj)\.", r"blocks.\1.attn.v."),
        (rf"^{_L}{_ATTN}(?:output\.dense|o_proj|out_proj)\.", r"blocks.\1.attn.proj."),
        (rf"^{_L}layer_scale([12])\.lambda1$", r"blocks.\1.ls\2.gamma"),  # DINOv2's LayerScale
        (rf"^{_L}(?:intermediate\.dense|mlp\.fc1|mlp\.up_proj)\.", r"blocks.\1.mlp.fc1."),
        (rf"^{_L}(?:output\.dense|mlp\.fc2|mlp\.down_proj)\.", r"blocks.\1.mlp.fc2."),
        (rf"^{_L}mlp\.gate_proj\.", r"blocks.\1.mlp.fc1_g."),  # DINOv3's gated MLP; its
        # up_proj (fc1 above) becomes fc1_x in _hf_layouts
        (r"^(?:layernorm|post_layernorm)\.", "norm."),
        (r"^pooler\.dense\.", "pre_logits.fc."),
        # SigLIP's attention-pool head is timm's AttentionPoolLatent: probe = latent, the
        # MultiheadAttention's in_proj = q then kv (split in convert), out_proj = proj
        (r"^head\.probe$", "attn_pool.latent"),
        (r"^head\.attention\.in_proj_(weight|bias)$", r"attn_pool.in_proj.\1"),
        (r"^head\.attention\.out_proj\.", "attn_pool.proj."),
        (r"^head\.layernorm\.", "attn_pool.norm."),
        (r"^head\.mlp\.", "attn_pool.mlp."),
        (r"^(?:classifier|cls_classifier)\.", "head."),
        (r"^distillation_classifier\.", "head_dist."),  # DeiT with its teacher's head
        # CLIP's projection: a bias-free linear layer, our head with a zero bias (as timm
        # converts OpenAI's `proj`)
        (r"^visual_projection\.weight$", "head.weight"),
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


def read_state_dict(path: str | os.PathLike) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """Tensors of a .pth/.pt/.bin/.safetensors file or a Hugging Face folder, plus its config
    files (`config.json`, `preprocessor_config.json`) when it is a folder."""
    path = Path(path)
    extras: dict[str, Any] = {}
    if path.is_dir():
        for name in ("config.json", "preprocessor_config.json"):
            if (path / name).is_file():
                extras[name] = B.parse_json((path / name).read_bytes(), str(path / name),
                                            CheckpointError)
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
            # timm's train.py saves its argparse.Namespace beside the weights: plain data
            with torch.serialization.safe_globals([argparse.Namespace]):
                state = torch.load(str(path), map_location="cpu", weights_only=True)
        else:
            raise CheckpointError(f"{path}: expected .pth, .pt, .bin, .safetensors or a "
                                  f"Hugging Face folder")
    except CheckpointError:
        raise
    except Exception as exc:  # pickle, zip and safetensors errors of many kinds
        raise CheckpointError(f"cannot read checkpoint {path}: {first_line(exc)}") from None
    if isinstance(state, dict) and isinstance(state.get("arch"), str):
        extras["arch"] = state["arch"]  # timm's train.py: the model's name (--model)
    for key in WRAPPER_KEYS:  # {"model": state_dict}, {"state_dict": ...}
        if isinstance(state, dict) and isinstance(state.get(key), dict):
            state = state[key]
            break
    if not isinstance(state, dict) or not state or \
            not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise CheckpointError(f"{path} holds no state dict of tensors")
    if all(k.startswith("module.") for k in state):  # saved from DataParallel / DDP
        state = {k[len("module."):]: v for k, v in state.items()}
    for key, value in state.items():
        _check_tensor(path, key, value)
    return state, extras


def _check_tensor(path: Path, key: str, value: torch.Tensor) -> None:
    """A state dict entry that our model can take as a weight, or one line on why not."""
    problem = B.weight_problem(key, value)
    if problem:
        raise CheckpointError(f"{path}: {problem}")


HF_PATCH_EMBED = (rf"(?:(?:{'|'.join(HF_BASES)})\.)?embeddings\."
                  rf"(?:patch_embeddings\.projection|patch_embeddings|patch_embedding)\.weight")
# Hugging Face weights that only training or masked inputs use, and a whole CLIP or SigLIP
# model's text tower: the image tower is what is exported.
HF_UNUSED = re.compile(r"embeddings\.(?:mask_token|position_ids)|text_model\..*"
                       r"|text_projection\..*|logit_scale|logit_bias")


def _format_of(keys) -> Optional[str]:
    keys = set(keys)
    if "patch_embed.proj.weight" in keys and any(k.startswith("blocks.0.") for k in keys):
        return "timm"
    if any(re.fullmatch(HF_PATCH_EMBED, k) for k in keys):
        return "hf"
    if "conv_proj.weight" in keys or "encoder.pos_embedding" in keys:
        return "torchvision"
    return None


def detect_format(keys, given: Optional[str] = None) -> str:
    """The format the keys show; `given` (--format) must not contradict them."""
    found = _format_of(keys)
    if given is not None:
        if given not in FORMATS:
            raise CheckpointError(f"unknown format {given!r}; choose one of {FORMATS}")
        if found is not None and found != given:
            raise CheckpointError(f"--format {given}, but the checkpoint's keys are {found}'s; "
                                  f"pass --format {found} or leave it out")
        return given
    if found is None:
        raise CheckpointError(f"cannot tell the checkpoint format from its keys "
                              f"({', '.join(sorted(map(str, keys))[:3])}, ...); pass --format")
    return found


def convert(state: dict[str, torch.Tensor], fmt: str, zero_key_bias: bool = False,
            channels: Optional[int] = None) -> dict[str, torch.Tensor]:
    """Rename keys to ours; fuse Hugging Face's separate q, k, v into one qkv and reshape
    what it stores in other shapes (below)."""
    rules = [(re.compile(p), r) for p, r in RENAMES[fmt]]
    out: dict[str, torch.Tensor] = {}
    for key, value in state.items():
        for pattern, replacement in rules:
            key = pattern.sub(replacement, key)
        if fmt == "hf" and HF_UNUSED.fullmatch(key):
            continue
        out[key] = value
    if fmt == "hf":
        _hf_layouts(out, projection="visual_projection.weight" in state, channels=channels)
    if fmt == "timm":
        _eva_layouts(out)
    for key in [k for k in out if re.fullmatch(r"blocks\.\d+\.attn\.q\.(weight|bias)", k)]:
        prefix, kind = key.rsplit(".q.", 1)
        parts = [out.pop(f"{prefix}.{p}.{kind}", None) for p in "qkv"]
        if kind == "bias" and parts[1] is None and parts[0] is not None \
                and parts[2] is not None and zero_key_bias:  # EVA's and DINOv3's keys have none
            parts[1] = torch.zeros_like(parts[0])
        if any(p is None for p in parts):
            raise CheckpointError(f"{prefix}: query/key/value {kind} are not all present")
        out[f"{prefix}.qkv.{kind}"] = torch.cat(parts, dim=0)
    return out


# Tables timm's rotary modules computed and older releases saved: ours computes them.
EVA_DERIVED = re.compile(r"rope\.(?:bands|pos_embed|periods|pos_embed_cached)"
                         r"|blocks\.\d+\.attn\.k_bias")


# Names only timm's Eva gives its weights (EVA, EVA02, ROPE-ViT, PE, DINOv3)
EVA_KEYS = re.compile(r"blocks\.\d+\.(?:attn\.q_bias|attn\.q_proj\.weight|gamma_1"
                      r"|mlp\.fc1_g\.weight)|rope\.freqs")


def _check_eva_named(raw: dict[str, torch.Tensor], known: dict[str, Any]) -> None:
    """timm Eva weights say nothing of their rotary positions (the tables are computed, not
    saved): without a name or --set, a model without them would load every key and compute
    something else, so it is refused."""
    eva = sorted(k for k in raw if EVA_KEYS.fullmatch(k))
    if eva and "rope_type" not in known:
        raise CheckpointError(f"these are timm Eva weights ({eva[0]}, ...): whether and how it "
                              f"rotates positions is not in them; name the model with "
                              f"--timm-name or pass --set rope_type=none|cat|dinov3|mixed")
    if "rope.freqs" in raw and "rope_grid_indexing" not in known:
        raise CheckpointError("ROPE-ViT mixed weights (rope.freqs): the grid's axis order is "
                              "not in them; name the model with --timm-name or pass --set "
                              "rope_grid_indexing=xy|ij")


def _eva_layouts(out: dict[str, torch.Tensor]) -> None:
    """timm's Eva tensors whose layout is not ours, in place: its attention's query and value
    biases (the key has none) become one qkv bias with zeros for the key, F.linear's own
    arithmetic; derived rotary tables go."""
    for key in [k for k in out if EVA_DERIVED.fullmatch(k)]:
        del out[key]
    for key in [k for k in out if re.fullmatch(r"blocks\.\d+\.attn\.q_bias", k)]:
        prefix = key[:-len("q_bias")]
        q, v = out.pop(key), out.pop(f"{prefix}v_bias", None)
        if v is None or v.shape != q.shape or f"{prefix}qkv.bias" in out:
            raise CheckpointError(f"{prefix}q_bias without a v_bias of its shape")
        out[f"{prefix}qkv.bias"] = torch.cat([q, torch.zeros_like(q), v])


def _hf_layouts(out: dict[str, torch.Tensor], projection: bool,
                channels: Optional[int] = None) -> None:
    """Hugging Face's tensors whose layout is not timm's, in place: CLIP's class embedding [D]
    and position table [T, D] gain their batch dims; SigLIP's pooling attention splits its
    in_proj into q and kv; CLIP's bias-free projection gets a zero bias; DINOv2 with
    registers adds the class token's position to the token itself (registers get none, so the
    table holds the patches alone: timm's no_embed_class, as timm converts these weights)."""
    if "reg_token" in out and out["reg_token"].dim() == 3 and out["reg_token"].shape[1] == 0:
        del out["reg_token"]  # DINOv3ViTModel keeps a [1, 0, D] tensor for no registers
    for key in [k for k in out if k.endswith(".mlp.fc1_g.weight")]:  # DINOv3's gated MLP
        block = key[:-len("fc1_g.weight")]
        for kind in ("weight", "bias"):
            if f"{block}fc1.{kind}" in out:
                out[f"{block}fc1_x.{kind}"] = out.pop(f"{block}fc1.{kind}")
    weight = out.get("patch_embed.proj.weight")
    if weight is not None and weight.dim() == 2:  # SigLIP2: a Linear on (row, col, channel)
        D, width = weight.shape
        channels = channels or 3  # config.json's num_channels
        P = math.isqrt(width // channels)
        if P * P * channels != width:
            raise CheckpointError(f"patch embedding of {width} inputs is not a square patch of "
                                  f"{channels} channels")
        out["patch_embed.proj.weight"] = weight.reshape(D, P, P, channels).permute(0, 3, 1, 2) \
            .contiguous()  # [D, C, P, P]: the Conv2d that computes the same
    if "cls_token" in out and out["cls_token"].dim() == 1:
        out["cls_token"] = out["cls_token"].reshape(1, 1, -1)
    if "pos_embed" in out and out["pos_embed"].dim() == 2:
        out["pos_embed"] = out["pos_embed"].unsqueeze(0)
    for kind in ("weight", "bias"):
        packed = out.pop(f"attn_pool.in_proj.{kind}", None)
        if packed is not None:
            width = packed.shape[0] // 3
            out[f"attn_pool.q.{kind}"], out[f"attn_pool.kv.{kind}"] = packed[:width], packed[width:]
    if projection and "head.bias" not in out:
        out["head.bias"] = torch.zeros(out["head.weight"].shape[0], dtype=out["head.weight"].dtype)
    if "reg_token" in out and "cls_token" in out and out.get("pos_embed") is not None \
            and out["pos_embed"].dim() == 3:
        pos = out["pos_embed"]
        out["cls_token"] = out["cls_token"] + pos[:, :1]
        out["pos_embed"] = pos[:, 1:]


def _tensor(state: dict[str, torch.Tensor], key: str, rank: int) -> torch.Tensor:
    if key not in state:
        raise CheckpointError(f"checkpoint has no {key}; is it a ViT?")
    value = state[key]
    if value.dim() != rank or 0 in value.shape:
        raise CheckpointError(f"checkpoint's {key} has shape {list(value.shape)}; a ViT's has "
                              f"{rank} non-empty dims")
    return value


# What each framework fixes in code, so its checkpoints need not say it.
# Hugging Face's interpolate_pos_encoding does not antialias (DINOv2 with registers does:
# hf_architecture says so).
FORMAT_FIXED = {"timm": {"norm_eps": 1e-6}, "torchvision": {"norm_eps": 1e-6},
                "hf": {"pos_embed_antialias": False}}
# What the weights cannot show: it must come from a config file, a named model or --set.
NOT_IN_WEIGHTS = ("num_heads", "norm_eps")


def _grid(pos: torch.Tensor, prefix: int, no_embed_class: Optional[bool]) -> tuple[int, bool]:
    """The patch grid side a [1, T, D] pos_embed holds, and whether it leaves out the prefix
    tokens (timm's no_embed_class), which the named architecture says when there is one."""
    fits = []
    for without_prefix, tokens in ((False, pos.shape[1] - prefix), (True, pos.shape[1])):
        grid = math.isqrt(max(tokens, 0))
        if grid > 0 and grid * grid == tokens and no_embed_class in (None, without_prefix):
            fits.append((grid, without_prefix))
    if not fits:
        raise CheckpointError(f"checkpoint's pos_embed holds {pos.shape[1]} tokens, not a "
                              f"square patch grid with or without the {prefix} prefix token(s)")
    if len(fits) > 1 and prefix:
        raise CheckpointError(f"checkpoint's pos_embed holds {pos.shape[1]} tokens: a "
                              f"{fits[0][0]}x{fits[0][0]} grid plus {prefix} prefix token(s) "
                              f"or a {fits[1][0]}x{fits[1][0]} grid alone; name the model "
                              f"(--timm-name) or pass --set no_embed_class=true|false")
    return fits[0]


def infer_config(state: dict[str, torch.Tensor], fmt: str, hf_config: Optional[dict] = None,
                 known: Optional[dict[str, Any]] = None) -> dict[str, Any]:
    """Config fields read off the (renamed) weights' names and shapes, what the format fixes,
    and a Hugging Face config.json. Fields none of these show (NOT_IN_WEIGHTS, and the
    activation) are left out. `known`: what a named model or --set says, where the weights
    alone are ambiguous."""
    proj = _tensor(state, "patch_embed.proj.weight", 4)  # [D, C, P, P]
    D = proj.shape[0]
    known = known or {}
    if "pos_embed" not in state and ("rope.freqs" in state or known.get("rope_type")):
        pos = None  # rotary only (DINOv3, ROPE-ViT): the size is the named model's or --set's
    else:
        pos = _tensor(state, "pos_embed", 3)  # [1, (prefix) + N, D]
    blocks = {int(m.group(1)) for k in state if (m := re.match(r"blocks\.(\d+)\.", k))}
    distilled = "dist_token" in state
    class_token = "cls_token" in state
    reg_tokens = _tensor(state, "reg_token", 3).shape[1] if "reg_token" in state else 0
    prefix = int(class_token) + int(distilled) + reg_tokens
    patch = proj.shape[-1]
    said = known.get("no_embed_class")  # a --set string or a named model's bool
    if said is not None:
        said = ViTConfig.from_dict({"no_embed_class": said}).no_embed_class
    if pos is not None:
        grid, no_embed_class = _grid(pos, prefix, said)
    elif "img_size" not in known:
        raise CheckpointError("checkpoint has no pos_embed (rotary positions only): its image "
                              "size is not in the weights; name the model with --timm-name or "
                              "pass --set img_size=N")
    else:
        side = ViTConfig.from_dict({"img_size": known["img_size"], "patch_size": patch}).img_size
        grid, no_embed_class = side // patch, bool(said)
    fc_norm = "fc_norm.weight" in state
    pool = "map" if "attn_pool.latent" in state else "token" if class_token else "avg"
    if pool == "token" and "head.weight" in state and state["head.weight"].dim() == 2 \
            and state["head.weight"].shape[1] == 2 * D and "pre_logits.fc.weight" not in state:
        pool = "token_avg"  # DINOv2's linear head: the class token and the patch mean
    values: dict[str, Any] = dict(
        img_size=grid * patch, patch_size=patch, in_chans=proj.shape[1], embed_dim=D,
        depth=max(blocks) + 1 if blocks else 0, distilled=distilled,
        qkv_bias="blocks.0.attn.qkv.bias" in state,
        patch_norm="patch_embed.norm.weight" in state,
        num_classes=state["head.weight"].shape[0] if "head.weight" in state else 0,
        class_token=class_token, reg_tokens=reg_tokens, no_embed_class=no_embed_class,
        global_pool=pool, fc_norm=fc_norm, final_norm=fc_norm or "norm.weight" in state,
        pre_norm="norm_pre.weight" in state, qk_norm="blocks.0.attn.q_norm.weight" in state,
        # LayerScale's gammas are in the weights; its starting value (timm's default here)
        # only matters for training
        init_values=1e-5 if "blocks.0.ls1.gamma" in state else None,
        pos_embed="learn" if pos is not None else "none",
        scale_mlp="blocks.0.mlp.norm.weight" in state,
        scale_attn_inner="blocks.0.attn.norm.weight" in state,
        **FORMAT_FIXED[fmt])
    if "rope.freqs" in state:
        values["rope_type"] = "mixed"  # ROPE-ViT's learned frequencies
    fc1 = state.get("blocks.0.mlp.fc1.weight", state.get("blocks.0.mlp.fc1_g.weight"))
    if fc1 is not None and fc1.dim() == 2:
        values["mlp_ratio"] = _ratio(fc1.shape[0], D)
        fc2 = state.get("blocks.0.mlp.fc2.weight")
        if "blocks.0.mlp.fc1_g.weight" in state:
            values["mlp_layer"] = "swiglu"  # timm's SwiGLU: gate and input in two Linears
        elif fc2 is not None and fc2.dim() == 2 and 2 * fc2.shape[1] == fc1.shape[0]:
            values["mlp_layer"] = "swiglu_packed"  # fc2 takes half: timm's SwiGLUPacked
    if "pre_logits.fc.weight" in state:
        values["representation_size"] = state["pre_logits.fc.weight"].shape[0]
    if hf_config:
        values.update(hf_config)
    return values


def _ratio(hidden: int, width: int) -> float:
    """An mlp_ratio whose int(width * ratio) is `hidden` (timm's rounding), whatever the
    float error of hidden / width (EVA02's 8/3)."""
    ratio = hidden / width
    return ratio if int(width * ratio) == hidden else (hidden + 0.5) / width


# Hugging Face model types whose image model is timm's VisionTransformer (BEiT's relative
# position bias and the rotary ones are not).
HF_MODEL_TYPES = ("vit", "deit", "vit_mae", "dinov2", "dinov2_with_registers",
                  "clip_vision_model", "siglip_vision_model", "clip", "siglip", "dinov3_vit",
                  "siglip2_vision_model", "siglip2")
# Hugging Face's activation names (ACT2FN) that are exactly one of ours.
HF_ACTIVATIONS = {"gelu": "gelu", "gelu_pytorch_tanh": "gelu_tanh", "quick_gelu": "quick_gelu",
                  "silu": "silu"}
# Models whose forward resamples the position table to the input's grid every time (DINOv2):
# their processor's crop is the size they run at.
HF_RESAMPLED = ("dinov2", "dinov2_with_registers", "dinov3_vit", "siglip2_vision_model")


# What config.json says of the architecture, its key -> our field and type: the model is
# built as it says, so weights that contradict it (another width, depth or patch) fail to
# fit, in one line
HF_FIELDS = {"num_attention_heads": ("num_heads", int), "layer_norm_eps": ("norm_eps", float),
             "num_channels": ("in_chans", int), "hidden_size": ("embed_dim", int),
             "num_hidden_layers": ("depth", int), "patch_size": ("patch_size", int),
             "image_size": ("img_size", int), "qkv_bias": ("qkv_bias", bool)}
_HF_KIND = {int: integer(1, whole_floats=True), float: POSITIVE_NUMBER, bool: BOOLEAN}
HF_CONFIG_KINDS = {**{key: _HF_KIND[kind] for key, (_, kind) in HF_FIELDS.items()},
                   "num_register_tokens": integer(0).or_null(),
                   "id2label": object_of(STRING).named("an object mapping class ids to strings")
                   .or_null()}
DINOV3_KINDS = {"use_gated_mlp": BOOLEAN, "rope_theta": POSITIVE_NUMBER}


def hf_architecture(doc: Any) -> tuple[Optional[str], dict[str, Any]]:
    """The model_type of a Hugging Face config.json (a whole CLIP or SigLIP model's is its
    image tower's) and the fields that shape our model, each type-checked."""
    if not isinstance(doc, dict):
        raise CheckpointError("config.json: expected a JSON object")
    model_type = doc.get("model_type")
    if model_type in ("clip", "siglip", "siglip2"):  # the whole model: its image tower's config
        vision = doc.get("vision_config")
        if not isinstance(vision, dict):
            raise CheckpointError(f"config.json: a {model_type} model without a vision_config "
                                  f"object")
        doc = {**vision, "model_type": f"{model_type}_vision_model"}
        model_type = doc["model_type"]
    if model_type is not None and model_type not in HF_MODEL_TYPES:
        raise CheckpointError(f"config.json: model_type {model_type!r} is not supported (one of "
                              f"{', '.join(HF_MODEL_TYPES)})")
    side = doc.get("patch_size")
    if isinstance(side, list) and len(side) == 2 and side[0] == side[1]:
        doc = {**doc, "patch_size": side[0]}  # [16, 16]: a square patch
    check_fields(doc, HF_CONFIG_KINDS, "config.json", CheckpointError)
    values: dict[str, Any] = {ours: kind(doc[key]) for key, (ours, kind) in HF_FIELDS.items()
                              if key in doc}
    act = doc.get("hidden_act", "gelu")
    if not isinstance(act, str) or act not in HF_ACTIVATIONS:
        raise CheckpointError(f"config.json: hidden_act {act!r} is not supported "
                              f"(one of {', '.join(HF_ACTIVATIONS)})")
    values["act_layer"] = HF_ACTIVATIONS[act]
    if doc.get("use_swiglu_ffn"):
        raise CheckpointError(f"config.json: use_swiglu_ffn: {model_type}'s SwiGLU MLP is not "
                              f"supported yet (only the two-layer GELU MLP)")
    if model_type == "siglip2_vision_model":  # NaFlex: its table resampled per image grid
        values.update(pos_embed_interpolation="bilinear", pos_embed_antialias=True)
    if model_type in ("siglip_vision_model", "siglip2_vision_model") \
            and doc.get("vision_use_head") is False:
        raise CheckpointError("config.json: vision_use_head is false: this SigLIP tower has no "
                              "pooled output to export (only its tokens)")
    if doc.get("num_register_tokens") is not None:
        values["reg_tokens"] = doc["num_register_tokens"]
    if model_type == "dinov3_vit":  # DINOv3ViTModel: rotary positions, no table, class token
        check_fields(doc, DINOV3_KINDS, "config.json", CheckpointError)
        values["mlp_layer"] = "swiglu" if doc.get("use_gated_mlp") else "mlp"
        for key in ("proj_bias", "mlp_bias"):
            if doc.get(key) is False:
                raise CheckpointError(f"config.json: {key} false: DINOv3 without that bias is "
                                      f"not supported")
        values.update(rope_type="dinov3", rope_temperature=float(doc.get("rope_theta", 100.0)),
                      rope_rotate_half=True, pos_embed="none", global_pool="token")
    if model_type == "dinov2_with_registers":  # registers take no position: see _hf_layouts
        values["no_embed_class"] = True
        values["pos_embed_antialias"] = True  # its interpolate_pos_encoding antialiases
    return model_type, values


def named_architecture(timm_name: Optional[str] = None,
                       torchvision_weights: Optional[str] = None) -> dict[str, Any]:
    """num_heads and norm_eps of the model a --timm-name or --torchvision-weights names, read
    off the framework's own module built on the meta device (no weights, no download)."""
    if timm_name:
        import timm

        try:
            with torch.device("meta"):
                model = timm.create_model(timm_name.split(".")[0], pretrained=False)
        except Exception as exc:  # timm's errors for unknown or unsupported names
            raise ConfigError(f"timm cannot build {timm_name!r}: {first_line(exc)}") from None
        return timm_architecture(model, timm_name)
    if torchvision_weights:
        import torchvision

        enum = torchvision_weights.split(".")[0]
        try:
            builder = torchvision.models.get_model_builder(enum.lower().removesuffix("_weights"))
            with torch.device("meta"):
                model = builder()
            layer = model.encoder.layers[0]
        except (ValueError, AttributeError, IndexError):
            raise ConfigError(f"torchvision has no ViT for {torchvision_weights!r}") from None
        return {"num_heads": layer.self_attention.num_heads, "norm_eps": layer.ln_1.eps}
    return {}


def named_sizes(timm_name: Optional[str] = None,
                torchvision_weights: Optional[str] = None) -> dict[str, int]:
    """The width (embed_dim) and depth of the model a --timm-name or --torchvision-weights
    names, off the framework's module built on the meta device: what its heads are meant
    for, so weights of another width or depth contradict the name."""
    try:
        if timm_name:
            import timm

            with torch.device("meta"):
                model = timm.create_model(timm_name.split(".")[0], pretrained=False)
            return {"embed_dim": int(model.embed_dim), "depth": len(model.blocks)}
        if torchvision_weights:
            import torchvision

            enum = torchvision_weights.split(".")[0]
            builder = torchvision.models.get_model_builder(enum.lower().removesuffix("_weights"))
            with torch.device("meta"):
                model = builder()
            return {"embed_dim": int(model.hidden_dim), "depth": len(model.encoder.layers)}
    except Exception:  # named_architecture has said what is wrong with the name already
        return {}
    return {}


def _not_identity(module) -> bool:
    return not isinstance(module, torch.nn.Identity)


def _timm_activation(act) -> Optional[str]:
    kind = type(act).__name__
    if kind == "QuickGELU":
        return "quick_gelu"
    if kind == "GELUTanh" or (kind == "GELU" and getattr(act, "approximate", "none") == "tanh"):
        return "gelu_tanh"
    if kind == "SiLU":
        return "silu"
    return "gelu" if kind == "GELU" else None


def timm_architecture(model, name: str) -> dict[str, Any]:
    """The config fields of a timm VisionTransformer (built on the meta device) that its
    weights cannot show or that we must match, read off its modules; one line naming what
    our model lacks when it is built of anything else (BEiT's relative position bias, EVA's
    rotary attention, SwiGLU, RMSNorm, ...)."""
    from timm.layers import GluMlp, LayerScale, Mlp
    from timm.models import vision_transformer as tv

    def refuse(what: str):
        raise ConfigError(f"timm's {name!r} {what}; vit-export builds timm's VisionTransformer "
                          f"with the options its ViT, DeiT, DINOv2, CLIP and SigLIP models use, "
                          f"and its Eva with those of EVA02, ROPE-ViT, PE and DINOv3")

    kind = type(model).__name__
    if kind == "Eva":
        return _eva_architecture(model, refuse)
    if kind not in ("VisionTransformer", "VisionTransformerDistilled"):
        refuse(f"is built by timm's {kind} class, not VisionTransformer or Eva")
    block = model.blocks[0]
    if type(block) is not tv.Block:
        refuse(f"has {type(block).__name__} blocks")
    attn, mlp = block.attn, block.mlp
    if type(attn) is not tv.Attention:
        refuse(f"has {type(attn).__name__} attention")
    if type(mlp) is GluMlp and mlp.gate_last:
        refuse("has a GluMlp MLP that gates with the second half")
    if type(mlp) not in (Mlp, GluMlp):
        refuse(f"has a {type(mlp).__name__} MLP")
    act = _timm_activation(mlp.act)
    _refuse_unbuilt(model, [block.norm1, block.norm2, attn.q_norm, attn.k_norm, model.norm,
                            model.norm_pre, model.fc_norm, model.patch_embed.norm], mlp, refuse, {
        "has no learned position embedding": model.pos_embed is None,
        "normalizes the attention output (scale_attn_norm)": _not_identity(attn.norm),
        "gates the attention output": getattr(attn, "gate", None) is not None,
        "normalizes inside the MLP (scale_mlp_norm)": _not_identity(mlp.norm),
        "has no bias on the projections (proj_bias=False)": attn.proj.bias is None,
        "pools over the prefix tokens too": getattr(model, "pool_include_prefix", False),
        "has a LayerScale not in both branches":
            isinstance(block.ls1, LayerScale) != isinstance(block.ls2, LayerScale),
    })
    return {"num_heads": attn.num_heads, "norm_eps": block.norm1.eps, "act_layer": act,
            "mlp_layer": "swiglu_packed" if type(mlp) is GluMlp else "mlp",
            "qk_norm": _not_identity(attn.q_norm), "pre_norm": _not_identity(model.norm_pre),
            "class_token": model.cls_token is not None, "reg_tokens": model.num_reg_tokens,
            "no_embed_class": model.no_embed_class, "global_pool": model.global_pool,
            "fc_norm": _not_identity(model.fc_norm),
            "final_norm": _not_identity(model.norm) or _not_identity(model.fc_norm),
            "init_values": block.ls1.init_values if isinstance(block.ls1, LayerScale)
            else None}


# Our config fields that timm's VisionTransformer takes under the same name and meaning
TIMM_VIT_FIELDS = ("img_size", "patch_size", "in_chans", "num_classes", "embed_dim", "depth",
                   "num_heads", "mlp_ratio", "qkv_bias", "qk_norm", "init_values",
                   "class_token", "reg_tokens", "no_embed_class", "pre_norm", "final_norm",
                   "global_pool")
# Fields timm's VisionTransformer has no way to build other than at these values
TIMM_VIT_FIXED = {"representation_size": None, "distilled": False, "patch_norm": False,
                  "rope_type": None, "scale_mlp": False, "scale_attn_inner": False,
                  "pool_include_prefix": False, "pos_embed": "learn",
                  "projection_head": False, "normalize": False}


def timm_model(config: ViTConfig, state: dict[str, torch.Tensor]) -> torch.nn.Module:
    """timm's own VisionTransformer built to `config` and holding `state` (our names are
    timm's), in eval mode at the native size: the model users run, timed beside a bundle as
    bench's timm peers. One line (ConfigError) where timm's VisionTransformer does not build
    `config` the same: rotary or EVA's options, a representation layer, another output; the
    model built is read back by `timm_architecture`, so a field mapped wrong is refused, not
    timed."""
    from functools import partial

    from timm.layers import Mlp, SwiGLUPacked
    from timm.models.vision_transformer import VisionTransformer

    def refuse(what: str):
        raise ConfigError(f"timm's VisionTransformer does not build this model: {what}")

    for field, value in TIMM_VIT_FIXED.items():
        if getattr(config, field) != value:
            refuse(f"{field} is {getattr(config, field)!r}")
    if config.output_names != ("logits",):
        refuse(f"it gives {', '.join(config.output_names)}, timm's gives logits")
    if config.mlp_layer not in ("mlp", "swiglu_packed"):
        refuse(f"mlp_layer {config.mlp_layer!r}")
    if config.attn_pool_num_heads not in (None, config.num_heads) or \
            config.attn_pool_mlp_ratio not in (None, config.mlp_ratio):
        refuse("its attention pool has other heads or MLP than its blocks")
    acts = {"gelu": torch.nn.GELU, "gelu_tanh": partial(torch.nn.GELU, approximate="tanh"),
            "silu": torch.nn.SiLU, "quick_gelu": "quick_gelu"}
    kwargs = {field: getattr(config, field) for field in TIMM_VIT_FIELDS}
    model = VisionTransformer(
        **kwargs, fc_norm=config.fc_norm, weight_init="skip", act_layer=acts[config.act_layer],
        norm_layer=partial(torch.nn.LayerNorm, eps=config.norm_eps),
        mlp_layer=SwiGLUPacked if config.mlp_layer == "swiglu_packed" else Mlp)
    built = timm_architecture(model, "peer")
    wrong = [k for k, v in built.items() if getattr(config, k) != v
             and not (k == "fc_norm" and config.fc_norm is None)]
    if wrong:
        refuse(f"{wrong[0]} comes out {built[wrong[0]]!r}, and this model's is "
               f"{getattr(config, wrong[0])!r}")
    try:
        model.load_state_dict(state, strict=True)
    except RuntimeError as exc:
        refuse(f"its weights do not fit: {first_line(exc)}")
    return model.eval()


def _refuse_unbuilt(model, norms: list, mlp, refuse, unsupported: dict[str, bool]) -> None:
    """Refuse, in one line, what either timm class we read (VisionTransformer, Eva) may hold
    and our model does not build: a norm other than LayerNorm, then the class's own
    `unsupported` (what -> found), then what both share: padding, a non-square patch, an
    activation or pool we lack, a patch bias that does not follow pre_norm, an attention
    pool of another shape, another patch embedding."""
    from timm.layers import AttentionPoolLatent, PatchEmbed

    odd = [type(n).__name__ for n in norms if _not_identity(n)
           and not isinstance(n, torch.nn.LayerNorm)]
    if odd:
        refuse(f"normalizes with {odd[0]}")
    act = _timm_activation(mlp.act)
    pool = model.attn_pool
    unsupported = {
        **unsupported,
        f"uses the {type(mlp.act).__name__} activation": act is None,
        f"pools with {model.global_pool!r}": model.global_pool not in POOLS,
        "pads images to the patch (dynamic_img_pad)": getattr(model.patch_embed,
                                                               "dynamic_img_pad", False),
        "has a non-square patch": len(set(model.patch_embed.patch_size)) != 1,
        "has a patch projection whose bias does not follow pre_norm":
            (model.patch_embed.proj.bias is None) != _not_identity(model.norm_pre),
        "has an attention pool of another shape": pool is not None and not (
            type(pool) is AttentionPoolLatent and pool.latent_len == 1
            and pool.pos_embed is None and pool.mlp is not None and pool.pool == "token"
            and not _not_identity(pool.q_norm) and _not_identity(pool.q)
            and _timm_activation(pool.mlp.act) == act),
    }
    for what, found in unsupported.items():
        if found:
            refuse(what)
    if not isinstance(model.patch_embed, PatchEmbed):
        refuse(f"embeds patches with {type(model.patch_embed).__name__}")


def _rope_fields(rope, refuse) -> dict[str, Any]:
    """The rope_* fields of a timm rotary module, or one line on what we do not build."""
    from timm.layers import pos_embed_sincos as ps

    kind = type(rope).__name__
    if getattr(rope, "aug_active", False):
        refuse("augments its rotary coordinates at inference")  # only in training, but said
    if isinstance(rope, ps.RotaryEmbeddingCat):
        if rope.in_pixels or rope.grid_type != "index":
            refuse("has pixel-frequency rotary embeddings")
        ref = rope.ref_feat_shape
        if ref is not None and len(set(ref)) != 1:
            refuse(f"rescales rotary positions to a non-square grid {tuple(ref)}")
        return {"rope_type": "cat", "rope_temperature": float(rope.temperature),
                "rope_grid_offset": float(rope.grid_offset),
                "rope_grid_indexing": rope.grid_indexing, "rope_rotate_half": rope.rotate_half,
                "ref_feat_shape": None if ref is None else int(ref[0])}
    if isinstance(rope, ps.RotaryEmbeddingDinoV3):
        if rope.normalize_coords != "separate" or rope.min_period is not None:
            refuse("normalises its rotary coordinates otherwise than DINOv3's released models")
        return {"rope_type": "dinov3", "rope_temperature": float(rope.temperature),
                "rope_grid_offset": float(rope.grid_offset),
                "rope_grid_indexing": rope.grid_indexing, "rope_rotate_half": rope.rotate_half}
    if isinstance(rope, ps.RotaryEmbeddingMixed):
        return {"rope_type": "mixed", "rope_temperature": float(rope.temperature),
                "rope_grid_indexing": rope.grid_indexing, "rope_rotate_half": False}
    refuse(f"has {kind} rotary embeddings")


def _eva_architecture(model, refuse) -> dict[str, Any]:
    """timm's Eva (EVA02, ROPE-ViT, Perception Encoder, DINOv3) as config fields, read off its
    modules; one line naming what our model lacks (post-norm blocks, gated or grouped-query
    attention, attention-only LayerScale, ...)."""
    from timm.layers import AttentionRope, GluMlp, Mlp, SwiGLU
    from timm.models import eva

    block = model.blocks[0]
    if type(block) is not eva.EvaBlock:
        refuse(f"has {type(block).__name__} blocks (post-norm)")
    attn, mlp = block.attn, block.mlp
    if type(attn) not in (eva.EvaAttention, AttentionRope):
        refuse(f"has {type(attn).__name__} attention")
    D = model.embed_dim
    if attn.qkv is None and getattr(attn, "num_kv_groups", 1) != 1:
        refuse("has grouped-query attention (num_kv_heads)")
    if attn.head_dim * attn.num_heads != D:
        refuse(f"has attention heads of width {attn.head_dim}, not embed_dim / num_heads")
    if type(mlp) is SwiGLU:
        layer = "swiglu"
    elif type(mlp) is GluMlp and not mlp.gate_last:
        layer = "swiglu_packed"
    elif type(mlp) is Mlp:
        layer = "mlp"
    else:
        refuse(f"has a {type(mlp).__name__} MLP")
    act = _timm_activation(mlp.act)
    _refuse_unbuilt(model, [block.norm1, block.norm2, attn.q_norm, attn.k_norm, attn.norm,
                            mlp.norm, model.norm, model.norm_pre, model.fc_norm], mlp, refuse, {
        "gates the attention output": getattr(attn, "gate", None) is not None,
        "has grouped-query attention (num_kv_heads)": getattr(attn, "num_kv_groups", 1) != 1,
        "has no bias on the attention projection": attn.proj.bias is None,
        "has a LayerScale on the attention branch only": (block.gamma_1 is None)
        != (block.gamma_2 is None),
        "has a non-square image size": len(set(model.patch_embed.img_size)) != 1,
        "drops patches (patch_drop_rate)": model.patch_drop is not None,
    })
    pool = model.attn_pool
    values = {"num_heads": attn.num_heads, "norm_eps": block.norm1.eps, "act_layer": act,
              "mlp_layer": layer, "qk_norm": _not_identity(attn.q_norm),
              "pre_norm": _not_identity(model.norm_pre),
              "class_token": model.cls_token is not None,
              "reg_tokens": 0 if model.reg_token is None else model.reg_token.shape[1],
              "no_embed_class": model.no_embed_class, "global_pool": model.global_pool,
              "fc_norm": _not_identity(model.fc_norm),
              "final_norm": _not_identity(model.norm) or _not_identity(model.fc_norm),
              "init_values": block.init_values if block.gamma_1 is not None else None,
              "pos_embed": "learn" if model.pos_embed is not None else "none",
              "scale_mlp": _not_identity(mlp.norm), "scale_attn_inner": _not_identity(attn.norm),
              "rope_type": None}
    if pool is not None:  # Eva's attention pool takes every token, the prefix too
        values["pool_include_prefix"] = True
        values["attn_pool_num_heads"] = pool.num_heads
        values["attn_pool_mlp_ratio"] = _ratio(pool.mlp.fc1.out_features, D)
    if model.rope is not None:
        values.update(_rope_fields(model.rope, refuse))
    if model.pos_embed is None:  # rotary only: the size it is built for, not in the weights
        values["img_size"] = model.patch_embed.img_size[0]
    return values


def _unknown_architecture(path, fmt: str, values: dict[str, Any]) -> str:
    missing = [f for f in NOT_IN_WEIGHTS if f not in values]
    D = values["embed_dim"]
    hints = {"num_heads": HEADS_BY_WIDTH.get(D, max(D // 64, 1)), "norm_eps": 1e-12}
    sets = " ".join(f"--set {f}={hints[f]}" for f in missing)
    where = (f"{path} has no config.json" if fmt == "hf" else
             f"the weights of {path} do not show it")
    return (f"{' and '.join(missing)} unknown: {where}; pass {sets} (the usual value for "
            f"width {D}), or name the model with --preset, --timm-name or --torchvision-weights")


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


def import_files(path: str | os.PathLike) -> dict[str, str]:
    """The files an import of `path` reads (a checkpoint file, or a Hugging Face folder's
    config.json and weights) -> sha256, as the import record keeps them."""
    path = Path(path)
    if path.is_dir():
        names = [n for n in ("config.json", "model.safetensors", "pytorch_model.bin")
                 if (path / n).is_file()]
        names = names[:2] if "model.safetensors" in names else names
        return {n: B.sha256_file(path / n) for n in names}
    return {path.name: B.sha256_file(path)} if path.is_file() else {}


def _labels(extras: dict[str, Any], num_classes: int) -> Optional[list[str]]:
    id2label = (extras.get("config.json") or {}).get("id2label")
    if not id2label or len(id2label) != num_classes:
        return None
    return [str(id2label.get(str(i), id2label.get(i, i))) for i in range(num_classes)]


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


def load_checkpoint(path: str | os.PathLike, fmt: Optional[str] = None,
                    preset: Optional[str] = None, overrides: Optional[dict[str, Any]] = None,
                    timm_name: Optional[str] = None, torchvision_weights: Optional[str] = None,
                    ) -> tuple[VisionTransformer, B.Description]:
    """Our model with the checkpoint's weights, and the description of where they came from.

    `overrides` are --set values: model config fields and `preprocessing.FIELD` ones.
    """
    raw, extras = read_state_dict(path)
    overrides, prep_overrides = split_overrides(overrides or {})
    fmt = detect_format(raw, fmt)
    hf_type, hf_config = hf_architecture(extras["config.json"]) \
        if fmt == "hf" and "config.json" in extras else (None, None)  # unsupported: said first
    state = convert(raw, fmt, zero_key_bias=fmt == "timm" or hf_type == "dinov3_vit",
                    channels=(hf_config or {}).get("in_chans"))
    notes: list[str] = []
    arch = extras.get("arch")
    if fmt == "timm" and not (timm_name or torchvision_weights or preset) and arch \
            and timm_knows(arch):
        timm_name = arch
        notes.append(f"architecture {arch!r} from the checkpoint's arch key (timm's train.py)")
    named = named_architecture(timm_name, torchvision_weights)  # an unsupported one: say so first
    if fmt == "timm":
        _check_eva_named(raw, {**named, **overrides})
    inferred = infer_config(state, fmt, hf_config, {**(hf_config or {}), **named, **overrides})
    sizes = named_sizes(timm_name, torchvision_weights)
    named_as = timm_name or torchvision_weights
    wrong = [f"{field} {inferred[field]} in the weights, {value} in {named_as}"
             for field, value in sizes.items()
             if field in inferred and field not in overrides and inferred[field] != value]
    if wrong and "num_heads" not in overrides:  # --set num_heads says what the name cannot
        raise CheckpointError(f"{path} does not fit the model it is named as "
                              f"({'; '.join(wrong)}): its heads and norms would be guessed "
                              f"from another model; name the right one, or --set num_heads=N")
    chosen = preset_config(preset).to_dict() if preset else {}  # the whole preset, defaults too
    values = {**inferred, **named, **chosen, **overrides}
    if fmt == "hf" and "visual_projection.weight" in raw and "projection_head" not in overrides:
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
    if any(f not in values for f in NOT_IN_WEIGHTS):  # a guess never reaches a bundle
        raise CheckpointError(_unknown_architecture(path, fmt, values))
    config = ViTConfig.from_dict(values)
    config, notes_pos = _place_table(config, state, fmt)
    notes += notes_pos
    model = VisionTransformer(config)
    problem = fit_report(model, state)
    if problem:
        raise CheckpointError(problem)
    model.load_state_dict(state, strict=True)
    preprocessing, prep_notes = resolve_preprocessing(
        config, fmt, extras, timm_name, torchvision_weights, preset, prep_overrides)
    notes += prep_notes
    description = B.Description(
        config, preprocessing, labels=_labels(extras, config.num_classes) if hf_config is not None else None,
        name=Path(path).stem,
        # the checkpoint's absolute path: validate finds the source files from anywhere
        extra={"import": {"checkpoint": os.path.abspath(path), "format": fmt, "notes": notes,
                          **({"timm_name": timm_name} if timm_name else {}),
                          **({"torchvision_weights": torchvision_weights}
                             if torchvision_weights else {}),
                          "files": import_files(path)}})
    return model.eval(), description


def load_model(source: Optional[str | os.PathLike] = None, preset: Optional[str] = None,
               checkpoint: Optional[str | os.PathLike] = None, fmt: Optional[str] = None,
               overrides: Optional[dict[str, str]] = None, seed: int = 0,
               timm_name: Optional[str] = None, torchvision_weights: Optional[str] = None
               ) -> tuple[VisionTransformer, B.Description]:
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
                               timm_name=timm_name, torchvision_weights=torchvision_weights)
    model_overrides, prep_overrides = split_overrides(overrides)
    torch.manual_seed(seed)
    model = create_model(preset, **model_overrides)
    prep, _ = resolve_preprocessing(model.config, timm_name=timm_name,
                                    torchvision_weights=torchvision_weights, preset=preset,
                                    overrides=prep_overrides)
    return model.eval(), B.Description(model.config, prep, name=preset,
                                       extra={"weights": f"random init, seed {seed}"})
