import json
import re
from pathlib import Path

import onnx
import pytest
import torch
from click.testing import CliRunner
from conftest import h100_peers_result, make_bundle, one_line, run

from vit_export import benchmarking as bench
from vit_export import bundle as B
from vit_export import cpu, parity, render
from vit_export.cli import cli
from vit_export.errors import BundleError, ConfigError
from vit_export.exporting.variants import batch_dependence
from vit_export.model import preset_config


def test_model_flops_of_vit_base_match_the_published_count():
    # 17.56 G multiply-adds per image (timm/fvcore report 17.58 with softmax and norms)
    assert bench.model_flops(preset_config("vit_base_patch16_224")) == pytest.approx(
        2 * 17_563_828_224, rel=1e-12)
    tiny = preset_config("vit_seed_tiny")
    assert bench.model_flops(tiny.replace(depth=4)) > bench.model_flops(tiny)
    # the embedding before the head skips the head's 768 x 1000 multiply-adds
    base = preset_config("vit_base_patch16_224")
    assert bench.model_flops(base) - bench.model_flops(base.replace(output="embedding")) == \
        2 * 768 * 1000


@pytest.fixture(scope="module")
def variant_bundle(tmp_path_factory):
    return make_bundle(tmp_path_factory.mktemp("variants") / "b", variants=["optimized", "int8"])


def test_bench_rows_are_consistent(variant_bundle):
    result = bench.bench(variant_bundle, [1, 3], threads=1, min_runs=3, min_seconds=0.0,
                         warmup=1, trust_code=True)
    names = list(dict.fromkeys(r.backend for r in result.rows))
    assert names == ["eager", "torchscript", "onnxruntime", "onnxruntime[model.opt.onnx]",
                     "onnxruntime[model.int8.onnx]"]
    assert result.threads == 1 and result.matmul_peak_gflops > 1
    # every backend runs on the device ONNX Runtime really got, and says so
    assert {r.device for r in result.rows} == {result.device}
    placements = {"host", "device"} if result.device == "cuda" else {"host"}
    assert {r.io for r in result.rows} == placements
    on_cuda = result.device == "cuda"  # GPU peaks there: fp32 (TF32 off) and fp16
    assert set(result.peaks) == ({"fp32", "fp16"} if on_cuda else {"fp32", "bf16", "int8"})
    assert result.peaks["fp32"]["gflops"] == result.matmul_peak_gflops
    # a CPU's peaks are their GEMMs' medians, timed in turns with the runners
    assert {p["statistic"] for p in result.peaks.values()} == {"best" if on_cuda else "median"}
    precisions = {"onnxruntime[model.int8.onnx]": "fp16" if on_cuda else "int8"}
    for r in result.rows:
        assert r.runs >= 3 and r.p50_ms <= r.p90_ms <= r.p99_ms
        assert r.images_per_s == pytest.approx(r.batch / (r.p50_ms / 1e3))
        assert r.gflops == pytest.approx(result.gflop_per_image * r.images_per_s)
        assert r.precision == precisions.get(r.backend, "fp32")
        # each row against the peak of its own precision, measured in the same run
        assert r.peak_fraction == pytest.approx(r.gflops / result.peaks[r.precision]["gflops"])
        assert r.peak_rss_mb > 10
        assert r.validated  # the export that made the bundle validated every model
    for batch in (1, 3):  # above batch 1, of the backends whose answers do not move with it
        fastest = min((r for r in result.rows if r.batch == batch and r.io == "host"
                       and not (batch > 1 and batch_dependence(r.backend))),
                      key=lambda r: r.p50_ms)
        assert result.recommendation[batch]["backend"] == fastest.backend
        assert result.recommendation[batch]["p50_ms"] == fastest.p50_ms
    eager = {(r.batch, r.io): r for r in result.rows if r.backend == "eager"}
    assert all(r.speedup == 1.0 for r in eager.values())
    for r in result.rows:
        assert r.speedup == pytest.approx(eager[r.batch, r.io].p50_ms / r.p50_ms)


