"""Fail closed where a library underneath would not: a signal the exporter loses or reports as
its own error, JSON files that never end or hold gigabytes, a checkpoint named as a model of
another patch size, ONNX Runtime's own log lines, and inputs that are not real numbers. Each
test asserts the exit code or the error, its one line, and what is left on disk."""
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import weakref
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import SMALL, one_line, run

from vit_export import bundle as B
from vit_export import runtime
from vit_export.bundle.folder import CONFIG_BYTES
from vit_export.checkpoints import load_checkpoint
from vit_export.errors import (
    BundleError,
    InputError,
    SavedRunError,
    Signalled,
    raise_signalled,
    received,
)
from vit_export.exporting import ExportOptions, export_bundle
from vit_export.model import VisionTransformer, create_model
from vit_export.parity import load_run, read_parity
from vit_export.parity.saved import META, META_BYTES

ROOT = Path(__file__).resolve().parent.parent


# ---------------------------------------------------------------- signals

@pytest.fixture
def command_signals():
    """SIGTERM handled as a command handles it (errors.raise_signalled), given back after."""
    saved = signal.getsignal(signal.SIGTERM)
    signal.signal(signal.SIGTERM, raise_signalled)
    yield
    signal.signal(signal.SIGTERM, saved)


class _SignalledWhileExported(VisionTransformer):
    """Sends its own process SIGTERM once, while torch.export traces it for the dynamo
    exporter. `how`: "lost", from a weakref callback, where Python drops the handler's
    exception ("Exception ignored") and the export goes on; "reported", caught and raised
    as a TypeError, as torch's argument parser did with one raised in its Python callback
    (torch.onnx then fails with its own "Next steps" message)."""

    def __init__(self, config, how: str):
        super().__init__(config)
        self.how, self.sent = how, False

    def forward(self, x):
        if torch.compiler.is_exporting() and not self.sent:
            self.sent = True
            if self.how == "lost":
                box = type("Box", (), {})()
                ref = weakref.ref(box, lambda _: signal.raise_signal(signal.SIGTERM))
                del box  # the callback runs here, and its Signalled is dropped
                assert ref() is None
            else:
                try:
                    signal.raise_signal(signal.SIGTERM)
                except Signalled as exc:
                    raise TypeError(f"argument 'size' failed to unpack: {exc!r}") from None
        return super().forward(x)


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
@pytest.mark.parametrize("how", ["lost", "reported"])
def test_a_signal_the_exporter_loses_or_reports_as_its_error_stops_the_export(
        command_signals, tmp_path, how):
    """SIGTERM during the dynamo exporter's step came back as the exporter's failure (exit 1,
    "Next steps: ...") or not at all (the bundle written, exit 0). The signal stops the step
    as itself, and nothing is written."""
    torch.manual_seed(0)
    model = _SignalledWhileExported(create_model("vit_seed_tiny").config, how).eval()
    description = B.Description(model.config, B.Preprocessing.default_for(model.config))
    before = len(received)
    with pytest.raises(Signalled):
        export_bundle(model, tmp_path / "b", description,
                      ExportOptions(exporter="dynamo", validation={"batch_sizes": (1,)}))
    assert received[before:] == [signal.SIGTERM]  # sent once, while the exporter traced
    assert list(tmp_path.iterdir()) == []  # no bundle, no .vx-partial-*


# `vit-export` in a process of its own. With "lost" as its first argument, the process sends
# itself SIGTERM from a garbage collector callback once torch.export traces the model: Python
# drops an exception raised there ("Exception ignored in garbage collection callback").
CHILD = """
import gc, signal, sys, torch
if sys.argv.pop(1) == "lost":
    def stop(phase, info, sent=[]):
        if phase == "start" and not sent and torch.compiler.is_exporting():
            sent.append(signal.SIGTERM)
            signal.raise_signal(signal.SIGTERM)
    gc.callbacks.append(stop)
from vit_export.cli import main
main()
"""


