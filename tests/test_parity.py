import io
import json
import shutil

import numpy as np
import onnx
import pytest
import torch
from conftest import make_bundle, rewrite_hash
from onnx import numpy_helper

from vit_export import bundle as B
from vit_export import parity, render
from vit_export.errors import OptionError, ParityError, SavedRunError
from vit_export.model import create_model
from vit_export.parity import ValidateOptions

TOL = parity.PROFILES["fp32"]


def test_compare_exact_numbers():
    ref = np.array([[1.0, 2.0, 4.0], [0.0, -4.0, 1.0]], np.float32)
    cand = ref.copy()
    cand[0, 1] += 0.5
    m = parity.compare(ref, cand, TOL)
    assert m["max_abs"] == pytest.approx(0.5)
    assert m["max_rel"] == pytest.approx(0.5 / 4.0)
    assert m["top1"] == 1.0 and not m["passed"]
    assert m["failures"][0] == "max abs error 0.5 > 0.0001"
    assert parity.compare(ref, ref, TOL)["passed"]


def test_compare_top1_flip_is_excused_only_at_a_tie():
    ref = np.array([[1.0, 1.00001, 0.0]], np.float32)
    flipped = np.array([[1.00002, 1.00001, 0.0]], np.float32)
    m = parity.compare(ref, flipped, TOL)
    assert m["top1"] == 0.0 and m["top1_decisive"] == 1.0 and m["passed"]
    loose = parity.Tolerance(atol=1.0, rtol=1.0, min_cosine=0.0, min_top1=1.0, stage_rel_l2=1.0)
    m = parity.compare(np.array([[0.0, 5.0]]), np.array([[6.0, 5.0]]), loose)
    assert m["top1_decisive"] == 0.0 and "top-1 agreement 0.0000 < 1.0" in m["failures"]


def test_compare_shape_mismatch_and_nan_fail():
    assert not parity.compare(np.zeros((2, 3)), np.zeros((3, 3)), TOL)["passed"]
    m = parity.compare(np.zeros((1, 3)), np.array([[0.0, np.nan, 0.0]]), TOL)
    assert "non-finite values in the output" in m["failures"]


def test_scan_finds_batch_baked_into_a_static_export(tmp_path):
    """The bug users hit: an export without dynamic axes bakes the batch into shape constants."""
    model = create_model("vit_seed_tiny").eval()
    path = tmp_path / "static.onnx"
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(model, (torch.randn(2, 3, 32, 32),), str(path), dynamo=False,
                          input_names=["pixel_values"], output_names=["logits"],
                          opset_version=18)
    checks = {c.name: c for c in parity.scan_graph(path, export_batch=2)}
    assert not checks["static.onnx: symbolic batch axis on pixel_values"].passed
    baked = checks["static.onnx: no baked batch in shape constants"]
    assert not baked.passed and "Reshape" in baked.detail and "[2, " in baked.detail


