"""The graph our dynamo export writes is one ONNX Runtime's fusions recognise: GELU fused into
one kernel by the session's own optimizer, the same numbers bit for bit as the exporter's
order."""
from __future__ import annotations

import json
from collections import Counter

import numpy as np
import onnx
import onnxruntime as ort
import torch
from conftest import TINY, run

from vit_export import fusion
from vit_export.model import create_model


def _session(path, level=ort.GraphOptimizationLevel.ORT_ENABLE_ALL, dump=None):
    options = ort.SessionOptions()
    options.graph_optimization_level = level
    options.log_severity_level = 3
    if dump:
        options.optimized_model_filepath = str(dump)
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def test_the_exported_gelu_is_fused_by_onnx_runtime(tiny_bundle, tmp_path):
    dump = tmp_path / "optimized.onnx"
    _session(tiny_bundle / "model.onnx", dump=dump)
    ops = Counter(n.op_type for n in onnx.load(str(dump), load_external_data=False).graph.node)
    depth = json.loads((tiny_bundle / "config.json").read_text())["model"]["depth"]
    assert ops["Erf"] == 0 and ops["Gelu"] + ops["BiasGelu"] == depth, ops


def test_reordering_gelu_keeps_every_bit(tmp_path):
    torch.manual_seed(0)
    model = create_model("vit_seed_tiny", **TINY).eval()
    x = torch.randn(2, 3, TINY["img_size"], TINY["img_size"])
    raw = tmp_path / "raw.onnx"
    torch.onnx.export(model, (x,), str(raw), dynamo=True, opset_version=18,
                      input_names=["pixel_values"], verbose=False)
    proto = onnx.load(str(raw))
    assert Counter(n.op_type for n in proto.graph.node)["Erf"] == TINY["depth"]
    assert fusion.gelu_for_fusion(proto) == TINY["depth"]
    assert fusion.gelu_for_fusion(proto) == 0  # the fused order is left as it is
    onnx.save(proto, str(tmp_path / "reordered.onnx"))
    plain = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    feed = {"pixel_values": (x.numpy() * 3).astype(np.float32)}
    before = _session(raw, plain).run(None, feed)[0]
    after = _session(tmp_path / "reordered.onnx", plain).run(None, feed)[0]
    assert np.array_equal(before, after)


def test_layer_scale_is_folded_so_every_block_fuses(tmp_path):
    torch.manual_seed(0)
    model = create_model("vit_seed_tiny", **TINY, init_values=0.5).eval()
    with torch.no_grad():  # LayerScale far from one: a fold that forgot gamma shows
        for block in model.blocks:
            block.ls1.gamma.uniform_(0.2, 1.5)
            block.ls2.gamma.uniform_(0.2, 1.5)
    x = torch.randn(2, 3, TINY["img_size"], TINY["img_size"])
    raw = tmp_path / "raw.onnx"
    torch.onnx.export(model, (x,), str(raw), dynamo=True, opset_version=18,
                      input_names=["pixel_values"], verbose=False)
    proto = onnx.load(str(raw))
    assert fusion.after_projection(proto, TINY["embed_dim"]) == ["Mul"] * TINY["depth"]
    assert fusion.fold_layer_scale(proto) == 2 * TINY["depth"]  # attention's and the MLP's
    assert fusion.after_projection(proto, TINY["embed_dim"]) == ["Add"] * TINY["depth"]
    onnx.save(proto, str(tmp_path / "folded.onnx"))
    feed = {"pixel_values": x.numpy()}
    expected = model(x).detach().numpy()
    folded = _session(tmp_path / "folded.onnx").run(None, feed)[0]
    np.testing.assert_allclose(folded, expected, rtol=1e-4, atol=1e-5)


def test_a_layer_scale_model_exports_optimized(tmp_path):
    out = tmp_path / "ls"
    code, stdout, stderr = run("export", out, "--preset", "vit_seed_tiny", "--set",
                               "init_values=0.5", "--optimize")
    assert code == 0, stdout + stderr
    proto = onnx.load(str(out / "model.opt.onnx"))
    depth = json.loads((out / "config.json").read_text())["model"]["depth"]
    assert fusion.fused_attention_count(proto) == depth


def test_variant_refusals_name_the_option_in_the_caller_s_spelling(tmp_path):
    import pytest

    from vit_export.config import preset_config
    from vit_export.errors import ExportError
    from vit_export.exporting import variants

    with pytest.raises(ExportError) as caught:
        variants.make_variant("static", tmp_path / "model.onnx", tmp_path, None, "{}")
    assert str(caught.value) == "static int8 needs calibration images (calibrate)"
    assert caught.value.cli_message() == "static int8 needs calibration images (--calibrate)"
    rotary = preset_config("vit_seed_tiny", rope_type="cat")
    with pytest.raises(ExportError) as caught:
        variants.to_optimized(tmp_path / "model.onnx", rotary)
    assert caught.value.cli_message().startswith("--optimize: ONNX Runtime's transformer "
                                                 "optimizer fuses plain attention")
    assert str(caught.value).startswith("optimize=True: ")
