"""Fail closed: signals, a full disk, unwritable folders, and outputs that would overwrite
inputs. Each test asserts the exit code, the one error line, and the exact state of the disk
afterwards. Signals and disks are real: a subprocess is killed at a step it announced on
stderr (--progress), and a small tmpfs is mounted where this machine allows it (root)."""
import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from conftest import default_sigint, one_line, run

ROOT = Path(__file__).resolve().parent.parent




def tree(path: Path) -> dict[str, bytes]:
    """Every file under `path` (hidden ones too) with its bytes: the exact state of a disk."""
    return {str(p.relative_to(path)): p.read_bytes() for p in sorted(path.rglob("*"))
            if p.is_file()}


# One export per case, each a few seconds: one in the quick run (SIGINT, which a background
# test run must restore for its child), the whole matrix with --run-slow.
@pytest.mark.parametrize("sig,step", [
    pytest.param(signal.SIGTERM, "writing weights", marks=pytest.mark.slow),
    pytest.param(signal.SIGTERM, "exporting ONNX", marks=pytest.mark.slow),
    pytest.param(signal.SIGTERM, "validating against eager PyTorch", marks=pytest.mark.slow),
    pytest.param(signal.SIGINT, "tracing TorchScript", marks=pytest.mark.slow),
    pytest.param(signal.SIGINT, "running onnxruntime", marks=pytest.mark.slow),
])
def test_signal_during_export_leaves_the_old_bundle_exactly(tiny_bundle, tmp_path, sig, step):
    out = tmp_path / "b"
    shutil.copytree(tiny_bundle, out)
    before = tree(tmp_path)
    proc = subprocess.Popen(
        [sys.executable, "cli.py", "export", str(out), "--preset", "vit_seed_tiny", "--force",
         "--progress", "--batch-sizes", "1,3,7,9"], cwd=ROOT, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True, preexec_fn=default_sigint)  # noqa: PLW1509
    lines = []
    for line in proc.stderr:
        lines.append(line)
        if step in line:
            proc.send_signal(sig)
            break
    rest = proc.stderr.read()
    code = proc.wait(timeout=120)
    errors = [line for line in lines + rest.splitlines() if not line.startswith("[")]
    assert code == 128 + sig, (lines, rest)
    assert [line.strip() for line in errors if line.strip()] == [
        (f"Error: {'interrupted by SIGINT' if sig == signal.SIGINT else 'stopped by SIGTERM'}"
        f"; nothing half-written was left")]
    assert tree(tmp_path) == before  # no .vx-partial-*, no .vx-old-*, the old bundle as it was


@pytest.fixture
def small_disk(tmp_path):
    """A real tmpfs of 600 KiB: a tiny bundle (about 1.3 MB) cannot fit."""
    mount = tmp_path / "disk"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=600k", "tmpfs", str(mount)],
                          capture_output=True, check=False)
    if done.returncode != 0:
        pytest.skip("cannot mount a tmpfs here (not root)")
    yield mount
    subprocess.run(["umount", str(mount)], check=True)


def test_full_disk_during_export_names_it_and_leaves_nothing(small_disk):
    code, out, err = run("export", small_disk / "b", "--preset", "vit_seed_tiny",
                         "--batch-sizes", "1")
    assert code == 1 and out == ""
    line = one_line(err)
    assert line.startswith("Error: No space left on device"), line
    assert list(small_disk.iterdir()) == []


def test_full_disk_for_a_report_keeps_the_old_report(tiny_bundle, small_disk):
    report = small_disk / "parity.json"
    report.write_text("old report")
    (small_disk / "filler").write_bytes(b"\0" * (600 * 1024 - 8192))
    code, _, err = run("validate", tiny_bundle, "--batch-sizes", "1", "--report", report,
                       "--layers")
    assert code == 1 and one_line(err).startswith("Error: No space left on device")
    assert report.read_text() == "old report"
    assert sorted(p.name for p in small_disk.iterdir()) == ["filler", "parity.json"]


