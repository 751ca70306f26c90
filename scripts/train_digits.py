"""Train the ViT shipped in models/digits on scikit-learn's handwritten digits.

    python scripts/train_digits.py [--out models/digits] [--epochs 60] [--seed 0]

1,797 8x8 grayscale digits (load_digits), a seeded stratified 80/20 split; the held-out 20% is
never trained on and is saved as held_out.npz for validation, plus a few PNG samples. Takes
about 80 s on two CPU cores (97.5% held-out accuracy with seed 0, torch 2.14.1). Writes
config.json + weights.safetensors, the inputs of `vit-export export --from models/digits`.
`--describe-only` rewrites models/digits/config.json alone, as today's writer writes it,
around the weights already there (their sha256 unchanged).
"""
from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image

from vit_export import bundle as B
from vit_export.model import VisionTransformer, ViTConfig

CONFIG = ViTConfig(img_size=8, patch_size=2, in_chans=1, num_classes=10, embed_dim=64, depth=4,
                   num_heads=4, mlp_ratio=2.0, drop_rate=0.0, drop_path_rate=0.05)


def with_sources(prep: B.Preprocessing) -> B.Preprocessing:
    """The preprocessing the model was trained with, each value's source recorded: the
    digits' own size, the training split's statistics, and this script's choices."""
    return (prep.with_source("train_digits.py: the training pipeline")
            .with_source("train_digits.py: the digits are 8x8", ["img_size", "resize_size"])
            .with_source("train_digits.py: the training split's pixel statistics",
                         ["mean", "std"]))


def load_split(seed: int):
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    digits = load_digits()
    images = np.round(digits.images * (255 / 16)).astype(np.uint8)  # 0..16 -> 0..255
    return train_test_split(images, digits.target, test_size=0.2, random_state=seed,
                            stratify=digits.target)


def shift_augment(x: torch.Tensor, g: torch.Generator) -> torch.Tensor:
    """Random translation by up to one pixel in each direction (zero padding)."""
    padded = F.pad(x, (1, 1, 1, 1), value=float(x.min()))
    out = torch.empty_like(x)
    offsets = torch.randint(0, 3, (len(x), 2), generator=g)
    for i, (dy, dx) in enumerate(offsets.tolist()):
        out[i] = padded[i, :, dy:dy + 8, dx:dx + 8]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("models/digits"))
    parser.add_argument("--epochs", type=int, default=150)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--describe-only", action="store_true",
                        help="rewrite OUT/config.json alone, around the weights there")
    args = parser.parse_args()
    if args.describe_only:
        found = B.read_bundle(args.out)  # the weights checked against their sha256
        d = found.description
        description = B.Description(d.config, with_sources(d.preprocessing), labels=d.labels,
                                    name=d.name, extra=d.extra)
        B.write_config(args.out, description, files=[B.WEIGHTS_FILE])
        return

    torch.manual_seed(args.seed)
    torch.set_num_threads(2)
    g = torch.Generator().manual_seed(args.seed)
    train_x, test_x, train_y, test_y = load_split(args.seed)
    mean = float(train_x.mean() / 255)
    std = float(train_x.std() / 255)
    prep = with_sources(B.Preprocessing(img_size=8, resize_size=8, mean=(mean,), std=(std,),
                                        interpolation="bilinear"))

    def tensor(images):  # the same normalization that preprocessing.preprocess applies
        return (torch.from_numpy(images).float()[:, None] / 255 - mean) / std

    xtr, ytr = tensor(train_x), torch.from_numpy(train_y).long()
    xte, yte = tensor(test_x), torch.from_numpy(test_y).long()
    model = VisionTransformer(CONFIG)
    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-3, weight_decay=0.05)
    batch = 64
    steps = args.epochs * math.ceil(len(xtr) / batch)
    schedule = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=3e-3, total_steps=steps,
                                                   pct_start=0.1)
    start = time.time()
    for epoch in range(args.epochs):
        model.train()
        order = torch.randperm(len(xtr), generator=g)
        for i in range(0, len(xtr), batch):
            idx = order[i:i + batch]
            loss = F.cross_entropy(model(shift_augment(xtr[idx], g)), ytr[idx],
                                   label_smoothing=0.1)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            schedule.step()
        if (epoch + 1) % 25 == 0:
            model.eval()
            with torch.no_grad():
                acc = (model(xte).argmax(1) == yte).float().mean().item()
            print(f"epoch {epoch + 1}: loss {loss.item():.4f}, held-out accuracy {acc:.4f}, "
                  f"{time.time() - start:.0f}s")
    model.eval()
    with torch.no_grad():
        accuracy = (model(xte).argmax(1) == yte).float().mean().item()

    out = args.out
    description = B.Description(
        CONFIG, prep, labels=[str(i) for i in range(10)], name="vit_digits_8x8",
        extra={"training": {
            "script": "scripts/train_digits.py", "dataset": "sklearn.datasets.load_digits",
            "seed": args.seed, "epochs": args.epochs, "train_size": len(xtr),
            "held_out_size": len(xte), "held_out_accuracy": round(accuracy, 4),
            "held_out_file": "held_out.npz", "torch": torch.__version__}})
    out.mkdir(parents=True, exist_ok=True)
    B.write_weights(model, out / B.WEIGHTS_FILE)
    B.write_config(out, description, files=[B.WEIGHTS_FILE])
    np.savez_compressed(out / "held_out.npz", images=test_x, labels=test_y)
    samples = out / "samples"
    samples.mkdir(exist_ok=True)
    for old in samples.glob("*.png"):
        old.unlink()
    for i in range(8):  # the first eight held-out digits, true label in the name
        Image.fromarray(test_x[i], "L").save(samples / f"true_{test_y[i]}_{i:03d}.png")
    print(json.dumps({"held_out_accuracy": accuracy, "seconds": round(time.time() - start)}))


if __name__ == "__main__":
    main()
