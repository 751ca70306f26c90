"""The ViT families people ship today, built tiny (width 96, two blocks, a 3x3 patch grid) by
their own frameworks with every weight random at order 1, and how to read each one's output.
Shared by tests/test_families.py and scripts/families_table.py (the table in docs/guides/families.md).

Every weight is perturbed: timm starts LayerScale at 1e-5 (each block almost the identity)
and the tokens at 1e-6, so a comparison on fresh weights could not see a wrong block.
"""
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

EMBED = 96  # divides by every family's head count (4, 6, 12, 16, 24)

# timm name -> what sets it apart from the 2020 ViT (for the reader; the tests read timm).
TIMM_FAMILIES = {
    "vit_small_patch16_224.augreg_in21k_ft_in1k": "ViT (augreg)",
    "vit_base_patch16_224.mae": "MAE encoder: the 2020 ViT, released headless",
    "deit_small_distilled_patch16_224": "DeiT distilled: a second token and head",
    "deit3_small_patch16_224": "DeiT III: LayerScale, no_embed_class",
    "vit_small_patch14_dinov2": "DINOv2: LayerScale, patch 14, trained at 518",
    "vit_small_patch14_reg4_dinov2": "DINOv2 with registers: 4 registers, no_embed_class",
    "vit_giant_patch14_dinov2": "DINOv2 ViT-g: SwiGLU packed in one fc1, SiLU, 24 heads",
    "vit_base_patch16_clip_224": "OpenCLIP: pre_norm, unbiased patch projection, eps 1e-5",
    "vit_base_patch16_clip_quickgelu_224": "OpenAI CLIP: quick GELU",
    "vit_base_patch16_siglip_224": "SigLIP: no class token, MAP attention pool",
    "vit_base_patch16_siglip_gap_224": "SigLIP GAP: average pool, no fc_norm",
    "vit_medium_patch16_reg4_gap_256": "timm GAP with registers: fc_norm after the pool",
    "vit_base_patch16_gap_224": "timm GAP: no class token",
    # timm's Eva: rotary position embeddings
    "eva02_tiny_patch14_224": "EVA02: rotary rescaled to a 16x16 grid, packed SwiGLU, q/v bias",
    "eva02_base_patch14_224": "EVA02 B: q, k, v in three Linears, SwiGLU with sub-LN",
    "eva02_base_patch16_clip_224": "EVA-CLIP: a LayerNorm on the attention output",
    "vit_small_patch16_dinov3": "DINOv3: centred rotary, halves, 4 registers, no table",
    "vit_small_plus_patch16_dinov3": "DINOv3 S+: SwiGLU in two Linears, aligned to 8",
    "vit_small_patch16_rope_224": "ROPE-ViT axial: rotary alone, temperature 100, xy",
    "vit_small_patch16_rope_mixed_224": "ROPE-ViT mixed: learned frequencies per block and head",
    "vit_small_patch16_rope_ape_224": "ROPE-ViT axial with a learned table too",
    "vit_pe_core_tiny_patch16_384": "Perception Encoder: rotary + table, pre-norm, 8-head pool",
    "vit_base_patch16_rope_reg1_gap_256": "timm ROPE with a register and GAP, no class token",
}


