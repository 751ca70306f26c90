import json
import math
import re
import shutil
import subprocess
import sys
from pathlib import Path

import click
import numpy as np
import pytest
from conftest import auto_device, one_line, run
from PIL import Image

from vit_export import __version__
from vit_export import bundle as B
from vit_export.cli import cli

ROOT = Path(__file__).resolve().parent.parent




def every_command(group: click.Group = cli, path: tuple[str, ...] = ()):
    """(path, command) for every command registered, nested groups' commands too."""
    for name, command in group.commands.items():
        yield (*path, name), command
        if isinstance(command, click.Group):
            yield from every_command(command, (*path, name))


def test_every_command_walks_into_nested_groups():
    inner = click.Group("inner", commands=[click.Command("leaf")])
    outer = click.Group("outer", commands=[click.Command("first"), inner])
    assert [path for path, _ in every_command(outer)] == [("first",), ("inner",),
                                                          ("inner", "leaf")]


def test_version():
    code, out, _ = run("--version")
    assert code == 0 and __version__ in out


@pytest.mark.parametrize("path", [(), *(path for path, _ in every_command())],
                         ids=lambda path: " ".join(path) or "vit-export")
def test_help_on_every_command(path):
    code, out, err = run(*path, "--help")
    assert code == 0 and err == ""
    assert out.startswith(f"Usage: {' '.join(('cli', *path))} [OPTIONS]")


@pytest.mark.slow  # quick suite under 3 min on a Zen 3 (2 cores): CI runs it
def test_top_level_shim_behaves_like_the_package():
    out = subprocess.run([sys.executable, "cli.py", "--version"], cwd=ROOT, capture_output=True,
                         text=True, check=True).stdout
    assert out.strip() == f"vit-export, version {__version__}"


def test_quick_test_prints_the_seed_line():
    code, out, _ = run("quick-test", "--provider", "cpu")
    assert code == 0
    assert out.startswith("device=cpu, logits_shape=(2, 10), loss=")
    assert out.strip().endswith("]") and ", pred=[" in out


