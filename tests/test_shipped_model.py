"""The model shipped in models/digits: the README's main job runs on it."""
import json
import re
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from vit_export import bundle as B
from vit_export.cli import cli
from vit_export.images import load_labelled_npz

DIGITS = Path(__file__).resolve().parent.parent / "models" / "digits"


def test_shipped_model_is_small_and_reaches_its_recorded_accuracy():
    size = sum(p.stat().st_size for p in DIGITS.rglob("*") if p.is_file())
    assert size < 5e6
    found = B.read_bundle(DIGITS)
    training = found.description.extra["training"]
    x, labels = load_labelled_npz(DIGITS / training["held_out_file"],
                                  found.description.preprocessing)
    assert len(x) == training["held_out_size"] == 360
    with torch.no_grad():
        predicted = B.load_eager(found)(torch.from_numpy(x)).argmax(1).numpy()
    accuracy = float((predicted == labels).mean())
    assert accuracy == pytest.approx(training["held_out_accuracy"], abs=1e-4)
    assert accuracy >= 0.95


def test_main_job_export_validate_infer(tmp_path):
    runner = CliRunner()
    out_dir = tmp_path / "digits"
    held_out = DIGITS / "held_out.npz"
    result = runner.invoke(cli, ["export", str(out_dir), "--from", str(DIGITS),
                                 "--real-data", str(held_out)])
    assert result.exit_code == 0, result.output
    report_file = tmp_path / "report.json"
    result = runner.invoke(cli, ["validate", str(out_dir), "--real-data", str(held_out),
                                 "--report", str(report_file)])
    assert result.exit_code == 0, result.output
    assert "accuracy on held_out (360 labelled): eager 97.50%, onnxruntime 97.50%" in result.output
    report = json.loads(report_file.read_text())
    real = [r for r in report["results"] if r["inputs"] == "held_out"]
    assert {r["candidate"] for r in real} == {"onnxruntime"}  # model.ts: only when trusted
    assert "note: model.ts not run: a file that can carry code runs only with --trust-code" \
        in result.output
    assert all(r["top1"] == 1.0 and r["max_abs"] <= 1e-4 for r in real)
    result = runner.invoke(cli, ["infer", str(out_dir), str(DIGITS / "samples"), "--top-k", "1",
                                 "--json"])
    assert result.exit_code == 0
    results = json.loads(result.output)["results"]
    assert len(results) == 8
    for r in results:
        true = re.search(r"true_(\d)_", r["input"]).group(1)
        assert r["top"][0]["label"] == true, r


@pytest.mark.slow  # .ci/run's parity gate exports and validates the same int8 model too
def test_int8_and_optimized_models_agree_on_held_out_digits(tmp_path):
    out_dir = tmp_path / "digits"
    result = CliRunner().invoke(cli, [
        "export", str(out_dir), "--from", str(DIGITS), "--optimize", "--quantize", "int8",
        "--real-data", str(DIGITS / "held_out.npz"), "--batch-sizes", "1,3"])
    assert result.exit_code == 0, result.output
    report = json.loads((out_dir / "parity.json").read_text())
    real = {r["candidate"]: r for r in report["results"] if r["inputs"] == "held_out"}
    int8 = real["onnxruntime[model.int8.onnx]"]
    assert int8["profile"] == "int8" and int8["batch"] == 360
    assert int8["top1"] >= 0.99 and int8["accuracy"] >= 0.95
    optimized = real["onnxruntime[model.opt.onnx]"]
    assert optimized["profile"] == "fp32" and optimized["top1"] == 1.0
