"""Batch inference across Ray nodes: images/s of `infer --ray --address` on a cluster of
1, 2 and 3 worker nodes, each with its share of the cores, one worker per node. Writes a
JSON result (--out): the machine, the date, and for each node count the images/s and the
efficiency per worker (images/s per worker over the one-node figure).

    python benchmarks/cluster_scaling.py --out cluster-scaling.json [--images 3000]
        [--nodes 1,2,3] [--cpus-per-node 1] [--batch-size 64] [--repeats 3]
        [--preset vit_small_patch16_224]

The cluster is Ray's own (`ray.cluster_utils.Cluster`): a head node of no CPUs (the driver
joins it) and worker nodes started as Ray starts a node, all on this machine, so the figures
say how the work spreads over nodes and what each node's share of the run costs, not what a
network between machines adds. Nodes on one machine share its cores: give each node a
share that does not overlap (--cpus-per-node times the largest node count at most the
cores), and run it on a machine that runs nothing else. The model is the shipped digits
model (8x8 PNG digits), or with --preset that preset with random weights on 320x240 JPEG
crops of scikit-learn's photos. Each run is the command as a user runs it, in a process of
its own: its images/s is the one the command reports (Ray Data from the first input to the
last record), its wall time is the whole process's. Every run's records must equal the first
run's (checked).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def cpu_model() -> str:
    """The CPU's model name, as /proc/cpuinfo gives it (elsewhere: platform's word)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def write_digits(folder: Path, count: int) -> None:
    """`count` PNG files of the 360 held-out digits, repeated."""
    import numpy as np
    from PIL import Image

    with np.load(ROOT / "models" / "digits" / "held_out.npz") as data:
        images = data["images"]
    for i in range(count):
        Image.fromarray(images[i % len(images)]).save(folder / f"{i:05d}.png")


def prepare(work: Path, preset: str | None, images: int) -> tuple[Path, Path]:
    """The bundle and the folder of images the runs classify."""
    bundle, folder = work / "bundle", work / "images"
    folder.mkdir()
    source = ["--preset", preset] if preset else ["--from", ROOT / "models" / "digits"]
    command(["export", bundle, *source, "--provider", "cpu", "--quiet"])
    if preset:
        sys.path.insert(0, str(ROOT / "benchmarks"))
        from embed_throughput import write_images

        write_images(folder, images)
    else:
        write_digits(folder, images)
    return bundle, folder


def command(args: list) -> tuple[str, float]:
    """The CLI in a process of its own: (stdout, wall seconds), or exit with its error."""
    start = time.perf_counter()
    done = subprocess.run([sys.executable, str(ROOT / "cli.py"), *map(str, args)],
                          capture_output=True, text=True, check=False)
    seconds = time.perf_counter() - start
    if done.returncode:
        raise SystemExit(f"vit-export {args[0]} failed: {done.stderr.strip()}")
    return done.stdout, seconds


def on_nodes(nodes: int, cpus: float, bundle: Path, folder: Path, args, work: Path
             ) -> dict:
    """The runs on a cluster of `nodes` worker nodes: the best images/s of --repeats."""
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0})
    try:
        for _ in range(nodes):
            cluster.add_node(num_cpus=cpus)
        cluster.wait_for_nodes(timeout=300)
        runs = []
        for repeat in range(args.repeats):
            out = work / f"{nodes}-nodes-{repeat}.jsonl"
            stdout, wall = command(["infer", bundle, folder, "--ray", "--address",
                                    cluster.address, "--workers", nodes, "--batch-size",
                                    args.batch_size, "--output", out])
            rate = re.search(r"([\d.]+) files/s", stdout)
            runs.append({"images_per_s": float(rate.group(1)) if rate else 0.0,
                         "wall_s": round(wall, 2), "records": out})
    finally:
        cluster.shutdown()
    best = max(runs, key=lambda run: run["images_per_s"])
    return {"nodes": nodes, "workers": nodes, "cpus_per_node": cpus,
            "images_per_s": best["images_per_s"], "wall_s": best["wall_s"],
            "runs_images_per_s": [run["images_per_s"] for run in runs],
            "records": [run["records"] for run in runs]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="the JSON result to write")
    parser.add_argument("--images", type=int, default=3000)
    parser.add_argument("--nodes", default="1,2,3", help="node counts, comma-separated")
    parser.add_argument("--cpus-per-node", type=float, default=1.0)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--preset", help="a preset with random weights [default: the "
                        "shipped digits model]")
    args = parser.parse_args()
    counts = [int(n) for n in args.nodes.split(",")]
    if max(counts) * args.cpus_per_node > (os.cpu_count() or 1):
        print(f"note: {max(counts)} nodes of {args.cpus_per_node:g} CPUs share "
              f"{os.cpu_count()} cores: the larger clusters' figures are of shared cores",
              file=sys.stderr)
    with tempfile.TemporaryDirectory(prefix="cluster-scaling-") as tmp:
        work = Path(tmp)
        bundle, folder = prepare(work, args.preset, args.images)
        rows = [on_nodes(n, args.cpus_per_node, bundle, folder, args, work) for n in counts]
        check_same(rows)
    write_result(args, counts, rows)


def check_same(rows: list[dict]) -> None:
    """Every run's records are the first run's, byte for byte; then the paths go."""
    first = rows[0]["records"][0].read_bytes()
    for row in rows:
        for path in row.pop("records"):
            if path.read_bytes() != first:
                raise SystemExit(f"{path.name}: the records differ from the first run's")


def write_result(args, counts: list[int], rows: list[dict]) -> None:
    one = next((row["images_per_s"] for row in rows if row["nodes"] == 1), None)
    for row in rows:  # images/s per worker over one worker's
        row["efficiency_per_worker"] = round(row["images_per_s"] / (row["workers"] * one), 3) \
            if one else None
    result = {"benchmark": "cluster_scaling",
              "machine": {"cpu": cpu_model(), "cores": os.cpu_count(),
                          "python": platform.python_version()},
              "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
              "model": args.preset or "digits", "images": args.images,
              "batch_size": args.batch_size, "repeats": args.repeats,
              "cpus_per_node": args.cpus_per_node, "node_counts": counts, "results": rows}
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    for row in rows:
        print(f"{row['nodes']} node(s): {row['images_per_s']:.1f} images/s, efficiency per "
              f"worker {row['efficiency_per_worker']}")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
