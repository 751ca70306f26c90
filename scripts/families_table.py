"""Measure the families tables of the docs (guides/families.md): each timm family at a tiny size (width 96, two
blocks, every weight random at order 1; tests/families.py builds them), imported with
--timm-name's code path, against timm's own forward: eager, ONNX Runtime at a fixed size,
ONNX Runtime with a dynamic size at two other image sizes, and that model's fp16 variant
(the worst cosine over the native and the two other sizes), and the sizes the family matches
timm at when exported at a size other than its native one. Then each Hugging Face model
from its save_pretrained folder against transformers' forward, the same way where
transformers runs other sizes. Prints Markdown tables.

    python scripts/families_table.py
"""
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]
from families import (
    HF_FAMILIES,
    cosines,
    save_hf,
    siglip2,
    siglip2_output,
    size_of,
    source_matrix,
    tiny_hf,
    tiny_timm,
)

from vit_export import bundle as B
from vit_export import runtime
from vit_export.checkpoints import load_checkpoint
from vit_export.errors import VitExportError
from vit_export.exporting import export_onnx
from vit_export.exporting.variants import _converter_input, to_fp16
from vit_export.model import with_dynamic_size
from vit_export.onnxio import save_onnx

ROWS = [("ViT (augreg)", "vit_small_patch16_224.augreg_in21k_ft_in1k"),
        ("MAE", "vit_base_patch16_224.mae"),
        ("DeiT (distilled)", "deit_small_distilled_patch16_224"),
        ("DeiT III", "deit3_small_patch16_224"),
        ("DINOv2", "vit_small_patch14_dinov2"),
        ("DINOv2 with registers", "vit_small_patch14_reg4_dinov2"),
        ("DINOv2 ViT-g (SwiGLU)", "vit_giant_patch14_dinov2"),
        ("CLIP (OpenAI, quickgelu)", "vit_base_patch16_clip_quickgelu_224"),
        ("OpenCLIP", "vit_base_patch16_clip_224"),
        ("SigLIP (MAP head)", "vit_base_patch16_siglip_224"),
        ("SigLIP (GAP head)", "vit_base_patch16_siglip_gap_224"),
        ("timm GAP", "vit_base_patch16_gap_224"),
        ("timm GAP with registers", "vit_medium_patch16_reg4_gap_256"),
        ("EVA02 (rotary, packed SwiGLU)", "eva02_tiny_patch14_224"),
        ("EVA02 B (SwiGLU with sub-LN)", "eva02_base_patch14_224"),
        ("EVA-CLIP", "eva02_base_patch16_clip_224"),
        ("DINOv3", "vit_small_patch16_dinov3"),
        ("DINOv3 S+ (SwiGLU)", "vit_small_plus_patch16_dinov3"),
        ("ROPE-ViT axial", "vit_small_patch16_rope_224"),
        ("ROPE-ViT mixed", "vit_small_patch16_rope_mixed_224"),
        ("ROPE-ViT axial + table", "vit_small_patch16_rope_ape_224"),
        ("Perception Encoder", "vit_pe_core_tiny_patch16_384"),
        ("timm ROPE GAP with a register", "vit_base_patch16_rope_reg1_gap_256")]
# transformers models that run other sizes, and how they are asked to
HF_DYNAMIC = {"ViTModel": {"interpolate_pos_encoding": True},
              "CLIPVisionModel": {"interpolate_pos_encoding": True},
              "SiglipVisionModel": {"interpolate_pos_encoding": True},
              "Dinov2Model": {}, "Dinov2WithRegistersModel": {}, "DINOv3ViTModel": {}}


def rel(a, b):
    return float(np.abs(a - b).max() / np.abs(a).max())


def dynamic_cells(model, description, reference, tmp):
    """The dynamic-size export against `reference(x)` at 4x2 and 2x5 patches (max error), and
    its fp16 variant's worst cosine there and at the native size."""
    dynamic = with_dynamic_size(model)
    path = tmp / "dynamic.onnx"
    export_onnx(dynamic, path, B.Description(dynamic.config, description.preprocessing).to_json())
    save_onnx(to_fp16(_converter_input(path)), tmp / "dynamic.fp16.onnx")
    session = runtime.ort_runner(path, "cpu")
    half = runtime.ort_runner(tmp / "dynamic.fp16.onnx", "cpu")
    P, side = model.config.patch_size, model.config.img_size
    worst, cosine = 0.0, 1.0
    for h, w in ((4 * P, 2 * P), (2 * P, 5 * P), (side, side)):
        x = torch.randn(2, 3, h, w, generator=torch.Generator().manual_seed(h * w))
        expected = reference(x)
        if h != side:
            worst = max(worst, rel(expected, session(x.numpy())))
        cosine = min(cosine, float(cosines(expected, half(x.numpy())).min()))
    return f"{worst:.1e}", f"{cosine:.7f}"