def test_scan_tells_a_baked_batch_from_a_constant_shaped_like_one(tmp_path):
    """A Reshape of what the batch reaches to [2, ...] is a baked batch; one of a tensor the
    exporter recorded as fixed-shape (computed from constants: Swin's window mask) is not."""
    from onnx import TensorProto, helper

    mask = numpy_helper.from_array(np.zeros((4, 49), np.float32), "mask")
    shape = numpy_helper.from_array(np.array([2, 7, 2, 7], np.int64), "grid")
    flat = numpy_helper.from_array(np.array([2, -1], np.int64), "flat")
    graph = helper.make_graph(
        [helper.make_node("Reshape", ["mask", "grid"], ["mask4"]),
         helper.make_node("Reshape", ["x", "flat"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 6])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", None])],
        initializer=[mask, shape, flat])
    onnx.save(helper.make_model(graph), tmp_path / "g.onnx")
    checks = {c.name: c for c in parity.scan_graph(tmp_path / "g.onnx", 2)}
    baked = checks["g.onnx: no baked batch in shape constants"]
    assert not baked.passed and "[2, -1]" in baked.detail and "[2, 7, 2, 7]" not in baked.detail


def test_scan_passes_our_export(tiny_bundle):
    assert all(c.passed for c in parity.scan_graph(tiny_bundle / B.ONNX_FILE, 2))


def test_validate_reports_a_perturbed_onnx_export(tiny_bundle, tmp_path):
    copy = tmp_path / "b"
    shutil.copytree(tiny_bundle, copy)
    proto = onnx.load(str(copy / B.ONNX_FILE))
    # one block's weights perturbed (the dynamo exporter keeps bias names; weights are folded)
    target = next(t for t in proto.graph.initializer if t.name == "blocks.0.mlp.fc1.bias")
    array = numpy_helper.to_array(target).copy()
    array += 0.01
    target.CopyFrom(numpy_helper.from_array(array, target.name))
    onnx.save(proto, str(copy / B.ONNX_FILE))
    rewrite_hash(copy, B.ONNX_FILE)
    report = parity.validate(copy, ValidateOptions(batch_sizes=[1, 4]))
    assert not report.passed
    bad = [r for r in report.results if not r.passed]
    assert {r.candidate for r in bad} == {"onnxruntime"} and {r.batch for r in bad} == {1, 4}
    assert all(r.max_abs > 1e-3 for r in bad)
    assert report.failures[0].startswith("onnxruntime batch 1 (random(seed=0)): max abs error")


def test_validate_with_real_inputs_reports_accuracy(tiny_bundle):
    rng = np.random.default_rng(1)
    x = rng.standard_normal((10, 3, 32, 32), dtype=np.float32)
    eager = B.load_eager(B.read_bundle(tiny_bundle))
    labels = eager(torch.from_numpy(x)).argmax(1).numpy()
    labels[:3] = (labels[:3] + 1) % 10  # three wrong labels: 70% accuracy
    report = parity.validate(tiny_bundle, ValidateOptions(batch_sizes=[1, 4],
                                                          real_inputs={"held": (x, labels)},
                                                          trust_code=True))
    rows = [r for r in report.results if r.inputs == "held"]
    assert {r.candidate for r in rows} == {"torchscript", "onnxruntime"}
    assert all(r.batch == 10 and r.accuracy == pytest.approx(0.7) for r in rows)
    assert all(r.reference_accuracy == pytest.approx(0.7) for r in rows)


@pytest.mark.parametrize("values, says", [
    (dict(batch_sizes=[0, 2]), "batch_sizes=0 is not an integer >= 1"),
    (dict(batch_sizes=["2"]), "batch_sizes='2' is not an integer >= 1"),
    (dict(batch_sizes=[]), "batch_sizes=[]: give one batch size or more"),
    (dict(seed=-1), "seed=-1 is not an integer in"),
    (dict(threads=0), "threads=0 is not an integer in [1, 1024]"),
    (dict(threads=100_000), "threads=100000 is not an integer in [1, 1024]"),
    (dict(batch_sizes="18"), "batch_sizes='18': give a list of integers"),
    (dict(overrides={"atol": 10 ** 400}), "atol=1000"),
    (dict(profile="bogus"), "profile='bogus': choose one of fp32, "),
    (dict(overrides={"atol": float("nan")}), "atol=nan is not a finite number in [0, 1e+06]"),
    (dict(overrides={"rtol": float("inf")}), "rtol=inf is not a finite number"),
    (dict(overrides={"min_cosine": -5}), "min_cosine=-5 is not a finite number in [-1, 1]"),
    (dict(overrides={"min_neighbours": -1}), "min_neighbours=-1 is not"),
    (dict(overrides={"min_top1": 0.5}), "unknown tolerance 'min_top1'"),
])
def test_validate_options_hold_the_flags_ranges(values, says):
    """What validate's flags refuse, its options refuse for every caller, before any run:
    an infinite tolerance would judge nothing, a NaN fail what passes."""
    with pytest.raises(OptionError) as refused:
        ValidateOptions(**values)
    assert says in str(refused.value)


def test_validates_flags_hold_the_tolerances_to_the_options_ranges():
    """The two spellings of one rule stay one rule: each tolerance flag's range is the
    range ValidateOptions holds the keyword to."""
    from vit_export.cli import cli
    from vit_export.parity.validation import TOLERANCE_RANGES

    types = {p.name: p.type for p in cli.commands["validate"].params}
    assert {name: (types[name].low, types[name].high) for name in TOLERANCE_RANGES} == \
        TOLERANCE_RANGES


def test_validate_options_take_one_runtime_as_one_name():
    assert ValidateOptions(runtimes="openvino").runtimes == ("openvino",)


def test_inputs_from_files_reads_what_validate_images_and_real_data_read(tiny_bundle, tmp_path):
    """Image files and an .npy go in preprocessed as one set, "images"; the labelled .npz as
    a set named by its stem; only the image files go to the pipeline check, and a bundle
    without model.e2e.onnx gets no uint8 pictures."""
    from PIL import Image

    rng = np.random.default_rng(0)
    files = [tmp_path / "a.png", tmp_path / "b.png", tmp_path / "x.npy"]
    for f in files[:2]:
        Image.fromarray(rng.integers(0, 256, (40, 36, 3), dtype=np.uint8)).save(f)
    np.save(files[2], rng.standard_normal((3, 3, 32, 32)).astype(np.float32))
    np.savez(tmp_path / "held.npz", images=rng.integers(0, 256, (4, 32, 32, 3), dtype=np.uint8),
             labels=np.arange(4))
    found = B.read_bundle(tiny_bundle)
    given = parity.inputs_from_files(found, files, tmp_path / "held.npz")
    assert given.real_inputs.keys() == {"held", "images"}
    x, labels = given.real_inputs["images"]
    assert x.shape == (5, 3, 32, 32) and labels is None
    x, labels = given.real_inputs["held"]
    assert x.shape == (4, 3, 32, 32) and labels.tolist() == [0, 1, 2, 3]
    assert given.raw_images is None and given.image_files == files[:2]
    assert parity.inputs_from_files(found) == parity.FileInputs()


@pytest.fixture(scope="module", params=["dynamo", "torchscript"])
def deep_bundle(request, tmp_path_factory):
    """Four blocks with no two weights alike (trained-like), so each block has its own."""
    torch.manual_seed(0)
    model = create_model("vit_seed_tiny", depth=4).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.02)
    description = B.Description(model.config, B.Preprocessing.default_for(model.config))
    from vit_export.exporting import ExportOptions, export_bundle
    out = tmp_path_factory.mktemp(request.param) / "deep"
    export_bundle(model, out, description, ExportOptions(exporter=request.param))
    return out


