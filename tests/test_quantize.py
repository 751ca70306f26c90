"""Static int8: calibration input, the ViT recipe, the ISA that decides it, and validation.

Calibration uses the training part of scikit-learn's digits (the split scripts/train_digits.py
trained on); models/digits/held_out.npz, which measures agreement, is never calibrated on.
"""
import json
import shutil
from pathlib import Path

import numpy as np
import onnx
import pytest
from click.testing import CliRunner
from conftest import make_bundle, run
from onnx import numpy_helper
from PIL import Image

from vit_export import bundle as B
from vit_export import cpu, runtime
from vit_export.benchmarking import BenchRow, recommend
from vit_export.cli import cli
from vit_export.errors import InputError, ParityError
from vit_export.exporting.variants import BATCH_DEPENDENT, batch_dependence, static_int8_options
from vit_export.images import MIN_CALIBRATION_IMAGES, load_calibration
from vit_export.model import random_input
from vit_export.parity.budget import AccuracyBudget, budget_check, measure, over_budget

DIGITS = Path(__file__).resolve().parent.parent / "models" / "digits"
PREP = B.read_bundle(DIGITS, verify=False).description.preprocessing


@pytest.fixture(scope="module")
def train_digits(tmp_path_factory) -> Path:
    """The training part of load_digits as a calibration .npz (uint8 [N, 8, 8])."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    digits = load_digits()
    images = np.round(digits.images * (255 / 16)).astype(np.uint8)
    train, _, _, _ = train_test_split(images, digits.target, test_size=0.2, random_state=0,
                                      stratify=digits.target)
    path = tmp_path_factory.mktemp("calibration") / "train_digits.npz"
    np.savez(path, images=train)
    return path


# ---------------------------------------------------------------- calibration input


def test_calibration_sample_is_seeded_and_recorded(train_digits):
    a = load_calibration(train_digits, PREP, count=32, seed=3)
    b = load_calibration(train_digits, PREP, count=32, seed=3)
    c = load_calibration(train_digits, PREP, count=32, seed=4)
    assert a.x.shape == (32, 1, 8, 8) and a.x.dtype == np.float32
    assert np.array_equal(a.x, b.x) and not np.array_equal(a.x, c.x)
    assert a.record == {"source": "train_digits.npz", "kind": "npz",
                        "sha256": B.sha256_file(train_digits), "available": 1437,
                        "images": 32, "seed": 3}
    assert load_calibration(train_digits, PREP, count=5000).record["images"] == 1437


def test_calibration_from_a_folder_of_images(tmp_path, train_digits):
    with np.load(train_digits) as data:
        images = data["images"][:MIN_CALIBRATION_IMAGES]
    for i, im in enumerate(images):
        Image.fromarray(im).save(tmp_path / f"{i:02d}.png")
    found = load_calibration(tmp_path, PREP, count=64)
    assert found.record["kind"] == "folder" and found.record["images"] == MIN_CALIBRATION_IMAGES
    assert len(found.record["sha256"]) == 64
    (tmp_path / "00.png").write_bytes(b"changed")  # the digest covers the contents
    with pytest.raises(InputError, match="00.png is not an image Pillow can read"):
        load_calibration(tmp_path, PREP)


def _npz(path: Path, images) -> Path:
    np.savez(path, images=images)
    return path


@pytest.mark.parametrize("make, message", [
    (lambda p: p / "missing", "calibration set {p}/missing does not exist"),
    (lambda p: (p / "empty").mkdir() or p / "empty", "{p}/empty holds no image or .npy files"),
    (lambda p: _npz(p / "few.npz", np.zeros((15, 8, 8), np.uint8)),
     "calibration set {p}/few.npz holds 15 image(s); static quantization needs at least 16"),
    (lambda p: _npz(p / "five.npz", np.zeros((20, 8, 8, 5), np.uint8)),
     ("{p}/five.npz: `images` has 5 channels; an image has 1 (gray), 2 (gray, alpha), "
     "3 (RGB) or 4 (RGBA)")),
    (lambda p: _npz(p / "float.npz", np.zeros((20, 8, 8), np.float32)),
     "{p}/float.npz: `images` must be uint8 [N, H, W] or [N, H, W, C], got float32 (20, 8, 8)"),
    (lambda p: (p / "junk.npz").write_bytes(b"not a zip") and p / "junk.npz",
     "{p}/junk.npz is not an .npz of `images` and `labels`: it is not an .npz archive"),
    (lambda p: (p / "x.txt").write_text("x") and p / "x.txt",
     "calibration set {p}/x.txt: expected a folder of images or a .npz with `images`"),
])
def test_bad_calibration_input_is_one_line_and_exit_1(tmp_path, make, message):
    source = make(tmp_path)
    expected = message.format(p=tmp_path)
    with pytest.raises(InputError) as caught:
        load_calibration(source, PREP)
    assert str(caught.value).startswith(expected)
    result = CliRunner().invoke(cli, ["export", str(tmp_path / "out"), "--from", str(DIGITS),
                                      "--quantize", "static", "--calibrate", str(source)])
    assert result.exit_code == 1
    assert result.stderr.startswith("Error: " + expected) and result.stderr.count("\n") == 1
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("args", [["--quantize", "static"], ["--quantize", "int8",
                                                              "--calibrate", "x.npz"]])
def test_calibrate_goes_with_static_only(tmp_path, args):
    result = CliRunner().invoke(cli, ["export", str(tmp_path / "out"), "--from", str(DIGITS)]
                                + args)
    assert result.exit_code == 2
    assert result.stderr == ("Error: --quantize static needs --calibrate PATH, and --calibrate "
                             "applies to --quantize static only\n")


# ---------------------------------------------------------------- the recipe


def test_weight_range_follows_the_isa():
    avx2 = cpu.Isa("avx2 cpu", frozenset({"avx2"}))
    vnni = cpu.Isa("vnni cpu", frozenset({"avx2", "avx512f", "avx512_vnni"}))
    assert static_int8_options(avx2)["reduce_range"] is True  # vpmaddubsw saturates int16
    assert static_int8_options(vnni)["reduce_range"] is False
    assert static_int8_options(avx2)["made_for_isa"] == "AVX2 (no AVX-512, VNNI, AMX, BF16)"


@pytest.fixture(scope="module")
def static_digits(tmp_path_factory, train_digits) -> tuple[Path, dict]:
    out = tmp_path_factory.mktemp("static") / "digits"
    result = CliRunner().invoke(cli, [
        "export", str(out), "--from", str(DIGITS), "--quantize", "static",
        "--calibrate", str(train_digits), "--real-data", str(DIGITS / "held_out.npz"),
        "--batch-sizes", "1,3"])
    assert result.exit_code == 0, result.output + result.stderr
    return out, json.loads((out / B.PARITY_FILE).read_text())


@pytest.mark.slow  # quick suite under 3 min on a Zen 3 (2 cores): CI runs it
def test_static_model_quantizes_only_the_weight_gemms(static_digits):
    out, _ = static_digits
    proto = onnx.load(str(out / "model.int8-static.onnx"))
    nodes = list(proto.graph.node)
    inits = {t.name: numpy_helper.to_array(t) for t in proto.graph.initializer}
    consumers = {}
    for n in nodes:
        for name in n.input:
            consumers.setdefault(name, []).append(n)
    dequantized = [n for n in nodes if n.op_type == "DequantizeLinear"]
    # every dequantized value feeds a MatMul: Add, LayerNorm, Softmax, GELU stay fp32
    assert dequantized and {c.op_type for n in dequantized for c in consumers[n.output[0]]} \
        == {"MatMul"}
    quantized = [c for n in dequantized for c in consumers[n.output[0]]]
    depth = 4
    assert len({n.name for n in quantized}) == 4 * depth  # qkv, proj, fc1, fc2 per block
    assert all(consumers[n.output[0]][0].input[1] == n.output[0]
               for n in dequantized if n.input[0] in inits and inits[n.input[0]].ndim == 2)
    weights = [inits[n.input[0]] for n in dequantized if n.input[0] in inits]
    scales = [inits[n.input[1]] for n in dequantized if n.input[0] in inits]
    assert len(weights) == 4 * depth and all(w.dtype == np.int8 for w in weights)
    assert all(s.shape == (w.shape[1],) for w, s in zip(weights, scales))  # per channel
    reduce = json.loads((out / B.CONFIG_FILE).read_text())["export"]["static_int8"][
        "reduce_range"]
    assert max(int(np.abs(w.astype(int)).max()) for w in weights) == (64 if reduce else 127)
    # the head and the attention's activation x activation MatMuls take no dequantized input
    matmuls = [n for n in nodes if n.op_type in ("MatMul", "Gemm")]
    assert len(matmuls) - len({n.name for n in quantized}) == 2 * depth + 1


@pytest.mark.slow  # an export with calibration: CI runs it
def test_static_int8_refuses_a_graph_whose_weights_it_cannot_find(static_digits, tmp_path):
    """model.onnx as a bundle keeps it (its weights pointed into weights.safetensors, each
    MatMul's reaching it through a Transpose) holds no weight GEMM static int8 can name: an
    error, never onnxruntime's reading of no names, which quantizes every MatMul."""
    from types import SimpleNamespace

    from vit_export.errors import ExportError
    from vit_export.exporting.variants import _converter_input, to_int8_static

    out, _ = static_digits
    proto = _converter_input(out / B.ONNX_FILE)
    weights = {t.name for t in proto.graph.initializer}
    assert any(n.op_type == "Transpose" and n.input[0] in weights for n in proto.graph.node)
    calibration = SimpleNamespace(x=np.zeros((8, 3, 8, 8), np.float32))
    with pytest.raises(ExportError, match="^static int8 found no weight GEMM"):
        to_int8_static(proto, tmp_path, calibration, static_int8_options(cpu.isa()))
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow  # quick suite under 3 min on a Zen 3 (2 cores): CI runs it
def test_static_model_is_validated_and_records_its_calibration(static_digits, train_digits):
    out, report = static_digits
    config = json.loads((out / B.CONFIG_FILE).read_text())
    assert config["export"]["onnx_models"]["model.int8-static.onnx"] == "int8-static"
    assert config["files"]["model.int8-static.onnx"] == B.sha256_file(
        out / "model.int8-static.onnx")
    static = config["export"]["static_int8"]
    assert static["calibration"] == {"source": "train_digits.npz", "kind": "npz",
                                     "sha256": B.sha256_file(train_digits),
                                     "available": 1437, "images": 64, "seed": 0}
    assert static["reduce_range"] is (not cpu.isa().int8_dot)
    assert report["passed"]
    held = [r for r in report["results"] if r["inputs"] == "held_out"
            and r["candidate"] == "onnxruntime[model.int8-static.onnx]"]
    assert len(held) == 1 and held[0]["profile"] == "int8-static" and held[0]["batch"] == 360
    tol = report["profiles"]["int8-static"]
    assert held[0]["top1_decisive"] >= tol["min_top1"] and held[0]["cosine"] >= tol["min_cosine"]


# ---------------------------------------------------------------- an accuracy budget


def test_a_budget_is_judged_on_the_drop_and_the_lowest_cosine():
    reference = np.array([[2.0, 0.0], [0.0, 2.0], [2.0, 0.0], [0.0, 2.0]])
    logits = np.array([[2.0, 0.1], [0.0, 2.0], [0.0, 2.0], [0.0, 2.0]])  # one flipped
    found = measure(reference, logits, np.array([0, 1, 0, 1]))
    assert (found.reference_accuracy, found.accuracy, found.drop) == (100.0, 75.0, 25.0)
    assert over_budget(AccuracyBudget(25), found) is None
    assert over_budget(AccuracyBudget(24.9), found) == (
        "loses 25.00 top-1 points against eager fp32 (75.00% vs 100.00%), budget 24.9")
    assert over_budget(AccuracyBudget(25, min_cosine=0.5), found).startswith(
        "gives one image a logit cosine of 0.000000 against eager fp32, budget 0.5")
    with pytest.raises(ParityError, match="0 to 100 top-1 points, got -1"):
        AccuracyBudget(-1)


NEEDS_LABELS = ("--max-drop needs --quantize static and --real-data FILE.npz (labelled "
                "images the drop is measured on)")


@pytest.mark.parametrize("args, message", [
    (["--quantize", "static", "--calibrate", "x.npz", "--max-drop", "1"], NEEDS_LABELS),
    (["--quantize", "int8", "--real-data", "x.npz", "--max-drop", "1"], NEEDS_LABELS),
    (["--quantize", "static", "--calibrate", "x.npz", "--real-data", "y.npz",
      "--budget-min-cosine", "0.9"],
     "--budget-min-cosine is part of an accuracy budget: give --max-drop"),
    (["--quantize", "static", "--calibrate", "x.npz", "--real-data", "y.npz",
      "--min-cosine", "0.9"],
     "--min-cosine is now --budget-min-cosine (a static int8 budget's lowest cosine)"),
])
def test_a_budget_needs_static_int8_and_labelled_images(tmp_path, args, message):
    result = CliRunner().invoke(cli, ["export", str(tmp_path / "out"), "--from", str(DIGITS)]
                                + args)
    assert result.exit_code == 2
    assert result.stderr == f"Error: {message}\n"


def _export_within(out: Path, train_digits: Path, *budget: str):
    return CliRunner().invoke(cli, [
        "export", str(out), "--from", str(DIGITS), "--quantize", "static",
        "--calibrate", str(train_digits), "--real-data", str(DIGITS / "held_out.npz"),
        "--batch-sizes", "1", *budget])


@pytest.fixture(scope="module")
def budget_digits(tmp_path_factory, train_digits) -> Path:
    """Static int8 within 0 points and a cosine of 0.999: fully quantized, the digits fall
    below that cosine on every machine measured, so blocks are kept."""
    out = tmp_path_factory.mktemp("budget") / "digits"
    result = _export_within(out, train_digits, "--max-drop", "0", "--budget-min-cosine",
                            "0.999")
    assert result.exit_code == 0, result.output + result.stderr
    return out


def _quantized_gemms(path: Path) -> int:
    proto = onnx.load(str(path))
    dequantized = {n.output[0] for n in proto.graph.node if n.op_type == "DequantizeLinear"}
    return len({n.name for n in proto.graph.node
                if n.op_type == "MatMul" and set(n.input) & dequantized})


@pytest.mark.slow  # digits exports with static int8 and their validation
def test_a_budget_met_records_the_blocks_it_kept_and_the_drop_it_measured(budget_digits):
    config = json.loads((budget_digits / B.CONFIG_FILE).read_text())
    budget = config["export"]["static_int8"]["budget"]
    assert (budget["max_drop"], budget["min_cosine"]) == (0.0, 0.999)
    measured = budget["measured"]
    assert measured["inputs"] == "held_out" and measured["images"] == 360
    assert measured["drop"] <= 0 and measured["min_cosine"] >= 0.999
    kept = budget["kept_fp32"]
    assert set(kept) <= {f"blocks.{i}" for i in range(4)} and len(kept) < 4
    assert len(budget["kept_nodes"]) == 4 * len(kept)  # qkv, proj, fc1, fc2 of each
    # the kept blocks are fp32 in the graph: 4 quantized GEMMs per block left
    assert _quantized_gemms(budget_digits / "model.int8-static.onnx") == 4 * (4 - len(kept))
    report = json.loads((budget_digits / B.PARITY_FILE).read_text())
    held = next(r for r in report["results"] if r["inputs"] == "held_out"
                and r["candidate"] == "onnxruntime[model.int8-static.onnx]")
    assert held["accuracy"] * 100 == pytest.approx(measured["accuracy"])  # what export saw
    check = next(c for c in report["checks"] if "accuracy budget" in c["name"])
    assert check["passed"] and check["name"] == ("model.int8-static.onnx within its "
                                                 "accuracy budget")


@pytest.mark.slow
def test_a_budget_too_tight_is_refused_in_one_line_and_nothing_is_written(tmp_path,
                                                                          train_digits):
    out = tmp_path / "digits"
    result = _export_within(out, train_digits, "--max-drop", "0", "--budget-min-cosine",
                            "1")
    assert result.exit_code == 1
    assert result.stderr.startswith(
        "Error: static int8 cannot meet the accuracy budget on held_out, nothing written: "
        "with blocks.") and result.stderr.count("\n") == 1
    assert "kept in fp32 it gives one image a logit cosine of" in result.stderr
    assert result.stderr.endswith("budget 1\n")
    assert not out.exists() and list(tmp_path.iterdir()) == []


@pytest.mark.slow
@pytest.mark.parametrize("real_data", [False, True])
def test_validate_holds_static_int8_to_the_budget_config_json_records(tmp_path, budget_digits,
                                                                      real_data):
    bundle = tmp_path / "digits"
    shutil.copytree(budget_digits, bundle)
    passed = CliRunner().invoke(cli, ["validate", str(bundle), "--batch-sizes", "1"])
    assert passed.exit_code == 0, passed.output + passed.stderr
    config = json.loads((bundle / B.CONFIG_FILE).read_text())
    config["export"]["static_int8"]["budget"]["min_cosine"] = 1.0  # tightened after export
    (bundle / B.CONFIG_FILE).write_text(json.dumps(config))
    args = ["--real-data", str(DIGITS / "held_out.npz")] if real_data else []
    result = CliRunner().invoke(cli, ["validate", str(bundle), "--batch-sizes", "1", *args])
    assert result.exit_code == 1
    on = "held_out" if real_data else "held_out, as recorded at export"
    assert result.stderr.startswith(
        "Error: parity failed: model.int8-static.onnx within its accuracy budget: gives one "
        "image a logit cosine of ")
    assert f"budget 1 on {on}; kept in fp32: blocks." in result.stderr


# ---------------------------------------------------------------- answers that depend on the batch


@pytest.fixture(scope="module")
def int8_bundle(tmp_path_factory) -> Path:
    """The seed-sized model with model.int8.onnx (dynamic int8) beside model.onnx."""
    return make_bundle(tmp_path_factory.mktemp("int8") / "tiny", variants=["int8"])


def test_dynamic_int8_answers_an_image_differently_beside_other_images(int8_bundle):
    bundle = B.read_bundle(int8_bundle)
    image = random_input(bundle.config, 1, seed=1).numpy()
    mates = 4 * random_input(bundle.config, 7, seed=2).numpy()  # a wider range of activations
    batch = np.concatenate([image, mates])
    moved = {}
    for file in (B.ONNX_FILE, "model.int8.onnx"):
        runner = runtime.ort_runner(bundle.onnx_model(file), "cpu")
        assert runner.device == "cpu"
        moved[file] = float(np.abs(runner(image)[0] - runner(batch)[0]).max())
    assert moved[B.ONNX_FILE] < 1e-5  # fp32: the same answer alone and batched
    assert moved["model.int8.onnx"] > 100 * max(moved[B.ONNX_FILE], 1e-6)
    assert batch_dependence("onnxruntime[model.int8.onnx]") == (
        "onnxruntime[model.int8.onnx]: " + BATCH_DEPENDENT["model.int8.onnx"])
    assert batch_dependence("onnxruntime[model.int8-static.onnx]") is None
    assert batch_dependence("onnxruntime") is None


def _row(backend: str, batch: int, p50: float) -> BenchRow:
    return BenchRow(backend, "cpu", "host", batch, 5, p50, p50, p50, batch / p50, 1.0, 0.1,
                    1.0, 100.0, "int8" if "int8" in backend else "fp32", True)


def test_batched_traffic_gets_a_model_whose_answers_do_not_depend_on_the_batch():
    int8 = "onnxruntime[model.int8.onnx]"
    rows = [_row("onnxruntime", b, 2.0) for b in (1, 8)] + [_row(int8, b, 1.0) for b in (1, 8)]
    chosen = recommend(rows)
    assert chosen[1]["backend"] == int8 and "note" not in chosen[1]  # one image: no batch-mates
    assert chosen[8]["backend"] == "onnxruntime"  # faster int8 passed over, and said so
    assert chosen[8]["note"].startswith(f"{int8} ran faster (")
    assert chosen[8]["note"].endswith(f"{BATCH_DEPENDENT['model.int8.onnx']}; chosen instead: "
                                      f"onnxruntime, whose answers do not")
    static = "onnxruntime[model.int8-static.onnx]"
    rows += [_row(static, 8, 1.5)]
    assert recommend(rows)[8]["backend"] == static  # fixed ranges: the fastest steady one
    only = recommend([_row(int8, 8, 1.0)])  # nothing else was validated: chosen, with the why
    assert only[8] == {**only[8], "backend": int8, "note": batch_dependence(int8)}


def test_triton_and_infer_say_a_dynamic_int8_answer_depends_on_the_batch(tmp_path,
                                                                          int8_bundle):
    note = batch_dependence("model.int8.onnx")
    code, out, err = run("triton", int8_bundle, tmp_path / "repo")
    assert code == 0, err
    assert f"note: vit_seed_tiny_onnx_int8 serves {note}\n" in out
    code, out, err = run("triton", int8_bundle, tmp_path / "one", "--max-batch-size", "1")
    assert code == 0 and "dynamic int8" not in out  # a batch of one has no batch-mates
    images = []
    for seed in (1, 2):
        images.append(tmp_path / f"{seed}.npy")
        np.save(images[-1], random_input(B.read_bundle(int8_bundle).config, 1,
                                         seed=seed).numpy()[0])
    code, out, err = run("infer", int8_bundle, *images, "--runtime",
                         "onnxruntime[model.int8.onnx]", "--batch-size", "2")
    assert code == 0, err
    assert err.endswith(f"note: onnxruntime[model.int8.onnx]: {BATCH_DEPENDENT['model.int8.onnx']}"
                        f"; --batch-size 1 answers each image alone\n")


@pytest.mark.parametrize("max_batch, said", [(8, True), (1, False)])
def test_serve_says_a_dynamic_int8_answer_depends_on_the_batch(monkeypatch, int8_bundle,
                                                               max_batch, said):
    import socket

    import vit_export.deploy.ray.serve as cli_module

    with socket.socket() as probe:  # a port free now
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    served = []
    monkeypatch.setattr(cli_module, "serve_bundle",  # no Ray: what serve says before it
                        lambda bundle, options, address, started: served.append(options))
    code, _, err = run("serve", int8_bundle, "--runtime", "onnxruntime[model.int8.onnx]",
                       "--max-batch-size", max_batch, "--port", port)
    assert code == 0, err
    assert served[0].runtime == "onnxruntime[model.int8.onnx]"
    note = (f"note: {batch_dependence('onnxruntime[model.int8.onnx]')}; --max-batch-size 1 "
            f"answers each request alone\n")
    assert (note in err) is said


@pytest.mark.parametrize("record", ["tight", {"max_drop": "x"}, {"max_drop": 1, "kept_fp32": 3},
                                    {"max_drop": 200}])
def test_a_budget_config_json_cannot_hold_is_one_line(record):
    with pytest.raises(ParityError, match="accuracy budget"):
        budget_check(record, None)


@pytest.mark.slow  # quick suite under 3 min on a Zen 3 (2 cores): CI runs it
def test_bench_sets_each_model_s_speed_beside_its_measured_top1_drop(static_digits):
    from vit_export import render
    from vit_export.benchmarking import bench

    out, report = static_digits
    result = bench(out, batch_sizes=[1], warmup=0, min_runs=1, min_seconds=0)
    int8 = "onnxruntime[model.int8-static.onnx]"
    row = next(r for r in report["results"]
               if r["candidate"] == int8 and r["inputs"] == "held_out")
    assert result.accuracy[int8]["drop"] == pytest.approx(
        100 * (row["reference_accuracy"] - row["accuracy"]), abs=1e-3)
    assert result.accuracy[int8]["images"] == 360
    table = render.bench_table(result, str(out)).splitlines()
    header = next(line for line in table if line.startswith("backend"))
    assert header.endswith(" top-1 drop")
    line = next(line for line in table if line.startswith(int8))
    assert line.endswith(f"{result.accuracy[int8]['drop']:>7.2f} pt")
    assert any(line.startswith("top-1 drop: points of top-1 accuracy below eager's (97.50%) "
                               "on held_out (360 labelled images)") for line in table)
