"""Measure the rotary figures of the docs (guides/families.md).

1. A DINOv3 ViT-S (timm's vit_small_patch16_dinov3 at full size, every weight random at
   order 1) exported through the CLI with --dynamic-size and --precision fp16, against
   timm's own forward at 224, 320 and 448x288: max error over the output's largest value,
   eager, ONNX Runtime fp32 and the fp16 variant's cosine.
2. Where fp16 loses precision in the rotary path: each rotary family (width 96, two blocks,
   queries and keys scaled up so attention is sharp and position matters, as in trained
   models) exported with --dynamic-size, converted to fp16 with the rotary tables in fp16
   (before) and in fp32 (after, the default): the table's own error and the worst patch
   token's cosine against eager fp32, at four image sizes.

    python scripts/rope_check.py
"""
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import onnx
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]
from families import cosines, perturb, size_of, tiny_timm

from vit_export import bundle as B
from vit_export import runtime
from vit_export.checkpoints import load_checkpoint
from vit_export.exporting import export_onnx
from vit_export.exporting.variants import _converter_input, to_fp16
from vit_export.model import with_dynamic_size, with_output
from vit_export.onnxio import node_scopes

FAMILIES = ["vit_small_patch16_dinov3", "eva02_tiny_patch14_224", "vit_small_patch16_rope_224",
            "vit_small_patch16_rope_mixed_224", "vit_pe_core_tiny_patch16_384"]
SHARPEN = 4.0  # queries and keys x 4: attention logits x 16


def rel(a, b):
    return float(np.abs(a - b).max() / np.abs(a).max())


def dinov3_vit_s(tmp: Path) -> None:
    import timm

    name = "vit_small_patch16_dinov3"
    peer = perturb(timm.create_model(name, pretrained=False, num_classes=0))
    torch.save(peer.state_dict(), tmp / "dinov3.pth")
    out = tmp / "bundle"
    subprocess.run([sys.executable, str(ROOT / "cli.py"), "export", str(out), "--checkpoint",
                    str(tmp / "dinov3.pth"), "--timm-name", name, "--dynamic-size",
                    "--precision", "fp16", "--provider", "cpu"], check=True, capture_output=True)
    model = B.read_bundle(out)
    fp32 = runtime.ort_runner(out / B.ONNX_FILE, "cpu")
    fp16 = runtime.ort_runner(out / "model.fp16.onnx", "cpu")
    ours, _ = load_checkpoint(tmp / "dinov3.pth", timm_name=name)
    ours = with_dynamic_size(ours)
    print(f"DINOv3 ViT-S ({model.description.config.depth} blocks, width "
          f"{model.description.config.embed_dim}), --dynamic-size, against timm:")
    print("| size | eager | ONNX Runtime fp32 | fp16 cosine |")
    print("| --- | --- | --- | --- |")
    for h, w in ((224, 224), (320, 320), (448, 288)):
        x = torch.randn(2, 3, h, w, generator=torch.Generator().manual_seed(h * w))
        with torch.no_grad():
            expected, eager = peer(x).numpy(), ours(x).numpy()
        print(f"| {h}x{w} | {rel(expected, eager):.1e} | {rel(expected, fp32(x.numpy())):.1e} "
              f"| {cosines(expected, fp16(x.numpy())).min():.7f} |", flush=True)


def table_value(proto: onnx.ModelProto) -> str:
    """The rotary table: the last value the rope module computes."""
    return [n for n in proto.graph.node if "rope" in node_scopes(n)][-1].output[0]


def fp16_rotary(name: str, tmp: Path) -> None:
    peer = tiny_timm(name, num_classes=0)
    torch.save(peer.state_dict(), tmp / "w.pth")
    model, description = load_checkpoint(tmp / "w.pth", timm_name=name, overrides=size_of(peer))
    with torch.no_grad():
        for block in model.blocks:  # queries and keys: the first 2 D rows of qkv
            block.attn.qkv.weight[:2 * model.config.embed_dim] *= SHARPEN
    model = with_output(with_dynamic_size(model), "tokens")
    path = tmp / "fp32.onnx"
    export_onnx(model, path, B.Description(model.config, description.preprocessing).to_json())
    table = table_value(onnx.load(str(path)))
    sessions = {}
    for label, keep in (("before", []), ("after", None)):
        proto = to_fp16(_converter_input(path), keep=keep)
        proto.graph.output.append(onnx.helper.make_tensor_value_info(
            table, onnx.TensorProto.FLOAT16, None))
        onnx.save(proto, str(tmp / f"{label}.onnx"))  # the table as an output of no shape
        sessions[label] = runtime.ort_runner(tmp / f"{label}.onnx", "cpu")
    P = model.config.patch_size
    for side in (224, 448, 640, 1024):
        side = side // P * P
        x = torch.randn(2, 3, side, side, generator=torch.Generator().manual_seed(side))
        with torch.no_grad():
            tokens = model(x).numpy()
            reference = model.rope(side // P, side // P, x).numpy()
        cells = []
        for label, session in sessions.items():
            got_tokens, got_table = session.session.run(
                None, {session.input.name: x.numpy()})
            worst = min(cosines(tokens[:, i], got_tokens[:, i]).min()
                        for i in range(tokens.shape[1]))
            error = np.abs(got_table.astype(np.float64) - reference).max()
            cells.append(f"{error:.1e} / {worst:.6f}")
        print(f"| `{name}` | {side}x{side} | " + " | ".join(cells) + " |", flush=True)


def main():
    with tempfile.TemporaryDirectory() as tmp:
        dinov3_vit_s(Path(tmp))
    print()
    print("fp16 variant, rotary tables in fp16 (before) and in fp32 (after): the table's max "
          "error / the worst patch token's cosine against eager fp32")
    print("| model | size | before | after |")
    print("| --- | --- | --- | --- |")
    for name in FAMILIES:
        with tempfile.TemporaryDirectory() as tmp:
            fp16_rotary(name, Path(tmp))


if __name__ == "__main__":
    main()