def proved(framework, name, tmp) -> str:
    """The sizes the family matches its own framework at (tests/families.source_matrix:
    native, an export size other than it, two more, one not square) and the worst error."""
    errors = source_matrix(framework, name, tmp)
    sizes = ", ".join(f"{h}x{w}" for h, w in errors)
    return f"{sizes} ({max(errors.values()):.1e})"


def measure(name, tmp):
    peer = tiny_timm(name)
    torch.save(peer.state_dict(), tmp / "w.pth")
    try:
        model, description = load_checkpoint(tmp / "w.pth", timm_name=name,
                                             overrides=size_of(peer))
    except VitExportError as exc:
        return f"refused: {str(exc).split(';')[0]}", "", "", "", "", ""
    c = model.config
    x = torch.randn(3, 3, c.img_size, c.img_size, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = peer(x).numpy()
        eager = rel(expected, model(x).numpy())
    path = tmp / "fixed.onnx"
    export_onnx(model, path, B.Description(c, description.preprocessing).to_json())
    onnx_fixed = rel(expected, runtime.ort_runner(path, "cpu")(x.numpy()))
    peer_dynamic = tiny_timm(name, dynamic=True)
    with torch.no_grad():
        cells = dynamic_cells(model, description, lambda x: peer_dynamic(x).numpy(), tmp)
    return ("exports", f"{eager:.1e}", f"{onnx_fixed:.1e}", *cells, proved("timm", name, tmp))


def measure_hf(name, tmp):
    """A transformers model's save_pretrained folder against its own forward (its pooled
    output, projection or logits): eager and ONNX Runtime at the model's size, and where
    transformers runs other sizes, the dynamic-size export and its fp16 variant."""
    peer = siglip2() if name == "Siglip2VisionModel" else tiny_hf(name)

    def forward(x, **kwargs):
        if name == "Siglip2VisionModel":
            return siglip2_output(peer, x).numpy()
        with torch.no_grad():
            return HF_FAMILIES[name][3](peer(pixel_values=x, **kwargs)).numpy()
    model, description = load_checkpoint(save_hf(peer, tmp / "hf"))
    c = model.config
    x = torch.randn(3, 3, c.img_size, c.img_size, generator=torch.Generator().manual_seed(1))
    expected = forward(x)
    with torch.no_grad():
        eager = rel(expected, model(x).numpy())
    path = tmp / "fixed.onnx"
    export_onnx(model, path, B.Description(c, description.preprocessing).to_json())
    onnx_fixed = rel(expected, runtime.ort_runner(path, "cpu")(x.numpy()))
    cells = ("-", "-")
    if name == "Siglip2VisionModel" or name in HF_DYNAMIC:
        kwargs = HF_DYNAMIC.get(name, {})
        with torch.no_grad():
            cells = dynamic_cells(model, description, lambda x: forward(x, **kwargs), tmp)
    source = proved("transformers", name, tmp)
    return ("exports", f"{eager:.1e}", f"{onnx_fixed:.1e}", *cells, source,
            ",".join(c.output_names))


def main():
    print("| family | timm model | timm: exports | eager vs timm | ONNX vs timm | "
          "ONNX, dynamic size, 2 other sizes | fp16 cosine, 3 sizes | sizes proved against "
          "timm |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for family, name in ROWS:
        with tempfile.TemporaryDirectory() as tmp:
            cells = measure(name, Path(tmp))
        print(f"| {family} | `{name}` | " + " | ".join(cells) + " |", flush=True)
    print()
    print("| family | transformers class | exports | eager vs transformers | "
          "ONNX vs transformers | ONNX, dynamic size, 2 other sizes | fp16 cosine, 3 sizes | "
          "sizes proved against transformers | output |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    rows = [(name, family) for name, (_, _, family, _) in HF_FAMILIES.items()]
    for name, family in rows + [("Siglip2VisionModel", "SigLIP2 (NaFlex) vision tower")]:
        with tempfile.TemporaryDirectory() as tmp:
            cells = measure_hf(name, Path(tmp))
        print(f"| {family} | `{name}` | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()