def _perturb(bundle_dir, tmp_path, name, delta):
    copy = tmp_path / "planted"
    shutil.copytree(bundle_dir, copy)
    proto = onnx.load(str(copy / B.ONNX_FILE))
    target = next(t for t in proto.graph.initializer if t.name == name)
    target.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(target) + delta, name))
    onnx.save(proto, str(copy / B.ONNX_FILE))
    rewrite_hash(copy, B.ONNX_FILE)
    return copy


def test_layers_find_every_stage_and_pass_a_good_export(deep_bundle):
    report = parity.validate(deep_bundle, ValidateOptions(batch_sizes=[2], layers=True))
    assert report.passed and report.first_divergence == {}
    stages = [s.stage for s in report.stages]
    assert stages == [name for name, _ in parity.stage_names(create_model(
        "vit_seed_tiny", depth=4).config)]
    assert max(s.rel_l2 for s in report.stages) < 1e-5


def test_planted_divergence_names_the_block(deep_bundle, tmp_path):
    planted = _perturb(deep_bundle, tmp_path, "blocks.2.mlp.fc1.bias", 0.05)
    report = parity.validate(planted, ValidateOptions(batch_sizes=[2], layers=True))
    assert not report.passed
    assert report.first_divergence[B.ONNX_FILE].startswith(
        "block 2 MLP first exceeds rel L2 1e-05")
    by_stage = {s.stage: s for s in report.stages}
    assert all(by_stage[s].passed for s in ("patch_embed", "blocks.1", "blocks.2.attn"))
    assert not by_stage["blocks.2.mlp"].passed and not by_stage["blocks.3"].passed
    # the shipped model was not touched: the temporary copy carried the extra outputs
    assert len(onnx.load(str(planted / B.ONNX_FILE)).graph.output) == 1


@pytest.mark.slow  # quick suite under 3 min on a Zen 3 (2 cores): CI runs it
@pytest.mark.parametrize("exporter", ["dynamo", "torchscript"])
def test_layers_leave_out_modules_inside_onnx_runtime_fusions(tmp_path, exporter):
    """In model.opt.onnx SkipLayerNormalization holds each block's residual Add and the
    projection's bias, so no block, attention or MLP has an output of its own there: only the
    stages before the first block are compared, not the bias-less MatMul before the fusion."""
    bundle_dir = make_bundle(tmp_path / "b", exporter=exporter, variants=["optimized"])
    report = parity.validate(bundle_dir, ValidateOptions(batch_sizes=[2], layers=True))
    assert report.passed, report.failures
    assert [s.stage for s in report.stages if s.model == "model.opt.onnx"] == [
        "patch_embed", "pos_embed"]
    assert len([s for s in report.stages if s.model == B.ONNX_FILE]) == len(
        parity.stage_names(create_model("vit_seed_tiny").config))


def test_junit_failure_count_equals_the_report(deep_bundle, tmp_path):
    from xml.etree import ElementTree as ET
    planted = _perturb(deep_bundle, tmp_path, "blocks.1.attn.proj.bias", 0.05)
    for bundle_dir in (deep_bundle, planted):
        report = parity.validate(bundle_dir, ValidateOptions(batch_sizes=[1, 3], layers=True))
        suite = ET.fromstring(render.junit(report))
        failed = [c for c in suite.iter("testcase") if c.find("failure") is not None]
        assert int(suite.get("failures")) == len(failed) == len(report.failures)
        assert int(suite.get("tests")) == len(report.results) + len(report.checks) + len(
            report.stages)
    assert len(report.failures) > 0
    markdown = render.markdown(report)
    assert markdown.startswith(f"### vit-export parity: FAIL ({len(report.failures)} failed)")
    assert "block 1 attention first exceeds" in markdown