def test_read_only_folder(small_disk):
    subprocess.run(["mount", "-o", "remount,ro", str(small_disk)], check=True)
    code, out, err = run("export", small_disk / "b", "--preset", "vit_seed_tiny")
    assert code == 1 and out == ""
    assert one_line(err) == f"Error: cannot write in {small_disk}: Read-only file system"
    assert list(small_disk.iterdir()) == []


# ---------------------------------------------------------------- never lose a user's file


@pytest.mark.parametrize("option", ["--report", "--junit", "--markdown"])
def test_report_path_inside_the_bundle_is_refused_before_any_work(tiny_bundle, tmp_path, option):
    copy = tmp_path / "b"
    shutil.copytree(tiny_bundle, copy)
    before = tree(tmp_path)
    code, out, err = run("validate", copy, option, copy / "config.json")
    assert code == 2 and out == ""
    assert f"{option} {copy / 'config.json'} would overwrite {copy}" in one_line(err)
    assert tree(tmp_path) == before


def test_report_path_that_is_the_real_data_file_is_refused(tiny_bundle, tmp_path):
    data = tmp_path / "held.npz"
    data.write_bytes(b"not touched")
    code, _, err = run("validate", tiny_bundle, "--real-data", data, "--junit", data)
    assert code == 2 and "would overwrite" in one_line(err)
    assert data.read_bytes() == b"not touched"


@pytest.mark.parametrize("where", ["same", "inside", "contains"])
def test_export_onto_its_own_source_is_refused(tiny_bundle, tmp_path, where):
    source = tmp_path / "src" / "model"
    shutil.copytree(tiny_bundle, source)
    (source / "notes.txt").write_text("mine")
    out = {"same": source, "inside": source / "out", "contains": tmp_path / "src"}[where]
    before = tree(tmp_path)
    code, _, err = run("export", out, "--from", source, "--force")
    assert code == 2 and "would overwrite" in one_line(err)
    assert tree(tmp_path) == before


def test_a_file_a_bundle_links_to_is_read_and_never_overwritten(tiny_bundle, tmp_path):
    """A bundle file may be a symlink to a file elsewhere (a shared store); what it points
    to is read as the bundle is, so a report, a plot or a Triton repository over it is
    refused before any work, as one over the bundle's own folder is."""
    store, linked = tmp_path / "store", tmp_path / "linked"
    store.mkdir()
    shutil.copytree(tiny_bundle, linked)
    (linked / "weights.safetensors").rename(store / "weights.safetensors")
    (linked / "weights.safetensors").symlink_to(store / "weights.safetensors")
    before = tree(tmp_path)
    for args in (("validate", linked, "--report", store / "weights.safetensors"),
                 ("validate", linked, "--report", linked / "weights.safetensors"),
                 ("bench", linked, "--plot", store / "weights.safetensors"),
                 ("triton", linked, store, "--force")):
        code, out, err = run(*args)
        assert (code, out) == (2, ""), (args, err)
        assert f"would overwrite {linked}, which this command reads" in one_line(err), args
    assert tree(tmp_path) == before


def test_the_overwrite_rule_reads_paths_as_the_system_does(tiny_bundle, tmp_path):
    """Links are followed where a reader follows them: a bundle's files wherever they point,
    and an output's "link/.." after the link (a path collapsed first named another file).
    An image folder's stray links (a loop, a link to a folder above) refuse nothing."""
    from vit_export import bundle as B
    from vit_export.errors import OptionError

    bundle = tmp_path / "s" / "real" / "b"
    shutil.copytree(tiny_bundle, bundle)
    (tmp_path / "lnk").symlink_to(tmp_path / "s" / "real" / "x", target_is_directory=True)
    (tmp_path / "s" / "real" / "x").mkdir()
    sneaky = tmp_path / "lnk" / ".." / "b" / "weights.safetensors"  # s/real/b's own file
    with pytest.raises(OptionError, match=r"would overwrite .*/b, which this command reads$"):
        B.refuse_overwriting({"--report": sneaky}, [bundle])
    images = tmp_path / "images"
    images.mkdir()
    (images / "loop").symlink_to(images / "loop")
    (images / "up").symlink_to(tmp_path, target_is_directory=True)
    B.refuse_overwriting({"--output": tmp_path / "out.npy"}, [images])