def test_optimized_and_int8_models_are_what_they_claim(variant_bundle):
    optimized = onnx.load(str(variant_bundle / "model.opt.onnx"))
    ops = {n.op_type for n in optimized.graph.node}
    assert {"Attention", "SkipLayerNormalization", "BiasGelu"} <= ops  # fused by the optimizer
    int8 = onnx.load(str(variant_bundle / "model.int8.onnx"))
    ops = {n.op_type for n in int8.graph.node}
    assert "DynamicQuantizeLinear" in ops and "MatMulInteger" in ops
    assert any(t.data_type == onnx.TensorProto.INT8 for t in int8.graph.initializer)
    config = json.loads((variant_bundle / "config.json").read_text())
    assert config["export"]["onnx_models"] == {
        "model.onnx": "fp32", "model.opt.onnx": "fp32", "model.int8.onnx": "int8"}
    report = json.loads((variant_bundle / "parity.json").read_text())
    profiles = {r["candidate"]: r["profile"] for r in report["results"]}
    assert profiles["onnxruntime[model.opt.onnx]"] == "fp32"
    assert profiles["onnxruntime[model.int8.onnx]"] == "int8"
    assert report["passed"]


def test_bench_cli_writes_table_json_and_plot(variant_bundle, tmp_path):
    out_json, out_png = tmp_path / "b.json", tmp_path / "b.png"
    result = CliRunner().invoke(cli, [
        "bench", str(variant_bundle), "--batch-sizes", "1,2", "--min-seconds", "0",
        "--min-runs", "2", "--warmup", "0", "--threads", "1", "--runners",
        "onnxruntime[model.int8.onnx]", "--report", str(out_json), "--plot", str(out_png),
        "--provider", "cpu"])  # the CPU's table: its ISA and three peaks
    assert result.exit_code == 0, result.output
    lines = result.output.strip().splitlines()
    assert "fp32 matmul peak" in lines[0]
    assert lines[1] == f"cpu: {cpu.isa().model}; ISA {cpu.isa().summary}"
    assert lines[2].startswith("GEMM peaks, timed in turns with the runners (medians): fp32 ")
    # each precision's peak: the fastest of the installed runtimes' GEMMs, named
    assert re.search(r"fp32 [\d.]+ GFLOP/s \((torch\.mm|onnxruntime MatMul|openvino MatMul) "
                     r"fp32 2048x2048\); bf16 ", lines[2]), lines[2]
    assert re.search(r" GOP/s \((onnxruntime MatMulInteger u8s8|openvino MatMul QDQ int8) "
                     r"2048x2048", lines[2]), lines[2]
    assert lines[3].split()[:5] == ["backend", "device", "input", "batch", "p50"]
    int8 = "onnxruntime[model.int8.onnx]"
    device = json.loads(out_json.read_text())["device"]
    assert [line.split()[:4] for line in lines[4:8]] == [
        [name, device, "host", batch] for name in ("eager", int8) for batch in ("1", "2")]
    assert [line.split(":")[0] for line in lines[8:] if line.startswith("fastest")] == [
        "fastest validated at batch 1", "fastest validated at batch 2"]
    assert lines[-1] == f"note: {batch_dependence(int8)}"  # its answers move with the batch
    # where it was fastest at batch 2, it was passed over for a model whose answers do not
    assert all(line.startswith(f"note: {int8} ran faster (") for line in lines[10:-1])
    data = json.loads(out_json.read_text())
    assert data["batch_sizes"] == [1, 2] and len(data["rows"]) == 4
    assert out_png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_bench_rejects_unknown_target():
    result = CliRunner().invoke(cli, ["bench", "no_such_bundle_or_preset"])
    assert result.exit_code == 1 and "no_such_bundle_or_preset does not exist" in result.stderr