def test_profiles_and_overrides():
    assert parity.profile_tolerance("fp16").min_cosine == 0.999
    tightened = parity.profile_tolerance("fp32", {"atol": 1e-9, "rtol": None})
    assert tightened.atol == 1e-9 and tightened.rtol == parity.PROFILES["fp32"].rtol
    with pytest.raises(ParityError, match="unknown tolerance profile 'bf8'"):
        parity.profile_tolerance("bf8")


def test_require_provider_is_a_failed_check(tiny_bundle):
    from conftest import auto_device

    ran = auto_device()  # what --provider auto really gets here
    report = parity.validate(tiny_bundle, ValidateOptions(batch_sizes=[1], require_provider=ran))
    checks = {c.name: c.passed for c in report.checks}  # on CUDA the placement check follows
    assert report.passed and checks[f"provider is {ran}"] is True
    other = "cpu" if ran == "cuda" else "cuda"
    report = parity.validate(tiny_bundle, ValidateOptions(batch_sizes=[1], require_provider=other))
    assert not report.passed
    assert report.failures == [f"provider is {other}: {ran} ran (requested auto)"]


def test_a_model_that_raises_while_running_is_one_line_naming_the_stage(tiny_bundle, tmp_path):
    """A runner that raises in the run stage (here ONNX Runtime: a graph that reshapes its
    logits to a baked batch of 2, run at batch 1; on CUDA it was eager PyTorch) is
    one line naming the runner, its device and the inputs, never a traceback."""
    from conftest import one_line, run

    bundle = tmp_path / "b"
    shutil.copytree(tiny_bundle, bundle)
    proto = onnx.load(str(bundle / B.ONNX_FILE))
    graph = proto.graph
    for node in graph.node:
        node.output[:] = ["raw" if o == "logits" else o for o in node.output]
    graph.initializer.append(numpy_helper.from_array(np.array([2, 10], np.int64), "baked"))
    graph.node.append(onnx.helper.make_node("Reshape", ["raw", "baked"], ["logits"]))
    onnx.save(proto, str(bundle / B.ONNX_FILE))
    rewrite_hash(bundle, B.ONNX_FILE)
    with pytest.raises(ParityError, match=r"^onnxruntime on cpu failed on random\(seed=0\): ") \
            as info:
        parity.validate(bundle, ValidateOptions(batch_sizes=[1], provider="cpu"))
    assert "\n" not in str(info.value)
    code, _, err = run("validate", bundle, "--batch-sizes", "1", "--provider", "cpu")
    assert code == 1 and one_line(err) == f"Error: {info.value}"


@pytest.mark.slow  # three real-data validations of a fresh int8 bundle: 6 s
def test_real_data_verdict_does_not_depend_on_chunking(tmp_path):
    """--batch-sizes governs the random batches only: real data runs in fixed chunks and is
    judged whole, so changing the batch sizes changes nothing in its rows. (A dynamic int8
    model's outputs depend on the batch an input shares: chunking must not follow them.)"""
    from conftest import make_bundle

    bundle_dir = make_bundle(tmp_path / "b", variants=["int8"])
    x = np.random.default_rng(3).standard_normal((60, 3, 32, 32), dtype=np.float32)
    labels = np.arange(60) % 10
    reports = [parity.validate(bundle_dir, ValidateOptions(batch_sizes=sizes,
                                                           real_inputs={"held": (x, labels)},
                                                           trust_code=True))
               for sizes in ([1, 3, 7], [2, 5])]
    rows = [{r.candidate: r for r in report.results if r.inputs == "held"} for report in reports]
    assert rows[0].keys() == rows[1].keys() == {
        "torchscript", "onnxruntime", "onnxruntime[model.int8.onnx]"}
    for name in rows[0]:
        a, b = rows[0][name], rows[1][name]
        assert a.batch == b.batch == 60
        assert a == b  # every number, not only the verdict
    assert reports[0].passed == reports[1].passed


def test_markdown_and_text_carry_accuracy_and_stages(deep_bundle):
    x = np.random.default_rng(0).standard_normal((6, 3, 32, 32), dtype=np.float32)
    report = parity.validate(deep_bundle, ValidateOptions(
        batch_sizes=[2], layers=True, real_inputs={"held": (x, np.arange(6) % 10)}))
    markdown, text = render.markdown(report), render.text(report)
    accuracy = next(r for r in report.results if r.candidate == "onnxruntime" and r.accuracy
                    is not None)
    shown = f"{accuracy.accuracy:.2%} (eager {accuracy.reference_accuracy:.2%})"
    assert shown in markdown and f"onnxruntime {accuracy.accuracy:.2%}" in text
    assert "| model.onnx | block 3 MLP | 2 |" in markdown
    assert len([line for line in markdown.splitlines() if line.startswith("| model.onnx |")]) \
        == len(report.stages)
    assert text.rstrip().endswith("PASS")


