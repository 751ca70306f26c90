import json

import onnx
import pytest
from click.testing import CliRunner
from conftest import make_bundle

from vit_export import bench
from vit_export.cli import cli
from vit_export.model import preset_config


def test_model_flops_of_vit_base_match_the_published_count():
    # 17.56 G multiply-adds per image (timm/fvcore report 17.58 with softmax and norms)
    assert bench.model_flops(preset_config("vit_base_patch16_224")) == pytest.approx(
        2 * 17_563_828_224, rel=1e-12)
    tiny = preset_config("vit_seed_tiny")
    assert bench.model_flops(tiny.replace(depth=4)) > bench.model_flops(tiny)


@pytest.fixture(scope="module")
def variant_bundle(tmp_path_factory):
    return make_bundle(tmp_path_factory.mktemp("variants") / "b", variants=["optimized", "int8"])


def test_bench_rows_are_consistent(variant_bundle):
    result = bench.bench(variant_bundle, [1, 3], threads=1, min_runs=3, min_seconds=0.0,
                         warmup=1)
    names = list(dict.fromkeys(r.backend for r in result.rows))
    assert names == ["eager", "torchscript", "onnxruntime", "onnxruntime[model.opt.onnx]",
                     "onnxruntime[model.int8.onnx]"]
    assert result.threads == 1 and result.matmul_peak_gflops > 1
    # every backend runs on the device ONNX Runtime really got, and says so
    assert {r.device for r in result.rows} == {result.device}
    placements = {"host", "device"} if result.device == "cuda" else {"host"}
    assert {r.io for r in result.rows} == placements
    for r in result.rows:
        assert r.runs >= 3 and r.p50_ms <= r.p90_ms <= r.p99_ms
        assert r.images_per_s == pytest.approx(r.batch / (r.p50_ms / 1e3))
        assert r.gflops == pytest.approx(result.gflop_per_image * r.images_per_s)
        assert r.peak_fraction == pytest.approx(r.gflops / result.matmul_peak_gflops)
        assert r.peak_rss_mb > 10
    eager = {(r.batch, r.io): r for r in result.rows if r.backend == "eager"}
    assert all(r.speedup == 1.0 for r in eager.values())
    for r in result.rows:
        assert r.speedup == pytest.approx(eager[r.batch, r.io].p50_ms / r.p50_ms)


def test_optimized_and_int8_models_are_what_they_claim(variant_bundle):
    optimized = onnx.load(str(variant_bundle / "model.opt.onnx"))
    ops = {n.op_type for n in optimized.graph.node}
    assert {"SkipLayerNormalization", "BiasGelu"} <= ops  # fused by the transformer optimizer
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
        "--min-runs", "2", "--warmup", "0", "--threads", "1", "--backends",
        "onnxruntime[model.int8.onnx]", "--json", str(out_json), "--plot", str(out_png)])
    assert result.exit_code == 0, result.output
    lines = result.output.strip().splitlines()
    assert "fp32 matmul peak" in lines[0]
    assert lines[1].split()[:5] == ["backend", "device", "input", "batch", "p50"]
    int8 = "onnxruntime[model.int8.onnx]"
    device = json.loads(out_json.read_text())["device"]
    assert [line.split()[:4] for line in lines[2:]] == [
        [name, device, "host", batch] for name in ("eager", int8) for batch in ("1", "2")]
    data = json.loads(out_json.read_text())
    assert data["batch_sizes"] == [1, 2] and len(data["rows"]) == 4
    assert out_png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_bench_rejects_unknown_target():
    result = CliRunner().invoke(cli, ["bench", "no_such_bundle_or_preset"])
    assert result.exit_code == 1 and "no_such_bundle_or_preset does not exist" in result.stderr


def test_bench_rejects_unknown_backend(variant_bundle):
    result = CliRunner().invoke(cli, ["bench", str(variant_bundle), "--backends", "tensorrt"])
    assert result.exit_code == 1
    assert result.stderr.startswith("Error: no backend 'tensorrt' in this bundle; it has eager, ")