def test_bench_rejects_unknown_backend(variant_bundle):
    result = CliRunner().invoke(cli, ["bench", str(variant_bundle), "--runners", "tensorrt"])
    assert result.exit_code == 2  # not the shape of a runner name: a usage error
    assert "name one or more runners" in result.stderr
    for names in ("onnxruntime,onnxruntime", "", " , "):  # each once, and at least one
        assert CliRunner().invoke(cli, ["bench", str(variant_bundle), "--runners",
                                        names]).exit_code == 2
    result = CliRunner().invoke(cli, ["bench", str(variant_bundle), "--runners",
                                      "onnxruntime[model.nope.onnx]"])
    assert result.exit_code == 1
    assert result.stderr.startswith("Error: no runtime 'onnxruntime[model.nope.onnx]' in this "
                                    "bundle; it has eager, ")
    result = CliRunner().invoke(cli, ["bench", str(variant_bundle), "--runners", "openvino"])
    assert (result.exit_code, result.stderr) == (
        1, "Error: runtime openvino is OpenVINO's: add --runtimes openvino\n")
    result = CliRunner().invoke(cli, ["bench", str(variant_bundle), "--runtimes",
                                      "onnxruntime[model.int8.onnx]"])
    assert result.exit_code == 2 and "'onnxruntime[model.int8.onnx]' is a runner, not a " \
        "runtime (pytorch, onnxruntime, openvino): bench --runners names runners" in \
        result.stderr
    result = CliRunner().invoke(cli, ["bench", str(variant_bundle), "--runtimes", "tensorrt"])
    assert result.exit_code == 2 and "name one or more of the opt-in runtimes (openvino)" in \
        result.stderr
    result = CliRunner().invoke(cli, ["bench", str(variant_bundle), "--runtimes",
                                      "onnxruntime"])  # it meant "time only these" before
    assert result.exit_code == 2 and "'onnxruntime' always runs: --runtimes adds the opt-in " \
        "runtimes (openvino): bench --runners names runners" in result.stderr


@pytest.mark.slow  # quick suite under 3 min on a Zen 3 (2 cores): CI runs it
def test_bench_record_writes_performance_json_and_keeps_the_hashes(tmp_path):
    # proved on CPU, as the CPU run below needs: variant_bundle is proved where --provider
    # auto runs, which is CUDA on a GPU machine, and infer on CPU rightly refuses that proof
    bundle = make_bundle(tmp_path / "b", variants=["int8"], validation={"provider": "cpu"})
    result = CliRunner().invoke(cli, [
        "bench", str(bundle), "--batch-sizes", "1", "--min-seconds", "0", "--min-runs", "2",
        "--warmup", "0", "--threads", "1", "--runners", "onnxruntime[model.int8.onnx]",
        "--record", "--provider", "cpu"])
    assert result.exit_code == 0, result.output
    recorded = json.loads((bundle / B.PERFORMANCE_FILE).read_text())
    fastest = [line for line in result.output.splitlines()
               if line.startswith("fastest validated at batch 1: ")]
    assert len(fastest) == 1
    assert fastest[0].split(": ")[1].split()[0] == recorded["fastest_validated"]["1"]["backend"]
    assert recorded["isa"] == cpu.isa().summary and set(recorded["peaks"]) == {
        "fp32", "bf16", "int8"}
    assert result.output.strip().endswith(f"recorded in {bundle / B.PERFORMANCE_FILE}")
    B.read_bundle(bundle, verify=True)  # config.json's sha256s still hold
    assert not [p for p in bundle.iterdir() if p.name.startswith(".")]  # nothing left over
    # infer (--runtime auto) runs what was recorded, on this CPU, and says why
    chosen = recorded["fastest_validated"]["1"]["backend"]
    samples = Path(__file__).parent.parent / "models" / "digits" / "samples"
    code, out, err = run("infer", bundle, samples, "--provider", "cpu")
    assert code == 0, err
    assert out.splitlines()[-1] == (f"8 input(s) on {chosen} (cpu); performance.json's "
                                    f"fastest validated at batch 1")
    code, out, _ = run("infer", bundle, samples, "--provider", "cpu", "--runtime",
                       "onnxruntime")
    assert out.splitlines()[-1] == "8 input(s) on onnxruntime (cpu)"
    # measured on another CPU: not evidence for this one
    (bundle / B.PERFORMANCE_FILE).write_text(json.dumps(recorded | {"cpu": "Other CPU 9000"}))
    code, out, _ = run("infer", bundle, samples, "--provider", "cpu")
    assert out.splitlines()[-1] == (
        f"8 input(s) on onnxruntime (cpu); performance.json names {chosen}, but it was "
        f"measured on Other CPU 9000, and this CPU is {cpu.isa().model}")
    # proved on another device: not evidence for this one either
    (bundle / B.PERFORMANCE_FILE).write_text(json.dumps(recorded))
    parity = json.loads((bundle / B.PARITY_FILE).read_text())
    (bundle / B.PARITY_FILE).write_text(json.dumps(parity | {"provider_used": "cuda"}))
    code, out, _ = run("infer", bundle, samples, "--provider", "cpu")
    assert out.splitlines()[-1] == (
        f"8 input(s) on onnxruntime (cpu); performance.json names {chosen}, but parity.json "
        f"proved the bundle on cuda and this run is on cpu (export it with --provider cpu)")
    (bundle / B.PERFORMANCE_FILE).write_text(json.dumps(recorded | {"fastest_validated": {
        "1": {"backend": 7}}}))
    code, out, err = run("infer", bundle, samples)
    assert (code, out) == (1, "") and one_line(err) == (
        f"Error: {bundle / B.PERFORMANCE_FILE}: fastest_validated must be an object of batch "
        f"sizes (1 to 1048576) -> {{\"backend\": runner name}}, got {{'1': {{'backend': 7}}}}")