@pytest.mark.slow  # quick suite under 3 min on a Zen 3 (2 cores): CI runs it
def test_a_precision_the_file_does_not_have_is_caught(tmp_path):
    """Declaring model.onnx int8 in config.json would buy the int8 profile's loose tolerance
    for an fp32 file: the graph says what it is, the check fails, and the fp32 profile judges."""
    from conftest import make_bundle

    bundle_dir = make_bundle(tmp_path / "b", variants=["fp16", "int8"])
    found = {name: parity.graph_precision(bundle_dir / name)
             for name in ("model.onnx", "model.fp16.onnx", "model.int8.onnx")}
    assert found == {"model.onnx": "fp32", "model.fp16.onnx": "fp16", "model.int8.onnx": "int8"}
    report = parity.validate(bundle_dir, ValidateOptions(batch_sizes=[1]))
    assert all(c.passed for c in report.checks)
    config = json.loads((bundle_dir / B.CONFIG_FILE).read_text())
    config["export"]["onnx_models"] = {"model.onnx": "int8", "model.fp16.onnx": "fp16",
                                       "model.int8.onnx": "int8"}
    (bundle_dir / B.CONFIG_FILE).write_text(json.dumps(config))
    report = parity.validate(bundle_dir, ValidateOptions(batch_sizes=[1]))
    failed = [c for c in report.checks if not c.passed]
    assert [(c.name, c.detail) for c in failed] == [
        ("model.onnx: precision is the declared int8", "the graph holds fp32 weights and ops")]
    assert {r.profile for r in report.results if r.candidate == "onnxruntime"} == {"fp32"}
    assert not report.passed


def test_profile_tf32_judges_the_fp32_models_and_leaves_fp16_its_own(tmp_path):
    """--profile tf32: the fp32 ONNX models are judged by tf32 (ONNX Runtime's CUDA provider
    computing in TF32), an fp16 model beside them by fp16, TorchScript by fp32; the report
    says TF32 was on. Only CUDA has TF32: on a CPU run the profile is refused, not applied
    to fp32 compute it does not describe. A profile no model of the bundle has is refused."""
    from conftest import auto_device, make_bundle

    bundle = make_bundle(tmp_path / "b", variants=["fp16"])
    if auto_device() == "cpu":
        with pytest.raises(ParityError, match="^profile='tf32' judges TF32 compute, which "
                                              "ONNX Runtime has on CUDA only, and this run "
                                              "is on cpu$") as caught:
            parity.validate(bundle, ValidateOptions(batch_sizes=[1], profile="tf32"))
        # the library names its keyword, the CLI its flag, in the one message
        assert caught.value.cli_message().startswith("--profile tf32 judges TF32 compute")
    else:
        report = parity.validate(bundle, ValidateOptions(batch_sizes=[1, 2], profile="tf32",
                                                         trust_code=True))
        profiles = {r.candidate: r.profile for r in report.results}
        assert profiles == {"torchscript": "fp32", "onnxruntime": "tf32",
                            "onnxruntime[model.fp16.onnx]": "fp16"}
        assert report.passed and report.tf32
        assert "TF32 on in ONNX Runtime (eager in full fp32)" in render.text(report)
    assert not parity.validate(bundle, ValidateOptions(batch_sizes=[1])).tf32
    with pytest.raises(ParityError, match=r"^profile='int8' is for int8 models, and this "
                                          r"bundle has none \(model.fp16.onnx, model.onnx\)$"):
        parity.validate(bundle, ValidateOptions(batch_sizes=[1], profile="int8"))


# ---------------------------------------------------------------- saved runs and compare


@pytest.fixture(scope="module")
def saved_runs(tiny_bundle, tmp_path_factory):
    """Two runs of `validate --provider cpu --save-outputs`, as a CPU CI job keeps them, and
    the first one's report."""
    from conftest import run

    folder = tmp_path_factory.mktemp("saved")
    for name in ("a", "b"):
        code, out, err = run("validate", tiny_bundle, "--batch-sizes", "1,3", "--provider",
                             "cpu", "--save-outputs", folder / f"{name}.npz", "--report",
                             folder / f"{name}.json")
        assert code == 0 and out.endswith("PASS\n"), out + err
    return folder


