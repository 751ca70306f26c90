"""OpenVINO as a second runtime of the bundle's ONNX models (the `openvino` extra): validated
like every runner, its bf16 compute judged by the bf16 profile, benched and recommended."""
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import SMALL, one_line, run

from vit_export import benchmarking as bench
from vit_export import bundle as B
from vit_export import cpu, runtime
from vit_export.errors import ProviderError
from vit_export.model import random_input
from vit_export.runtime import ov_rows

pytest.importorskip("openvino")

DIGITS = Path(__file__).resolve().parent.parent / "models" / "digits"


# OpenVINO is an extra: its module fixture exports and quantizes a bundle per worker (8 s
# each on 2 cores of a Zen 3), so the whole file runs in the whole suite, as CI runs it
pytestmark = pytest.mark.slow

@pytest.fixture(scope="module")
def static_bundle(tmp_path_factory) -> Path:
    """The shipped model with its static int8 model, validated with OpenVINO at export.
    (Calibrated on the held-out digits only to be quick: test_quantize calibrates properly.)"""
    out = tmp_path_factory.mktemp("openvino") / "digits"
    code, _, stderr = run("export", out, "--from", DIGITS, "--quantize", "static",
                          "--calibrate", DIGITS / "held_out.npz", "--openvino",
                          "--real-data", DIGITS / "held_out.npz", "--batch-sizes", "1,3")
    assert code == 0, stderr
    return out


def test_export_validates_every_openvino_runner(static_bundle):
    report = json.loads((static_bundle / B.PARITY_FILE).read_text())
    assert report["passed"]
    rows = {(r["candidate"], r["inputs"]): r for r in report["results"]}
    held = {name: rows[(name, "held_out")] for name, _ in rows if (name, "held_out") in rows}
    assert held["openvino"]["profile"] == "fp32" and held["openvino"]["max_abs"] <= 1e-4
    assert held["openvino[model.int8-static.onnx]"]["profile"] == "int8-static"
    if cpu.isa().bf16:
        bf16 = held["openvino-bf16"]
        assert bf16["profile"] == "bf16" and bf16["cosine"] >= 0.9995
        assert bf16["top1_decisive"] >= 0.99
        assert report["profiles"]["bf16"]["min_cosine"] == 0.9995
        # the int8 model with bf16 where it is not int8: judged as int8, by its file
        mixed = held["openvino-bf16[model.int8-static.onnx]"]
        assert mixed["profile"] == "int8-static" and mixed["passed"]
        code, out, stderr = run("infer", static_bundle, DIGITS / "samples", "--runtime",
                                "openvino-bf16[model.int8-static.onnx]")
        assert code == 0, stderr
        assert "on openvino-bf16[model.int8-static.onnx] (cpu)" in out
    else:  # the plugin would compute in f32: the row is left out, and the report says why
        assert "openvino-bf16" not in held
        assert any(n.startswith("openvino-bf16 left out: asked OpenVINO's CPU plugin for "
                                "bf16") for n in report["notes"])
    accuracy = {r["candidate"]: r["accuracy"] for r in report["results"]
                if r["inputs"] == "held_out"}
    assert accuracy["openvino"] == pytest.approx(0.975)


def test_runner_takes_numpy_and_tensors_and_checks_the_input(static_bundle):
    found = B.read_bundle(static_bundle)
    spec = runtime.InputSpec.from_description(found.description.to_dict())
    runner = runtime.OpenVinoRunner(found.onnx_path, "openvino", "f32", 1, spec)
    assert runner.precision == "f32" and runner.device == "cpu"
    x = random_input(found.config, 3, 0)
    eager = found.load_eager()(x).detach().numpy()
    out = runner(x.numpy())
    assert isinstance(out, np.ndarray) and np.abs(out - eager).max() <= 1e-4
    again = runner(x)  # a tensor in, a tensor out; the answer is a copy, not reused memory
    assert np.array_equal(again.numpy(), out) and not np.shares_memory(again.numpy(), out)
    with pytest.raises(Exception, match=r"input of shape \[3, 1, 9, 9\]: .*8x8 only|"
                                        r"a 9x9 input"):
        runner(np.zeros((3, 1, 9, 9), np.float32))


def test_a_precision_the_cpu_cannot_compute_is_an_error(static_bundle):
    found = B.read_bundle(static_bundle)
    if cpu.isa().bf16:
        assert runtime.OpenVinoRunner(found.onnx_path, "openvino-bf16", "bf16").precision \
            == "bf16"
    else:
        with pytest.raises(ProviderError, match="would compute in f32"):
            runtime.OpenVinoRunner(found.onnx_path, "openvino-bf16", "bf16")
    with pytest.raises(ProviderError, match="unknown OpenVINO precision 'f16'"):
        runtime.OpenVinoRunner(found.onnx_path, "openvino", "f16")