@pytest.mark.slow
@pytest.mark.parametrize("how", ["sent", "lost"])
def test_sigterm_during_the_dynamo_export_exits_143_and_leaves_nothing(tmp_path, how):
    """`export` stopped by SIGTERM while torch.onnx's dynamo exporter runs: sent by another
    process once the step has begun, as a user stops it, or landing where Python drops the
    handler's exception (the export went on, and wrote the bundle). Exit 143, the one line,
    no bundle and no staging folder."""
    proc = subprocess.Popen(
        [sys.executable, "-c", CHILD, how, "export", str(tmp_path / "b"), *SMALL,
         "--progress"], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines = []
    for line in proc.stderr:
        lines.append(line)
        if how == "sent" and "exporting ONNX (dynamo" in line:
            time.sleep(0.3)  # into torch.export's tracing (the step takes a second or more)
            proc.send_signal(signal.SIGTERM)
            break
    rest = proc.stderr.read()
    code = proc.wait(timeout=120)
    said = [line.strip() for line in lines + rest.splitlines()
            if line.strip() and not line.startswith("[")]  # progress lines start with "["
    assert code == 128 + signal.SIGTERM, (lines, rest)
    assert said == ["Error: stopped by SIGTERM; nothing half-written was left"]
    assert list(tmp_path.iterdir()) == []


# ---------------------------------------------------------------- JSON files a command reads

def test_a_config_json_that_leads_out_of_the_bundle_or_is_huge_is_one_line(tiny_bundle,
                                                                           tmp_path):
    """config.json as a link to /proc/self/pagemap (a regular file of size 0 that reads on,
    or fails) was "Error: Invalid argument", naming no file; one of 300 MB was read whole
    (1.6 GB at its peak). A bundle's config.json is its own file, in its folder, of at most
    CONFIG_BYTES, refused before it is read."""
    bundle = Path(shutil.copytree(tiny_bundle, tmp_path / "b"))
    config = bundle / B.CONFIG_FILE
    config.unlink()
    os.symlink("/proc/self/pagemap", config)
    code, out, err = run("info", bundle)
    assert (code, out) == (1, "")
    assert one_line(err).startswith(f"Error: {config} leads outside {bundle} (to /proc/")
    config.unlink()
    with open(config, "wb") as f:
        f.truncate(300 << 20)  # sparse: 300 MB that cost no disk
    code, out, err = run("validate", bundle, "--batch-sizes", "1")
    assert (code, out) == (1, "")
    assert one_line(err) == (f"Error: {config} holds {300 << 20} bytes, more than the "
                             f"{CONFIG_BYTES} such a file holds")


def test_a_bundles_parity_or_performance_json_that_leads_out_of_it_is_not_its_own(
        tiny_bundle, tmp_path):
    """parity.json and performance.json are read as the bundle's own verdict and record:
    a link to another bundle's (here: a copy of its own, elsewhere) was read as this one's.
    info says why it shows no verdict; infer --runtime auto refuses the record in one
    line."""
    bundle = Path(shutil.copytree(tiny_bundle, tmp_path / "b"))
    elsewhere = tmp_path / "elsewhere.json"
    shutil.move(bundle / B.PARITY_FILE, elsewhere)
    os.symlink(elsewhere, bundle / B.PARITY_FILE)
    code, out, _ = run("info", bundle)
    assert code == 0
    assert out.splitlines()[-1] == (
        f"parity at export: none for these files: {bundle / B.PARITY_FILE} leads outside "
        f"{bundle} (to {elsewhere}): only a file in the folder is read as its own")
    (bundle / B.PARITY_FILE).unlink()
    record = tmp_path / "performance.json"
    record.write_text(json.dumps({"device": "cpu", "cpu": "x", "fastest_validated": {
        "1": {"backend": "onnxruntime"}}}))
    os.symlink(record, bundle / B.PERFORMANCE_FILE)
    x = tmp_path / "x.npy"
    np.save(x, np.zeros((1, 3, 32, 32), np.float32))
    code, out, err = run("infer", bundle, x)
    assert (code, out) == (1, "")
    assert one_line(err) == (f"Error: {bundle / B.PERFORMANCE_FILE} leads outside {bundle} "
                             f"(to {record}): only a file in the folder is read as its own")


def test_a_json_file_of_proc_that_reads_on_is_refused_naming_it():
    """A file of /proc says 0 bytes and reads on: read as JSON it is refused by name, having
    read one byte past its declared size."""
    for proc in ("/proc/self/status", "/proc/self/pagemap"):
        with pytest.raises(BundleError) as caught:
            read_parity(proc)
        assert str(caught.value) == (f"{proc} is not a file of fixed size (0 bytes declared, "
                                     f"1+ read)")


def test_a_saved_runs_description_over_its_limit_is_refused_before_it_is_decompressed(
        tmp_path):
    """compare reads run.json out of a saved run's .npz whole: 17 Mi characters (68 MB once
    decompressed, 70 KB compressed) are refused from the size its zip entry declares."""
    run_file = tmp_path / "run.npz"
    np.savez_compressed(run_file, **{META: np.array("a" * (17 << 20))})
    assert run_file.stat().st_size < 1 << 20
    with pytest.raises(SavedRunError) as caught:
        load_run(run_file)
    assert str(caught.value) == (f"{run_file} is not a saved run: its {META} takes "
                                 f"{4 * (17 << 20) + 128} bytes, more than {META_BYTES}")


# ---------------------------------------------------------------- checkpoints

def test_a_checkpoint_named_as_a_model_of_another_patch_size_is_refused_before_export(
        tmp_path):
    """A patch-8 timm checkpoint exported with --timm-name vit_tiny_patch16_224 was refused,
    after the whole export, as "export does not match eager": timm's model built from the
    name had 16x16 patches (its checkpoint filter resampled the weights to fit). The
    mismatch is named before any work; stated with --set, the model is the checkpoint's and
    computes what timm's own model of those weights computes."""
    timm = pytest.importorskip("timm")
    torch.manual_seed(0)
    peer = timm.create_model("vit_tiny_patch16_224", pretrained=False, patch_size=8,
                             img_size=32, num_classes=10).eval()  # its width and depth
    ckpt = tmp_path / "weights.pth"
    torch.save(peer.state_dict(), ckpt)
    code, out, err = run("export", tmp_path / "b", "--checkpoint", ckpt, "--timm-name",
                         "vit_tiny_patch16_224", "--set", "img_size=32")
    assert (code, out) == (1, "")
    assert one_line(err) == (
        "Error: the checkpoint's patch size is 8 (patch_embed.proj.weight [192, 3, 8, 8]), and "
        "the model it is named as has patch size 16: name a model of patch size 8, or "
        "--set patch_size=8")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["weights.pth"]
    model, _ = load_checkpoint(ckpt, timm_name="vit_tiny_patch16_224",
                               overrides={"img_size": "32", "patch_size": "8"})
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        assert torch.allclose(model(x), peer(x), atol=1e-5)


# ---------------------------------------------------------------- ONNX Runtime's own log

def _failing_models(bundle: Path, folder: Path) -> dict[str, Path]:
    """The bundle's model.onnx with a node added after its logits that ONNX Runtime
    refuses: as the session is made (a Resize of a mode it lacks: "Exception during
    initialization") or as it runs (a Reshape of 10 logits into rows of 7)."""
    import onnx
    from onnx import helper, numpy_helper

    made = {}
    for when in ("made", "run"):
        proto = onnx.load(str(bundle / B.ONNX_FILE))
        logits = proto.graph.output[0].name
        last = next(n for n in proto.graph.node if logits in n.output)
        last.output[0] = "before"
        if when == "made":
            scales = numpy_helper.from_array(np.ones(2, np.float32), "scales")
            proto.graph.initializer.append(scales)
            proto.graph.node.append(helper.make_node("Resize", ["before", "", "scales"],
                                                     [logits], mode="nowhere"))
        else:
            rows = numpy_helper.from_array(np.array([-1, 7], np.int64), "rows")
            back = numpy_helper.from_array(np.array([-1, 10], np.int64), "back")
            proto.graph.initializer.extend([rows, back])
            proto.graph.node.extend([helper.make_node("Reshape", ["before", "rows"], ["r"]),
                                     helper.make_node("Reshape", ["r", "back"], [logits])])
        made[when] = folder / f"{when}.onnx"
        onnx.save(proto, str(made[when]))
    return made


def test_onnx_runtimes_own_log_lines_reach_stderr_only_with_verbose(tiny_bundle, tmp_path,
                                                                    capfd):
    """A model ONNX Runtime refuses as its session is made or as it runs: the one Error
    line, and none of ONNX Runtime's coloured "[E:onnxruntime:...]" lines, which it writes
    to the process's stderr itself (a session's own severity, 3, let them through whatever
    the default logger's). --verbose shows them."""
    x = tmp_path / "x.npy"
    np.save(x, np.zeros((1, 3, 32, 32), np.float32))
    for when, model in _failing_models(tiny_bundle, tmp_path).items():
        code, out, err = run("infer", model, x, "--provider", "cpu")
        printed = capfd.readouterr().err  # what the C++ library wrote to the process's stderr
        assert (code, out) == (1, "")
        assert one_line(err).startswith("Error: ONNX Runtime c" if when == "made" else
                                        "Error: ONNX Runtime failed while running"), err
        assert "onnxruntime" not in printed, printed
        code, _, _ = run("--verbose", "infer", model, x, "--provider", "cpu")
        assert code == 1 and "[E:onnxruntime:" in capfd.readouterr().err


# ---------------------------------------------------------------- runner inputs

NOT_REAL = ("timedelta64[s]", "datetime64[s]", "object", "complex64", "<U3", "|S3", "|V8")
REAL = ("bool", "uint8", "int64", "float16", "float64")


@pytest.mark.parametrize("name", [
    "onnxruntime", "openvino",
    # eager and the TorchScript trace (runtime/pytorch.py's TorchRunner) are held to
    # InputSpec's shape, not yet to the dtype: numpy converts what they are given
    "eager", "torchscript",
])
def test_a_runner_refuses_an_input_that_is_not_real_numbers_naming_its_dtype(tiny_bundle,
                                                                           name):
    """A timedelta64 array was numpy's TypeError out of ONNX Runtime's runner, and OpenVINO's
    ran it (and datetimes, strings, objects, complex numbers cut to their real part) as
    float32. Booleans, integers and floats are real numbers; every other dtype is an
    InputError naming it."""
    if name == "openvino":
        pytest.importorskip("openvino")
    runner = runtime.open_runner(B.read_bundle(tiny_bundle), name, "cpu")
    shape = (1, 3, 32, 32)
    for dtype in NOT_REAL:
        x = np.zeros(shape, dtype) if dtype == "|V8" else np.ones(shape).astype(dtype)
        assert x.dtype.str == np.dtype(dtype).str
        with pytest.raises(InputError) as caught:
            runner(x)
        assert str(caught.value) == f"input of dtype {x.dtype}: expected real numbers"
    for dtype in REAL:
        assert np.isfinite(runner(np.ones(shape, dtype))).all()
