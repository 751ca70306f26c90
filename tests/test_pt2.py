"""torch.export programs (model.pt2) and AOTInductor packages (model.aoti.pt2) in a bundle:
they load with PyTorch's own APIs, run at batch sizes they were not made at, agree with eager,
are validated, timed and run by infer, and a package that cannot run here is one line."""
import copy
import json
import shutil
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import DIGITS, SMALL, auto_device, one_line, rewrite_hash, run

from vit_export import benchmarking as bench
from vit_export import bundle as B
from vit_export import cpu, parity, pt2
from vit_export.archives import carried_description
from vit_export.errors import BundleError
from vit_export.exporting import ExportOptions, export_bundle
from vit_export.model import create_model, random_input
from vit_export.runtime import TorchRunner, load_torch_file


@pytest.fixture(scope="module")
def pt2_bundle(tmp_path_factory) -> Path:
    """Exported as a user would: the CLI, --pt2 --aoti, validated before it is written. The
    AOTInductor compile takes about 10 s: the tests that need a package are marked slow."""
    out = tmp_path_factory.mktemp("pt2") / "b"
    code, stdout, stderr = run("export", out, *SMALL, "--pt2", "--aoti", "--provider", "cpu")
    assert code == 0, stdout + stderr
    return out


@pytest.mark.slow
def test_the_bundle_files_load_with_pytorchs_own_apis_and_run_at_unseen_batch_sizes(pt2_bundle):
    bundle = B.read_bundle(pt2_bundle)  # every sha256 checked, both new files listed
    assert {B.PT2_FILE, B.AOTI_FILE} <= set(bundle.hashes)
    export = bundle.description.export
    assert export["export_batch"] == 2
    assert export["pt2"]["symbolic_axes"] == {"0": [1, 1 << 16]}
    aoti = export["aoti"]
    assert aoti["device"] == "cpu" and aoti["options"] == {"freezing": True}
    assert aoti["precision"] == "fp32" and bundle.torch_profiles["aoti"] == "fp32"
    assert aoti["precision"] == "fp32" and bundle.torch_profiles["aoti"] == "fp32"
    assert aoti["bytes"] == (pt2_bundle / B.AOTI_FILE).stat().st_size
    assert aoti["compile_seconds"] > 0
    extra = {pt2.EXTRA_FILE: ""}
    program = torch.export.load(str(pt2_bundle / B.PT2_FILE), extra_files=extra)
    assert json.loads(extra[pt2.EXTRA_FILE])["model"]["depth"] == 1  # the description
    package = torch._inductor.aoti_load_package(str(pt2_bundle / B.AOTI_FILE))
    assert json.loads(package.get_metadata()[B.METADATA_KEY])["model"]["embed_dim"] == 32
    eager = bundle.load_eager()
    for batch in (1, 5, 9):  # exported and compiled at 2
        x = random_input(bundle.config, batch, seed=batch)
        with torch.inference_mode():
            want = eager(x)
            assert (program.module()(x) - want).abs().max().item() <= 1e-5
            assert (package(x) - want).abs().max().item() <= 1e-5
        assert want.abs().max().item() > 0.1  # logits that say something


def _validated_with_layers(bundle_dir: Path, tmp_path: Path) -> dict:
    """`validate --layers` on the CPU, passing; its parity.json."""
    report_path = tmp_path / "parity.json"
    code, stdout, stderr = run("validate", bundle_dir, "--provider", "cpu", "--layers",
                               "--trust-code", "--report", report_path)
    assert code == 0, stdout + stderr
    return json.loads(report_path.read_text())


@pytest.mark.slow
def test_validate_lists_and_judges_both_with_the_fp32_profile(pt2_bundle, tmp_path):
    report = _validated_with_layers(pt2_bundle, tmp_path)
    # the program's stages, found by the module scopes torch.export records, against eager's
    stages = {s["stage"]: s for s in report["stages"] if s["model"] == B.PT2_FILE}
    assert list(stages) == ["patch_embed", "pos_embed", "blocks.0.attn", "blocks.0.mlp",
                            "blocks.0", "norm"]
    assert all(s["passed"] and s["rel_l2"] <= 1e-6 for s in stages.values())
    rows = [r for r in report["results"] if r["candidate"] in ("pt2", "aoti")]
    assert {(r["candidate"], r["batch"]) for r in rows} == {
        (name, b) for name in ("pt2", "aoti") for b in (1, 3, 7)}
    assert all(r["passed"] and r["profile"] == "fp32" for r in rows)
    assert max(r["max_abs"] for r in rows) <= 1e-5
    checks = {c["name"]: c for c in report["checks"]}
    batch_axis = checks["model.pt2: symbolic batch axis on pixel_values"]
    assert batch_axis["passed"] and "[1, 65536]" in batch_axis["detail"]
    unseen = checks["aoti: runs at batch sizes it was not compiled at"]
    assert unseen["passed"] and "1, 3, 7 of 1, 3, 7" in unseen["detail"]
    # only at the batch it was compiled at, nothing proves the batch is not baked in
    code, stdout, _ = run("validate", pt2_bundle, "--provider", "cpu", "--batch-sizes", "2",
                          "--trust-code")
    assert code == 1 and "aoti: runs at batch sizes it was not compiled at: FAIL" in stdout