def test_bench_record_needs_a_bundle():
    result = CliRunner().invoke(cli, ["bench", "vit_seed_tiny", "--record"])
    assert result.exit_code == 2
    assert result.stderr == ("Error: --record writes into a bundle; a preset TARGET is "
                             "exported to a temporary folder\n")


def test_a_backend_that_failed_parity_is_never_recommended(variant_bundle, tmp_path):
    import shutil

    bundle = tmp_path / "b"
    shutil.copytree(variant_bundle, bundle)
    report = json.loads((bundle / B.PARITY_FILE).read_text())
    for row in report["results"]:
        if row["candidate"] == "onnxruntime[model.int8.onnx]" and row["batch"] == 1:
            row["passed"] = False
    report["passed"] = False
    (bundle / B.PARITY_FILE).write_text(json.dumps(report))
    assert parity.validated_runners(B.read_bundle(bundle)) == {"eager"}
    report["passed"] = True  # a hand-edited verdict: the failed row still counts
    (bundle / B.PARITY_FILE).write_text(json.dumps(report))
    assert "onnxruntime[model.int8.onnx]" not in parity.validated_runners(B.read_bundle(bundle))
    (bundle / B.PARITY_FILE).unlink()
    assert parity.validated_runners(B.read_bundle(bundle)) == {"eager"}
    rows = [bench.BenchRow("eager", "cpu", "host", 1, 3, 10.0, 10.0, 10.0, 100, 1, 0.5, 1.0,
                           1, "fp32", True),
            bench.BenchRow("fast", "cpu", "host", 1, 3, 5.0, 5.0, 5.0, 200, 2, 0.5, 2.0, 1,
                           "int8", False)]
    assert bench.recommend(rows)[1]["backend"] == "eager"
    rows[1].validated = True
    assert bench.recommend(rows)[1] == {"backend": "fast", "p50_ms": 5.0, "images_per_s": 200,
                                        "speedup_vs_eager": 2.0, "precision": "int8"}


CPUINFO = """processor\t: 0
model name\t: {model}
flags\t\t: fpu sse2 avx fma {flags}

processor\t: 1
model name\t: {model}
flags\t\t: fpu sse2 avx fma {flags}
"""


@pytest.mark.parametrize("flags, summary, int8_dot, bf16", [
    ("avx2", "AVX2 (no AVX-512, VNNI, AMX, BF16)", False, False),
    ("avx2 avx512f avx512_vnni", "AVX2, AVX-512, AVX512-VNNI (no AMX, BF16)", True, False),
    ("avx2 avx_vnni", "AVX2, AVX-VNNI (no AVX-512, AMX, BF16)", True, False),
    ("avx2 avx512f avx512_vnni avx512_bf16 amx_bf16 amx_int8",
     "AVX2, AVX-512, AVX512-VNNI, AVX512-BF16, AMX-BF16, AMX-INT8", True, True),
    ("sse4_2", "no AVX2 (no AVX-512, VNNI, AMX, BF16)", False, False),
])
def test_isa_from_cpuinfo(flags, summary, int8_dot, bf16):
    found = cpu.parse_cpuinfo(CPUINFO.format(model="Some CPU 9000", flags=flags))
    assert found.model == "Some CPU 9000" and found.summary == summary
    assert found.int8_dot is int8_dot and found.bf16 is bf16