@pytest.mark.slow  # bench's timing loops over every runner: 4 s
def test_bench_times_openvino_and_recommends_from_what_passed(static_bundle):
    result = bench.bench(static_bundle, [1, 4], threads=1, min_runs=2, min_seconds=0.0,
                         warmup=1, runtimes=["openvino"])
    rows = {(r.backend, r.batch): r for r in result.rows}
    assert rows[("openvino", 4)].validated and rows[("openvino", 4)].precision == "fp32"
    assert rows[("openvino[model.int8-static.onnx]", 4)].precision == "int8"
    if cpu.isa().bf16:  # the int8 model with bf16 where not int8 is held to the int8 peak
        assert rows[("openvino-bf16", 4)].precision == "bf16"
        assert rows[("openvino-bf16[model.int8-static.onnx]", 4)].precision == "int8"
    fastest = result.recommendation[4]
    assert fastest["p50_ms"] == min(r.p50_ms for (_, b), r in rows.items() if b == 4)


def test_bench_compiles_no_shape_inside_a_timed_call(static_bundle, monkeypatch):
    """OpenVINO keeps four input shapes compiled. Timed in turns across five batch sizes, a
    runner would compile again inside timed calls; bench times one batch size at a time,
    after its warm-up, so every compile falls before the timing starts."""
    import openvino

    events = []

    class Counting(openvino.Core):
        def compile_model(self, model, *args, **kwargs):
            events.append("compile")
            return super().compile_model(model, *args, **kwargs)

    monkeypatch.setattr(openvino, "Core", Counting)
    bench.bench(static_bundle, [1, 2, 3, 4, 5], threads=1, min_runs=3, min_seconds=0.0,
                warmup=1, runtimes=["openvino"], runners=["openvino"],
                progress=events.append)
    timed = [i for i, e in enumerate(events) if e.startswith("timing them at batch")]
    assert len(timed) == 5 and events.count("compile") >= 5
    for start in timed:
        following = events[start + 1:]
        upto = next((i for i, e in enumerate(following) if e.startswith("warming up")),
                    len(following))
        assert "compile" not in following[:upto], events


def test_validate_openvino_on_cuda_or_without_openvino_is_one_line(static_bundle, tmp_path):
    code, _, stderr = run("validate", static_bundle, "--openvino", "--provider", "cuda")
    assert code == 1
    line = one_line(stderr)  # no GPU: CUDA refused first; a GPU: OpenVINO refused
    assert line.startswith("Error: requested CUDAExecutionProvider but ") or line == (
        "Error: OpenVINO runs on the CPU, and every runner must run where ONNX Runtime does: "
        "use --provider cpu with OpenVINO")
    # without the extra: a real process whose import of openvino fails
    hide = tmp_path / "hide"
    hide.mkdir()
    (hide / "sitecustomize.py").write_text(
        "import importlib.util, sys\n"
        "_find = importlib.util.find_spec\n"
        "importlib.util.find_spec = lambda name, *a: None if name == 'openvino' "
        "else _find(name, *a)\n")
    done = subprocess.run([sys.executable, str(DIGITS.parent.parent / "cli.py"), "validate",
                           str(static_bundle), "--openvino"], capture_output=True, text=True,
                          env={"PYTHONPATH": str(hide), "PATH": "/usr/bin:/bin"}, check=False)
    assert done.returncode == 1, done.stderr
    assert one_line(done.stderr) == "Error: --runtimes openvino: it is not installed; pip " \
                                    "install 'vit-export[openvino]'"


def test_infer_on_openvino_answers_as_onnx_runtime(static_bundle):
    samples = DIGITS / "samples"
    answers = {}
    runtimes = ["onnxruntime", "openvino"] + (["openvino-bf16"] if cpu.isa().bf16 else [])
    for name in runtimes:
        code, stdout, stderr = run("infer", static_bundle, samples, "--runtime", name,
                                   "--top-k", 1, "--json")
        assert code == 0, stderr
        answers[name] = json.loads(stdout)["results"]
    for name in runtimes[1:]:
        assert [r["top"][0]["class"] for r in answers[name]] == \
            [r["top"][0]["class"] for r in answers["onnxruntime"]]
    probs = [(a["top"][0]["prob"], b["top"][0]["prob"])
             for a, b in zip(answers["onnxruntime"], answers["openvino"])]
    assert max(abs(a - b) for a, b in probs) <= 1e-5  # f32 on both
    code, stdout, stderr = run("infer", static_bundle / "model.int8-static.onnx", samples,
                               "--runtime", "openvino", "--top-k", 1)
    assert code == 0, stderr
    assert stdout.splitlines()[-1] == "8 input(s) on openvino (cpu)"
    # every sample is named for its true class, and the int8 file on OpenVINO gets them all
    assert all(line.split()[1] == Path(line.split(":")[0]).stem.split("_")[1]
               for line in stdout.splitlines()[:-1])