@pytest.mark.slow
def test_infer_gives_the_same_answers_on_every_runtime(pt2_bundle):
    answers = {}
    for runtime_name in ("onnxruntime", "torchscript", "pt2", "aoti"):
        code, stdout, stderr = run("infer", pt2_bundle, DIGITS / "samples", "--runtime",
                                   runtime_name, "--json", "--provider", "cpu")
        assert code == 0, stderr
        answers[runtime_name] = json.loads(stdout)["results"]
    labels = {name: [[t["label"] for t in r["top"]] for r in results]
              for name, results in answers.items()}
    assert labels["pt2"] == labels["aoti"] == labels["onnxruntime"] == labels["torchscript"]
    for name in ("pt2", "aoti"):
        probs = np.array([[t["prob"] for t in r["top"]] for r in answers[name]])
        onnx = np.array([[t["prob"] for t in r["top"]] for r in answers["onnxruntime"]])
        np.testing.assert_allclose(probs, onnx, atol=1e-5)
    # a .pt2 file alone runs too: the description it carries gives the preprocessing
    code, stdout, stderr = run("infer", pt2_bundle / B.AOTI_FILE, DIGITS / "samples",
                               "--runtime", "aoti", "--json", "--provider", "cpu")
    assert code == 0, stderr
    assert json.loads(stdout)["results"] == answers["aoti"]


@pytest.mark.slow
def test_a_pt2_file_needs_its_runtime_and_a_bundle_without_one_says_so(pt2_bundle, tiny_bundle):
    code, _, stderr = run("infer", pt2_bundle / B.PT2_FILE, DIGITS / "samples", "--runtime",
                          "onnxruntime")
    assert code == 2 and "a .pt2 file runs with --runtime pt2 or aoti" in one_line(stderr)
    for file, ran in ((B.PT2_FILE, "pt2"), (B.AOTI_FILE, "aoti")):  # no --runtime: the file's
        code, stdout, stderr = run("infer", pt2_bundle / file, DIGITS / "samples",
                                   "--provider", "cpu")
        assert code == 0, stderr
        assert stdout.splitlines()[-1] == f"8 input(s) on {ran} (cpu)"
    code, _, stderr = run("infer", pt2_bundle / B.PT2_FILE, DIGITS / "samples", "--runtime",
                          "aoti")
    assert code == 1 and "is a torch.export program, not an AOTInductor package" in \
        one_line(stderr)
    for runtime_name, flag in (("pt2", "--pt2"), ("aoti", "--aoti")):
        code, _, stderr = run("infer", tiny_bundle, DIGITS / "samples", "--runtime",
                              runtime_name)
        assert code == 1 and one_line(stderr).endswith(f"(export {flag})")