def _rewritten(path, out, change) -> None:
    """A copy of saved run `path` at `out`, `change(arrays, meta)` applied to its arrays and
    run.json (the file as someone who edits it would write it)."""
    with np.load(path, allow_pickle=False) as data:
        arrays = {k: data[k] for k in data.files}
    meta = json.loads(str(arrays["run.json"]))
    change(arrays, meta)
    arrays["run.json"] = np.array(json.dumps(meta))
    np.savez(out, **arrays)


def test_a_saved_run_is_judged_again_exactly_as_validate_judged_it(tiny_bundle, tmp_path):
    """save -> load -> compare_run gives the report's rows, every number: the run is whole
    data, and comparing it needs no model."""
    x = np.random.default_rng(2).standard_normal((5, 3, 32, 32), dtype=np.float32)
    report = parity.validate(tiny_bundle, ValidateOptions(
        batch_sizes=[2], provider="cpu", real_inputs={"held": (x, np.arange(5))},
        save_outputs=tmp_path / "run.npz"))
    run = parity.load_run(tmp_path / "run.npz")
    assert parity.compare_run(run, report.profiles) == report.results
    assert [(r.name, r.device, r.profile, r.reference) for r in run.runners] == [
        ("eager", "cpu", "fp32", None), ("onnxruntime", "cpu", "fp32", "eager")]
    assert run.files == report.files and run.threads is None
    assert np.array_equal(run.sets[1].x, x) and run.sets[1].labels.tolist() == [0, 1, 2, 3, 4]
    with np.load(tmp_path / "run.npz", allow_pickle=False) as data:  # plain arrays only
        assert all(data[k].dtype != object for k in data.files)


def test_compare_of_two_saved_runs_gives_validates_verdicts(saved_runs):
    """A's eager against every runner of B: B's onnxruntime rows are validate's rows (the
    same numbers, on CPU), and B's eager matches A's to the bit."""
    from conftest import run

    code, out, err = run("compare", saved_runs / "a.npz", saved_runs / "b.npz", "--report",
                         saved_runs / "ab.json", "--junit", saved_runs / "ab.xml")
    assert code == 0 and out.endswith("PASS\n"), out + err
    validated = json.loads((saved_runs / "a.json").read_text())["results"]
    compared = json.loads((saved_runs / "ab.json").read_text())
    rows = {(r["candidate"], r["batch"], r["inputs"]): r for r in compared["results"]}
    assert {r["reference"] for r in compared["results"]} == {"eager@cpu (A)"}
    assert len(rows) == 2 * len(validated) == 4
    for want in validated:
        got = rows[(f"{want['candidate']}@cpu (B)", want["batch"], want["inputs"])]
        assert [got[k] for k in ("passed", "max_abs", "max_rel", "cosine", "top1")] == \
            [want[k] for k in ("passed", "max_abs", "max_rel", "cosine", "top1")]
        assert rows[("eager@cpu (B)", want["batch"], want["inputs"])]["max_abs"] == 0.0
    line = next(line for line in out.splitlines() if line.startswith("onnxruntime@cpu (B)"))
    assert line.startswith("onnxruntime@cpu (B) (vs eager@cpu (A)) fp32        1  random(seed=0)")
    assert "<testsuite name=\"vit-export parity\"" in (saved_runs / "ab.xml").read_text()


def test_a_run_on_one_thread_against_one_on_the_default_device(saved_runs, tiny_bundle,
                                                               tmp_path):
    """Runs from two kinds of machine: here one thread against the default threads (and,
    where CUDA is, the GPU against the CPU), each side named by where it really ran."""
    import torch
    from conftest import auto_device, run

    threads = torch.get_num_threads()
    seen = []
    one = parity.run_bundle(tiny_bundle, ValidateOptions(batch_sizes=[1, 3], threads=1),
                            progress=lambda step: seen.append(torch.get_num_threads()))
    assert seen and set(seen) == {1} and torch.get_num_threads() == threads  # restored
    assert one.threads == 1 and one.device == auto_device()
    parity.save_run(one, tmp_path / "one.npz")
    for first, second in ((tmp_path / "one.npz", saved_runs / "a.npz"),
                          (saved_runs / "a.npz", tmp_path / "one.npz")):
        code, out, err = run("compare", first, second)
        assert code == 0 and out.endswith("PASS\n"), out + err
    device = auto_device()
    assert f"onnxruntime@{device} (B) (vs eager@cpu (A))" in out
    assert f"candidates: every runner of B = {tmp_path / 'one.npz'}: bundle {tiny_bundle}, " \
        f"requested auto, ran on {device}, threads 1," in out


