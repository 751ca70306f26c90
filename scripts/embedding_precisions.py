"""Measure how reduced precisions move an embedding: CLIP with its projection,
SigLIP and DINOv2 from Hugging Face folders with their own processors (random weights at
order 1, tests/families.py), exported with every variant (fp16, dynamic int8, static int8
calibrated on photos, OpenVINO bf16), each validated against eager on real photos: the two
scikit-learn photos and seeded crops of them (some grayscale, some RGBA). Prints, per model
and variant, the lowest cosine and the top-10 neighbour agreement (raw, and with near-ties
excused) from `vit-export validate --images ... --report`; and for the patch tokens
(exported beside the embedding), the lowest cosine of any one token.

    python scripts/embedding_precisions.py [--crops 318] [--width 96] [--grid 3]
"""
import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
from PIL import Image

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]
import families

MODELS = ("CLIPVisionModelWithProjection", "SiglipVisionModel", "Dinov2Model")


def photos(folder: Path, crops: int, seed: int = 0) -> Path:
    """The two photos and `crops` seeded crops of them, every 5th grayscale, every 7th RGBA
    with a transparent band."""
    from sklearn.datasets import load_sample_images

    rng = np.random.default_rng(seed)
    sources = [Image.fromarray(a) for a in load_sample_images().images]
    folder.mkdir(parents=True, exist_ok=True)
    for i, image in enumerate(sources):
        image.save(folder / f"photo{i}.png")
    for i in range(crops):
        image = sources[i % 2]
        w, h = image.size
        cw, ch = int(w * rng.uniform(0.15, 0.9)), int(h * rng.uniform(0.15, 0.9))
        x, y = int(rng.integers(0, w - cw)), int(rng.integers(0, h - ch))
        crop = image.crop((x, y, x + cw, y + ch))
        if i % 5 == 0:
            crop = crop.convert("L")
        elif i % 7 == 0:
            alpha = np.full((ch, cw), 255, np.uint8)
            alpha[:, : cw // 4] = 0
            crop = crop.copy()
            crop.putalpha(Image.fromarray(alpha))
        crop.save(folder / f"crop{i:04d}.png")
    return folder


def processor(name: str, side: int):
    import transformers

    if name.startswith("CLIP"):
        return transformers.CLIPImageProcessorPil(size={"shortest_edge": side},
                                                 crop_size={"height": side, "width": side})
    if name.startswith("Siglip"):
        return transformers.SiglipImageProcessorPil(size={"height": side, "width": side})
    return transformers.BitImageProcessorPil(size={"shortest_edge": side + 6},
                                             crop_size={"height": side, "width": side})


def cli(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ROOT / "cli.py"), *map(str, args)],
                          capture_output=True, text=True, check=False)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--crops", type=int, default=318)
    parser.add_argument("--width", type=int, default=families.EMBED)
    parser.add_argument("--grid", type=int, default=3)
    args = parser.parse_args()
    families.EMBED = args.width
    side = args.grid * families.HF_PATCH
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        images = photos(tmp / "photos", args.crops)
        for name in MODELS:
            peer = families.tiny_hf(name, grid=args.grid)
            folder = families.save_hf(peer, tmp / name, processor(name, side))
            for variant, extra in (("fp16+int8", ["--precision", "fp16", "--quantize", "int8",
                                                  "--embed-preprocessing"]),
                                   ("static", ["--quantize", "static", "--calibrate", images])):
                out = tmp / f"{name}-{variant}"
                done = cli("export", out, "--checkpoint", folder, "--provider", "cpu",
                           "--outputs", "embedding,tokens", "--openvino", "--quiet", *extra)
                if done.returncode:
                    rows.append((name, variant, "export failed", done.stderr.strip()[-300:]))
                    continue
                report = tmp / f"{name}-{variant}.json"
                done = cli("validate", out, "--images", images, "--openvino", "--provider",
                           "cpu", "--report", report, "--quiet")
                if not report.is_file():
                    rows.append((name, variant, "validate failed", done.stderr.strip()[-300:]))
                    continue
                for r in json.loads(report.read_text())["results"]:
                    if r["inputs"].startswith(("random", "pictures")):  # neighbours: photos
                        continue
                    if variant == "static" and "int8-static" not in r["candidate"]:
                        continue  # the fp32 runners: already in the first export's rows
                    agree = [f"{r[k]:.4f}" if r[k] is not None else "-"
                             for k in ("top1", "top1_decisive")]
                    rows.append((name, r["candidate"], r["profile"], r["output"],
                                 r["inputs"], f"{r['cosine']:.6f}", *agree, r["batch"],
                                 "ok" if r["passed"] else "; ".join(r["failures"])))
    print(f"{args.crops + 2} photos, width {args.width}, depth 2, "
          f"{side}x{side} input; random weights")
    print("| model | runner | profile | output | inputs | min cosine (per token for tokens) "
          "| nn@10 | nn@10 (ties excused) | images | result |")
    print("| --- | --- | --- | --- | --- | ---: | ---: | ---: | ---: | --- |")
    for row in rows:
        print("| " + " | ".join(map(str, row)) + " |")


if __name__ == "__main__":
    main()
