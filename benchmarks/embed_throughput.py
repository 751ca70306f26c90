"""Batch embedding: `infer --ray --embed` on Ray Data against `infer --embed` in one process,
on the same few thousand JPEG files, in one run. Prints files/s for each and the ratio.

    python benchmarks/embed_throughput.py [--images 3000] [--preset vit_small_patch16_224]
        [--workers 2] [--batch-size 16]

The images are seeded crops of scikit-learn's two photos (320x240 JPEGs). The model is the
preset with random weights, exported with `--outputs embedding --normalize`. Both runs write
Parquet and must give the same embeddings (checked). Each command runs as a user runs it: a
fresh process, Ray started and stopped inside the Ray one, so its start-up is counted.
"""
from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from PIL import Image

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def write_images(folder: Path, count: int, seed: int = 0) -> list[Path]:
    from sklearn.datasets import load_sample_images

    rng = np.random.default_rng(seed)
    photos = [Image.fromarray(a) for a in load_sample_images().images]
    files = []
    for i in range(count):
        photo = photos[i % 2]
        x, y = int(rng.integers(0, photo.width - 320)), int(rng.integers(0, photo.height - 240))
        path = folder / f"{i:05d}.jpg"
        photo.crop((x, y, x + 320, y + 240)).save(path, quality=90)
        files.append(path)
    return files


def timed(args: list) -> float:
    start = time.perf_counter()
    done = subprocess.run([sys.executable, str(ROOT / "cli.py"), *map(str, args)],
                          capture_output=True, text=True, check=False)
    seconds = time.perf_counter() - start
    if done.returncode:
        raise SystemExit(f"{' '.join(map(str, args[:2]))} failed: {done.stderr.strip()}")
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--images", type=int, default=3000)
    parser.add_argument("--preset", default="vit_small_patch16_224")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=16)
    args = parser.parse_args()
    from vit_export.embeddings import read

    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        (tmp / "images").mkdir()
        write_images(tmp / "images", args.images)
        bundle = tmp / "bundle"
        timed(["export", bundle, "--preset", args.preset, "--outputs", "embedding",
               "--normalize", "--provider", "cpu", "--quiet"])
        single = timed(["infer", bundle, tmp / "images", "--embed", "--batch-size",
                        args.batch_size, "--output", tmp / "single.parquet"])
        ray = timed(["infer", bundle, tmp / "images", "--embed", "--ray", "--workers",
                     args.workers, "--batch-size", args.batch_size, "--output",
                     tmp / "ray.parquet"])
        names, a = read(tmp / "single.parquet")
        ray_names, b = read(tmp / "ray.parquet")
        assert names == ray_names, "the two runs named their inputs differently"
        diff = float(np.abs(a - b).max())
    print(f"{args.images} JPEG files (320x240), {args.preset} (random weights), embedding "
          f"{a.shape[1]} wide, batch {args.batch_size}")
    print("| run | seconds | files/s | ratio |")
    print("| --- | ---: | ---: | ---: |")
    print(f"| infer --embed (one process) | {single:.1f} | {args.images / single:.1f} | 1.00x |")
    print(f"| infer --ray --embed, {args.workers} worker(s) | {ray:.1f} | "
          f"{args.images / ray:.1f} | {single / ray:.2f}x |")
    print(f"largest difference between the two: {diff:.2e}")


if __name__ == "__main__":
    main()
