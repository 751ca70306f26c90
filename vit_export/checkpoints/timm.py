"""timm checkpoints (VisionTransformer and Eva: ViT, DeiT, DINOv2, CLIP, SigLIP, EVA02,
ROPE-ViT, PE, DINOv3): their names and tensors' layouts, the config fields a timm model built
on the meta device shows (`timm_architecture`), and timm's own model for bench's peers."""
from __future__ import annotations

import re
from typing import Any, Optional

import torch

from ..config import POOLS, ViTConfig
from ..errors import CheckpointError, ConfigError, first_line, param
from .family import Family, mlp_ratio_of, set_option

RENAMES: list[tuple[str, str]] = [
    (r"^blocks\.(\d+)\.gamma_([12])$", r"blocks.\1.ls\2.gamma"),  # Eva's LayerScale
    # Eva's unfused attention (EVA02 B/L): fused into qkv below
    (r"^blocks\.(\d+)\.attn\.([qkv])_proj\.", r"blocks.\1.attn.\2."),
]


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
                              f"{param('timm_name')} or pass "
                              f"{set_option('rope_type', 'none|cat|dinov3|mixed')}")
    if "rope.freqs" in raw and "rope_grid_indexing" not in known:
        raise CheckpointError(f"ROPE-ViT mixed weights (rope.freqs): the grid's axis order is "
                              f"not in them; name the model with {param('timm_name')} or "
                              f"pass {set_option('rope_grid_indexing', 'xy|ij')}")


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
    if type(model.patch_embed).__name__ != "PatchEmbed":  # a hybrid's CNN stem
        refuse(f"embeds its patches with a {type(model.patch_embed).__name__}")
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
    return {"patch_size": model.patch_embed.patch_size[0],
            "num_heads": attn.num_heads, "norm_eps": block.norm1.eps, "act_layer": act,
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
    values = {"patch_size": model.patch_embed.patch_size[0],
              "num_heads": attn.num_heads, "norm_eps": block.norm1.eps, "act_layer": act,
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
        values["attn_pool_mlp_ratio"] = mlp_ratio_of(pool.mlp.fc1.out_features, D)
    if model.rope is not None:
        values.update(_rope_fields(model.rope, refuse))
    if model.pos_embed is None:  # rotary only: the size it is built for, not in the weights
        values["img_size"] = model.patch_embed.img_size[0]
    return values



def timm_named(timm_name: str) -> dict[str, Any]:
    """The config fields of the model a --timm-name names, read off timm's module built on
    the meta device (no weights, no download)."""
    import timm

    try:
        with torch.device("meta"):
            model = timm.create_model(timm_name.split(".")[0], pretrained=False)
    except Exception as exc:  # timm's errors for unknown or unsupported names
        raise ConfigError(f"timm cannot build {timm_name!r}: {first_line(exc)}") from None
    return timm_architecture(model, timm_name)


def timm_sizes(timm_name: str) -> dict[str, int]:
    """The width and depth of the model a --timm-name names (meta device)."""
    import timm

    with torch.device("meta"):
        model = timm.create_model(timm_name.split(".")[0], pretrained=False)
    return {"embed_dim": int(model.embed_dim), "depth": len(model.blocks)}


def _recognise(keys) -> bool:
    return "patch_embed.proj.weight" in keys and any(k.startswith("blocks.0.") for k in keys)


def _layouts(out: dict[str, torch.Tensor], raw: dict[str, torch.Tensor],
             channels: Optional[int]) -> None:
    _eva_layouts(out)


FAMILY = Family("timm", RENAMES, _recognise, fixed={"norm_eps": 1e-6}, layouts=_layouts,
                check_named=_check_eva_named)
