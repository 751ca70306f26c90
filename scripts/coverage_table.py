"""Measure which vision transformers vit-export exports and proves, and by which road: every
architecture below, as a small checkpoint with every weight random (tests/families.py's
perturb), exported as a user would (`vit_export.export`, the whole proof: batch axis,
graph scan, every artifact against eager, source rows), then its model.onnx run by ONNX
Runtime against the framework's own forward (the peer built here, nothing of ours) at
batches 1 and 3. Each is also tried with the rebuild alone (`road="native"`), what
vit-export did before the framework road. Writes benchmarks/results/coverage.json and
prints the Markdown table of docs/guides/families.md.

    python scripts/coverage_table.py [--only NAME ... [--update]]
"""
import argparse
import json
import logging
import sys
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np
import torch
import torchvision

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]
from families import HF_FAMILIES, perturb, save_hf, shrink, size_of, tiny_hf, tiny_timm

import vit_export
from vit_export.errors import VitExportError

sys.path.insert(0, str(ROOT / "docs" / "hooks"))
from coverage import table  # the guide's table, as its build draws it


def cpu_name() -> str:
    """The CPU's model name with its family and model numbers (which tell Zen 3, 4 and 5
    apart where the name is only "AMD EPYC")."""
    info = {}
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        key, _, value = line.partition(":")
        info.setdefault(key.strip(), value.strip())
    return (f"{info.get('model name', 'unknown CPU')} (family {info.get('cpu family', '?')}, "
            f"model {info.get('model', '?')})")

RESULT = ROOT / "benchmarks" / "results" / "coverage.json"
SMALL = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=2, intermediate_size=128)

# timm models vit-export rebuilds (tests/families.py's tiny sizes)
TIMM_NATIVE = ["vit_small_patch16_224.augreg_in21k_ft_in1k", "vit_base_patch16_224.mae",
               "deit_small_distilled_patch16_224", "deit3_small_patch16_224",
               "vit_small_patch14_dinov2", "vit_small_patch14_reg4_dinov2",
               "vit_giant_patch14_dinov2", "vit_base_patch16_clip_quickgelu_224",
               "vit_base_patch16_clip_224", "vit_base_patch16_siglip_224",
               "vit_base_patch16_siglip_gap_224", "vit_base_patch16_gap_224",
               "vit_medium_patch16_reg4_gap_256", "eva02_tiny_patch14_224",
               "eva02_base_patch14_224", "eva02_base_patch16_clip_224",
               "vit_small_patch16_dinov3", "vit_small_plus_patch16_dinov3",
               "vit_small_patch16_rope_224", "vit_small_patch16_rope_mixed_224",
               "vit_small_patch16_rope_ape_224", "vit_pe_core_tiny_patch16_384",
               "vit_base_patch16_rope_reg1_gap_256"]
# timm models of other classes: name -> create_model's small sizes (also --set values)
TIMM_OTHER = {
    "aimv2_large_patch14_224": dict(embed_dim=64, depth=2, num_heads=2, img_size=56),
    "beit_base_patch16_224": dict(embed_dim=64, depth=2, num_heads=2, img_size=64),
    "beitv2_base_patch16_224": dict(embed_dim=64, depth=2, num_heads=2, img_size=64),
    "cait_xxs24_224": dict(embed_dim=64, depth=2, num_heads=2, img_size=64,
                           depth_token_only=1),
    "hiera_tiny_224": dict(embed_dim=32, num_heads=1, stages=[1, 1, 1, 1], img_size=224),
    "levit_128s": dict(img_size=64),
    "mvitv2_tiny": dict(img_size=64),
    "naflexvit_base_patch16_gap": dict(embed_dim=64, depth=2, num_heads=2, img_size=64),
    "pit_ti_224": dict(img_size=64),
    "samvit_base_patch16": dict(embed_dim=64, depth=2, num_heads=2, img_size=64,
                                global_attn_indexes=[1], window_size=2, neck_chans=32),
    "swin_tiny_patch4_window7_224": dict(embed_dim=32, depths=[1, 1], num_heads=[1, 2],
                                         img_size=56, window_size=7),
    "swinv2_tiny_window8_256": dict(embed_dim=32, depths=[1, 1], num_heads=[1, 2],
                                    img_size=64, window_size=8),
    "vitamin_small_224": dict(img_size=64),
    "xcit_nano_12_p16_224": dict(embed_dim=64, depth=2, num_heads=2, img_size=64),
    "deit_tiny_patch16_224": dict(embed_dim=64, depth=2, num_heads=2, img_size=64),
    # one model of each other vision-transformer module timm has, at its own (smallest) size
    "crossvit_tiny_240": {}, "davit_tiny": {}, "efficientformer_l1": {},
    "efficientformerv2_s0": {}, "gcvit_xxtiny": {}, "maxvit_nano_rw_256": {},
    "nextvit_small": {}, "swinv2_cr_tiny_ns_224": {}, "tiny_vit_5m_224": {},
    "tnt_s_patch16_224": {}, "twins_pcpvt_small": {}, "vit_small_r26_s32_224": {},
    "vit_relpos_small_patch16_224": {}, "volo_d1_224": {},
}
# torchvision's transformer builders, at their own sizes: builder -> the weights enum named
TORCHVISION = {"vit_b_16": "ViT_B_16_Weights.IMAGENET1K_V1",
               "swin_t": "Swin_T_Weights.IMAGENET1K_V1",
               "swin_v2_t": "Swin_V2_T_Weights.IMAGENET1K_V1",
               "maxvit_t": "MaxVit_T_Weights.IMAGENET1K_V1"}