def test_bf16_without_hardware_is_a_probe_said_to_be_emulated():
    avx2 = cpu.Isa("avx2 cpu", frozenset({"avx2"}))
    peak = cpu.bf16_peak(avx2)
    assert not peak.hardware and peak.kernel == "torch.mm bf16 256x256"
    assert peak.note == "no bf16 hardware (needs AVX512-BF16 or AMX): emulated"
    assert peak.gflops > 0


@pytest.mark.parametrize("peer", ["eager-amp", "timm-compile-ro-fp16"])
def test_bench_peers_that_need_cuda_are_left_out_on_cpu_with_a_note(variant_bundle, peer):
    """As any peer that cannot run here: the run goes on, and a note says why (a bench
    script shared by CPU and GPU machines holds on both)."""
    result = CliRunner().invoke(cli, ["bench", str(variant_bundle), "--provider", "cpu",
                                      "--peers", peer, "--batch-sizes", "1", "--min-seconds",
                                      "0.01", "--runners", "onnxruntime"])
    assert result.exit_code == 0, result.stderr
    assert f"note: {peer} left out: it needs CUDA, and this run is on cpu" in result.stdout
    assert f"\n{peer} " not in result.stdout  # no row


def test_bench_rejects_an_unknown_peer(variant_bundle):
    result = CliRunner().invoke(cli, ["bench", str(variant_bundle), "--peers", "tensorrt"])
    assert result.exit_code == 2
    assert result.stderr.splitlines()[-1] == (
        "Error: unknown peer 'tensorrt'; choose from eager-amp, torch-compile, "
        "torch-compile-amp, cuda-graph, timm, timm-compile, timm-fp16, timm-compile-fp16, "
        "timm-compile-ro-fp16")


@pytest.mark.slow
def test_torch_compile_peer_is_checked_against_eager_then_timed(variant_bundle):
    """max-autotune compiles for a minute or more on 2 cores: slow."""
    result = bench.bench(variant_bundle, [1, 2], threads=2, min_runs=2, min_seconds=0.0,
                         warmup=1, runners=["eager"], peers=["torch-compile"],
                         provider="cpu")
    rows = [r for r in result.rows if r.backend == "torch-compile"]
    assert [r.batch for r in rows] == [1, 2] and not result.notes
    assert all(r.validated and r.precision == "fp32" for r in rows)


@pytest.mark.slow
def test_timm_peers_hold_the_bundles_weights_and_are_checked_then_timed(variant_bundle):
    """timm's own model with the bundle's weights, eager and torch.compile'd (default mode):
    each matched eager before it was timed; compiling takes tens of seconds here: slow."""
    result = bench.bench(variant_bundle, [1, 2], threads=2, min_runs=2, min_seconds=0.0,
                         warmup=1, runners=["eager"], peers=["timm", "timm-compile"],
                         provider="cpu")
    rows = [r for r in result.rows if r.backend.startswith("timm")]
    assert [(r.backend, r.batch) for r in rows] == [
        ("timm", 1), ("timm", 2), ("timm-compile", 1), ("timm-compile", 2)]
    assert all(r.validated and r.peer and r.precision == "fp32" for r in rows)
    assert not result.notes


@pytest.mark.cuda
def test_bench_on_cuda_times_every_runner_and_peer_on_the_gpu(tmp_path):
    bundle = make_bundle(tmp_path / "b", variants=["fp16"], validation=dict(provider="cuda"))
    result = bench.bench(bundle, [1, 2], min_runs=3, min_seconds=0.0, warmup=1,
                         provider="cuda", peers=["eager-amp", "cuda-graph"], trust_code=True)
    assert result.device == "cuda" and result.gpu.startswith(torch.cuda.get_device_name())
    assert set(result.peaks) == {"fp32", "fp16"} and not result.notes
    names = list(dict.fromkeys(r.backend for r in result.rows))
    assert names == ["eager", "torchscript", "onnxruntime", "onnxruntime[model.fp16.onnx]",
                     "eager-amp", "onnxruntime+cuda-graph",
                     "onnxruntime[model.fp16.onnx]+cuda-graph"]
    for r in result.rows:
        assert r.device == "cuda" and r.validated, r
        half = "fp16" in r.backend or r.backend == "eager-amp"
        assert r.precision == ("fp16" if half else "fp32")
    assert {(r.backend, r.io, r.batch) for r in result.rows} == {
        (n, io, b) for n in names for io in ("host", "device") for b in (1, 2)}