@pytest.mark.parametrize("args, code, message", [
    (["model.ts", "--runtime", "openvino"], 2, ("--runtime openvino cannot run {b}/model.ts: a "
     ".ts file runs with --runtime torchscript (or give the bundle folder)")),
    (["", "--runtime", "openvino-bf16", "--provider", "cuda"], 1, ("--runtime openvino-bf16 "
     "runs on the CPU; --provider cuda cannot be honoured")),
])
def test_infer_openvino_refusals_are_one_line(static_bundle, args, code, message):
    target = static_bundle / args[0] if args[0] else static_bundle
    got, _, stderr = run("infer", target, DIGITS / "samples", *args[1:])
    assert got == code
    assert one_line(stderr) == "Error: " + message.format(b=static_bundle)


def test_compiled_shapes_are_bounded_and_answers_stay_right(static_bundle):
    found = B.read_bundle(static_bundle)
    spec = runtime.InputSpec.from_description(found.description.to_dict())
    runner = runtime.OpenVinoRunner(found.onnx_path, "openvino", "f32", 1, spec)
    eager = found.load_eager()
    for batch in (1, 2, 3, 4, 5, 6, 1):
        x = random_input(found.config, batch, batch)
        assert np.abs(runner(x.numpy()) - eager(x).detach().numpy()).max() <= 1e-4
        assert len(runner._compiled) <= runtime.OpenVinoRunner.KEEP_COMPILED


def test_static_int8_and_openvino_carry_every_output(tmp_path):
    """--outputs logits,embedding,tokens with static int8 and OpenVINO: the calibrated model
    keeps the three outputs, and each OpenVINO runner (of model.onnx and of the int8 file, in
    f32 and, where the CPU has it, in bf16) gives the three, each judged against eager; the
    tokens by the profile's per-token floor."""
    out = tmp_path / "three"
    code, _, stderr = run("export", out, "--from", DIGITS, "--outputs",
                          "logits,embedding,tokens", "--quantize", "static", "--calibrate",
                          DIGITS / "held_out.npz", "--openvino", "--batch-sizes", "1,3")
    assert code == 0, stderr
    report = json.loads((out / B.PARITY_FILE).read_text())
    assert report["passed"] and report["outputs"] == ["logits", "embedding", "tokens"]
    compared: dict[str, set] = {}
    for row in report["results"]:
        compared.setdefault(row["candidate"], set()).add(row["output"])
    runners = {"openvino", "openvino[model.int8-static.onnx]",
               "onnxruntime[model.int8-static.onnx]"}
    if cpu.isa().bf16:
        runners |= {"openvino-bf16", "openvino-bf16[model.int8-static.onnx]"}
    assert runners <= set(compared)
    assert all(outputs == {"logits", "embedding", "tokens"} for outputs in compared.values())
    tokens = [r for r in report["results"] if r["output"] == "tokens"
              and r["profile"] == "int8-static"]
    floor = report["profiles"]["int8-static"]["min_token_cosine"]
    assert tokens and all(floor <= r["cosine"] < 0.9999 for r in tokens)  # int8 moves them


def test_bench_holds_a_runner_whose_rows_it_cut_to_eager(tmp_path):
    """65 tokens (32 px, patch 4) on 1 thread: at batch 1 OpenVINO's static int8 runner cuts
    them at 64 (runtime.ov_rows) where its kernel was measured, and bench checks it against
    eager there before counting it as validated; at batch 3 nothing is cut."""
    out = tmp_path / "cut"
    images = np.random.default_rng(0).integers(0, 256, (16, 32, 32, 3), np.uint8)
    np.savez(tmp_path / "calib.npz", images=images)
    code, _, stderr = run("export", out, *SMALL, "--set", "patch_size=4", "--quantize",
                          "static", "--calibrate", tmp_path / "calib.npz", "--openvino",
                          "--batch-sizes", "1,3")
    assert code == 0, stderr
    said: list[str] = []
    result = bench.bench(out, [1, 3], threads=1, min_runs=2, min_seconds=0.0, warmup=1,
                         runtimes=["openvino"], progress=said.append)
    name = "openvino[model.int8-static.onnx]"
    checked = f"checking {name} against eager at batch 1 (rows cut)"
    assert (checked in said) == ov_rows.applies(cpu.isa().flags)
    assert not any("batch 3 (rows cut)" in line for line in said)
    rows = {(r.backend, r.batch): r for r in result.rows}
    assert rows[(name, 1)].validated and rows[(name, 3)].validated


def test_an_openvino_error_says_its_cause_not_where_it_was_thrown(tmp_path):
    """OpenVINO's report starts with the C++ file that threw it: the one line was
    `Exception from src/inference/src/cpp/core.cpp:105:`, without the cause."""
    import onnx
    from conftest import DIGITS

    out = tmp_path / "digits"
    assert run("export", out, "--from", DIGITS)[0] == 0
    model = onnx.load(out / "model.onnx")
    model.graph.node[0].op_type = "NoSuchOp"
    onnx.save(model, tmp_path / "bad.onnx")
    code, _, err = run("infer", tmp_path / "bad.onnx", DIGITS / "samples" / "true_2_006.png",
                       "--runtime", "openvino")
    assert code == 1
    assert one_line(err) == ("Error: OpenVINO cannot compile bad.onnx: Model wasn't fully "
                             "converted. No conversion rule found for operations: NoSuchOp-18")
