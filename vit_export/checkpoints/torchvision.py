"""torchvision checkpoints (torchvision.models.vit_*): their names, and the heads, norms and
sizes of the model a --torchvision-weights enum names."""
from __future__ import annotations

from typing import Any

import torch

from ..errors import ConfigError
from .family import Family

RENAMES: list[tuple[str, str]] = [
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
]


def _builder(torchvision_weights: str):
    import torchvision

    enum = torchvision_weights.split(".")[0]
    return torchvision.models.get_model_builder(enum.lower().removesuffix("_weights"))


def torchvision_architecture(torchvision_weights: str) -> dict[str, Any]:
    """num_heads and norm_eps of the ViT a --torchvision-weights enum names, off torchvision's
    module built on the meta device (no weights, no download)."""
    try:
        builder = _builder(torchvision_weights)
        with torch.device("meta"):
            model = builder()
        layer = model.encoder.layers[0]
    except (ValueError, AttributeError, IndexError):
        raise ConfigError(f"torchvision has no ViT for {torchvision_weights!r}") from None
    return {"num_heads": layer.self_attention.num_heads, "norm_eps": layer.ln_1.eps}


def torchvision_sizes(torchvision_weights: str) -> dict[str, int]:
    """The width and depth of the ViT a --torchvision-weights enum names (meta device)."""
    with torch.device("meta"):
        model = _builder(torchvision_weights)()
    return {"embed_dim": int(model.hidden_dim), "depth": len(model.encoder.layers)}


def _recognise(keys) -> bool:
    return "conv_proj.weight" in keys or "encoder.pos_embedding" in keys


FAMILY = Family("torchvision", RENAMES, _recognise, fixed={"norm_eps": 1e-6})
