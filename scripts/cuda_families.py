"""Model folders for the CUDA proof's `families` stage (scripts/cuda_proof.sh, issue 24): one
tiny model of each ViT family, from timm and from Hugging Face folders, imported here by the
code `export --checkpoint` runs, and written as a model folder (config.json and
weights.safetensors, what `export --from` reads) that gives its logits and its embedding (or
the embedding alone, where the model has no classifier).

The GPU machine has timm but not transformers, and another torch: these folders carry the
import across, and the export there is made by its own torch. That the import reproduces timm
and transformers is proved here by tests/test_families.py; there, the proof is that each
family's export runs on CUDA as eager PyTorch does on CUDA, logits and embedding alike.
The models are tests/families.py's: width 96, two blocks, every weight random at order 1.

    python scripts/cuda_families.py [OUT]        (default out/cuda-families)
"""
import dataclasses
import sys
import tempfile
from collections.abc import Collection
from pathlib import Path
from typing import Optional

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]
from families import save_hf, size_of, tiny_hf, tiny_timm

from vit_export import bundle as B
from vit_export.checkpoints import load_checkpoint
from vit_export.model import with_output

# folder name -> timm name: one of each architecture the docs' families table names
TIMM = {
    "vit-augreg": "vit_small_patch16_224.augreg_in21k_ft_in1k",
    "deit-distilled": "deit_small_distilled_patch16_224",
    "deit3": "deit3_small_patch16_224",
    "dinov2-reg4": "vit_small_patch14_reg4_dinov2",
    "dinov2-giant-swiglu": "vit_giant_patch14_dinov2",
    "openclip": "vit_base_patch16_clip_224",
    "clip-quickgelu": "vit_base_patch16_clip_quickgelu_224",
    "siglip-map": "vit_base_patch16_siglip_224",
    "gap-reg4": "vit_medium_patch16_reg4_gap_256",
    "eva02": "eva02_tiny_patch14_224",
    "eva-clip": "eva02_base_patch16_clip_224",
    "dinov3": "vit_small_patch16_dinov3",
    "rope-mixed": "vit_small_patch16_rope_mixed_224",
    "pe-core": "vit_pe_core_tiny_patch16_384",
}
# folder name -> transformers class (headless: the embedding alone)
HF = {
    "hf-clip": "CLIPVisionModelWithProjection",
    "hf-siglip": "SiglipVisionModel",
    "hf-dinov2": "Dinov2Model",
    "hf-dinov3": "DINOv3ViTModel",
}


def write_folder(model, description, folder: Path) -> None:
    outputs = "logits,embedding" if "logits" in model.config.output_names else "embedding"
    model = with_output(model, outputs)
    folder.mkdir(parents=True, exist_ok=True)
    B.write_weights(model, folder / B.WEIGHTS_FILE)
    B.write_config(folder, dataclasses.replace(description, config=model.config),
                   files=[B.WEIGHTS_FILE])


def main(out: Path, only: Optional[Collection[str]] = None) -> None:
    """Write the folders into `out`: all of them, or those named in `only`."""
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        for folder, name in TIMM.items():
            if only is not None and folder not in only:
                continue
            peer = tiny_timm(name)
            torch.save(peer.state_dict(), tmp / "w.pth")
            model, description = load_checkpoint(tmp / "w.pth", timm_name=name,
                                                 overrides=size_of(peer))
            write_folder(model, description, out / folder)
            print(f"{out / folder}: {name}")
        for folder, name in HF.items():
            if only is not None and folder not in only:
                continue
            model, description = load_checkpoint(save_hf(tiny_hf(name), tmp / folder))
            write_folder(model, description, out / folder)
            print(f"{out / folder}: transformers {name}")


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else ROOT / "out" / "cuda-families"))