def test_a_bundle_made_while_an_export_ran_is_kept(tmp_path):
    """Without force, a folder that appears at the output while the export works (another
    export, a user) is never replaced: the export ends in one line, the folder as it was."""
    from vit_export import bundle as B
    from vit_export.errors import BundleError

    out = tmp_path / "b"
    made = r"b was made while this ran; use force to replace it$"
    with pytest.raises(BundleError, match=made), B.staged_folder(out) as staging:
        (staging / "config.json").write_text("new")
        out.mkdir()
        (out / "mine.txt").write_text("precious")
    assert tree(tmp_path) == {"b/mine.txt": b"precious"}


def test_the_front_door_refuses_the_overwrites_the_commands_refuse(tiny_bundle, tmp_path,
                                                                   monkeypatch):
    """A Python caller is held to the rules the commands are: no output over what the call
    reads (an export into its own source's folder, a saved run over the labelled data, an
    embedding over its input), refused before any work, nothing on disk touched."""
    import numpy as np

    import vit_export
    from vit_export.errors import OptionError

    source = tmp_path / "src"
    shutil.copytree(tiny_bundle, source)
    held = tmp_path / "held.npz"
    np.savez(held, images=np.zeros((2, 3, 32, 32), np.float32), labels=np.zeros(2, int))
    pixels = tmp_path / "in.npy"
    np.save(pixels, np.zeros((3, 32, 32), np.float32))
    before = tree(tmp_path)
    calls = [
        (lambda: vit_export.export(source, source / "out", force=True), f"out='{source / 'out'}'"),
        (lambda: vit_export.validate(source, real_data=held, save_outputs=held),
         f"save_outputs='{held}'"),
        (lambda: vit_export.infer(source, [pixels], embed=True, output=pixels, force=True),
         f"output='{pixels}'"),
    ]
    for call, named in calls:
        with pytest.raises(OptionError) as refused:
            call()
        assert str(refused.value).startswith(f"{named} would overwrite ")
    assert tree(tmp_path) == before
    # a preset's name is no path, even where a folder of that name is the output: past the
    # rule, to the next check before any work (a batch that cannot fit in memory)
    shutil.copytree(tiny_bundle, tmp_path / "vit_seed_tiny")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(OptionError, match=r"^batch_sizes: batch 1000000000 needs about"):
        vit_export.export("vit_seed_tiny", "vit_seed_tiny", kind="preset", force=True,
                          batch_sizes=[10 ** 9])


@pytest.mark.slow  # quick suite under 3 min on this Zen 3: CI runs it
def test_force_onto_a_symlink_replaces_the_link_not_its_target(tiny_bundle, tmp_path):
    target = tmp_path / "target"
    target.mkdir()
    (target / "keep.txt").write_text("keep")
    link = tmp_path / "link"
    link.symlink_to(target)
    code, _, err = run("export", link, "--preset", "vit_seed_tiny", "--batch-sizes", "1",
                       "--force")
    assert code == 0, err
    assert not link.is_symlink() and (link / "model.onnx").is_file()
    assert tree(target) == {"keep.txt": b"keep"}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link", "target"]


@pytest.mark.slow  # quick suite under 3 min on a Zen 3 (2 cores): CI runs it
def test_failed_export_removes_the_parents_it_made(tmp_path):
    import torch

    from vit_export import bundle as B
    from vit_export.errors import ParityError
    from vit_export.exporting import export_bundle
    from vit_export.model import VisionTransformer, create_model

    class Skewed(VisionTransformer):  # an exporter bug, planted: validation must fail
        def forward(self, x):
            out = super().forward(x)
            return out + 0.5 if torch.onnx.is_in_onnx_export() else out

    model = Skewed(create_model("vit_seed_tiny").config)
    description = B.Description(model.config, B.Preprocessing.default_for(model.config))
    with pytest.raises(ParityError):
        export_bundle(model, tmp_path / "a" / "b" / "c", description)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow  # a whole export for one path name: 4 s
