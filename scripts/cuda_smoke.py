"""The CUDA smoke test: what a user runs on a GPU machine, end to end, in one command.

    python scripts/cuda_smoke.py [--work out/cuda-smoke]

1. The shipped model (models/digits) and ViT-B/16 (the vit_base_patch16_224 preset, random
   weights) exported on CUDA with their optimized and fp16 models.
2. Both validated with `--provider cuda --require-provider cuda --trust-code`: every runner
   against eager PyTorch on the same GPU (the shipped model on its 360 held-out digits too).
3. `infer` on the shipped samples on CUDA, each sample's top-1 against its true digit.
4. A short `bench` of both on CUDA, batch 1 and 64.
5. `pytest -m cuda`: the tests that mean something only on a GPU.

Then one table of the proof: each runner, the device it ran on, its precision, its largest
absolute error against eager over everything validate ran, and its images/s at batch 64
with the images in host memory, as users' images are. Each command is printed before it
runs; the first that fails stops the smoke with exit 1. Without CUDA (ONNX Runtime's CUDA
provider does not load, or PyTorch sees no GPU) it exits 1 with one line saying why. The
bundles and the JSON reports stay in the work folder.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Optional

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
DIGITS = "models/digits"
PRESET = "vit_base_patch16_224"
BENCH_BATCHES = (1, 64)


def cuda_missing() -> Optional[str]:
    """Why CUDA does not run here, or None: ONNX Runtime's provider first (no torch needed to
    say a machine has no driver), then PyTorch's view of the GPU."""
    from vit_export import runtime

    problem = runtime.cuda_problem()
    if problem is None and not runtime.torch_cuda():
        problem = "PyTorch sees no CUDA device"
    return problem


def steps(work: Path) -> list[tuple[list[str], Optional[Path]]]:
    """The commands, in order, as a user types them (`vit-export ...`, `pytest ...`), each
    with the file its output goes to (None: the terminal)."""
    cuda = ["--provider", "cuda"]
    checked = [*cuda, "--require-provider", "cuda", "--trust-code"]
    out = []
    for name, source in (("digits", ["--from", DIGITS]), ("base", ["--preset", PRESET])):
        bundle = str(work / name)
        out.append((["vit-export", "export", bundle, *source, "--optimize", "--precision",
                     "fp16", *cuda, "--force"], None))
        data = ["--real-data", f"{DIGITS}/held_out.npz"] if name == "digits" else []
        out.append((["vit-export", "validate", bundle, *data, *checked,
                     "--report", str(work / f"{name}.validate.json")], None))
    out.append((["vit-export", "infer", str(work / "digits"), f"{DIGITS}/samples",
                 "--top-k", "1", *cuda, "--json"], work / "digits.infer.json"))
    for name in ("digits", "base"):
        out.append((["vit-export", "bench", str(work / name), *cuda, "--trust-code",
                     "--batch-sizes", ",".join(map(str, BENCH_BATCHES)), "--min-seconds",
                     "1", "--report", str(work / f"{name}.bench.json")], None))
    out.append((["pytest", "-m", "cuda", "-q", "-rs", "-p", "no:cacheprovider"], None))
    return out


def run(args: list[str], output: Optional[Path]) -> int:
    """One step from the checkout's root, with this checkout's vit_export; its stdout into
    `output` where one is given."""
    print("$ " + " ".join(args) + (f" > {output}" if output else ""), flush=True)
    program = {"vit-export": ["-m", "vit_export.cli"], "pytest": ["-m", "pytest"]}[args[0]]
    command = [sys.executable, *program, *args[1:]]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])}
    if output is None:
        return subprocess.run(command, cwd=ROOT, env=env, check=False).returncode
    with open(output, "w") as sink:
        return subprocess.run(command, cwd=ROOT, env=env, stdout=sink, check=False).returncode


def proof_table(validated: dict[str, dict], benched: dict[str, dict]) -> list[str]:
    """One line per model and runner: the device it ran on, its precision, its max abs error
    against eager (validate's results, every batch and input set), its img/s at the largest
    batch of BENCH_BATCHES with host input (bench's rows). `validated` and `benched` map a
    model's name to validate's and bench's --report."""
    batch = max(BENCH_BATCHES)
    rows = [("model", "runner", "device", "precision", "max abs vs eager",
             f"img/s, batch {batch}")]
    for name, result in benched.items():
        errors: dict[str, float] = {}
        for r in validated[name]["results"]:
            errors[r["candidate"]] = max(errors.get(r["candidate"], 0.0), r["max_abs"])
        for row in result["rows"]:
            if row["batch"] != batch or row["io"] != "host":
                continue
            error = "reference" if row["backend"] == "eager" else (
                f"{errors[row['backend']]:.2e}" if row["backend"] in errors else "not validated")
            rows.append((name, row["backend"], row["device"], row["precision"], error,
                         f"{row['images_per_s']:.1f}"))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows]


def top1_line(infer: dict) -> str:
    """How many samples infer classified as their true digit (`true_D_NNN.png`), and where."""
    right = sum(r["top"][0]["class"] == int(re.search(r"true_(\d)_", r["input"]).group(1))
                for r in infer["results"])
    return (f"infer on {infer['provider']}: {right} of {len(infer['results'])} samples "
            f"classified as their true digit")


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--work", type=Path, default=ROOT / "out" / "cuda-smoke",
                        help="where the bundles and reports go (default out/cuda-smoke)")
    work = parser.parse_args(argv).work.resolve()
    missing = cuda_missing()
    if missing:
        print(f"cuda_smoke: no CUDA on this machine: {missing}", file=sys.stderr)
        return 1
    work.mkdir(parents=True, exist_ok=True)
    for args, output in steps(work):
        code = run(args, output)
        if code != 0:
            print(f"cuda_smoke: FAILED: {args[0]} {args[1]} exited {code}", file=sys.stderr)
            return 1

    def report(name: str) -> dict:
        return json.loads((work / name).read_text())

    names = ("digits", "base")
    table = proof_table({n: report(f"{n}.validate.json") for n in names},
                        {n: report(f"{n}.bench.json") for n in names})
    print("\n".join(["", *table, "", top1_line(report("digits.infer.json"))]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
