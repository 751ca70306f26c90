"""What an export costs a user, against optimum-onnx's on the same checkpoint: wall and CPU
seconds, peak memory and the size of what is written.

    python benchmarks/export_cost.py --optimum-python VENV/bin/python [--rounds 2]
                                     [--models vit_b16,dinov2_s14] [--out FILE.json]

Each model is a real-size transformers folder with random weights (ViT-B/16
`ViTForImageClassification`, DINOv2-S/14 `Dinov2Model`) and the image processor its Hub
folders ship, saved once. `vit-export export OUT
--checkpoint DIR` (its whole proof: three batch sizes on every artifact, the graph scan,
the source rows), the same with `--exporter torchscript`, and `optimum-cli export onnx --model DIR OUT` (run by `--optimum-python`, a
venv where optimum-onnx and the transformers it supports are installed; it validates its
ONNX against transformers at one batch) run alternately, each under /usr/bin/time, `--rounds`
times; the table gives each one's median and the ratio ours / optimum's of the same run.
vit-export runs with `--progress`, and its row keeps where the time went (`steps`: each
step's seconds, from the round nearest the median; the validation steps per runner; what
precedes the first step is Python's start and the imports). Writes the rows as JSON to
`--out` (with the CPU, the date and the versions).
"""
import argparse
import itertools
import json
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "scripts"), str(ROOT / "docs" / "hooks")]
from charts import export_table, steps_table  # the tables the benchmarks page draws
from coverage_table import cpu_name  # the CPU with its family and model numbers

MODELS = {
    "vit_b16": ("ViT-B/16", "ViTForImageClassification", "ViTConfig", {},
                "image-classification"),
    "dinov2_s14": ("DINOv2-S/14", "Dinov2Model", "Dinov2Config",
                   dict(hidden_size=384, num_attention_heads=6, image_size=518),
                   "feature-extraction"),
}


def make_folder(key: str, folder: Path) -> None:
    import torch
    import transformers

    _, cls, config, values, _ = MODELS[key]
    torch.manual_seed(0)
    model = getattr(transformers, cls)(getattr(transformers, config)(**values))
    model.save_pretrained(folder)
    # the processor the Hub's folders ship (optimum reads it for DINOv2's dummy inputs)
    processor = transformers.ViTImageProcessor() if key == "vit_b16" else \
        transformers.BitImageProcessor(size={"shortest_edge": 256},
                                       crop_size={"height": 224, "width": 224},
                                       image_mean=[0.485, 0.456, 0.406],
                                       image_std=[0.229, 0.224, 0.225])
    processor.save_pretrained(folder)


def timed(command: list[str]) -> dict:
    """Wall and CPU seconds and peak RSS of `command`, as /usr/bin/time measures them."""
    with tempfile.NamedTemporaryFile("r", suffix=".time") as report:
        start = time.perf_counter()
        done = subprocess.run(["/usr/bin/time", "-f", "%U %S %M", "-o", report.name, *command],
                              capture_output=True, text=True, check=False)
        wall = time.perf_counter() - start
        if done.returncode != 0:
            raise SystemExit(f"{' '.join(command)} failed:\n{done.stderr[-2000:]}")
        user, system, rss_kb = report.read().split()[-3:]
    return {"wall_s": wall, "cpu_s": float(user) + float(system),
            "peak_rss_mb": int(rss_kb) / 1024, "stderr": done.stderr}


STEP = re.compile(r"^\[\s*([0-9.]+)s\] (.+)$", re.MULTILINE)


def steps(stderr: str, wall: float) -> list[dict]:
    """Seconds per step of `export --progress`: a step lasts until the next one starts, the
    runs of one runner are one validation step, and what the clock did not see (Python's
    start and imports before the first step, the exit after the last) is the first row."""
    marks = [(float(t), re.sub(r"^running (\S+) on .*", r"validation: \1", text))
             for t, text in STEP.findall(stderr)]
    if not marks or marks[-1][1] != "done":
        raise SystemExit("export --progress printed no steps ending in 'done'")
    rows = [{"step": "Python's start, imports and exit", "s": wall - marks[-1][0]}]
    for (start, text), (end, _) in itertools.pairwise(marks):
        if rows[-1]["step"] == text:
            rows[-1]["s"] += end - start
        else:
            rows.append({"step": text, "s": end - start})
    return rows


def folder_mb(folder: Path) -> float:
    return sum(f.stat().st_size for f in folder.rglob("*") if f.is_file()) / 1e6


TOOLS = ("vit-export", "vit-export --exporter torchscript", "optimum-onnx")


def run_once(tool: str, key: str, checkpoint: Path, out: Path, optimum_python: str) -> dict:
    if tool.startswith("vit-export"):
        command = [sys.executable, "-m", "vit_export.cli", "export", str(out), "--checkpoint",
                   str(checkpoint), "--force", "--progress", *tool.split()[1:]]
    else:
        command = [optimum_python, "-m", "optimum.exporters.onnx", "--model", str(checkpoint),
                   "--task", MODELS[key][4], str(out)]
    row = timed(command)
    stderr = row.pop("stderr")
    if tool.startswith("vit-export"):
        row["steps"] = steps(stderr, row["wall_s"])
    return {**row, "folder_mb": folder_mb(out),
            "files": sorted(f.name for f in out.iterdir() if f.is_file())}


def versions(optimum_python: str) -> dict:
    import onnxruntime
    import torch
    import transformers

    import vit_export

    probe = ("import importlib.metadata as m; "
             "print(m.version('optimum-onnx'), m.version('transformers'), m.version('torch'))")
    theirs = subprocess.run([optimum_python, "-c", probe], capture_output=True, text=True,
                            check=True).stdout.split()
    return {"vit-export": vit_export.__version__, "torch": torch.__version__,
            "transformers": transformers.__version__, "onnxruntime": onnxruntime.__version__,
            "optimum-onnx": theirs[0], "optimum's transformers": theirs[1],
            "optimum's torch": theirs[2]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--optimum-python", required=True)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--tools", default=",".join(TOOLS),
                        help=f"of {', '.join(TOOLS)}; comma-separated")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for key in args.models.split(","):
            checkpoint = Path(tmp) / key
            make_folder(key, checkpoint)
            runs = {tool: [] for tool in args.tools.split(",")}
            for _ in range(args.rounds):  # alternately: a busy spell slows all alike
                for i, (tool, found) in enumerate(runs.items()):
                    out = Path(tmp) / f"{key}-{i}"
                    found.append(run_once(tool, key, checkpoint, out, args.optimum_python))
                    shutil.rmtree(out)  # not timed: each run writes into a new folder
            for tool, found in runs.items():
                row = {"model": MODELS[key][0], "tool": tool, "rounds": len(found),
                       "files": found[-1]["files"]}
                row.update({k: statistics.median(r[k] for r in found)
                            for k in ("wall_s", "cpu_s", "peak_rss_mb", "folder_mb")})
                if tool.startswith("vit-export"):  # the round whose wall time is nearest the median
                    near = min(found, key=lambda r: abs(r["wall_s"] - row["wall_s"]))
                    row["steps"] = near["steps"]
                rows.append(row)
    result = {"machine": cpu_name(), "date": time.strftime("%Y-%m-%d"),
              "versions": versions(args.optimum_python), "rows": rows}
    print(f"{result['machine']}, {result['date']}\n")
    print(export_table(result))
    print()
    print(steps_table(result))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