def test_a_very_long_legal_name_still_exports(tmp_path):
    out = tmp_path / ("b" * 250)  # a legal name; staging beside it must not exceed 255
    code, _, err = run("export", out, "--preset", "vit_seed_tiny", "--batch-sizes", "1")
    assert code == 0, err
    assert [p.name for p in tmp_path.iterdir()] == [out.name]


# ---------------------------------------------------------------- bad options, bad inputs


@pytest.mark.parametrize("args,message", [
    (["--atol", "nan"], "'nan' is not a finite number"),
    (["--atol", "-1"], "'-1' is not a finite number in [0, 1e+06]"),
    (["--rtol", "inf"], "'inf' is not a finite number"),
    (["--min-cosine", "1.5"], "'1.5' is not a finite number in [-1, 1]"),
    (["--seed", "-3"], "-3 is not in the range 0<=x<=4294967295"),
    (["--seed", "99999999999"], "is not in the range"),
    (["--batch-sizes", "0"], "batch sizes must be integers >= 1"),
    (["--batch-sizes", "1,100000000"], "--batch-sizes: batch 100000000 needs about"),
])
def test_bad_validate_options_are_usage_errors(tiny_bundle, args, message):
    code, out, err = run("validate", tiny_bundle, *args)
    assert code == 2 and out == "" and message in err


def test_bad_bench_options_are_usage_errors_before_any_work(tiny_bundle, tmp_path):
    code, _, err = run("bench", tiny_bundle, "--min-seconds", "inf")
    assert code == 2 and "'inf' is not a finite number" in err
    code, _, err = run("bench", tiny_bundle, "--variants", "int8")
    assert code == 2 and "--variants applies to a preset TARGET" in err
    code, _, err = run("bench", tiny_bundle, "--report", tmp_path / "no" / "such" / "b.json")
    assert code == 2 and "folder" in err and "does not exist" in err
    code, _, err = run("bench", tiny_bundle, "--report", tiny_bundle / "config.json")
    assert code == 2 and "would overwrite" in err
    code, _, err = run("bench", "vit_base_patch16_224", "--batch-sizes", "100000")
    assert code == 2 and "batch 100000 needs about 1" in err and "GiB is available" in err


def test_huge_export_batch_sizes_are_refused_before_the_export(tmp_path):
    code, out, err = run("export", tmp_path / "b", "--preset", "vit_seed_tiny",
                         "--batch-sizes", "10000000000")
    assert code == 2 and out == "" and "batch 10000000000 needs about" in one_line(err)
    assert not (tmp_path / "b").exists()
    # the export batch (traced, then probed at one more) and quick-test's batch too: they
    # were allocation errors as tracebacks
    # and one above what a bundle may declare: 1025 ran the whole export, then failed
    # naming the hidden staging folder
    for batch in ("1000000000", "1025"):
        code, out, err = run("export", tmp_path / "b", "--preset", "vit_seed_tiny",
                             "--export-batch-size", batch)
        assert (code, out) == (2, "")
        assert f"'--export-batch-size': {batch} is not in the range 2<=x<=1024" in \
            one_line(err)
        assert not (tmp_path / "b").exists()
    code, out, err = run("quick-test", "--batch-size", "1000000000")
    assert (code, out) == (2, "")
    assert one_line(err).startswith("Error: --batch-size: batch 1000000000 needs about ")


def test_triton_values_outside_their_protobuf_types_are_usage_errors(tiny_bundle, tmp_path):
    """Written, exit 0, and then refused by Triton's own config parser."""
    for option, value, limit in (("--max-batch-size", "3000000000", "1<=x<=2147483647"),
                                 ("--instances", "5000000000", "1<=x<=2147483647"),
                                 ("--max-queue-delay-us", str(10 ** 23),
                                  "0<=x<=18446744073709551615")):
        code, out, err = run("triton", tiny_bundle, tmp_path / "repo", option, value)
        assert (code, out) == (2, "")
        assert one_line(err) == (f"Error: Invalid value for '{option}': {value} is not in the "
                                 f"range {limit}.")
    assert not (tmp_path / "repo").exists()