def test_a_peer_that_fails_is_a_note_and_one_that_disagrees_is_never_recommended(
        variant_bundle, monkeypatch):
    """What bench does with peers that cannot be run here for real (a CUDA kernel that is
    missing, a compiler that computes something else): stand-ins with the runner protocol."""
    class Failing:
        name, device = "eager-amp", "cpu"

        def __call__(self, x):
            raise RuntimeError("no kernel image is available for execution\nC++ trace")

    class Off:
        name, device = "torch-compile", "cpu"

        def __init__(self, eager):
            self.eager = eager

        def __call__(self, x):
            return self.eager(x) + 1.0

    monkeypatch.setattr(bench.peers, "peer_runners",
                        lambda peers, eager, files, bundle: [Failing(), Off(eager)])
    result = bench.bench(variant_bundle, [1, 2], threads=1, min_runs=2, min_seconds=0.0,
                         warmup=0, runners=["eager"], peers=["timm", "torch-compile"],
                         provider="cpu")  # peers CPU runs: the stand-ins take their places
    assert result.notes == ["eager-amp left out: no kernel image is available for execution"]
    off = [r for r in result.rows if r.backend == "torch-compile"]
    assert [r.batch for r in off] == [1, 2] and all(r.peer and not r.validated for r in off)
    assert {b: v["backend"] for b, v in result.recommendation.items()} == {1: "eager", 2: "eager"}
    table = render.bench_table(result, "b")
    assert "peers, timed beside the bundle and never recommended: torch-compile (did NOT " \
           "match eager)" in table
    assert table.rstrip().endswith(
        "note: eager-amp left out: no kernel image is available for execution")