def test_compare_refuses_what_it_cannot_judge_in_one_line(saved_runs, tiny_bundle, tmp_path):
    """Exit 2, one line, nothing judged: a damaged file, an edited input, runs of another
    bundle, runs on other inputs (same set names, other arrays), and a saved run inside
    the bundle."""
    from conftest import one_line, run

    a = saved_runs / "a.npz"
    damaged = tmp_path / "damaged.npz"
    damaged.write_bytes(a.read_bytes()[:2000])
    edited = tmp_path / "edited.npz"
    _rewritten(a, edited, lambda arrays, meta: arrays[meta["sets"][0]["inputs"][0]].__iadd__(1))
    other = tmp_path / "other"
    shutil.copytree(tiny_bundle, other)
    proto = onnx.load(str(other / B.ONNX_FILE))
    proto.producer_name += " (re-saved)"  # the same model in another file: another bundle
    onnx.save(proto, str(other / B.ONNX_FILE))
    rewrite_hash(other, B.ONNX_FILE)
    x = np.random.default_rng(0).standard_normal((2, 3, 32, 32), dtype=np.float32)
    runs = {name: parity.run_bundle(path, ValidateOptions(batch_sizes=[1], provider="cpu",
                                                          real_inputs={"held": (data, None)}))
            for name, path, data in (("x", tiny_bundle, x), ("y", tiny_bundle, x + 1),
                                     ("other", other, x))}
    for name, result in runs.items():
        parity.save_run(result, tmp_path / f"{name}.npz")
    cases = {
        damaged: f"Error: {damaged} is not a saved run: cannot read it as .npz: BadZipFile: ",
        edited: f"Error: {edited}: sets[0] (random(seed=0)): the inputs do not match their "
                f"sha256 (damaged or modified)",
        tmp_path / "other.npz": f"Error: {tmp_path / 'x.npz'} and {tmp_path / 'other.npz'} are "
                                f"runs of different bundles: model.onnx: sha256 ",
        tmp_path / "y.npz": f"Error: {tmp_path / 'x.npz'} and {tmp_path / 'y.npz'} ran on "
                            f"different inputs: input set held differs (sha256 ",
    }
    for second, expected in cases.items():
        first = a if second in (damaged, edited) else tmp_path / "x.npz"
        code, out, err = run("compare", first, second)
        assert code == 2 and out == "" and one_line(err).startswith(expected), (second, err)
    code, _, err = run("compare", a, tmp_path / "x.npz")
    assert code == 2 and "ran on different inputs: input sets [random(seed=0) x1, " \
        "random(seed=0) x3] in" in one_line(err)
    before = sorted(p.name for p in tiny_bundle.iterdir())
    code, _, err = run("validate", tiny_bundle, "--save-outputs", tiny_bundle / "run.npz")
    assert code == 2 and one_line(err) == (f"Error: --save-outputs {tiny_bundle / 'run.npz'} "
                                           f"would overwrite {tiny_bundle}, which this command "
                                           f"reads")
    assert sorted(p.name for p in tiny_bundle.iterdir()) == before
    with pytest.raises(SavedRunError, match="run.npz is in the bundle .*: a saved run would "
                                            "overwrite or add to the bundle's own files$"):
        parity.save_run(runs["x"], tiny_bundle / "run.npz")  # the library refuses it too


