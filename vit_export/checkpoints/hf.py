"""Hugging Face checkpoints (transformers' ViT, DeiT, DINOv2, DINOv3, CLIP, SigLIP, SigLIP2):
their names, their tensors' layouts, and what their config.json says of the architecture.
Loads no torch until tensors are laid out: the Hub's checks read config.json through it."""
from __future__ import annotations

import math
import re
from typing import TYPE_CHECKING, Any, Optional

from ..errors import CheckpointError
from ..schema import BOOLEAN, POSITIVE_NUMBER, STRING, check_fields, integer, object_of
from .family import Family

if TYPE_CHECKING:
    import torch

_L = r"(?:encoder\.layers?|layers?|model\.layer)\.(\d+)\."  # transformers 4.x | 5.x | DINOv3
_ATTN = r"(?:attention|self_attn)\."  # ViT, DeiT, DINOv2 | CLIP, SigLIP
# The base model's attribute in Hugging Face's task models (ViTForImageClassification.vit,
# CLIPVisionModelWithProjection.vision_model, ...): its weights are the backbone's.
HF_BASES = ("vit", "deit", "dinov2", "dinov2_with_registers", "vision_model", "beit")
RENAMES: list[tuple[str, str]] = [
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
]
HF_PATCH_EMBED = (rf"(?:(?:{'|'.join(HF_BASES)})\.)?embeddings\."
                  rf"(?:patch_embeddings\.projection|patch_embeddings|patch_embedding)\.weight")
# Hugging Face weights that only training or masked inputs use, and a whole CLIP or SigLIP
# model's text tower: the image tower is what is exported.
HF_UNUSED = re.compile(r"embeddings\.(?:mask_token|position_ids)|text_model\..*"
                       r"|text_projection\..*|logit_scale|logit_bias")



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
        import torch

        out["head.bias"] = torch.zeros(out["head.weight"].shape[0], dtype=out["head.weight"].dtype)
    if "reg_token" in out and "cls_token" in out and out.get("pos_embed") is not None \
            and out["pos_embed"].dim() == 3:
        pos = out["pos_embed"]
        out["cls_token"] = out["cls_token"] + pos[:, :1]
        out["pos_embed"] = pos[:, 1:]



# Hugging Face model types whose image model is timm's VisionTransformer (BEiT's relative
# position bias and the rotary ones are not).
HF_MODEL_TYPES = ("vit", "deit", "vit_mae", "dinov2", "dinov2_with_registers",
                  "clip_vision_model", "siglip_vision_model", "clip", "siglip", "dinov3_vit",
                  "siglip2_vision_model", "siglip2")
# Hugging Face's activation names (ACT2FN) that are exactly one of ours.
HF_ACTIVATIONS = {"gelu": "gelu", "gelu_pytorch_tanh": "gelu_tanh", "quick_gelu": "quick_gelu",
                  "silu": "silu", "gelu_new": "gelu_tanh"}  # gelu_new: the same tanh GELU
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


def _refuse_unhonoured(doc: dict, model_type: Optional[str], values: dict) -> None:
    """A config.json option that changes the model, which the rebuild would not honour,
    refused by name before export (a ViT pooler with a ReLU, say: "export does not match
    eager" said it after the export)."""
    act = doc.get("pooler_act", "tanh")
    if act != "tanh":
        raise CheckpointError(f"config.json: pooler_act {act!r} is not supported (the pooler "
                              f"is rebuilt with tanh, as transformers' default)")
    width = doc.get("pooler_output_size")
    if width is not None and width != values.get("embed_dim", width):
        raise CheckpointError(f"config.json: pooler_output_size {width!r} is not supported "
                              f"(the pooler is rebuilt at the hidden size "
                              f"{values.get('embed_dim')})")


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
    _refuse_unhonoured(doc, model_type, values)
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



def hf_labels(extras: dict[str, Any], num_classes: int) -> Optional[list[str]]:
    id2label = (extras.get("config.json") or {}).get("id2label")
    if not id2label or len(id2label) != num_classes:
        return None
    return [str(id2label.get(str(i), id2label.get(i, i))) for i in range(num_classes)]



def _recognise(keys) -> bool:
    return any(re.fullmatch(HF_PATCH_EMBED, k) for k in keys)


def _layouts(out: dict[str, torch.Tensor], raw: dict[str, torch.Tensor],
             channels: Optional[int]) -> None:
    _hf_layouts(out, projection="visual_projection.weight" in raw, channels=channels)


def _config_of(extras: dict[str, Any]) -> tuple[Optional[str], Optional[dict[str, Any]]]:
    if "config.json" not in extras:
        return None, None
    return hf_architecture(extras["config.json"])


# Hugging Face's interpolate_pos_encoding does not antialias (DINOv2 with registers does:
# hf_architecture says so).
FAMILY = Family("hf", RENAMES, _recognise, fixed={"pos_embed_antialias": False},
                unused=HF_UNUSED, layouts=_layouts, config_of=_config_of)