@pytest.mark.slow  # decodes a 90-megapixel image in two processes: 9 s
def test_graph_warnings_and_libraries_stay_off_stderr(tiny_bundle, tmp_path):
    """A DecompressionBombWarning (an image over Pillow's pixel limit) is a library's
    warning: it goes to the log (--verbose), never into the command's stderr."""
    from PIL import Image

    big = tmp_path / "big.png"
    Image.new("L", (10000, 9000)).save(big)  # 90M pixels: over MAX_IMAGE_PIXELS, under 2x
    # a real process: pytest records warnings itself, which would hide a printed one
    done = subprocess.run([sys.executable, str(ROOT / "cli.py"), "infer", str(tiny_bundle),
                           str(big), "--top-k", "1"], capture_output=True, text=True,
                          check=False)
    assert done.returncode == 0 and done.stderr == "" and done.stdout.startswith(f"{big}: ")
    done = subprocess.run([sys.executable, str(ROOT / "cli.py"), "--verbose", "infer",
                           str(tiny_bundle), str(big), "--top-k", "1"],
                          capture_output=True, text=True, check=False)
    assert "DecompressionBombWarning" in done.stderr


def test_torchscript_runtime_on_an_onnx_file_is_a_usage_error(tiny_bundle, tmp_path):
    image = tmp_path / "x.npy"
    import numpy as np
    np.save(image, np.zeros((3, 32, 32), np.float32))
    code, _, err = run("infer", tiny_bundle / "model.onnx", image, "--runtime", "torchscript")
    assert code == 2 and "--runtime torchscript cannot run" in err


def test_non_finite_input_is_an_error_not_nan_probabilities(tiny_bundle, tmp_path):
    import numpy as np
    bad = np.zeros((2, 3, 32, 32), np.float32)
    bad[1, 0, 0, 0] = np.nan
    path = tmp_path / "x.npy"
    np.save(path, bad)
    code, out, err = run("infer", tiny_bundle, path, "--json")
    assert code == 1 and out == ""
    assert one_line(err) == f"Error: {path}[1]: non-finite values in the model's input"


def test_empty_npy_is_refused(tiny_bundle, tmp_path):
    import numpy as np
    path = tmp_path / "empty.npy"
    np.save(path, np.zeros((0, 3, 32, 32), np.float32))
    code, _, err = run("infer", tiny_bundle, path)
    assert code == 1 and one_line(err) == f"Error: {path}: holds no arrays (shape (0, 3, 32, 32))"


def test_a_file_name_with_a_newline_stays_one_line(tmp_path):
    weird = tmp_path / "bad\nname"
    code, _, err = run("validate", weird)
    assert code == 1 and one_line(err) == f"Error: {tmp_path}/bad\\nname does not exist"


@pytest.fixture
def signals_as_before():
    """SIGTERM and SIGINT's handlers, and Ray's set_sigterm_handler, given back after."""
    from ray._private import utils

    saved = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    setter = utils.set_sigterm_handler
    yield
    for signum, handler in saved.items():
        signal.signal(signum, handler)
    assert utils.set_sigterm_handler is setter


def test_a_signal_while_ray_starts_is_held_then_handled_as_the_handler_before_would(
        signals_as_before):
    """ray.init runs inside _signals_held: a signal raised where it lands could be dropped
    (a fork hook: CI's run hung), so it is held, then handled once the block is over, by
    the handler in place before, even when the block failed (Ray's processes got our group's
    SIGTERM too). The first one wins; one ignored stays ignored; ray.init cannot put its own
    SIGTERM handler in."""
    from ray._private import utils

    from vit_export.deploy.ray.session import _signals_held
    from vit_export.errors import Signalled, raise_signalled

    signal.signal(signal.SIGTERM, raise_signalled)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    with pytest.raises(Signalled), _signals_held(True):
        signal.raise_signal(signal.SIGTERM)  # held: the block goes on
        utils.set_sigterm_handler(lambda signum, frame: None)  # as ray.init does: kept out
        assert signal.getsignal(signal.SIGTERM) is not raise_signalled
        raise RuntimeError("Failed to start the GCS")  # what Ray then says
    assert signal.getsignal(signal.SIGTERM) is raise_signalled
    # the first wins over a second, which is handled at once
    with pytest.raises(Signalled), _signals_held(True):
        signal.raise_signal(signal.SIGTERM)
        signal.raise_signal(signal.SIGINT)
    with _signals_held(True):
        pass  # nothing held: nothing raised
    seen = []
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, lambda signum, frame: seen.append(signum))
    with _signals_held(True):
        signal.raise_signal(signal.SIGINT)  # ignored before: ignored
        signal.raise_signal(signal.SIGTERM)
        assert seen == []
    assert seen == [signal.SIGTERM]
    assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN


def test_signal_handler_is_restored_after_a_command():
    before = signal.getsignal(signal.SIGTERM)
    run("presets")
    assert signal.getsignal(signal.SIGTERM) is before



@pytest.mark.slow  # an export of its own, 5-7 s: the quick suite keeps under 3 minutes
def test_infer_refuses_a_foreign_model_onnx_whose_sha_was_rewritten(tiny_bundle, tmp_path):
    """A 7-class model.onnx in a 10-class bundle (sha256 made to match) would print five of
    seven classes under the wrong names: its graph is checked against the description first."""
    import json

    import numpy as np

    from vit_export import bundle as B

    copy = tmp_path / "b"
    shutil.copytree(tiny_bundle, copy)
    code, _, err = run("export", tmp_path / "seven", "--preset", "vit_seed_tiny", "--set",
                       "num_classes=7", "--quiet")
    assert code == 0, err
    shutil.copy(tmp_path / "seven" / "model.onnx", copy / "model.onnx")
    config = json.loads((copy / "config.json").read_text())
    config["files"]["model.onnx"] = B.sha256_file(copy / "model.onnx")
    (copy / "config.json").write_text(json.dumps(config))
    x = tmp_path / "x.npy"
    np.save(x, np.zeros((3, 32, 32), np.float32))
    code, out, err = run("infer", copy, x)
    assert code == 1 and out == ""
    assert one_line(err) == ("Error: model.onnx: output logits has shape ['batch', 7], but "
                             "config.json describes [batch, 10]")


def test_complex_npy_is_refused_not_cast(tiny_bundle, tmp_path):
    import numpy as np
    path = tmp_path / "c.npy"
    np.save(path, np.zeros((3, 32, 32), np.complex64))
    code, out, err = run("infer", tiny_bundle, path)
    assert code == 1 and out == ""
    assert one_line(err) == f"Error: {path}: array of dtype complex64 is not real numbers"


# ---------------------------------------------------------------- what an output replaces


@pytest.mark.skipif(os.geteuid() != 0, reason="mknod needs root")
def test_a_report_onto_a_device_node_is_written_through_not_replaced(tiny_bundle, tmp_path):
    """`--report /dev/null` must not turn the device into a regular file (as root that would
    destroy the system's node): a real character device made with mknod, /dev/null's
    numbers, takes the report and stays a device."""
    node = tmp_path / "null"
    os.mknod(node, stat.S_IFCHR | 0o666, os.makedev(1, 3))
    code, _, err = run("validate", tiny_bundle, "--batch-sizes", "1", "--report", node,
                       "--junit", node)
    assert code == 0, err
    assert stat.S_ISCHR(node.stat().st_mode) and node.stat().st_rdev == os.makedev(1, 3)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["null"]  # no temporary file left


def test_a_report_into_a_fifo_is_written_through(tiny_bundle, tmp_path):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    received = []
    reader = threading.Thread(target=lambda: received.append(fifo.read_bytes()))
    reader.start()
    code, _, err = run("validate", tiny_bundle, "--batch-sizes", "1", "--markdown", fifo)
    reader.join(timeout=60)
    assert code == 0, err
    assert received and received[0].startswith(b"### vit-export parity: PASS")
    assert stat.S_ISFIFO(fifo.stat().st_mode)