class _Payload:
    """What a hostile saved run would carry: unpickling it creates `marker`."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return open, (self.marker, "w")


def test_a_pickled_saved_run_is_refused_unread(saved_runs, tmp_path):
    """A pickle, and an .npz whose extra member is a pickled object array: refused in one
    line, and the payload never ran (the control shows it runs when unpickled)."""
    import pickle

    from conftest import one_line, run

    marker = tmp_path / "payload-ran"
    pickled = tmp_path / "pickled.npz"
    pickled.write_bytes(pickle.dumps({"run.json": _Payload(marker)}))
    inside = tmp_path / "inside.npz"
    with np.load(saved_runs / "a.npz", allow_pickle=False) as data:
        arrays = {k: data[k] for k in data.files}
    np.savez(inside, **arrays, extra=np.array([_Payload(marker)], dtype=object))
    refusals = {pickled: "pickled data (a saved run is an .npz, read without unpickling)",
                inside: "it holds arrays run.json does not name (extra)"}
    for path, expected in refusals.items():
        code, _, err = run("compare", saved_runs / "a.npz", path)
        assert code == 2 and one_line(err) == f"Error: {path} is not a saved run: {expected}"
        assert not marker.exists()
    pickle.loads(pickled.read_bytes())  # the control: unpickled, the payload runs
    assert marker.exists()


def test_compare_exits_1_on_one_perturbed_output(saved_runs, tmp_path):
    """One saved output of B moved by 1e-3, ten times the fp32 profile's max abs error: that
    row fails, the others pass, and compare exits 1 naming it in one line."""
    from conftest import one_line, run

    def perturb(arrays, meta):
        key = meta["sets"][1]["outputs"]["onnxruntime"]["logits"]  # batch 3
        arrays[key] = arrays[key] + np.float32(1e-3)

    _rewritten(saved_runs / "b.npz", tmp_path / "b.npz", perturb)
    code, out, err = run("compare", saved_runs / "a.npz", tmp_path / "b.npz")
    assert code == 1 and out.endswith("FAIL: 1 check(s) failed\n")
    failed = [line for line in out.splitlines() if "FAIL: max abs error" in line]
    assert len(failed) == 1 and failed[0].startswith("onnxruntime@cpu (B) (vs eager@cpu (A)) "
                                                     "fp32        3  random(seed=0)")
    assert one_line(err).startswith("Error: parity failed: onnxruntime@cpu (B) batch 3 "
                                    "(random(seed=0)): max abs error 0.001 > 0.0001")


def test_a_saved_runs_unnamed_array_is_refused_unread(saved_runs, tmp_path):
    """compare read every array of an .npz, used or not (1.1 MB cost 0.9 GB): an array run.json
    does not name is refused by its name alone, never decompressed (256 MB of zeros here)."""
    import tracemalloc
    import zipfile

    from conftest import one_line, run

    from vit_export.errors import SavedRunError
    from vit_export.parity import load_run

    bomb = tmp_path / "bomb.npz"
    with np.load(saved_runs / "b.npz", allow_pickle=False) as data:
        arrays = {k: data[k] for k in data.files}
    np.savez(bomb, **arrays)
    header = io.BytesIO()
    np.lib.format.write_array_header_1_0(
        header, {"descr": "|u1", "fortran_order": False, "shape": (256 << 20,)})
    with zipfile.ZipFile(bomb, "a", zipfile.ZIP_DEFLATED) as z, \
            z.open("padding.npy", "w", force_zip64=True) as f:
        f.write(header.getvalue())
        zeros = bytes(1 << 20)
        for _ in range(256):
            f.write(zeros)
    assert bomb.stat().st_size < 2 << 20
    tracemalloc.start()
    try:
        with pytest.raises(SavedRunError, match=r"it holds arrays run.json does not name "
                                                r"\(padding\)"):
            load_run(bomb)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 32 << 20, peak
    code, _, err = run("compare", saved_runs / "a.npz", bomb)
    assert code == 2 and "does not name (padding)" in one_line(err)


def test_a_saved_runs_texts_are_printed_escaped(saved_runs, tmp_path):
    """A runner's name, a note and a version holding a line break or a control character
    forged lines in compare's report and broke its JUnit XML: they are printed escaped."""
    from xml.etree import ElementTree as ET

    from conftest import run

    def forge(arrays, meta):
        meta["notes"].append("ok\nPASS")
        meta["versions"]["torch"] = "2\x1b[2J"
        for runner in meta["runners"]:
            if runner["name"] == "onnxruntime":
                runner["name"] = "onnx\nruntime\x07"
        for s in meta["sets"]:
            s["outputs"]["onnx\nruntime\x07"] = s["outputs"].pop("onnxruntime")

    _rewritten(saved_runs / "b.npz", tmp_path / "b.npz", forge)
    junit = tmp_path / "r.xml"
    code, out, err = run("compare", saved_runs / "a.npz", tmp_path / "b.npz", "--junit", junit)
    assert code == 0, err
    assert "\x1b" not in out and "\x07" not in out and "\nPASS\n" not in out[:-5]
    assert "onnx\\nruntime\\x07@cpu (B)" in out and "ok\\nPASS" in out
    ET.parse(junit)  # well-formed


@pytest.mark.parametrize("empty, message", [
    ("classes", "sets[0] eager logits is empty: shape (1, 0)"),
    ("rows", "sets[0] input is empty: shape (0, 3, 32, 32)")])
def test_a_saved_run_with_nothing_to_compare_is_one_line(saved_runs, tmp_path, empty, message):
    """Outputs of zero classes, or a set of zero rows, in both runs compared: numpy's
    argmax and reshape tracebacks before; refused as the file is read now."""
    from conftest import one_line, run

    from vit_export.parity.inputs import InputSet
    from vit_export.parity.runs import set_digest

    def hollow(arrays, meta):
        first = meta["sets"][0]
        for outputs in first["outputs"].values():
            for key in outputs.values():
                arrays[key] = arrays[key][:, :0] if empty == "classes" else arrays[key][:0]
        if empty == "rows":
            key = first["inputs"][0]
            arrays[key] = arrays[key][:0]
            first["sha256"] = set_digest(InputSet(first["name"], arrays[key]))

    _rewritten(saved_runs / "b.npz", tmp_path / "b.npz", hollow)
    code, _, err = run("compare", tmp_path / "b.npz", tmp_path / "b.npz")
    assert code == 2 and one_line(err) == f"Error: {tmp_path / 'b.npz'}: {message}"