# Left at their framework's random init: perturbed at order 1, LeViT's logits reach 1e10
# (every block multiplies them) and EfficientFormerV2's 5e9, where no tolerance means
# anything, and NextViT's are NaN
UNPERTURBED = {"levit_128s", "LevitForImageClassification", "efficientformerv2_s0",
               "nextvit_small"}
# transformers classes vit-export does not rebuild: class -> (config class, small values)
HF_OTHER = {
    "Aimv2VisionModel": ("Aimv2VisionConfig", dict(SMALL, image_size=56, patch_size=14)),
    "BeitForImageClassification": ("BeitConfig", dict(SMALL, image_size=64, patch_size=16,
                                                      use_relative_position_bias=True,
                                                      num_labels=5)),
    "Data2VecVisionForImageClassification": ("Data2VecVisionConfig", dict(
        SMALL, image_size=64, patch_size=16, use_relative_position_bias=True, num_labels=5)),
    "HieraForImageClassification": ("HieraConfig", dict(
        image_size=[64, 64], embed_dim=32, depths=[1, 1, 1, 1], num_heads=[1, 1, 1, 1],
        num_labels=5, patch_stride=[4, 4], masked_unit_size=[8, 8])),
    "IJepaForImageClassification": ("IJepaConfig", dict(SMALL, image_size=64, patch_size=16,
                                                        num_labels=5)),
    "LevitForImageClassification": ("LevitConfig", dict(image_size=64, num_labels=5)),
    "SwinForImageClassification": ("SwinConfig", dict(image_size=56, patch_size=4,
                                                      embed_dim=32, depths=[1, 1],
                                                      num_heads=[1, 2], window_size=7,
                                                      num_labels=5)),
    "Swinv2ForImageClassification": ("Swinv2Config", dict(image_size=56, patch_size=4,
                                                          embed_dim=32, depths=[1, 1],
                                                          num_heads=[1, 2], window_size=7,
                                                          num_labels=5)),
    "DPTModel": ("DPTConfig", dict(SMALL, image_size=64, patch_size=16)),
    "VitDetModel": ("VitDetConfig", dict(SMALL, image_size=64, patch_size=16,
                                         pretrain_image_size=64)),
    "ViTMSNForImageClassification": ("ViTMSNConfig", dict(SMALL, image_size=64,
                                                          patch_size=16, num_labels=5)),
    "YolosModel": ("YolosConfig", dict(SMALL, image_size=[64, 64], patch_size=16,
                                       num_detection_tokens=4)),
    "PvtV2ForImageClassification": ("PvtV2Config", dict(num_labels=5, image_size=64)),
    "CvtForImageClassification": ("CvtConfig", dict(num_labels=5)),
    "MobileViTForImageClassification": ("MobileViTConfig", dict(image_size=64, num_labels=5)),
    "MobileViTV2ForImageClassification": ("MobileViTV2Config", dict(image_size=64,
                                                                    num_labels=5)),
    "SegformerForImageClassification": ("SegformerConfig", dict(image_size=64, num_labels=5)),
    "SwiftFormerForImageClassification": ("SwiftFormerConfig", dict(image_size=64,
                                                                    num_labels=5)),
    "DonutSwinModel": ("DonutSwinConfig", dict(image_size=64, embed_dim=32, depths=[1, 1],
                                               num_heads=[1, 2], window_size=4)),
}


def _hf_other(name: str):
    import transformers

    config_class, values = HF_OTHER[name]
    torch.manual_seed(0)
    peer = getattr(transformers, name)(getattr(transformers, config_class)(**values)).eval()
    peer = peer if name in UNPERTURBED else perturb(peer)
    side = values.get("image_size", 224)
    return peer, side[0] if isinstance(side, list) else side


def _hf_answer(out):
    for field in ("logits", "pooler_output", "image_embeds"):
        if getattr(out, field, None) is not None:
            return out[field]
    return out.last_hidden_state


