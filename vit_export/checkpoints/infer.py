"""A model's config read off a checkpoint: the (renamed) weights' names and shapes, what the
family's framework fixes, and its config file; what none of them shows is asked for."""
from __future__ import annotations

import math
import re
from typing import Any, Optional

import torch

from ..config import ViTConfig
from ..errors import CheckpointError, param
from .family import mlp_ratio_of, set_option
from .formats import FAMILIES

# Standard head counts of the ViT family by width; anything else needs --set num_heads.
HEADS_BY_WIDTH = {192: 3, 384: 6, 768: 12, 1024: 16, 1280: 16}
# What the weights cannot show: it must come from a config file, a named model or --set.
NOT_IN_WEIGHTS = ("num_heads", "norm_eps")


def _tensor(state: dict[str, torch.Tensor], key: str, rank: int) -> torch.Tensor:
    if key not in state:
        raise CheckpointError(f"checkpoint has no {key}; is it a ViT?")
    value = state[key]
    if value.dim() != rank or 0 in value.shape:
        raise CheckpointError(f"checkpoint's {key} has shape {list(value.shape)}; a ViT's has "
                              f"{rank} non-empty dims")
    return value


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
                              f"({param('timm_name')}) or pass "
                              f"{set_option('no_embed_class', 'true|false')}")
    return fits[0]


def _positions(state: dict[str, torch.Tensor], known: dict[str, Any], patch: int,
               prefix: int) -> tuple[int, bool, bool]:
    """The patch grid side, whether the position table leaves out the prefix tokens, and
    whether there is a learned table at all (rotary-only models have none: their size is the
    named model's or --set's)."""
    said = known.get("no_embed_class")  # a --set string or a named model's bool
    if said is not None:
        said = ViTConfig.from_dict({"no_embed_class": said}).no_embed_class
    if "pos_embed" not in state and ("rope.freqs" in state or known.get("rope_type")):
        if "img_size" not in known:
            raise CheckpointError(
                f"checkpoint has no pos_embed (rotary positions only): its image size is not "
                f"in the weights; name the model with {param('timm_name')} or pass "
                f"{set_option('img_size', 'N')}")
        side = ViTConfig.from_dict({"img_size": known["img_size"], "patch_size": patch}).img_size
        return side // patch, bool(said), False
    grid, no_embed_class = _grid(_tensor(state, "pos_embed", 3), prefix, said)  # [1, T, D]
    return grid, no_embed_class, True


def _pool(state: dict[str, torch.Tensor], class_token: bool, width: int) -> str:
    pool = "map" if "attn_pool.latent" in state else "token" if class_token else "avg"
    head = state.get("head.weight")
    if pool == "token" and head is not None and head.dim() == 2 \
            and head.shape[1] == 2 * width and "pre_logits.fc.weight" not in state:
        pool = "token_avg"  # DINOv2's linear head: the class token and the patch mean
    return pool


def _mlp(state: dict[str, torch.Tensor], width: int) -> dict[str, Any]:
    """mlp_ratio and mlp_layer, off the first block's MLP."""
    fc1 = state.get("blocks.0.mlp.fc1.weight", state.get("blocks.0.mlp.fc1_g.weight"))
    if fc1 is None or fc1.dim() != 2:
        return {}
    values: dict[str, Any] = {"mlp_ratio": mlp_ratio_of(fc1.shape[0], width)}
    fc2 = state.get("blocks.0.mlp.fc2.weight")
    if "blocks.0.mlp.fc1_g.weight" in state:
        values["mlp_layer"] = "swiglu"  # timm's SwiGLU: gate and input in two Linears
    elif fc2 is not None and fc2.dim() == 2 and 2 * fc2.shape[1] == fc1.shape[0]:
        values["mlp_layer"] = "swiglu_packed"  # fc2 takes half: timm's SwiGLUPacked
    return values