def test_a_reader_that_leaves_early_ends_the_listing_quietly():
    """`vit-export presets | head -1`: the pipe closes after one line; the command stops as
    a tool killed by SIGPIPE does (exit 141), saying nothing of a broken pipe."""
    listing = subprocess.Popen([sys.executable, "-m", "vit_export.cli", "presets"], cwd=ROOT,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert listing.stdout.readline().startswith(b"preset ")
    listing.stdout.close()  # the reader leaves: the next write meets a closed pipe
    assert listing.wait(timeout=60) == 141
    assert listing.stderr.read() == b""


def test_presets_lists_sizes():
    code, out, _ = run("presets")
    assert code == 0 and "vit_base_patch16_224" in out and "86.6M" in out


def test_export_validate_infer_info_round_trip(tmp_path):
    out_dir = tmp_path / "bundle"
    code, out, _ = run("export", out_dir, "--preset", "vit_seed_tiny", "--provider", "cpu")
    assert code == 0, out
    assert "PASS" in out and f"wrote {out_dir}" in out
    report_file = tmp_path / "report.json"
    code, out, _ = run("validate", out_dir, "--batch-sizes", "1,5", "--report", report_file)
    assert code == 0 and out.strip().endswith("PASS")
    report = json.loads(report_file.read_text())
    assert report["passed"] and report["batch_sizes"] == [1, 5]
    assert report["provider_used"] == auto_device() and report["tf32"] is False
    image = tmp_path / "cat.png"
    Image.fromarray(np.random.default_rng(0).integers(0, 255, (40, 50, 3), np.uint8)).save(image)
    code, out, _ = run("infer", out_dir, image, "--top-k", "3", "--json")
    assert code == 0
    result = json.loads(out)
    assert result["provider"] == auto_device() and len(result["results"][0]["top"]) == 3
    probs = [t["prob"] for t in result["results"][0]["top"]]
    assert probs == sorted(probs, reverse=True) and 0 < sum(probs) <= 1.0 + 1e-6
    code, out_ts, _ = run("infer", out_dir / "model.ts", image, "--top-k", "3", "--json")
    assert code == 0
    ts_probs = [t["prob"] for t in json.loads(out_ts)["results"][0]["top"]]
    np.testing.assert_allclose(ts_probs, probs, atol=1e-5)
    code, out, _ = run("info", out_dir / "model.onnx")
    assert code == 0 and "dim 64, depth 2, heads 4" in out


def test_infer_text_output_uses_labels(tiny_bundle, tmp_path):
    images = tmp_path / "imgs"
    images.mkdir()
    for i in range(3):
        Image.fromarray(np.full((32, 32, 3), 60 * i, np.uint8)).save(images / f"{i}.png")
    code, out, _ = run("infer", tiny_bundle, images, "--top-k", "1", "--batch-size", "2")
    assert code == 0
    lines = out.strip().splitlines()
    assert len(lines) == 4 and lines[0].startswith(f"{images / '0.png'}: class_")
    assert lines[-1] == f"3 input(s) on onnxruntime ({auto_device()})"


@pytest.mark.parametrize("mode,shape", [("L", (32, 32)), ("RGBA", (32, 32, 4))])
def test_infer_converts_grayscale_and_rgba(tiny_bundle, tmp_path, mode, shape):
    image = tmp_path / "x.png"
    Image.fromarray(np.full(shape, 90, np.uint8), mode).save(image)
    code, out, _ = run("infer", tiny_bundle, image, "--json")
    assert code == 0 and len(json.loads(out)["results"]) == 1


def test_a_nan_on_its_way_into_json_is_one_line_and_no_file(tiny_bundle, tmp_path,
                                                              monkeypatch):
    """bench --json and --report wrote NaN (not JSON) where a figure was NaN; every JSON goes
    through one writer that refuses it in one line, before the report is written."""
    from vit_export import benchmarking as bench

    row = bench.BenchRow("eager", "cpu", "host", 1, 5, 1.0, 1.0, 1.0, 1000.0, 1.0, 0.1,
                         math.nan, 100.0)
    monkeypatch.setattr(bench, "bench", lambda *args, **kwargs: bench.BenchResult(
        str(tiny_bundle), 1, "cpu", 10.0, 0.01, [1], [row]))
    report = tmp_path / "bench.json"
    code, out, err = run("bench", tiny_bundle, "--batch-sizes", "1", "--json", "--report",
                         report)
    assert code == 1 and out == "" and not report.exists()
    assert one_line(err) == ("Error: cannot write JSON: rows[0].speedup is nan, and JSON has "
                             "no NaN or infinity")


def test_cuda_on_a_cpu_machine_exits_1_naming_why(tiny_bundle):
    from vit_export.runtime import cuda_problem
    problem = cuda_problem()
    if problem is None:
        pytest.skip("ONNX Runtime's CUDA provider loads on this machine")
    code, out, err = run("validate", tiny_bundle, "--provider", "cuda")
    assert code == 1 and out == ""
    assert one_line(err) == f"Error: requested CUDAExecutionProvider but {problem}"


def test_torchscript_on_cuda_without_cuda_is_an_error(tiny_bundle, tmp_path):
    from vit_export.runtime import torch_device
    if torch_device("cuda") == "cuda":
        pytest.skip("this machine has a GPU")
    image = tmp_path / "x.png"
    Image.fromarray(np.zeros((32, 32, 3), np.uint8)).save(image)
    code, _, err = run("infer", tiny_bundle, image, "--runtime", "torchscript", "--provider", "cuda")
    assert code == 1 and one_line(err) == (
        "Error: requested CUDA for TorchScript but PyTorch sees no CUDA device")


def test_missing_bundle(tmp_path):
    code, _, err = run("validate", tmp_path / "nope")
    assert code == 1 and one_line(err) == f"Error: {tmp_path / 'nope'} does not exist"


def test_truncated_model_onnx(tiny_bundle, tmp_path):
    copy = tmp_path / "b"
    shutil.copytree(tiny_bundle, copy)
    data = (copy / "model.onnx").read_bytes()
    (copy / "model.onnx").write_bytes(data[: len(data) // 3])
    for command in ("validate", "infer"):
        args = [command, copy] + ([copy / "config.json"] if command == "infer" else [])
        code, _, err = run(*args)
        assert code == 1 and "model.onnx does not match its sha256" in one_line(err)
    code, _, err = run("info", copy / "model.onnx")
    assert code == 1 and "cannot read ONNX model" in one_line(err)


def test_non_image_file_given_to_infer(tiny_bundle, tmp_path):
    bogus = tmp_path / "photo.jpg"
    bogus.write_bytes(b"%PDF-1.4 definitely not a jpeg")
    code, out, err = run("infer", tiny_bundle, bogus)
    assert code == 1 and out == "" and one_line(err) == f"Error: {bogus} is not an image Pillow can read"


@pytest.mark.parametrize("value", ["0", "1,0", "two", ""])
def test_bad_batch_sizes_are_usage_errors(tiny_bundle, value):
    code, _, err = run("validate", tiny_bundle, "--batch-sizes", value)
    assert code == 2 and "--batch-sizes" in err


def test_config_with_indivisible_image_size(tmp_path):
    out_dir = tmp_path / "b"
    code, _, err = run("export", out_dir, "--preset", "vit_seed_tiny", "--set", "img_size=33")
    assert code == 1
    assert one_line(err) == "Error: img_size 33 is not divisible by patch_size 8"
    assert not out_dir.exists() and list(tmp_path.iterdir()) == []


def test_bad_override_syntax_is_a_usage_error(tmp_path):
    code, _, err = run("export", tmp_path / "b", "--preset", "vit_seed_tiny", "--set", "depth")
    assert code == 2 and "expected KEY=VALUE" in err


@pytest.mark.slow  # quick suite under 3 min on this Zen 3: CI runs it
def test_existing_output_without_force_is_untouched(tiny_bundle, tmp_path):
    out_dir = tmp_path / "b"
    out_dir.mkdir()
    (out_dir / "mine.txt").write_text("keep")
    code, _, err = run("export", out_dir, "--preset", "vit_seed_tiny")
    assert code == 1 and one_line(err) == f"Error: {out_dir} already exists; use --force to replace it"
    assert [p.name for p in out_dir.iterdir()] == ["mine.txt"]
    code, out, _ = run("export", out_dir, "--preset", "vit_seed_tiny", "--force")
    assert code == 0 and "PASS" in out and not (out_dir / "mine.txt").exists()
    assert B.read_bundle(out_dir).config.embed_dim == 64


def test_export_needs_exactly_one_source(tmp_path):
    code, _, err = run("export", tmp_path / "b")
    assert code == 2 and "exactly one of --from, --preset, --checkpoint" in err
    code, _, err = run("export", tmp_path / "b", "--preset", "vit_gigantic")
    assert code == 1 and "unknown preset 'vit_gigantic'" in one_line(err)


def test_failed_parity_at_export_writes_nothing(tmp_path, monkeypatch):
    from vit_export import parity
    strict = parity.Tolerance(atol=0.0, rtol=0.0, min_cosine=1.0, min_top1=1.0, stage_rel_l2=0.0)
    monkeypatch.setitem(parity.PROFILES, "fp32", strict)
    out_dir = tmp_path / "b"
    code, out, err = run("export", out_dir, "--preset", "vit_seed_tiny")
    assert code == 1 and "FAIL" in out
    assert one_line(err).startswith("Error: export does not match eager PyTorch, nothing written")
    assert list(tmp_path.iterdir()) == []


def test_validate_writes_junit_markdown_and_json(tiny_bundle, tmp_path):
    from xml.etree import ElementTree as ET
    files = {k: tmp_path / f"r.{k}" for k in ("xml", "md", "json")}
    code, out, _ = run("validate", tiny_bundle, "--batch-sizes", "1,2", "--layers",
                       "--junit", files["xml"], "--markdown", files["md"], "--report", files["json"])
    assert code == 0 and "block 1 MLP" in out
    suite = ET.parse(files["xml"]).getroot()
    assert suite.get("failures") == "0" and int(suite.get("tests")) > 10
    assert files["md"].read_text().startswith("### vit-export parity: PASS")
    stages = json.loads(files["json"].read_text())["stages"]
    assert len(stages) == 9 and {s["profile"] for s in stages} == {"fp32"}
    # the per-stage chart beside the Markdown report, which shows it where Markdown renders
    chart = tmp_path / "r.layers.svg"
    assert "![The error after each stage, against eager](r.layers.svg)" in files["md"].read_text()
    svg = chart.read_text()
    assert svg.startswith("<?xml") and "<svg" in svg and "block 1 MLP" in svg


def test_tightened_tolerance_fails_with_exit_1_and_junit_failures(tiny_bundle, tmp_path):
    from xml.etree import ElementTree as ET
    junit = tmp_path / "r.xml"
    code, out, err = run("validate", tiny_bundle, "--batch-sizes", "1", "--atol", "1e-12",
                         "--junit", junit)
    assert code == 1 and "FAIL" in out
    assert one_line(err).startswith("Error: parity failed: onnxruntime batch 1")
    assert ET.parse(junit).getroot().get("failures") == "1"  # torchscript is bit-exact


def test_require_provider_cuda_fails_on_cpu(tiny_bundle):
    from vit_export.runtime import torch_device
    if torch_device("cuda") == "cuda":
        pytest.skip("this machine has a GPU")
    code, _, err = run("validate", tiny_bundle, "--batch-sizes", "1", "--require-provider", "cuda")
    assert code == 1
    assert one_line(err) == "Error: parity failed: provider is cuda: cpu ran (requested auto)"


def test_validate_on_real_images(tiny_bundle, tmp_path):
    for i in range(3):
        Image.fromarray(np.random.default_rng(i).integers(0, 255, (50, 40, 3), np.uint8)).save(
            tmp_path / f"{i}.jpg")
    code, out, _ = run("validate", tiny_bundle, "--batch-sizes", "1", "--images", tmp_path)
    assert code == 0 and re.search(r"^onnxruntime +fp32 +3  images .* ok$", out, re.MULTILINE)


@pytest.mark.slow  # quick suite under 3 min on this Zen 3: CI runs it
def test_fp16_export_from_cli(tmp_path):
    code, out, _ = run("export", tmp_path / "b", "--preset", "vit_seed_tiny", "--precision",
                       "fp16", "--fp16-io", "--batch-sizes", "1,3")
    assert code == 0 and "onnxruntime[model.fp16.onnx] fp16" in out
    import onnx
    proto = onnx.load(str(tmp_path / "b" / "model.fp16.onnx"))
    assert proto.graph.input[0].type.tensor_type.elem_type == onnx.TensorProto.FLOAT16
    code, _, err = run("export", tmp_path / "c", "--preset", "vit_seed_tiny", "--fp16-io")
    assert code == 2 and "--fp16-io needs --precision fp16" in err


def test_unwritable_report_paths(tiny_bundle, tmp_path):
    code, _, err = run("validate", tiny_bundle, "--batch-sizes", "1", "--junit", tmp_path)
    assert code == 2 and "is a directory" in err
    # refused before the validation runs, as bench refuses its --json and --plot
    missing = tmp_path / "missing" / "r.json"
    code, _, err = run("validate", tiny_bundle, "--batch-sizes", "1", "--report", missing)
    assert code == 2 and one_line(err) == (f"Error: cannot write {missing}: folder "
                                           f"{tmp_path / 'missing'} does not exist")
    code, _, err = run("validate", tiny_bundle, "--batch-sizes", "1", "--report",
                       "/proc/vit-export-report.json")  # not writable, even for root
    assert code == 2
    assert one_line(err).startswith("Error: cannot write /proc/vit-export-report.json: ")


@pytest.mark.slow  # quick suite under 3 min on this Zen 3: CI runs it
def test_progress_goes_to_stderr_with_elapsed_time(tmp_path):
    out_dir = tmp_path / "b"
    code, out, err = run("export", out_dir, "--preset", "vit_seed_tiny", "--batch-sizes", "1",
                         "--progress")
    assert code == 0
    steps = [re.fullmatch(r"\[\s*(\d+\.\d)s\] (.+)", line) for line in err.splitlines()]
    assert all(steps), err
    names = [m.group(2) for m in steps]
    assert names[:5] == ["loading the model", "writing weights", "tracing TorchScript",
                         "exporting ONNX (dynamo, opset 18)",  # weights pointed at as written
                         "validating against eager PyTorch"]
    assert names[-1] == "done"
    assert "running onnxruntime on random(seed=0), 1 input(s)" in names
    times = [float(m.group(1)) for m in steps]
    assert times == sorted(times)
    assert "[" not in out and "validating" not in out  # stdout holds the report alone
    code, out, err = run("validate", out_dir, "--batch-sizes", "1", "--quiet")
    assert code == 0 and err == "" and out.rstrip().endswith("PASS")
    code, _, err = run("validate", out_dir, "--batch-sizes", "1")  # not a terminal: quiet
    assert code == 0 and err == ""


def test_cli_leaves_logging_as_it_found_it():
    import logging

    root = logging.getLogger()
    before = (list(root.handlers), root.level, logging.root.manager.disable)
    for args in (["--verbose", "presets"], ["presets"]):
        assert run(*args)[0] == 0
        assert (list(root.handlers), root.level, logging.root.manager.disable) == before


@pytest.mark.slow  # quick suite under 3 min on this Zen 3: CI runs it
def test_export_leaves_the_hosts_logging_and_stdout_alone(tmp_path, caplog):
    import logging

    from vit_export.exporting import ExportOptions, export_bundle
    from vit_export.model import create_model

    stdout = sys.stdout
    model = create_model("vit_seed_tiny").eval()
    description = B.Description(model.config, B.Preprocessing.default_for(model.config))
    with caplog.at_level(logging.WARNING, logger="host"):
        export_bundle(model, tmp_path / "b", description,
                      ExportOptions(validation=dict(batch_sizes=[1])))
        logging.getLogger("host").warning("still heard")
    assert sys.stdout is stdout and logging.root.manager.disable == logging.NOTSET
    assert [r.getMessage() for r in caplog.records if r.name == "host"] == ["still heard"]


def test_every_option_of_every_command_says_what_it_does():
    silent = [f"{' '.join(path)} {option.opts[0]}" for path, command in every_command()
              for option in command.params
              if isinstance(option, click.Option) and not option.hidden and not option.help]
    assert silent == []


def test_a_signal_is_seen_through_the_system_error_a_c_extension_wraps_it_in():
    """Ray's ray.get, stopped by SIGTERM while it waited in C++, raised SystemError ("returned
    a result with an exception set") caused by our Signalled: serve printed a traceback and
    exited 1, not 143. An exit raised while a signal was handled is that exit."""
    from vit_export.errors import Signalled, signal_behind

    def wrapped(inner: BaseException, outer: BaseException) -> BaseException:
        try:
            try:
                raise inner
            except BaseException as exc:
                raise outer from exc
        except BaseException as exc:
            return exc

    stop = Signalled(15)
    assert signal_behind(wrapped(stop, SystemError("returned a result with an exception set"))) \
        is stop
    assert isinstance(signal_behind(wrapped(KeyboardInterrupt(), SystemError("x"))),
                      KeyboardInterrupt)
    assert signal_behind(stop) is stop
    assert signal_behind(wrapped(Signalled(15), SystemExit(143))) is None
    assert signal_behind(wrapped(Signalled(15), RuntimeError("x"))) is None
    assert signal_behind(SystemError("x")) is None


def test_the_core_and_the_deploy_modules_import_no_ray():
    """Ray is the serve extra: the command line, the core and every deployment module load
    without it; only a run that needs it imports it."""
    import subprocess
    import sys

    code = ("import sys, vit_export.cli, vit_export.parity, vit_export.exporting.export, "
            "vit_export.deploy.classify, vit_export.deploy.ray.serve, vit_export.deploy.ray.data, "
            "vit_export.deploy.ray.session, vit_export.deploy.triton; "
            "print(sorted(m for m in sys.modules if m == 'ray' or m.startswith('ray.')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    assert out.strip() == "[]"


def test_infer_on_the_e2e_model_takes_images_as_they_are_and_answers_as_model_onnx(tmp_path):
    """--runtime onnxruntime[model.e2e.onnx]: uint8 images of any size in (uint8
    model, whose preprocessing runs where the model does), batched by size, the same classes
    as model.onnx fed by our Python preprocessing; an .npy (pixel values already) refused."""
    from conftest import make_bundle

    bundle = make_bundle(tmp_path / "e2e", embed_preprocessing=True)
    rng = np.random.default_rng(0)
    folder = tmp_path / "images"
    folder.mkdir()
    for name, (w, h) in [("a", (40, 30)), ("b", (40, 30)), ("c", (50, 50)), ("d", (40, 30))]:
        Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)).save(folder / f"{name}.png")
    answers = {}
    for runtime in ("onnxruntime", "onnxruntime[model.e2e.onnx]"):
        code, out, err = run("infer", bundle, folder, "--runtime", runtime, "--json",
                             "--top-k", "10", "--batch-size", "4", "--provider", "cpu")
        assert code == 0, err
        report = json.loads(out)
        assert report["runtime"] == runtime
        answers[runtime] = {r["input"]: {t["class"]: t["prob"] for t in r["top"]}
                            for r in report["results"]}
    plain, e2e = answers.values()
    assert list(plain) == list(e2e) == [str(folder / f"{n}.png") for n in "abcd"]
    for name in plain:  # sizes 40x30, 40x30, 50x50, 40x30: three runs of one size
        assert set(plain[name]) == set(e2e[name])
        assert max(abs(plain[name][c] - e2e[name][c]) for c in plain[name]) < 1e-4
    # a Ray Data actor (its code, called here without Ray) and a server's decoding read the
    # images as infer does, so they give infer's answers
    from vit_export.deploy.classify import Classifier
    from vit_export.deploy.ray.data import _ClassifyFiles

    actor = _ClassifyFiles(str(bundle), "cpu", "onnxruntime[model.e2e.onnx]", 10, None, 4)
    rows = actor({"file": np.array([str(folder / f"{n}.png") for n in "abcd"])})
    assert rows["error"] == [""] * 4
    assert [json.loads(r)["input"] for r in rows["record"]] == list(e2e)
    for record in map(json.loads, rows["record"]):
        assert {t["class"]: t["prob"] for t in record["top"]} == e2e[record["input"]]
    served = Classifier(bundle, "cpu", "onnxruntime[model.e2e.onnx]")
    decoded = served.decode((folder / "c.png").read_bytes(), "c.png")
    assert decoded.dtype == np.uint8 and decoded.shape == (50, 50, 3)
    (answer,) = served(["c.png"], [decoded], 10)
    assert {t["class"]: t["prob"] for t in answer["top"]} == e2e[str(folder / "c.png")]
    np.save(tmp_path / "x.npy", np.zeros((3, 32, 32), np.float32))
    code, _, err = run("infer", bundle, tmp_path / "x.npy", "--runtime",
                       "onnxruntime[model.e2e.onnx]", "--provider", "cpu")
    assert code != 0
    assert one_line(err).endswith("model.e2e.onnx takes images and preprocesses them itself; "
                                  "an .npy array is pixel values already (run it with another "
                                  "--runtime)")


def test_images_run_in_runs_of_one_size_within_a_byte_budget():
    """model.e2e.onnx makes a float copy four times the images' size: photos run apart once
    their bytes pass RAW_RUN_BYTES (one at least, however large); model.onnx's inputs, of
    one size, run in one batch."""
    from vit_export.deploy.classify import RAW_RUN_BYTES, _runs

    big = np.zeros((2000, 3000, 3), np.uint8)  # 18 MB: three fit in 64 MiB, not four
    small = np.zeros((30, 40, 3), np.uint8)
    names = list("abcdefgh")
    arrays = [big] * 5 + [small, small, big]
    runs = [[name for name, _ in run] for run in _runs(names, arrays, RAW_RUN_BYTES)]
    assert runs == [list("abc"), list("de"), list("fg"), ["h"]]
    ten = [[len(run)] for run in _runs(list("abcdefghij"), [big] * 10, RAW_RUN_BYTES)]
    assert ten == [[3], [3], [2], [2]]  # the fewest runs within the budget, as even as can be
    huge = np.zeros((6000, 5000, 3), np.uint8)  # 90 MB: over the budget alone
    assert [len(run) for run in _runs(["x", "y"], [huge, huge], RAW_RUN_BYTES)] == [1, 1]
    assert [len(run) for run in _runs(names, arrays)] == [5, 2, 1]


def test_export_on_cuda_without_cuda_is_one_line_before_any_work(tmp_path):
    """It was refused by validation, the last step, after the whole export (a ViT-B/16: 49 s
    of work on 2 cores for one line)."""
    from vit_export import runtime

    problem = runtime.cuda_problem() or (None if runtime.torch_cuda() else "no CUDA device")
    if problem is None:
        pytest.skip("CUDA runs here")
    out = tmp_path / "b"
    code, stdout, stderr = run("export", out, "--preset", "vit_seed_tiny", "--provider", "cuda",
                               "--progress")
    assert code == 1 and not out.exists()
    assert one_line(stderr).startswith("Error: requested CUDAExecutionProvider but ")
    assert "loading the model" not in stdout + stderr


@pytest.mark.slow  # several seconds: the whole suite runs it
def test_info_shows_the_export_verdict_only_for_the_files_config_json_lists(tmp_path):
    """A model.onnx swapped in with config.json re-hashed: info said "parity at export:
    PASS", a verdict on other files."""
    import hashlib
    import json
    import shutil

    from conftest import DIGITS

    bundle = tmp_path / "digits"
    assert run("export", bundle, "--from", DIGITS)[0] == 0
    code, out, _ = run("info", bundle)
    assert code == 0 and "parity at export: PASS on cpu, batches [1, 3, 7] (of the files " \
        "config.json lists; validate checks their bytes)" in out
    other = tmp_path / "other"
    assert run("export", other, "--from", DIGITS, "--seed", "1", "--exporter",
               "torchscript")[0] == 0
    shutil.copy(other / "model.onnx", bundle / "model.onnx")
    config = json.loads((bundle / "config.json").read_text())
    config["files"]["model.onnx"] = hashlib.sha256(
        (bundle / "model.onnx").read_bytes()).hexdigest()
    (bundle / "config.json").write_text(json.dumps(config))
    code, out, _ = run("info", bundle)
    assert code == 0 and "parity at export: PASS" not in out
    assert "parity at export: none for these files: parity.json judged other files" in out


@pytest.mark.parametrize("command", [["serve"], ["bench"]])
def test_a_thread_count_no_machine_has_is_one_line(command, tiny_bundle):
    """serve --threads 100000 never became ready and said nothing."""
    code, _, err = run(command[0], tiny_bundle, *command[1:], "--threads", "100000")
    assert code == 2 and "'--threads': 100000 is not in the range 1<=x<=1024" in err