def cases():
    """(row label, framework, peer forward(x) -> tensor, export keyword arguments, side,
    a function saving the checkpoint into a folder) for every architecture."""
    for name in TIMM_NATIVE:
        peer = tiny_timm(name)
        yield (name, "timm", peer, dict(timm_name=name, overrides=size_of(peer)),
               peer.patch_embed.img_size[0], lambda d, p=peer: _pth(p, d))
    for name, sizes in TIMM_OTHER.items():
        import timm

        try:
            peer = timm.create_model(name, pretrained=False, num_classes=5, **sizes).eval()
            peer = peer if name in UNPERTURBED else perturb(peer)
        except Exception as exc:  # a size timm's class does not take
            yield (name, "timm", None, {"error": f"timm cannot build it small: {exc}"}, 0, None)
            continue
        from timm.data import resolve_model_data_config

        yield (name, "timm", peer, dict(timm_name=name, overrides={
            k: json.dumps(v) for k, v in sizes.items()}),
            sizes.get("img_size") or resolve_model_data_config(peer)["input_size"][-1],
            lambda d, p=peer: _pth(p, d))
    for builder, weights in TORCHVISION.items():
        yield (builder, "torchvision", _torchvision(builder),
               dict(torchvision_weights=weights),
               torchvision.models.get_weight(weights).transforms().crop_size[0],
               lambda d, b=builder: _safetensors(_torchvision(b), d))
    for name in HF_FAMILIES:
        peer = tiny_hf(name)
        yield (name, "transformers", lambda x, p=peer, n=name: HF_FAMILIES[n][3](
            p(pixel_values=x)), {}, peer.config.image_size, lambda d, p=peer: save_hf(p, d))
    for name in HF_OTHER:
        peer, side = _hf_other(name)
        yield (name, "transformers", lambda x, p=peer: _hf_answer(p(pixel_values=x)), {}, side,
               lambda d, p=peer: save_hf(p, d))


def _torchvision(builder: str):
    """torchvision's model at its own size, every weight random and scaled down (order-1
    weights through twelve blocks overflow), the same for the same builder."""
    torch.manual_seed(0)
    peer = perturb(torchvision.models.get_model_builder(builder)(weights=None, num_classes=5))
    shrink(peer)  # order-1 weights overflow twelve blocks
    return peer.eval()


def _safetensors(peer, folder: Path) -> Path:
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in peer.state_dict().items()},
              folder / "model.safetensors")
    return folder / "model.safetensors"


def _pth(peer, folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    torch.save(peer.state_dict(), folder / "weights.pth")
    return folder / "weights.pth"


def worst_error(forward, bundle: Path, side: int) -> float:
    """model.onnx against the peer's own forward, scaled by its largest value, batches 1, 3."""
    import onnxruntime as ort

    session = ort.InferenceSession(str(bundle / "model.onnx"),
                                   providers=["CPUExecutionProvider"])
    worst = 0.0
    for batch in (1, 3):
        x = torch.randn(batch, 3, side, side, generator=torch.Generator().manual_seed(batch))
        with torch.no_grad():
            expected = forward(x).float().numpy()
        got = session.run(None, {"pixel_values": x.numpy()})[0]
        worst = max(worst, float(np.abs(got - expected).max() / np.abs(expected).max()))
    return worst


def measure(case, tmp: Path) -> dict:
    name, framework, peer, kwargs, side, save = case
    row = {"name": name, "framework": framework}
    if peer is None:
        return {**row, "status": "refused", "reason": kwargs["error"]}
    source = save(tmp / "ckpt")
    try:
        vit_export.load(source, kind="checkpoint", road="native", **kwargs)
        row["before"] = "exports"
    except VitExportError as exc:
        row["before"] = f"refused: {str(exc).splitlines()[0][:160]}"
    try:
        report = vit_export.export(source, tmp / "bundle", kind="checkpoint", **kwargs)
    except VitExportError as exc:
        return {**row, "status": "refused", "reason": str(exc).splitlines()[0][:200]}
    config = json.loads((tmp / "bundle" / "config.json").read_text())
    row.update(status="exports and proves" if report.passed else "fails",
               road="framework" if "module" in config else "native",
               exporter=config["export"]["exporter"],
               source=(report.source or {}).get("status"),
               outputs=list(config["io"]["outputs"]))
    try:
        row["onnx_vs_framework"] = worst_error(peer, tmp / "bundle", side)
    except Exception as exc:  # the bundle does not take what the framework's model takes
        row.update(status="fails", reason=f"{type(exc).__name__}: {str(exc).splitlines()[0]}")
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="*", help="measure these names only (not saved)")
    parser.add_argument("--update", action="store_true",
                        help="with --only: replace those rows in the saved result")
    args = parser.parse_args()
    logging.disable(logging.WARNING)
    warnings.simplefilter("ignore")
    rows = []
    for case in cases():
        if args.only and case[0] not in args.only:
            continue
        with tempfile.TemporaryDirectory() as tmp:
            row = measure(case, Path(tmp))
        print(json.dumps(row), file=sys.stderr, flush=True)
        rows.append(row)
    result = {"machine": cpu_name(), "date": time.strftime("%Y-%m-%d"),
              "versions": {p: __import__(p).__version__ for p in
                           ("torch", "torchvision", "timm", "transformers", "onnxruntime")},
              "rows": rows}
    if args.only and args.update:  # the other rows as measured before, in their order
        again = {row["name"]: row for row in rows}
        saved = json.loads(RESULT.read_text())
        result["rows"] = [again.get(row["name"], row) for row in saved["rows"]]
        result["updated"] = sorted(again)
    if not args.only or args.update:
        RESULT.write_text(json.dumps(result, indent=1) + "\n")
    print(table(result))


if __name__ == "__main__":
    main()
