"""Each file read once per command, and hashed as it is read: infer opens model.onnx once
and never the files it does not run; export hashes each file it writes once, and its
validation loads those very bytes. The trust promise holds all along: a file is used only
as its sha256 in config.json covers it."""
from __future__ import annotations

import collections
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import DIGITS

from vit_export import bundle as B
from vit_export.errors import BundleError


def opened_files(args: list[str], cwd: Path, reads: bool = False) -> collections.Counter:
    """How many times `vit-export ARGS` opened each file (by name; with `reads`, for
    reading only), from strace's openat lines, or from Python's audit hook "open" where
    strace cannot run."""
    command = [sys.executable, "-m", "vit_export.cli", *args]
    if shutil.which("strace"):
        log = cwd / "strace.log"
        done = subprocess.run(["strace", "-f", "-qq", "-e", "trace=openat", "-o", str(log),
                               *command], check=False, capture_output=True, text=True,
                              cwd=cwd)
        if done.returncode == 0:
            lines = [x for x in log.read_text().splitlines() if " = -1 " not in x
                     and (not reads or "O_RDONLY" in x)]
            return collections.Counter(Path(x.split('"')[1]).name for x in lines if '"' in x)
    only_reads = "not set(str(a[1])) & set('wax+') and " if reads else ""
    hook = ("import sys, runpy\n"
            "sys.addaudithook(lambda e, a: e == 'open' and isinstance(a[0], str) and "
            + only_reads + "print('OPEN', a[0], file=sys.stderr))\n"
            "sys.argv = ['vit-export'] + sys.argv[1:]\n"
            "runpy.run_module('vit_export.cli', run_name='__main__')\n")
    done = subprocess.run([sys.executable, "-c", hook, *args], check=False,
                          capture_output=True, text=True, cwd=cwd)
    assert done.returncode == 0, done.stderr
    return collections.Counter(Path(x.split(" ", 1)[1]).name
                               for x in done.stderr.splitlines() if x.startswith("OPEN "))


def test_infer_opens_model_onnx_once_and_not_the_files_it_does_not_run(digits_bundle,
                                                                         tmp_path):
    """model.onnx reads its weights from weights.safetensors (its external data): each is
    opened once; model.ts, which infer does not run, never."""
    opened = opened_files(["infer", str(digits_bundle), str(DIGITS / "samples")], tmp_path)
    assert B.external_data(digits_bundle / B.ONNX_FILE) == [B.WEIGHTS_FILE]
    assert opened[B.ONNX_FILE] == 1 and opened[B.WEIGHTS_FILE] == 1, opened
    assert opened[B.TS_FILE] == 0, opened


def test_export_reads_each_file_it_writes_once(tmp_path):
    """export writes each file, then reads it back once: hashed for config.json as it is
    read, and those bytes are what validation loads (strace's openat lines, or Python's
    audit hook where strace cannot run)."""
    opened = opened_files(["export", "b", "--preset", "vit_seed_tiny", "--exporter",
                           "torchscript", "--quiet"], tmp_path, reads=True)
    listed = B.read_bundle(tmp_path / "b").hashes
    assert set(listed) >= {B.ONNX_FILE, B.TS_FILE, B.WEIGHTS_FILE}
    assert {name: opened[name] for name in listed} == {name: 1 for name in listed}


def test_a_file_swapped_after_export_is_refused_where_it_is_used(tiny_bundle, tmp_path):
    copy = shutil.copytree(tiny_bundle, tmp_path / "b")
    data = bytearray((copy / B.TS_FILE).read_bytes())
    data[len(data) // 2] ^= 0xFF
    (copy / B.TS_FILE).write_bytes(bytes(data))
    bundle = B.read_bundle(copy)  # the folder is sound; the file is checked as it is read
    with pytest.raises(BundleError, match=r"model\.ts does not match its sha256 in config\.json "
                                          r"\(truncated or modified\)"):
        bundle.read_file(B.TS_FILE)
    with pytest.raises(BundleError, match=r"model\.ts does not match its sha256"):
        B.read_bundle(copy).check_unread()


def test_the_bundle_and_image_readers_load_no_torch():
    """What reads a bundle's description and its files as bytes, and image files, imports
    no torch: a command that only reads (help, info) need not load it."""
    code = ("import sys, vit_export.bundle, vit_export.verified, vit_export.archives, "
            "vit_export.images; print('torch' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True,
                          text=True)
    assert done.stdout.strip() == "False"


@pytest.mark.slow  # ONNX Runtime's telemetry waits some seconds before it calls out
@pytest.mark.skipif(not shutil.which("strace"), reason="needs strace")
def test_loading_onnx_runtime_through_vit_export_touches_no_network(tmp_path):
    """onnxruntime-gpu looks up a Microsoft host about 9 s after it is imported (8 DNS
    packets, strace); through vit-export it makes no network call at all."""
    log = tmp_path / "strace.log"
    code = "import vit_export.cli, onnxruntime, time; time.sleep(14)"
    subprocess.run(["strace", "-f", "-qq", "-e", "trace=connect,sendto,sendmsg", "-o",
                    str(log), sys.executable, "-c", code], check=True, timeout=120)
    calls = [line for line in log.read_text().splitlines()
             if any(f"{name}(" in line for name in ("connect", "sendto", "sendmsg"))]
    assert calls == [], calls[:3]