def test_a_report_onto_a_symlink_writes_what_it_points_to_and_keeps_the_link(tiny_bundle,
                                                                             tmp_path):
    target = tmp_path / "reports" / "parity.json"
    target.parent.mkdir()
    target.write_text("old")
    link = tmp_path / "latest.json"
    link.symlink_to(target)
    dangling = tmp_path / "next.json"
    dangling.symlink_to(tmp_path / "reports" / "new.json")
    code, _, err = run("validate", tiny_bundle, "--batch-sizes", "1", "--report", link,
                       "--junit", dangling)
    assert code == 0, err
    assert link.is_symlink() and dangling.is_symlink()
    assert json.loads(target.read_text())["passed"] is True
    assert (tmp_path / "reports" / "new.json").read_text().startswith("<?xml")


def test_a_folder_or_a_symlink_loop_as_an_output_is_refused_before_any_work(tiny_bundle,
                                                                           tmp_path):
    folder = tmp_path / "reports"
    folder.mkdir()
    code, out, err = run("validate", tiny_bundle, "--report", folder)
    assert (code, out) == (2, "")
    assert one_line(err) == (f"Error: Invalid value for '--report': File '{folder}' is a "
                             f"directory.")  # click's own check, before ours
    loop = tmp_path / "loop"
    loop.symlink_to(loop)
    code, out, err = run("validate", tiny_bundle, "--markdown", loop)
    assert (code, out) == (2, "") and one_line(err).startswith(f"Error: --markdown {loop}: ")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["loop", "reports"]
    assert list(folder.iterdir()) == []


def test_a_performance_json_that_is_no_regular_file_or_no_record_is_one_line(tiny_bundle,
                                                                            tmp_path):
    """infer reads performance.json by default (--runtime auto), and it is outside the
    sha256s: a link to /dev/zero was read until the OOM killer came, a FIFO hung, and a
    superscript batch key was a traceback (hostile test)."""
    import numpy as np

    bundle = shutil.copytree(tiny_bundle, tmp_path / "b")
    record = bundle / "performance.json"
    x = tmp_path / "x.npy"
    np.save(x, np.zeros((1, 1, 8, 8), np.float32))
    os.symlink("/dev/zero", record)
    code, out, err = run("infer", bundle, x)
    assert (code, out) == (1, "") and one_line(err) == f"Error: {record} is not a regular file"
    record.unlink()
    os.mkfifo(record)
    code, out, err = run("infer", bundle, x)  # O_NONBLOCK: opened, refused, never waited on
    assert (code, out) == (1, "") and one_line(err) == f"Error: {record} is not a regular file"
    record.unlink()
    os.symlink(tmp_path / "nowhere.json", record)
    code, _, err = run("infer", bundle, x)
    assert code == 1 and one_line(err).startswith(f"Error: cannot read {record}: ")
    record.unlink()
    for key in ("\u00b2", "01", "\u0661"):  # superscript two, a leading zero, Arabic-Indic one
        record.write_text(json.dumps({"device": "cpu", "cpu": "x", "fastest_validated": {
            key: {"backend": "onnxruntime"}}}))
        code, _, err = run("infer", bundle, x)
        assert code == 1 and "fastest_validated must be an object of batch sizes" in \
            one_line(err)


def test_embed_force_refuses_a_folder_in_the_way_and_keeps_the_old_output(tmp_path,
                                                                          digit_images):
    """--force over FILE.npy whose FILE.inputs.json is a folder deleted FILE.npy, then
    failed naming a staging file."""
    embedded = tmp_path / "emb"
    assert run("export", embedded, "--preset", "vit_seed_tiny", "--set", "in_chans=1",
               "--set", "img_size=8", "--set", "patch_size=4", "--outputs", "embedding",
               "--quiet", "--provider", "cpu")[0] == 0
    out = tmp_path / "a.npy"
    assert run("infer", embedded, *digit_images[:2], "--embed", "--output", out)[0] == 0
    before = out.read_bytes()
    (tmp_path / "a.inputs.json").unlink()
    (tmp_path / "a.inputs.json").mkdir()
    code, _, err = run("infer", embedded, *digit_images[:3], "--embed", "--output", out,
                       "--force")
    assert code == 1 and one_line(err) == (f"Error: cannot write {tmp_path / 'a.inputs.json'}: "
                                           f"it is a folder")
    assert out.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.inputs.json", "a.npy", "emb"]