@pytest.mark.slow
def test_a_tampered_package_is_refused_by_its_sha256(pt2_bundle, tmp_path):
    copy = shutil.copytree(pt2_bundle, tmp_path / "b")
    data = bytearray((copy / B.AOTI_FILE).read_bytes())
    data[len(data) // 2] ^= 0xFF
    (copy / B.AOTI_FILE).write_bytes(bytes(data))
    for command in (("validate", copy), ("infer", copy, DIGITS / "samples", "--runtime", "aoti")):
        code, _, stderr = run(*command)
        assert code == 1
        assert one_line(stderr) == (f"Error: {copy / B.AOTI_FILE} does not match its sha256 in "
                                    f"config.json (truncated or modified)")


def test_an_unhashed_program_is_refused(tiny_bundle, program_bundle, tmp_path):
    copy = shutil.copytree(tiny_bundle, tmp_path / "b")
    shutil.copy(program_bundle / B.PT2_FILE, copy / B.PT2_FILE)  # dropped in after the export
    code, _, stderr = run("validate", copy)
    assert code == 1 and "model.pt2 has no sha256 in config.json" in one_line(stderr)


def _rewrite_package_metadata(path: Path, change) -> None:
    """What a package compiled elsewhere says: its metadata JSON, rewritten in place."""
    with zipfile.ZipFile(path) as archive:
        items = [(info, archive.read(info)) for info in archive.infolist()]
    with zipfile.ZipFile(path, "w") as archive:
        for info, data in items:
            if info.filename.endswith("wrapper_metadata.json"):
                values = json.loads(data)
                change(values)
                data = json.dumps(values).encode()
            archive.writestr(info, data)


def _as_made_by(torch_version: str):
    def change(values):
        description = json.loads(values[B.METADATA_KEY])
        description["versions"]["torch"] = torch_version
        values[B.METADATA_KEY] = json.dumps(description)
    return change


MISSING_ISA = next((word for word, flags in pt2.ISA_WORDS.items()
                    if not cpu.isa().flags & set(flags)), None)
FOREIGN = {
    "device": (lambda v: v.update(AOTI_DEVICE_KEY="cuda"),
               "model.aoti.pt2 was compiled for cuda and this run is on cpu"),
    "torch": (_as_made_by("2.9.0"),
              f"model.aoti.pt2 was compiled by torch 2.9.0 and this is torch {torch.__version__}"),
    "isa": (lambda v: v.update(AOTI_CPU_ISA=f"{v['AOTI_CPU_ISA']} {MISSING_ISA}"),
            f"and this CPU has no {MISSING_ISA}"),
    "machine": (lambda v: v.update(AOTI_MACHINE="riscv64"),
                "model.aoti.pt2 was compiled for riscv64 and this machine is"),
}


@pytest.mark.slow
@pytest.mark.parametrize("kind", list(FOREIGN))
def test_a_package_compiled_for_another_machine_is_one_line(pt2_bundle, tmp_path, kind):
    if kind == "isa" and MISSING_ISA is None:
        pytest.skip("this CPU has every vector ISA AOTInductor compiles for")
    if kind == "device" and auto_device() == "cuda":
        pytest.skip("a package for cuda runs here")
    change, expected = FOREIGN[kind]
    copy = shutil.copytree(pt2_bundle, tmp_path / "b")
    _rewrite_package_metadata(copy / B.AOTI_FILE, change)
    rewrite_hash(copy, B.AOTI_FILE)
    for command in (("validate", copy, "--provider", "cpu", "--trust-code"),
                    ("infer", copy, DIGITS / "samples", "--runtime", "aoti", "--provider", "cpu"),
                    ("bench", copy, "--provider", "cpu", "--runners", "aoti")):
        code, _, stderr = run(*command)
        assert code == 1 and expected in one_line(stderr)  # an error, not a parity table
    # the bundle's other runners still serve
    code, _, stderr = run("infer", copy, DIGITS / "samples", "--runtime", "pt2",
                          "--provider", "cpu")
    assert code == 0, stderr


@pytest.mark.slow
def test_an_isa_word_that_asks_for_nothing_is_not_a_refusal(pt2_bundle, tmp_path):
    # torch writes INVALID_VEC_ISA for code with no vector extension: it runs anywhere
    copy = shutil.copytree(pt2_bundle, tmp_path / "b")
    _rewrite_package_metadata(copy / B.AOTI_FILE,
                              lambda v: v.update(AOTI_CPU_ISA="INVALID_VEC_ISA"))
    assert pt2.package_problem(copy / B.AOTI_FILE, "cpu") is None


def test_aoti_without_a_compiler_is_refused_before_any_work(tmp_path, monkeypatch):
    monkeypatch.setattr(torch._inductor.config.cpp, "cxx", (None, str(tmp_path / "no-g++")))
    code, _, stderr = run("export", tmp_path / "b", *SMALL, "--aoti", "--provider", "cpu")
    assert code == 1
    assert "--aoti compiles C++ and finds no working compiler" in one_line(stderr)
    assert not (tmp_path / "b").exists()


def test_a_dynamic_size_program_has_symbolic_sides_and_runs_at_other_sizes(program_bundle):
    bundle = B.read_bundle(program_bundle)
    axes = bundle.description.export["pt2"]["symbolic_axes"]
    assert set(axes) == {"0", "2", "3"} and axes["2"][0] < 32 < axes["2"][1]
    program = torch.export.load(str(program_bundle / B.PT2_FILE)).module()
    eager = bundle.load_eager()
    x = random_input(bundle.config, 3, seed=1, size=(24, 56))  # never exported at
    with torch.inference_mode():
        assert (program(x) - eager(x)).abs().max().item() <= 1e-5
        assert eager(x).abs().max().item() > 0.1


def test_validate_layers_and_infer_run_the_program(program_bundle, tmp_path):
    report = _validated_with_layers(program_bundle, tmp_path)
    rows = [r for r in report["results"] if r["candidate"] == "pt2"]
    assert {r["batch"] for r in rows} == {1, 3, 7, 2}  # 2: each other image size
    assert len({r["inputs"] for r in rows}) > 1 and all(r["passed"] for r in rows)
    stages = [s["stage"] for s in report["stages"] if s["model"] == B.PT2_FILE]
    assert stages == ["patch_embed", "pos_embed", "blocks.0.attn", "blocks.0.mlp", "blocks.0",
                      "norm"]
    answers = {}
    for runtime_name in ("onnxruntime", "pt2"):
        code, stdout, stderr = run("infer", program_bundle, DIGITS / "samples", "--runtime",
                                   runtime_name, "--json", "--provider", "cpu")
        assert code == 0, stderr
        answers[runtime_name] = json.loads(stdout)["results"]
    for ours, theirs in zip(answers["pt2"], answers["onnxruntime"], strict=True):
        assert [t["label"] for t in ours["top"]] == [t["label"] for t in theirs["top"]]
        np.testing.assert_allclose([t["prob"] for t in ours["top"]],
                                   [t["prob"] for t in theirs["top"]], atol=1e-5)


@pytest.mark.slow
def test_bench_times_both_and_may_recommend_them(pt2_bundle):
    result = bench.bench(pt2_bundle, [1, 4], threads=1, min_runs=2, min_seconds=0.0, warmup=1,
                         provider="cpu", runners=["pt2", "aoti"])
    rows = {(r.backend, r.batch): r for r in result.rows}
    assert set(rows) == {(name, b) for name in ("eager", "pt2", "aoti") for b in (1, 4)}
    assert all(r.validated and not r.peer and r.precision == "fp32" for r in result.rows)
    for batch in (1, 4):  # the fastest validated row is recommended, whichever format it is
        fastest = min((r for r in result.rows if r.batch == batch), key=lambda r: r.p50_ms)
        assert result.recommendation[batch]["backend"] == fastest.backend


# ------------------------------------------------ an fp16 package (export --aoti-precision)


def test_an_fp16_package_without_cuda_is_one_line_before_any_work(tmp_path):
    out = tmp_path / "b"
    code, _, stderr = run("export", out, *SMALL, "--aoti", "--aoti-precision", "fp16",
                          "--provider", "cpu", "--progress")  # steps would show on stderr
    why = ("--provider cpu compiles for the CPU" if torch.cuda.is_available()
           else "this machine has none (PyTorch sees no CUDA device)")
    assert code == 1
    assert one_line(stderr) == (f"Error: --aoti-precision fp16 compiles model.aoti.pt2 for "
                                f"CUDA, and {why}")
    if auto_device() == "cpu":  # the default provider, where it finds no CUDA to compile for
        code, _, stderr = run("export", out, *SMALL, "--aoti", "--aoti-precision", "fp16",
                              "--progress")
        assert code == 1 and "compiles model.aoti.pt2 for CUDA, and" in one_line(stderr)
    assert not out.exists()
    code, _, stderr = run("export", out, *SMALL, "--aoti-precision", "fp32")
    assert code == 2 and "Error: --aoti-precision needs --aoti" in stderr
    assert not out.exists()


def test_the_fp16_program_takes_fp16_with_its_batch_symbolic():
    model = create_model("vit_seed_tiny", depth=1, embed_dim=32, num_heads=2).eval()
    x = random_input(model.config, 2)
    half = pt2.export_program(copy.deepcopy(model).half(), x.half())
    assert pt2.input_precision(half) == "fp16"
    assert pt2.input_precision(torch.export.export(torch.nn.Linear(32, 2), (x[:, 0],))) == "fp32"
    assert pt2.symbolic_axes(half) == {0: (1, 1 << 16), 1: None, 2: None, 3: None}
    assert {p.dtype for p in model.parameters()} == {torch.float32}  # eager: the reference
    x = random_input(model.config, 5, seed=1)  # a batch it was not exported at
    with torch.inference_mode():
        got, want = half.module()(x.half()), model(x)
    assert got.dtype == torch.float16 and got.shape == want.shape
    error = (got.float() - want).abs().max().item()
    assert 0 < error <= parity.PROFILES["fp16"].atol  # fp16: not exact, within its profile
    assert want.abs().max().item() > 0.1


def test_the_precision_a_package_carries_is_read_and_checked():
    assert pt2.package_precision({"export": {"aoti": {"precision": "fp16"}}}) == "fp16"
    assert pt2.package_precision({"export": {"exporter": "dynamo"}}) == "fp32"  # made before
    assert pt2.package_precision(None) == "fp32"  # a package that carries no description
    with pytest.raises(BundleError, match="the package says it computes in 'bf16', not one of"):
        pt2.package_precision({"export": {"aoti": {"precision": "bf16"}}})


def test_a_half_runner_feeds_fp16_and_gives_fp32():
    torch.manual_seed(0)
    layer = torch.nn.Linear(8, 3).half()
    x = np.random.default_rng(0).standard_normal((4, 8)).astype(np.float32)
    out = TorchRunner(layer, "aoti", "cpu", half=True)(x)
    assert out.dtype == np.float32
    with torch.inference_mode():
        assert np.array_equal(out, layer(torch.from_numpy(x).half()).float().numpy())
    with pytest.raises(RuntimeError):  # fed fp32, an fp16 module fails: the cast is needed
        TorchRunner(layer, "aoti", "cpu")(x)


@pytest.fixture(scope="module")
def fp16_package_bundle(tmp_path_factory) -> Path:
    """An fp16 package compiled for the CPU through the library (the CLI refuses it without
    CUDA; inductor compiles it cleanly, about 15 s): the runner's casts and the fp16 profile,
    end to end, where no GPU is."""
    torch.manual_seed(0)
    model = create_model("vit_seed_tiny", depth=1, embed_dim=32, num_heads=2).eval()
    description = B.Description(model.config, B.Preprocessing.default_for(model.config),
                                name="fp16-package")
    out = tmp_path_factory.mktemp("pt2") / "fp16"
    export_bundle(model, out, description, ExportOptions(
        aoti=True, aoti_precision="fp16", validation={"provider": "cpu"}))
    return out


@pytest.mark.slow
def test_an_fp16_package_is_fed_fp16_and_judged_by_the_fp16_profile(fp16_package_bundle,
                                                                     tmp_path):
    bundle = B.read_bundle(fp16_package_bundle)
    record = bundle.description.export["aoti"]
    assert record["precision"] == "fp16" and record["device"] == "cpu"
    assert bundle.torch_profiles == {"torchscript": "fp32", "aoti": "fp16"}
    carried = json.loads(carried_description(fp16_package_bundle / B.AOTI_FILE))
    assert carried["export"]["aoti"] == {"precision": "fp16"}
    runner = load_torch_file("aoti", fp16_package_bundle / B.AOTI_FILE)
    assert runner.half
    x = random_input(bundle.config, 3, seed=2)
    out = runner(x.numpy())
    assert out.dtype == np.float32
    # the package checks no input dtype (AOTInductor does only under
    # AOTI_RUNTIME_CHECK_INPUTS=1): the runner's cast is what feeds it fp16
    with torch.inference_mode():
        np.testing.assert_array_equal(out, runner.module(x.half()).float().numpy())
        want = bundle.load_eager()(x).numpy()
    assert 0 < np.abs(out - want).max() <= parity.PROFILES["fp16"].atol
    report_path = tmp_path / "parity.json"
    code, stdout, stderr = run("validate", fp16_package_bundle, "--provider", "cpu",
                               "--trust-code", "--report", report_path)
    assert code == 0, stdout + stderr
    report = json.loads(report_path.read_text())
    rows = [r for r in report["results"] if r["candidate"] == "aoti"]
    assert {r["batch"] for r in rows} == {1, 3, 7}
    assert all(r["passed"] and r["profile"] == "fp16" for r in rows)
    assert all(r["profile"] == "fp32" for r in report["results"] if r["candidate"] != "aoti")
    # fp16 is not fp32: its error is many times the fp32 files' (a margin that holds on any
    # CPU, unlike the fp32 profile's 1e-4, which this one exceeds by half only)
    fp32 = [r["max_abs"] for r in report["results"] if r["candidate"] == "onnxruntime"]
    assert max(r["max_abs"] for r in rows) > 10 * max(fp32)
    answers = {}
    for runtime_name in ("onnxruntime", "aoti"):
        code, stdout, stderr = run("infer", fp16_package_bundle, DIGITS / "samples",
                                   "--runtime", runtime_name, "--json", "--top-k", "1",
                                   "--provider", "cpu")
        assert code == 0, stderr
        answers[runtime_name] = [[t["label"] for t in r["top"]]
                                 for r in json.loads(stdout)["results"]]
    assert answers["aoti"] == answers["onnxruntime"]