def test_a_batch_size_given_twice_is_timed_once(variant_bundle, tmp_path):
    """bench --batch-sizes 1,1 timed everything twice and put eager at 1.16x of itself.
    --json prints the result, and nothing else, on stdout."""
    result = CliRunner().invoke(cli, [
        "bench", str(variant_bundle), "--batch-sizes", "1,1", "--min-seconds", "0",
        "--min-runs", "2", "--warmup", "0", "--threads", "1", "--runners", "onnxruntime",
        "--provider", "cpu", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["batch_sizes"] == [1]
    assert [(r["backend"], r["batch"]) for r in data["rows"]] == [("eager", 1), ("onnxruntime", 1)]


def test_parity_json_is_standard_json_and_info_reads_it(variant_bundle):
    # the int8 profile has no limit on max abs (infinite): written as null, not Infinity,
    # which strict readers (ours, jq, JavaScript) refuse
    def refuse(name):
        raise ValueError(f"{name} is not JSON")

    report = json.loads((variant_bundle / "parity.json").read_text(), parse_constant=refuse)
    assert report["profiles"]["int8"]["atol"] is None
    assert report["profiles"]["fp32"]["atol"] == 1e-4
    result = CliRunner().invoke(cli, ["info", str(variant_bundle)])
    assert result.exit_code == 0, result.output
    assert "parity at export: PASS" in result.output


def test_against_peer_sets_the_fastest_validated_file_beside_the_peer():
    """Per batch and input placement: the fastest validated backend that is not a peer (not
    the faster int8 model that failed parity, nor the CUDA graph), the peer's img/s there,
    host against device input for that backend, and its CUDA graph's img/s."""
    found = bench.against_peer(h100_peers_result(), "timm-compile-ro-fp16")
    assert [(a.batch, a.io, a.backend) for a in found] == [
        (b, io, "onnxruntime[model.opt.fp16.onnx]") for b in (1, 64) for io in ("host", "device")]
    b1, b64 = found[1], found[3]  # device input
    assert (b1.images_per_s, b1.peer_images_per_s, b1.graph_images_per_s) == pytest.approx(
        (595.91, 1527.5, 1405.54))
    assert b1.ratio == pytest.approx(595.91 / 1527.5) and b1.peer_validated
    assert (b64.peak_fraction, b64.precision) == (0.42, "fp16")
    assert b64.ratio == pytest.approx(9106.25 / 10242.9)
    assert b64.host_vs_device == found[2].host_vs_device == pytest.approx(5163.16 / 9106.25)
    assert found[2].peer_images_per_s == pytest.approx(6000.0)
    # a peer left out has no figure: no ratio; one timed without a device row, none either
    left_out = bench.against_peer(h100_peers_result(), "timm-compile-fp16")
    assert [(a.peer_images_per_s, a.ratio, a.peer_validated) for a in left_out] == [
        (None, None, False)] * 4
    # a stream of host batches (the next copy overlapping the run) counts as host input
    # where it is faster than a batch at a time, and only then; it is never a placement of
    # its own here
    streamed = h100_peers_result()
    for batch, rate in ((1, 500.0), (64, 8500.0)):  # slower at batch 1, faster at 64
        streamed["rows"].append({**next(r for r in streamed["rows"] if r["io"] == "host" and
                                        r["backend"] == b64.backend and r["batch"] == batch),
                                 "io": "stream", "images_per_s": rate})
    again = bench.against_peer(streamed, "timm-compile-ro-fp16")
    assert [(a.batch, a.io) for a in again] == [(a.batch, a.io) for a in found]
    assert again[0].host_vs_device == pytest.approx(624.63 / 595.91)
    assert again[2].host_vs_device == again[3].host_vs_device == pytest.approx(8500 / 9106.25)
    cpu = h100_peers_result()
    cpu["rows"] = [r for r in cpu["rows"] if r["io"] == "host"]
    assert [a.host_vs_device for a in bench.against_peer(cpu, "timm-compile-ro-fp16")] == [
        None, None]


def test_against_peer_refuses_an_unknown_peer_and_rows_that_are_not_bench_rows():
    with pytest.raises(ConfigError, match="unknown peer 'timm-ro'"):
        bench.against_peer(h100_peers_result(), "timm-ro")
    for broken in ({}, {"rows": [{"backend": "eager"}]}, {"rows": [1]}):
        with pytest.raises(BundleError, match=r"^not a bench result \(bench --json") as caught:
            bench.against_peer(broken, "timm")
        assert caught.value.cli_message().startswith("not a bench result (bench --json or ")


def test_each_precisions_peak_is_the_fastest_of_its_gemms():
    """A runtime whose GEMM outruns torch.mm (ONNX Runtime's fp32 on Zen 5) sets the peak,
    so no row's fraction of it passes 1; every installed runtime's GEMM is a candidate."""
    peaks = {"fp32 torch.mm": cpu.Peak("fp32", 219.0, "torch.mm fp32 2048x2048", True),
             "fp32 onnxruntime": cpu.Peak("fp32", 410.0, "onnxruntime MatMul fp32", True),
             "int8 onnxruntime": cpu.Peak("int8", 900.0, "onnxruntime MatMulInteger", True)}
    assert cpu.fastest(peaks) == {"fp32": peaks["fp32 onnxruntime"],
                                  "int8": peaks["int8 onnxruntime"]}
    kernels = {g.peak.kernel.split()[0] for g in cpu.gemms(1).values()}
    assert {"torch.mm", "onnxruntime"} <= kernels


def test_openvinos_float_peak_is_gemms_in_a_row():
    """OpenVINO's fp32 and bf16 peaks are timed on GEMMs in a row, so a call's conversion of
    its input and output is not charged to the GEMM: the graph computes that product, and
    the operations counted are every GEMM's."""
    import numpy as np
    import onnxruntime as ort
    from onnx import numpy_helper

    graph = cpu._matmul_graph(64, False, chain=3)
    weights = [numpy_helper.to_array(t) for t in onnx.load_from_string(graph).graph.initializer]
    a = np.random.default_rng(2).standard_normal((64, 64), dtype=np.float32)
    session = ort.InferenceSession(graph, providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(session.run(None, {"a": a})[0],
                               a @ weights[0] @ weights[1] @ weights[2], rtol=1e-4, atol=1e-5)
    pytest.importorskip("openvino")
    gemm = cpu.openvino_gemm("fp32", cpu.isa(), 1, n=64)
    assert gemm.ops == cpu.FLOAT_CHAIN * 2 * 64 ** 3
    assert gemm.peak.kernel == f"openvino MatMul fp32 64x64, {cpu.FLOAT_CHAIN} in a row"
    assert cpu.openvino_gemm("int8", cpu.isa(), 1, n=64).ops == 2 * 64 ** 3
    gemm.call()
