"""Measure the README's families tables: each timm family at a tiny size (width 96, two
blocks, every weight random at order 1; tests/families.py builds them), imported with
--timm-name's code path, against timm's own forward: eager, ONNX Runtime at a fixed size,
and ONNX Runtime with a dynamic size at two other image sizes. Then each Hugging Face model
from its save_pretrained folder against transformers' forward. Prints Markdown tables.

    python scripts/families_table.py
"""
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]
from families import HF_FAMILIES, hf_output, save_hf, tiny_hf, tiny_timm

from vit_export import bundle as B
from vit_export import runtime
from vit_export.checkpoints import load_checkpoint
from vit_export.errors import VitExportError
from vit_export.export import export_onnx
from vit_export.model import with_dynamic_size

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
        ("EVA02 (rotary: issue 23)", "eva02_tiny_patch14_224"),
        ("DINOv3 (rotary: issue 23)", "vit_small_patch16_dinov3")]


def rel(a, b):
    return float(np.abs(a - b).max() / np.abs(a).max())


def measure(name, tmp):
    peer = tiny_timm(name)
    torch.save(peer.state_dict(), tmp / "w.pth")
    try:
        model, description = load_checkpoint(tmp / "w.pth", timm_name=name)
    except VitExportError as exc:
        return f"refused: {str(exc).split(';')[0]}", "", "", ""
    P, c = model.config.patch_size, model.config
    x = torch.randn(3, 3, c.img_size, c.img_size, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = peer(x).numpy()
        eager = rel(expected, model(x).numpy())
    path = tmp / "fixed.onnx"
    export_onnx(model, path, B.Description(c, description.preprocessing).to_json())
    onnx_fixed = rel(expected, runtime.create_session(path, "cpu")(x.numpy()))
    dynamic, peer_dynamic = with_dynamic_size(model), tiny_timm(name, dynamic=True)
    path = tmp / "dynamic.onnx"
    export_onnx(dynamic, path, B.Description(dynamic.config, description.preprocessing).to_json())
    session = runtime.create_session(path, "cpu")
    worst = 0.0
    for h, w in ((4 * P, 2 * P), (2 * P, 5 * P)):
        x = torch.randn(2, 3, h, w, generator=torch.Generator().manual_seed(h * w))
        with torch.no_grad():
            worst = max(worst, rel(peer_dynamic(x).numpy(), session(x.numpy())))
    return "exports", f"{eager:.1e}", f"{onnx_fixed:.1e}", f"{worst:.1e}"


def measure_hf(name, tmp):
    """A transformers model's save_pretrained folder against its own forward (its pooled
    output, projection or logits): eager and ONNX Runtime at the model's size."""
    peer = tiny_hf(name)
    model, description = load_checkpoint(save_hf(peer, tmp / "hf"))
    c = model.config
    x = torch.randn(3, 3, c.img_size, c.img_size, generator=torch.Generator().manual_seed(1))
    expected = hf_output(name, peer, x).numpy()
    with torch.no_grad():
        eager = rel(expected, model(x).numpy())
    path = tmp / "fixed.onnx"
    export_onnx(model, path, B.Description(c, description.preprocessing).to_json())
    onnx_fixed = rel(expected, runtime.create_session(path, "cpu")(x.numpy()))
    return "exports", f"{eager:.1e}", f"{onnx_fixed:.1e}", ",".join(c.output_names)


def main():
    print("| family | timm model | timm: exports | eager vs timm | ONNX vs timm | "
          "ONNX, dynamic size, 2 other sizes |")
    print("| --- | --- | --- | --- | --- | --- |")
    for family, name in ROWS:
        with tempfile.TemporaryDirectory() as tmp:
            cells = measure(name, Path(tmp))
        print(f"| {family} | `{name}` | " + " | ".join(cells) + " |", flush=True)
    print()
    print("| family | transformers class | exports | eager vs transformers | "
          "ONNX vs transformers | output |")
    print("| --- | --- | --- | --- | --- | --- |")
    for name, (_, _, family, _) in HF_FAMILIES.items():
        with tempfile.TemporaryDirectory() as tmp:
            cells = measure_hf(name, Path(tmp))
        print(f"| {family} | `{name}` | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()
