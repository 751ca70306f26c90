"""scripts/cuda_smoke.py where no GPU is: it says so in one line, every command it would run
parses as the CLI and pytest take it, and its table reads the reports validate and bench
write. On a GPU machine it runs as a user runs it: `python scripts/cuda_smoke.py`."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import click

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "cuda_smoke.py"
sys.path.insert(0, str(ROOT / "scripts"))
try:
    import cuda_smoke
finally:
    sys.path.remove(str(ROOT / "scripts"))


def test_without_a_gpu_it_exits_1_in_one_line_before_any_work(tmp_path):
    """No GPU visible (on a GPU machine too, with CUDA_VISIBLE_DEVICES empty): one line on
    stderr naming why, nothing on stdout, no work folder."""
    work = tmp_path / "work"
    done = subprocess.run([sys.executable, str(SCRIPT), "--work", str(work)],
                          env={**os.environ, "CUDA_VISIBLE_DEVICES": ""},
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 1 and done.stdout == ""
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("cuda_smoke: no CUDA on this machine: ")
    assert len(lines[0]) > len("cuda_smoke: no CUDA on this machine: ") + 10  # the reason
    assert not work.exists()


def test_every_command_of_the_smoke_parses(tmp_path, pytestconfig):
    """Each `vit-export` step as the CLI parses it (a renamed flag or value raises), in
    order: export before validate, infer and bench; its pytest step selects the registered
    `cuda` mark."""
    from vit_export.cli import cli

    top = click.Context(cli, info_name="vit-export", **cli.context_settings)
    commands = []
    for args, _ in cuda_smoke.steps(tmp_path):
        if args[0] == "vit-export":
            cli.commands[args[1]].make_context(args[1], args[2:], parent=top)
            assert args[args.index("--provider") + 1] == "cuda", args
        commands.append(args[1] if args[0] == "vit-export" else args[0])
    assert commands == ["export", "validate", "export", "validate", "infer", "bench", "bench",
                        "pytest"]
    pytest_args = cuda_smoke.steps(tmp_path)[-1][0]
    mark = pytest_args[pytest_args.index("-m") + 1]
    assert any(line.startswith(f"{mark}:") for line in pytestconfig.getini("markers"))


def test_the_proof_table_holds_each_runner_at_the_largest_batch_with_its_error():
    """Made-up reports in validate's and bench's --report shapes: the max abs error is each
    runner's largest over validate's results; eager is the reference; a runner bench timed
    that validate did not run says so; device input and smaller batches are left out."""
    validated = {"digits": {"results": [
        {"candidate": "onnxruntime", "max_abs": 2e-6},
        {"candidate": "onnxruntime", "max_abs": 3.1e-6},
        {"candidate": "onnxruntime[model.fp16.onnx]", "max_abs": 6.4e-3}]}}

    def row(backend, batch, io, images_per_s, precision="fp32"):
        return dict(backend=backend, batch=batch, io=io, device="cuda",
                    images_per_s=images_per_s, precision=precision)

    benched = {"digits": {"rows": [
        row("eager", 1, "host", 10.0), row("eager", 64, "host", 500.0),
        row("onnxruntime", 64, "host", 2000.0), row("onnxruntime", 64, "device", 9999.0),
        row("onnxruntime[model.fp16.onnx]", 64, "host", 4000.0, "fp16"),
        row("torchscript", 64, "host", 700.0)]}}
    assert cuda_smoke.proof_table(validated, benched) == [
        ("model   runner                        device  precision  max abs vs eager  "
         "img/s, batch 64"),
        "digits  eager                         cuda    fp32       reference         500.0",
        "digits  onnxruntime                   cuda    fp32       3.10e-06          2000.0",
        "digits  onnxruntime[model.fp16.onnx]  cuda    fp16       6.40e-03          4000.0",
        "digits  torchscript                   cuda    fp32       not validated     700.0"]