def perturb(model: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
    """Every weight random at order 1: vectors (norms, LayerScale gammas, biases) around 1,
    matrices and tokens at 0.1."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            noise = torch.randn(p.shape, generator=g)
            p.copy_(1.0 + 0.3 * noise if p.ndim == 1 else 0.1 * noise)
    return model.eval()


def shrink(model: torch.nn.Module, factor: float = 0.2) -> torch.nn.Module:
    """Every matrix scaled by `factor`: order-1 weights through twelve blocks at a
    pretrained size overflow, and a finite answer is what a parity test compares."""
    with torch.no_grad():
        for p in model.parameters():
            if p.ndim > 1:
                p.mul_(factor)
    return model


def size_of(peer) -> dict[str, str]:
    """--set values for a tiny timm model named by its released model's name: its heads (a
    name whose width or depth the weights contradict vouches for none), and img_size where
    the weights do not show its size (rotary, no learned table)."""
    heads = {"num_heads": str(peer.blocks[0].attn.num_heads)}  # the name's are another width's
    if getattr(peer, "pos_embed", True) is not None:
        return heads
    return {**heads, "img_size": str(peer.patch_embed.img_size[0])}


def timm_checkpoint(folder: Path, name: str, **overrides) -> tuple[Path, list[str]]:
    """A tiny timm `name` saved as a .pth in `folder`, and the --set flags that say its
    sizes (with `overrides`): what `export --checkpoint PATH --timm-name NAME` is given."""
    peer = tiny_timm(name)
    path = folder / "weights.pth"
    torch.save(peer.state_dict(), path)
    return path, [a for k, v in {**size_of(peer), **overrides}.items()
                  for a in ("--set", f"{k}={v}")]


def tiny_timm(name: str, num_classes: int = 7, seed: int = 0, dynamic: bool = False):
    """The timm family at width 96, two blocks and a 3x3 patch grid; the same weights with
    `dynamic` (timm's dynamic_img_size)."""
    import timm

    arch = name.split(".")[0]
    patch = 14 if "patch14" in arch else 16
    model = timm.create_model(arch, pretrained=False, depth=2, embed_dim=EMBED,
                              img_size=3 * patch, num_classes=num_classes,
                              dynamic_img_size=dynamic)
    return perturb(model, seed)


# transformers class -> (its config class, extra config values, what the docs call it, the
# output we reproduce). The output is what users take from the model: the pooled embedding
# (pooler_output, CLIP's projected image_embeds) or the logits.
HF_FAMILIES: dict[str, tuple[str, dict, str, Callable]] = {
    "ViTForImageClassification": ("ViTConfig", {"num_labels": 7}, "ViT",
                                  lambda out: out.logits),
    "ViTModel": ("ViTConfig", {}, "ViT, headless", lambda out: out.pooler_output),
    "DeiTModel": ("DeiTConfig", {}, "DeiT, headless (its pooler)",
                  lambda out: out.pooler_output),
    "DeiTForImageClassificationWithTeacher": ("DeiTConfig", {"num_labels": 7},
                                              "DeiT with its teacher's head",
                                              lambda out: out.logits),
    "Dinov2Model": ("Dinov2Config", {"mlp_ratio": 2}, "DINOv2", lambda out: out.pooler_output),
    "Dinov2ForImageClassification": ("Dinov2Config", {"mlp_ratio": 2, "num_labels": 7},
                                     "DINOv2 with its linear head (class token and mean)",
                                     lambda out: out.logits),
    "Dinov2WithRegistersForImageClassification": (
        "Dinov2WithRegistersConfig", {"mlp_ratio": 2, "num_register_tokens": 4, "num_labels": 7},
        "DINOv2 with registers and its linear head", lambda out: out.logits),
    "Dinov2WithRegistersModel": ("Dinov2WithRegistersConfig",
                                 {"mlp_ratio": 2, "num_register_tokens": 4},
                                 "DINOv2 with registers", lambda out: out.pooler_output),
    "CLIPVisionModel": ("CLIPVisionConfig", {}, "CLIP vision tower",
                        lambda out: out.pooler_output),
    "CLIPVisionModelWithProjection": ("CLIPVisionConfig", {"projection_dim": 32},
                                      "CLIP vision tower with projection",
                                      lambda out: out.image_embeds),
    "SiglipVisionModel": ("SiglipVisionConfig", {}, "SigLIP vision tower",
                          lambda out: out.pooler_output),
    # rotary positions computed from the grid, no table; gated: SwiGLU in
    # gate_proj and up_proj, as DINOv3 ViT-S+ and larger
    "DINOv3ViTModel": ("DINOv3ViTConfig", {"num_register_tokens": 4}, "DINOv3",
                       lambda out: out.pooler_output),
    # MAE masks at random in training; at mask_ratio 0 its class token is the embedding
    "ViTMAEModel": ("ViTMAEConfig", {"mask_ratio": 0.0}, "MAE encoder",
                    lambda out: out.last_hidden_state[:, 0]),
}
HF_PATCH = 14


def tiny_hf(name: str, seed: int = 0, grid: int = 3, **values):
    """The transformers model at width 96, two blocks, patch 14 and a `grid` x `grid` patch
    grid (the side its config.json says), every weight random."""
    import transformers

    config_class, extra, _, _ = HF_FAMILIES[name]
    config = getattr(transformers, config_class)(
        hidden_size=EMBED, num_hidden_layers=2, num_attention_heads=4, intermediate_size=192,
        image_size=grid * HF_PATCH, patch_size=HF_PATCH, **{**extra, **values})
    torch.manual_seed(seed)
    return perturb(getattr(transformers, name)(config), seed)


def siglip2(seed: int = 0, grid: int = 3, patch: int = HF_PATCH):
    """A tiny Siglip2VisionModel (NaFlex) whose table holds a `grid` x `grid` patch grid."""
    import transformers

    config = transformers.Siglip2VisionConfig(
        hidden_size=EMBED, num_hidden_layers=2, num_attention_heads=4, intermediate_size=192,
        num_patches=grid * grid, patch_size=patch)
    torch.manual_seed(seed)
    return perturb(transformers.Siglip2VisionModel(config), seed)


def siglip2_output(model, x: torch.Tensor) -> torch.Tensor:
    """SigLIP2's pooled output for images [B, C, H, W], given as its processor gives them:
    patches in (row, column, channel) order, every one valid, the grid in spatial_shapes."""
    B, C, H, W = x.shape
    P = model.config.patch_size
    h, w = H // P, W // P
    patches = x.reshape(B, C, h, P, w, P).permute(0, 2, 4, 3, 5, 1).reshape(B, h * w, -1)
    with torch.no_grad():
        return model(pixel_values=patches, spatial_shapes=torch.tensor([[h, w]] * B),
                     pixel_attention_mask=torch.ones(B, h * w, dtype=torch.long)).pooler_output


def hf_output(name: str, model, x: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return HF_FAMILIES[name][3](model(pixel_values=x))


def save_hf(model, folder: Path, processor=None) -> Path:
    """A save_pretrained folder, as users download them (and the processor's JSON)."""
    model.save_pretrained(folder)
    if processor is not None:
        processor.save_pretrained(folder)
    return folder


# transformers class -> its image processor (the PIL backend: the reference pixels) at the
# tiny models' side (a 3 x 3 grid of HF_PATCH), as a save_pretrained folder holds it
def _processors() -> dict[str, Callable]:
    import transformers

    side = 3 * HF_PATCH
    return {
        "CLIPVisionModelWithProjection": lambda: transformers.CLIPImageProcessorPil(
            size={"shortest_edge": side}, crop_size={"height": side, "width": side}),
        "SiglipVisionModel": lambda: transformers.SiglipImageProcessorPil(
            size={"height": side, "width": side}),
        "Dinov2Model": lambda: transformers.BitImageProcessorPil(
            size={"shortest_edge": side + 6}, crop_size={"height": side, "width": side}),
        # rescales, then resizes in float32 with torch (no PIL backend)
        "DINOv3ViTModel": lambda: transformers.DINOv3ViTImageProcessor(
            size={"height": side, "width": side}),
    }


def processor(name: str):
    """The image processor of the Hugging Face model `name` (one of CLIP with projection,
    SigLIP, DINOv2, DINOv3), for the tiny models' side."""
    return _processors()[name]()


EMBEDDERS = ("CLIPVisionModelWithProjection", "SiglipVisionModel", "Dinov2Model")


def hf_embedder(name: str, folder: Path, photos) -> tuple[Path, np.ndarray]:
    """A tiny `name` (one of EMBEDDERS) saved with its processor to `folder`, and the source
    framework's own embeddings of `photos` (its processor, then its model): what every
    embedding test compares with."""
    from PIL import Image

    peer, pixels_of = tiny_hf(name), processor(name)
    save_hf(peer, folder, pixels_of)
    pixels = pixels_of([Image.open(f) for f in photos], return_tensors="pt")["pixel_values"]
    return folder, hf_output(name, peer, pixels).numpy()


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Row by row, in float64."""
    a, b = a.astype(np.float64), b.astype(np.float64)
    return (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))



def timm_at(name: str, img_size: int, peer) -> torch.nn.Module:
    """timm's own model of `name` at `img_size` with `peer`'s weights (tiny_timm's), loaded
    through timm's checkpoint_filter_fn (which resamples the table as timm does), with
    dynamic_img_size on."""
    import sys

    import timm

    arch = name.split(".")[0]
    model = timm.create_model(arch, pretrained=False, depth=2, embed_dim=EMBED,
                              img_size=img_size, num_classes=7, dynamic_img_size=True)
    filter_fn = getattr(sys.modules[type(model).__module__], "checkpoint_filter_fn", None)
    state = {k: v.clone() for k, v in peer.state_dict().items()}
    model.load_state_dict(filter_fn(state, model) if filter_fn else state, strict=True)
    return model.eval()


def _scaled(expected: np.ndarray, got: np.ndarray) -> float:
    scale = float(np.abs(expected).max())
    assert scale > 1e-2  # the reference says something to compare
    return float(np.abs(expected - got).max()) / scale


def _batch(size: tuple[int, int], n: int = 2) -> torch.Tensor:
    g = torch.Generator().manual_seed(size[0] * 31 + size[1])
    return torch.randn(n, 3, *size, generator=g)


def source_matrix(framework: str, name: str, folder: Path) -> dict[tuple[int, int], float]:
    """A family against its own framework's forward, built here by that framework: trained
    at one grid (timm 3x3, transformers 4x4 patches), imported at an export size other than
    it, then run at the export size, the native one and two more, one not square. The
    error at each (H, W), scaled by the output's largest value; the export size's is the
    worse of the fixed-size model's and the dynamic one's."""
    from vit_export.checkpoints import load_checkpoint
    from vit_export.model import with_dynamic_size

    if framework == "timm":
        peer = tiny_timm(name)
        P = peer.patch_embed.patch_size[0]
        export, sizes = 4 * P, [(4 * P, 4 * P), (3 * P, 3 * P), (2 * P, 2 * P), (5 * P, 3 * P)]
        torch.save(peer.state_dict(), folder / "weights.pth")
        model, _ = load_checkpoint(folder / "weights.pth", timm_name=name,
                                   overrides={**size_of(peer), "img_size": str(export)})
        reference = timm_at(name, export, peer)

        def expected(x):
            return reference(x)
    elif name == "Siglip2VisionModel":  # NaFlex: the table resampled to every image's grid
        peer = siglip2(grid=4)
        P = HF_PATCH
        export, sizes = 3 * P, [(3 * P, 3 * P), (4 * P, 4 * P), (2 * P, 2 * P), (5 * P, 3 * P)]
        model, _ = load_checkpoint(save_hf(peer, folder / name),
                                   overrides={"img_size": str(export)})

        def expected(x):
            return siglip2_output(peer, x)
    else:
        peer = tiny_hf(name, grid=4)
        P = HF_PATCH
        export, sizes = 3 * P, [(3 * P, 3 * P), (4 * P, 4 * P), (2 * P, 2 * P), (5 * P, 3 * P)]
        model, _ = load_checkpoint(save_hf(peer, folder / name),
                                   overrides={"img_size": str(export)})
        flag = not name.startswith(("Dinov2", "DINOv3"))  # those resample in every forward

        def expected(x):
            kwargs = {"interpolate_pos_encoding": True} \
                if flag and x.shape[-1] != 4 * P or flag and x.shape[-2] != 4 * P else {}
            return HF_FAMILIES[name][3](peer(pixel_values=x, **kwargs))
    dynamic = with_dynamic_size(model)
    errors = {}
    with torch.no_grad():
        for size in sizes:
            x = _batch(size)
            ref = expected(x).numpy()
            errors[size] = _scaled(ref, dynamic(x).numpy())
            if size == (export, export):
                errors[size] = max(errors[size], _scaled(ref, model(x).numpy()))
    return errors
