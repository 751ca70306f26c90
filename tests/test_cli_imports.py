"""The command line's help, every command's help and `info` load no torch: the group and
each command import what they run inside the command, and the names their flags show come
from modules that do not import torch."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DIGITS = ROOT / "models" / "digits"


def _torch_loaded(*args: str) -> list[str]:
    """The torch modules `python -X importtime -m vit_export.cli ARGS` imports."""
    done = subprocess.run([sys.executable, "-X", "importtime", "-m", "vit_export.cli", *args],
                          check=False, cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    return [line for line in done.stderr.splitlines()
            if line.startswith("import time:") and line.split("|")[-1].strip() == "torch"]


@pytest.mark.parametrize("args", [
    ("--help",), ("export", "--help"), ("bench", "--help"),
    ("info", str(DIGITS)),
])
def test_help_and_info_load_no_torch(args):
    assert _torch_loaded(*args) == []


def test_info_on_an_exported_bundle_loads_no_torch_and_counts_its_parameters(digits_bundle):
    from vit_export.bundle import read_description
    from vit_export.cli.cmd_export import count_params

    assert _torch_loaded("info", str(digits_bundle)) == []  # parity.json read too
    done = subprocess.run([sys.executable, "-m", "vit_export.cli", "info", str(digits_bundle)],
                          check=True, cwd=ROOT, capture_output=True, text=True)
    params = count_params(read_description(digits_bundle).config)  # built on the meta device
    assert f", params {params:,}\n" in done.stdout
    assert "parity at export: PASS" in done.stdout
