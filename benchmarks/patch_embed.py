"""The patch embedding as ONNX Runtime runs it, Conv against one GEMM.

    python benchmarks/patch_embed.py [--provider cpu|cuda] [--batch-sizes 1,8,64]

ViT-B/16's patch embedding alone (3x224x224 -> 196 tokens of 768), our PatchEmbed exported
twice by the dynamo exporter, as written (Conv) and lowered here (`GemmPatchEmbed`: the
patches cut out by reshapes, then the conv's weight as one MatMul; kernel = stride = patch,
so it is the same arithmetic), both timed in this one run on the same inputs: the ratio is
the lever's gain, never a figure carried over from another run. Their outputs are compared
first. The lowering lives here, not in the export, until a machine shows a gain.
"""
from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import numpy as np
import onnxruntime as ort
import torch

from vit_export.model import PatchEmbed
from vit_export.runtime import PROVIDERS
from vit_export.timing import seconds


class GemmPatchEmbed(PatchEmbed):
    """PatchEmbed's arithmetic as reshapes and one GEMM with the conv's weight."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, C, H, W = x.shape
        P = self.patch_size
        x = x.reshape(B, C, H // P, P, W // P, P).permute(0, 2, 4, 1, 3, 5)
        x = x.reshape(B, (H // P) * (W // P), C * P * P)
        weight = self.proj.weight.reshape(self.proj.out_channels, C * P * P)
        return self.norm(torch.nn.functional.linear(x, weight, self.proj.bias))  # [B, N, D]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--provider", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--batch-sizes", default="1,8,64")
    parser.add_argument("--min-seconds", type=float, default=1.0)
    args = parser.parse_args()
    torch.manual_seed(0)
    conv = PatchEmbed(224, 16, 3, 768).eval()
    gemm = GemmPatchEmbed(224, 16, 3, 768).eval()
    gemm.load_state_dict(conv.state_dict())
    x = torch.randn(2, 3, 224, 224)
    with tempfile.TemporaryDirectory() as tmp:
        sessions = {}
        for how, embed in (("conv", conv), ("gemm", gemm)):
            path = Path(tmp) / f"{how}.onnx"
            torch.onnx.export(embed, (x,), str(path), dynamo=True, input_names=["x"],
                              dynamic_shapes={"x": {0: torch.export.Dim("batch")}},
                              opset_version=18, verbose=False)
            sessions[how] = ort.InferenceSession(str(path),
                                                 providers=[PROVIDERS[args.provider]])
        ran = sessions["conv"].get_providers()[0]
        print(f"ViT-B/16 patch embedding on ONNX Runtime, {ran}; p50 ms, gemm's speedup")
        for batch in map(int, args.batch_sizes.split(",")):
            pixels = np.random.default_rng(batch).standard_normal(
                (batch, 3, 224, 224)).astype(np.float32)
            outs = {how: s.run(None, {"x": pixels})[0] for how, s in sessions.items()}
            diff = float(np.abs(outs["conv"] - outs["gemm"]).max())
            p50 = {how: float(np.median(seconds(lambda s=s, x=pixels: s.run(None, {"x": x}),
                                                warmup=3, min_runs=10,
                                                min_seconds=args.min_seconds))) * 1e3
                   for how, s in sessions.items()}
            print(f"  batch {batch:3d}: conv {p50['conv']:8.3f}  gemm {p50['gemm']:8.3f}  "
                  f"{p50['conv'] / p50['gemm']:.2f}x  (max abs diff {diff:.1e})")


if __name__ == "__main__":
    main()