def _check_patch(proj: torch.Tensor, known: dict[str, Any]) -> None:
    """The patch size the model is named or set with is the weights': timm's model of
    another patch size, built from the name, is another model (its checkpoint filter
    resamples the patch projection to fit), and would be refused as an export that does not
    match it rather than as the wrong name."""
    said = known.get("patch_size")
    try:
        said = None if said is None else int(said)
    except (TypeError, ValueError):  # not a size: the config's own check names it
        return
    patch = proj.shape[-1]
    if said is not None and said != patch:
        raise CheckpointError(f"the checkpoint's patch size is {patch} (patch_embed.proj."
                              f"weight {list(proj.shape)}), and the model it is named as has "
                              f"patch size {said}: name a model of patch size {patch}, or "
                              f"{set_option('patch_size', patch)}")


def infer_config(state: dict[str, torch.Tensor], fmt: str, hf_config: Optional[dict] = None,
                 known: Optional[dict[str, Any]] = None) -> dict[str, Any]:
    """Config fields read off the (renamed) weights' names and shapes, what the format fixes,
    and a Hugging Face config.json. Fields none of these show (NOT_IN_WEIGHTS, and the
    activation) are left out. `known`: what a named model or --set says, where the weights
    alone are ambiguous; a patch size it says that the weights contradict is refused."""
    proj = _tensor(state, "patch_embed.proj.weight", 4)  # [D, C, P, P]
    D, patch = proj.shape[0], proj.shape[-1]
    _check_patch(proj, known or {})
    blocks = {int(m.group(1)) for k in state if (m := re.match(r"blocks\.(\d+)\.", k))}
    distilled = "dist_token" in state
    class_token = "cls_token" in state
    reg_tokens = _tensor(state, "reg_token", 3).shape[1] if "reg_token" in state else 0
    prefix = int(class_token) + int(distilled) + reg_tokens
    grid, no_embed_class, learned = _positions(state, known or {}, patch, prefix)
    fc_norm = "fc_norm.weight" in state
    values: dict[str, Any] = dict(
        img_size=grid * patch, patch_size=patch, in_chans=proj.shape[1], embed_dim=D,
        depth=max(blocks) + 1 if blocks else 0, distilled=distilled,
        qkv_bias="blocks.0.attn.qkv.bias" in state,
        patch_norm="patch_embed.norm.weight" in state,
        num_classes=state["head.weight"].shape[0] if "head.weight" in state else 0,
        class_token=class_token, reg_tokens=reg_tokens, no_embed_class=no_embed_class,
        global_pool=_pool(state, class_token, D), fc_norm=fc_norm,
        final_norm=fc_norm or "norm.weight" in state,
        pre_norm="norm_pre.weight" in state, qk_norm="blocks.0.attn.q_norm.weight" in state,
        # LayerScale's gammas are in the weights; its starting value (timm's default here)
        # only matters for training
        init_values=1e-5 if "blocks.0.ls1.gamma" in state else None,
        pos_embed="learn" if learned else "none",
        scale_mlp="blocks.0.mlp.norm.weight" in state,
        scale_attn_inner="blocks.0.attn.norm.weight" in state,
        **FAMILIES[fmt].fixed, **_mlp(state, D))
    if "rope.freqs" in state:
        values["rope_type"] = "mixed"  # ROPE-ViT's learned frequencies
    if "pre_logits.fc.weight" in state:
        values["representation_size"] = state["pre_logits.fc.weight"].shape[0]
    if hf_config:
        values.update(hf_config)
    return values


def unknown_architecture(path, fmt: str, values: dict[str, Any]) -> str:
    """One line on the fields the weights do not show and nothing named, with the usual
    values to set."""
    missing = [f for f in NOT_IN_WEIGHTS if f not in values]
    D = values["embed_dim"]
    hints = {"num_heads": HEADS_BY_WIDTH.get(D, max(D // 64, 1)), "norm_eps": 1e-12}
    sets = param("overrides", {f: hints[f] for f in missing})
    where = (f"{path} has no config.json" if fmt == "hf" else
             f"the weights of {path} do not show it")
    return (f"{' and '.join(missing)} unknown: {where}; pass {sets} (the usual value for "
            f"width {D}), or name the model with {param('preset')}, {param('timm_name')} or "
            f"{param('torchvision_weights')}")
