import json
from collections import Counter

import numpy as np
import onnx
import pytest
import torch
from conftest import make_bundle

from vit_export import bundle as B
from vit_export import fusion, parity, runtime
from vit_export.errors import ExportError, ParityError
from vit_export.exporting import ExportOptions, export_bundle, export_onnx
from vit_export.exporting.variants import make_variant
from vit_export.model import VisionTransformer, create_model, random_input
from vit_export.onnxio import MAX_IR_VERSION, check_onnx, graph_only


def _dims(value):
    return [d.dim_param or d.dim_value for d in value.type.tensor_type.shape.dim]


@pytest.mark.slow  # quick suite under 3 min on a Zen 3 (2 cores): CI runs it
def test_a_released_model_is_freed_before_validation_which_reads_the_bundle(tmp_path):
    """release_model (the CLI's way): the caller's weights go once the files are written;
    validation still compares the bundle with eager PyTorch from weights.safetensors."""
    torch.manual_seed(0)
    model = create_model("vit_seed_tiny").eval()
    description = B.Description(model.config, B.Preprocessing.default_for(model.config))
    report = export_bundle(model, tmp_path / "b", description, ExportOptions(
        validation=parity.ValidateOptions(batch_sizes=[1, 3])), release_model=True)
    assert report.passed and {p.device.type for p in model.parameters()} == {"meta"}
    assert {r.batch for r in report.results} == {1, 3}


@pytest.mark.parametrize("exporter", ["dynamo", "torchscript"])
def test_bundle_contents_and_onnx_contract(tmp_path, exporter):
    out = make_bundle(tmp_path / "b", exporter=exporter)
    assert sorted(p.name for p in out.iterdir()) == sorted(
        [B.ONNX_FILE, B.TS_FILE, B.WEIGHTS_FILE, B.CONFIG_FILE, B.PARITY_FILE])
    proto = onnx.load(str(out / B.ONNX_FILE))
    onnx.checker.check_model(proto)
    assert [i.name for i in proto.graph.input] == ["pixel_values"]
    assert [o.name for o in proto.graph.output] == ["logits"]
    assert _dims(proto.graph.input[0]) == ["batch", 3, 32, 32]
    assert _dims(proto.graph.output[0]) == ["batch", 10]
    assert proto.ir_version <= MAX_IR_VERSION
    assert max(o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")) >= 17
    assert "LayerNormalization" in {n.op_type for n in proto.graph.node}
    meta = json.loads({p.key: p.value for p in proto.metadata_props}[B.METADATA_KEY])
    assert meta["model"]["embed_dim"] == 64 and meta["export"]["exporter"] == exporter
    report = json.loads((out / B.PARITY_FILE).read_text())
    assert report["passed"] and report["batch_sizes"] == [1, 3, 7]
    assert max(r["max_abs"] for r in report["results"]) <= 1e-4
    config = json.loads((out / B.CONFIG_FILE).read_text())
    assert config["files"][B.ONNX_FILE] == B.sha256_file(out / B.ONNX_FILE)
    assert all(p.stat().st_mode & 0o044 == 0o044 for p in out.iterdir())  # others may read
    assert config["export"]["external_data"] is False


@pytest.mark.parametrize("exporter", ["dynamo", "torchscript"])
def test_model_onnx_reads_its_weights_from_weights_safetensors(tmp_path, exporter):
    """By default the weights are in the bundle once for model.onnx and eager: each
    initializer weights.safetensors holds (transposed ones through a Transpose node) points
    into that file, and what runs from the folder by path, as a user's own ONNX Runtime or
    onnx.load would, is the same model as `--single-file`'s, which keeps them inside."""
    import onnxruntime as ort

    shared = make_bundle(tmp_path / "shared", exporter=exporter)
    whole = make_bundle(tmp_path / "whole", exporter=exporter, external_data=False)
    assert B.external_data(shared / B.ONNX_FILE) == [B.WEIGHTS_FILE]
    assert B.external_data(whole / B.ONNX_FILE) == []
    weights = (shared / B.WEIGHTS_FILE).stat().st_size

    def inside(folder):  # the initializers' bytes model.onnx holds itself
        proto = onnx.load(str(folder / B.ONNX_FILE), load_external_data=False)
        return sum(len(t.raw_data) for t in proto.graph.initializer)

    assert inside(shared) < 0.01 * weights < 0.9 * weights < inside(whole)
    config = json.loads((shared / B.CONFIG_FILE).read_text())["export"]
    assert config["weights_in"] == B.WEIGHTS_FILE
    assert json.loads((whole / B.CONFIG_FILE).read_text())["export"].get("weights_in") is None
    proto = onnx.load(str(shared / B.ONNX_FILE), load_external_data=False)
    external = {t.name for t, _ in B.external_tensors(proto)}
    transposed = [n for n in proto.graph.node if n.op_type == "Transpose"
                  and n.input[0] in external]
    depth = B.read_bundle(shared).config.depth
    assert len(transposed) == 4 * depth  # qkv, proj, fc1 and fc2 of each block
    onnx.checker.check_model(str(shared / B.ONNX_FILE))
    x = random_input(B.read_bundle(shared).config, 3).numpy()
    by_path = ort.InferenceSession(str(shared / B.ONNX_FILE), providers=["CPUExecutionProvider"])
    ours = runtime.open_runner(shared, "onnxruntime", "cpu")(x)
    assert np.array_equal(by_path.run(None, {"pixel_values": x})[0], ours)
    assert np.array_equal(runtime.open_runner(whole, "onnxruntime", "cpu")(x), ours)
    assert np.array_equal(runtime.open_runner(shared, "eager", "cpu")(x),
                          runtime.open_runner(whole, "eager", "cpu")(x))


def test_a_model_whose_weights_are_elsewhere_is_checked_in_memory(tmp_path):
    """onnx.checker judges model.onnx as written when its weights are in weights.safetensors,
    without the file (it would look for it beside the working directory): every node, type
    and name; a node reading a name nothing gives is refused."""
    from onnx import helper

    weight = helper.make_tensor("w", onnx.TensorProto.FLOAT, [2, 2], [1.0, 2.0, 3.0, 4.0])
    weight.ClearField("float_data")
    weight.data_location = onnx.TensorProto.EXTERNAL
    weight.external_data.add(key="location", value=B.WEIGHTS_FILE)
    x = helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 2])
    y = helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, 2])

    def model(reads: str) -> onnx.ModelProto:
        graph = helper.make_graph([helper.make_node("MatMul", ["x", reads], ["y"])], "g",
                                  [x], [y], [weight])
        return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])

    check_onnx(tmp_path / B.ONNX_FILE, graph_only(model("w")))
    with pytest.raises(ExportError, match="onnx.checker rejects model.onnx"):
        check_onnx(tmp_path / B.ONNX_FILE, graph_only(model("nowhere")))
    with pytest.raises(ExportError, match="should be stored in"):  # what graph_only spares
        check_onnx(tmp_path / B.ONNX_FILE, model("w"))


@pytest.mark.slow  # quick suite under 3 min on a Zen 3 (2 cores): CI runs it
def test_forced_external_data_still_validates(tmp_path):
    out = make_bundle(tmp_path / "b", external_data=True)
    data = out / B.ONNX_DATA_FILE
    assert data.is_file() and data.stat().st_size > 400_000
    assert (out / B.ONNX_FILE).stat().st_size < 100_000
    assert B.read_bundle(out).hashes[B.ONNX_DATA_FILE] == B.sha256_file(data)
    report = parity.validate(out)
    assert report.passed and max(r.max_abs for r in report.results) <= 1e-4


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_weights_are_streamed_as_the_bytes_safetensors_writes(tmp_path, dtype):
    """write_weights streams the file itself (safetensors' save held two copies of a ViT-g's
    4.5 GB at once); the bytes are the library's, and the library reads them back."""
    from safetensors.torch import load_file, save

    model = create_model("vit_seed_tiny", reg_tokens=2, init_values=0.5).to(dtype)
    B.write_weights(model, tmp_path / "w.safetensors")
    state = model.state_dict()
    assert (tmp_path / "w.safetensors").read_bytes() == save(state)
    back = load_file(str(tmp_path / "w.safetensors"))
    assert back.keys() == state.keys()
    assert all(torch.equal(back[k], v) for k, v in state.items())


@pytest.mark.slow  # quick suite under 3 min on a Zen 3 (2 cores): CI runs it
@pytest.mark.parametrize("shared", [False, True], ids=["whole", "into-the-weights-file"])
def test_the_onnx_export_keeps_no_reference_to_the_weights(tmp_path, shared):
    """onnxscript's rewrite rules kept the last graph they matched, and with it every weight
    of the exported model: a released ViT-L's 1.1 GiB stayed in memory. Also where the
    exporter's own tensors are read in memory to be pointed into the weights file."""
    import weakref

    model = create_model("vit_seed_tiny").eval()
    export_onnx(model, tmp_path / "m.onnx", "{}",
                spans=B.weight_spans(model) if shared else None)
    weight = weakref.ref(model.blocks[0].mlp.fc1.weight)
    model.to("meta")
    runtime.release_memory()
    assert weight() is None


@pytest.mark.slow  # two exports, 6 s: the quick suite keeps under 3 minutes
def test_weights_read_in_memory_give_the_model_the_whole_export_gives(tmp_path):
    """model.onnx pointed into weights.safetensors from the dynamo exporter's own tensors
    (never written) computes, to the bit, what the exporter's whole graph (saved, weights
    inside) computes: every weight found where the weights file holds it, the rest kept."""
    import onnxruntime as ort

    torch.manual_seed(0)
    model = create_model("vit_seed_tiny", reg_tokens=1, init_values=0.5).eval()
    (tmp_path / "whole").mkdir()
    (tmp_path / "shared").mkdir()
    whole = export_onnx(model, tmp_path / "whole" / B.ONNX_FILE, "{}", external_data=False)
    B.write_weights(model, tmp_path / "shared" / B.WEIGHTS_FILE)
    shared = export_onnx(model, tmp_path / "shared" / B.ONNX_FILE, "{}",
                         spans=B.weight_spans(model))
    assert "weights_in" not in whole and shared["weights_in"] == B.WEIGHTS_FILE
    proto = onnx.load(str(tmp_path / "shared" / B.ONNX_FILE), load_external_data=False)
    pointed = [t for t in proto.graph.initializer if t.data_location == onnx.TensorProto.EXTERNAL]
    assert sum(int({e.key: e.value for e in t.external_data}["length"])
               for t in pointed) > 0.9 * sum(p.nbytes for p in model.parameters())
    x = random_input(model.config, 3).numpy()
    outputs = [ort.InferenceSession(str(tmp_path / kind / B.ONNX_FILE),
                                    providers=["CPUExecutionProvider"]).run(None, {B.INPUT_NAME: x})[0]
               for kind in ("whole", "shared")]
    np.testing.assert_array_equal(outputs[0], outputs[1])


class _SkewedInOnnx(VisionTransformer):
    """An exporter bug, planted: the ONNX graph computes something eager PyTorch does not."""

    def forward(self, x):
        out = super().forward(x)
        return out + 0.5 if torch.onnx.is_in_onnx_export() else out


@pytest.mark.slow  # an export of its own, 5-7 s: the quick suite keeps under 3 minutes
def test_export_that_fails_validation_writes_nothing(tmp_path):
    """The README's Python API example, as it is, with an export that does not match."""
    torch.manual_seed(0)
    model = _SkewedInOnnx(create_model("vit_seed_tiny").config)
    description = B.Description(model.config, B.Preprocessing.default_for(model.config))
    with pytest.raises(ParityError, match="nothing written: onnxruntime batch 1") as caught:
        export_bundle(model, tmp_path / "b", description)
    assert list(tmp_path.iterdir()) == []
    report = caught.value.report
    assert not report.passed and report.bundle == str(tmp_path / "b")
    assert {r.candidate for r in report.results if not r.passed} == {"onnxruntime"}


def test_export_that_fails_validation_keeps_the_old_bundle(tiny_bundle, tmp_path):
    import shutil

    old = tmp_path / "b"
    shutil.copytree(tiny_bundle, old)
    before = {p.name: p.read_bytes() for p in old.iterdir()}
    model = _SkewedInOnnx(create_model("vit_seed_tiny").config)
    description = B.Description(model.config, B.Preprocessing.default_for(model.config))
    with pytest.raises(ParityError):
        export_bundle(model, old, description, ExportOptions(force=True))
    assert {p.name: p.read_bytes() for p in old.iterdir()} == before
    assert [p.name for p in tmp_path.iterdir()] == ["b"]


def test_torchscript_convolution_is_traced_with_tf32_off(tmp_path, monkeypatch):
    """A trace bakes `allow_tf32` into aten::_convolution: traced under PyTorch's default it
    ran the patch embedding in TF32 on a GPU, whatever the flags at run time (max rel 1.5e-4
    against eager at batch 7 on an H100). The flag is read from the saved graph, so this
    holds on a CPU-only machine too; the caller's own flags are left as they were."""
    from vit_export.exporting import trace_torchscript

    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", True)
    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", True)
    model = create_model("vit_seed_tiny").eval()
    trace_torchscript(model, tmp_path / "model.ts", 2, "{}")
    module = torch.jit.load(str(tmp_path / "model.ts"), map_location="cpu")
    convolutions = [n for n in module.inlined_graph.nodes() if n.kind() == "aten::_convolution"]
    assert len(convolutions) == 1
    allow_tf32 = list(convolutions[0].inputs())[-1]
    assert allow_tf32.node().kind() == "prim::Constant" and allow_tf32.toIValue() is False
    assert torch.backends.cudnn.allow_tf32 and torch.backends.cuda.matmul.allow_tf32


def test_a_model_the_caller_holds_is_still_theirs_after_the_export(tmp_path):
    """The front door releases the weights of a model it built itself, never those of one
    the caller handed it: the same model exports twice and still runs."""
    import vit_export

    torch.manual_seed(0)
    model = create_model("vit_seed_tiny").train()
    config = model.config
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        before = model.eval()(x)
    model.train()
    vit_export.export(model, tmp_path / "a", provider="cpu", batch_sizes=[1])
    report = vit_export.export(model, tmp_path / "b", provider="cpu", batch_sizes=[1],
                               outputs="embedding", normalize=True)
    assert report.passed and B.read_bundle(tmp_path / "b").config.output == "embedding"
    assert model.config == config and model.training  # its outputs, its mode
    with torch.no_grad():
        assert torch.equal(model.eval()(x), before)


def test_export_batch_must_be_at_least_two(tmp_path):
    model = create_model("vit_seed_tiny")
    description = B.Description(model.config, B.Preprocessing.default_for(model.config))
    with pytest.raises(ExportError, match="export_batch_size=1: the graphs are traced at a "
                                          "batch of 2 or more"):
        export_bundle(model, tmp_path / "b", description, ExportOptions(export_batch_size=1))
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("exporter", ["dynamo", "torchscript"])
def test_optimized_model_fuses_attention_and_matches_eager(tmp_path, exporter):
    out = make_bundle(tmp_path / "b", exporter=exporter, variants=["optimized"],
                      validation=dict(batch_sizes=[1, 3, 7], provider="cpu",
                                      require_provider="cpu"))
    depth = create_model("vit_seed_tiny").config.depth
    plain = Counter(n.op_type for n in onnx.load(str(out / B.ONNX_FILE)).graph.node)
    assert plain["Softmax"] == depth and plain["Attention"] == 0  # model.onnx as exported
    nodes = onnx.load(str(out / "model.opt.onnx")).graph.node
    fused = [n for n in nodes if n.op_type == "Attention" and n.domain == "com.microsoft"]
    assert len(fused) == depth
    assert all(n.input[1].endswith("_qkv_weight") for n in fused)  # q, k, v packed again
    ops = Counter(n.op_type for n in nodes)
    assert ops["Softmax"] == ops["Split"] == ops["Squeeze"] == 0  # no q, k, v taken apart
    # dynamo took q, k, v apart with 3 Slices a block; torchscript's one Slice is the grid's
    assert ops["Slice"] == plain["Slice"] - 3 * depth * (exporter == "dynamo")
    assert ops["MatMul"] == 3 * depth  # proj, fc1, fc2: qkv is inside Attention
    report = json.loads((out / B.PARITY_FILE).read_text())
    opt = [r for r in report["results"] if r["candidate"] == "onnxruntime[model.opt.onnx]"]
    assert [r["batch"] for r in opt] == [1, 3, 7]
    assert all(r["profile"] == "fp32" and r["max_abs"] <= 1e-4 for r in opt)
    assert report["passed"]


@pytest.mark.parametrize("fp16_io", [False, pytest.param(True, marks=pytest.mark.slow)],
                         ids=["fp32-io", "fp16-io"])
def test_the_optimized_graph_in_fp16_keeps_its_fused_ops_and_passes_fp16(tmp_path, fp16_io):
    """model.opt.fp16.onnx: the fused graph converted whole, with no Cast inside it (the
    fused ops keep their statistics in fp32 themselves), unlike model.fp16.onnx, which
    casts around every LayerNorm and Softmax."""
    out = make_bundle(tmp_path / "b", variants=["fp16", "optimized-fp16"], fp16_io=fp16_io,
                      validation=dict(batch_sizes=[1, 3], provider="cpu"))
    depth = create_model("vit_seed_tiny").config.depth
    graph = onnx.load(str(out / "model.opt.fp16.onnx")).graph
    ops = Counter(n.op_type for n in graph.node)
    assert ops["Attention"] == depth and ops["BiasGelu"] == depth
    assert ops["Cast"] == (0 if fp16_io else 2)  # the input's and the output's
    plain = Counter(n.op_type for n in onnx.load(str(out / "model.fp16.onnx")).graph.node)
    assert plain["Cast"] > 4 * depth  # LayerNorm and Softmax, in and out
    io = {v.type.tensor_type.elem_type for v in [*graph.input, *graph.output]}
    assert io == {onnx.TensorProto.FLOAT16 if fp16_io else onnx.TensorProto.FLOAT}
    assert all(t.data_type != onnx.TensorProto.FLOAT for t in graph.initializer
               if len(t.dims) == 2)  # every weight matrix is fp16
    report = json.loads((out / B.PARITY_FILE).read_text())
    rows = [r for r in report["results"]
            if r["candidate"] == "onnxruntime[model.opt.fp16.onnx]"]
    assert [r["batch"] for r in rows] == [1, 3] and report["passed"]
    assert all(r["profile"] == "fp16" and 0 < r["max_abs"] <= 5e-3 for r in rows)


@pytest.mark.parametrize("overrides", [
    pytest.param(dict(qkv_bias=False), marks=pytest.mark.slow),
    pytest.param(dict(mlp_ratio=3.0), marks=pytest.mark.slow),
    pytest.param(dict(dynamic_img_size=True), marks=pytest.mark.slow),
    pytest.param(dict(distilled=True), marks=pytest.mark.slow)],
    ids=["no-qkv-bias", "mlp-ratio-3", "dynamic-size", "distilled"])
def test_attention_is_fused_in_other_model_shapes(tmp_path, overrides):
    """No qkv bias: no Add to split (the fusion wants one); mlp_ratio 3: fc1's weight has the
    qkv weight's shape [D, 3D]; a dynamic size: the token count is symbolic; DeiT: two
    prefix tokens. Each still gets one fused node per block and matches eager."""
    torch.manual_seed(0)
    model = create_model("vit_seed_tiny", **overrides).eval()
    export_onnx(model, tmp_path / B.ONNX_FILE, "{}")
    name = make_variant("optimized", tmp_path / B.ONNX_FILE, tmp_path, model.config, "{}")
    assert fusion.fused_attention_count(onnx.load(str(tmp_path / name))) == model.config.depth
    runner = runtime.ort_runner(tmp_path / name, "cpu")
    size = (48, 40) if model.config.dynamic_img_size else None  # not the native 32x32
    for batch in (1, 3, 7):
        x = random_input(model.config, batch, size=size)
        with torch.no_grad():
            expected = model(x).numpy()
        assert np.abs(runner(x.numpy()) - expected).max() <= 1e-4


@pytest.fixture(scope="module")
def base_bundle(tmp_path_factory):
    """vit_base_patch16_224 with random weights, exported at batch 2 (about a minute)."""
    torch.manual_seed(0)
    model = create_model("vit_base_patch16_224").eval()
    description = B.Description(model.config, B.Preprocessing.default_for(model.config),
                                name="vit_base_patch16_224")
    out = tmp_path_factory.mktemp("base") / "vit_base"
    export_bundle(model, out, description, ExportOptions(precision="fp16"))
    return out


def _sample_photos(bundle_dir):
    """The two photos that ship inside scikit-learn, preprocessed for the bundle."""
    from PIL import Image
    from sklearn.datasets import load_sample_images

    from vit_export.preprocessing import preprocess
    prep = B.read_bundle(bundle_dir, verify=False).description.preprocessing
    return np.stack([preprocess(Image.fromarray(im), prep)
                     for im in load_sample_images().images])


@pytest.mark.slow  # ViT-B/16: half a minute to export on 2 cores
def test_vit_base_keeps_its_weights_once_for_onnx_and_eager(base_bundle):
    """86.6M fp32 parameters in weights.safetensors, which model.onnx reads as its external
    data: no model.onnx.data, and model.onnx is the graph."""
    assert not (base_bundle / B.ONNX_DATA_FILE).exists()
    assert B.external_data(base_bundle / B.ONNX_FILE) == [B.WEIGHTS_FILE]
    assert 340e6 < (base_bundle / B.WEIGHTS_FILE).stat().st_size < 360e6
    assert (base_bundle / B.ONNX_FILE).stat().st_size < 2e6
    onnx.checker.check_model(str(base_bundle / B.ONNX_FILE))


@pytest.mark.slow  # ViT-B/16: half a minute to export on 2 cores
def test_vit_base_parity_at_batch_1_3_7_fp32_and_fp16(base_bundle):
    photos = _sample_photos(base_bundle)
    report = parity.validate(base_bundle, parity.ValidateOptions(
        batch_sizes=[1, 3, 7], provider="cpu", real_inputs={"sklearn-photos": (photos, None)},
        trust_code=True))
    assert report.passed, report.failures
    fp16 = "onnxruntime[model.fp16.onnx]"
    assert {(r.candidate, r.batch, r.inputs) for r in report.results} == {
        (c, b, "random(seed=0)") for c in ("torchscript", "onnxruntime", fp16)
        for b in (1, 3, 7)} | {(c, 2, "sklearn-photos")
                               for c in ("torchscript", "onnxruntime", fp16)}
    fp32 = [r for r in report.results if r.profile == "fp32"]
    assert max(r.max_abs for r in fp32) <= 1e-4
    assert min(r.cosine for r in fp32) >= 0.99999
    half = [r for r in report.results if r.candidate == fp16]
    assert {r.profile for r in half} == {"fp16"}
    assert min(r.cosine for r in half) >= 0.999 and max(r.max_abs for r in half) > 1e-4


@pytest.mark.slow  # ViT-B/16: half a minute to export on 2 cores
def test_fp16_model_keeps_layernorm_and_softmax_in_fp32(base_bundle):
    proto = onnx.load(str(base_bundle / "model.fp16.onnx"))
    weights = [t for t in proto.graph.initializer if len(t.dims) == 2]
    assert weights and all(t.data_type == onnx.TensorProto.FLOAT16 for t in weights)
    assert proto.graph.input[0].type.tensor_type.elem_type == onnx.TensorProto.FLOAT
    assert 170e6 < (base_bundle / "model.fp16.onnx").stat().st_size < 180e6
    produced = {o: n for n in proto.graph.node for o in n.output}
    for node in proto.graph.node:
        if node.op_type in ("LayerNormalization", "Softmax"):
            source = produced.get(node.input[0])
            assert source is not None and source.op_type == "Cast", node.name


# ---------------------------------------------------------------- model.e2e.onnx


@pytest.mark.slow  # 5 s; the quick run proves model.e2e.onnx on real photos below
def test_e2e_on_the_digits_held_out(tmp_path):
    """The shipped digits model with preprocessing inside: uint8 8x8 digits in, the same
    decisions as Pillow + eager on all 360 held-out digits."""
    from click.testing import CliRunner

    from vit_export.cli import cli

    out = tmp_path / "digits"
    result = CliRunner().invoke(cli, [
        "export", str(out), "--from", "models/digits", "--embed-preprocessing",
        "--real-data", "models/digits/held_out.npz", "--provider", "cpu", "--quiet"])
    assert result.exit_code == 0, result.output
    report = json.loads((out / B.PARITY_FILE).read_text())
    rows = [r for r in report["results"] if r["candidate"] == "onnxruntime[model.e2e.onnx]"]
    held = next(r for r in rows if r["inputs"] == "held_out")
    assert held["batch"] == 360 and held["top1"] == 1.0 and held["passed"]
    assert held["max_abs"] <= 1e-4  # 8x8 in, 8x8 model: nothing resized, so fp32 parity
    assert held["accuracy"] == held["reference_accuracy"] > 0.95
    assert json.loads((out / B.CONFIG_FILE).read_text())["files"][B.E2E_FILE] == \
        B.sha256_file(out / B.E2E_FILE)
    proto = onnx.load(str(out / B.E2E_FILE))
    assert _dims(proto.graph.input[0]) == ["batch", "height", "width", 1]
    assert proto.graph.input[0].type.tensor_type.elem_type == onnx.TensorProto.UINT8


def _photo_files(folder):
    from PIL import Image
    from sklearn.datasets import load_sample_images

    folder.mkdir()
    china, flower = (Image.fromarray(a) for a in load_sample_images().images)
    china.save(folder / "china.jpg", quality=92)
    flower.crop((170, 0, 470, 427)).save(folder / "flower_portrait.png")
    china.resize((97, 61), Image.Resampling.LANCZOS).save(folder / "small.png")
    return folder


@pytest.mark.slow  # quick suite under 3 min on a Zen 3 (2 cores): CI runs it
def test_e2e_on_real_photos_through_validate_images(tmp_path):
    """A random tiny model at timm's preprocessing (resize 35, crop 32): validate --images
    runs model.e2e.onnx on the photos as files, against Pillow + eager."""
    from click.testing import CliRunner

    from vit_export.cli import cli

    out = tmp_path / "b"
    result = CliRunner().invoke(cli, [
        "export", str(out), "--preset", "vit_seed_tiny", "--timm-name",
        "vit_base_patch16_224.augreg_in21k_ft_in1k", "--embed-preprocessing",
        "--provider", "cpu", "--quiet"])
    assert result.exit_code == 0, result.output
    result = CliRunner().invoke(cli, ["validate", str(out), "--images",
                                      str(_photo_files(tmp_path / "photos")), "--provider", "cpu",
                                      "--report", str(tmp_path / "r.json")])
    assert result.exit_code == 0, result.output
    rows = [r for r in json.loads((tmp_path / "r.json").read_text())["results"]
            if r["candidate"] == "onnxruntime[model.e2e.onnx]" and r["inputs"] == "images"]
    assert len(rows) == 1 and rows[0]["batch"] == 3 and rows[0]["top1"] == 1.0
    assert rows[0]["reference"] == "pillow+eager" and rows[0]["max_abs"] <= 0.1


def test_e2e_refuses_what_the_graph_cannot_do(tmp_path):
    from vit_export.preprocessing import apply_preprocessing_overrides

    model = create_model("vit_seed_tiny")
    prep = apply_preprocessing_overrides(B.Preprocessing.default_for(model.config),
                                         {"interpolation": "lanczos"})
    with pytest.raises(ExportError, match="ONNX Resize has no lanczos filter"):
        export_bundle(model, tmp_path / "b", B.Description(model.config, prep),
                      ExportOptions(embed_preprocessing=True))
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow  # an export of its own, 5-7 s: the quick suite keeps under 3 minutes
def test_e2e_runner_takes_uint8_channels_last_only(tmp_path):
    from vit_export.errors import InputError
    from vit_export.runtime import ort_runner

    out = make_bundle(tmp_path / "b", embed_preprocessing=True)
    runner = ort_runner(out / B.E2E_FILE, "cpu")
    assert runner(np.zeros((2, 50, 40, 3), np.uint8)).shape == (2, 10)
    with pytest.raises(InputError, match=r"expected uint8 images \[batch, height, width, 3\]"):
        runner(np.zeros((1, 3, 50, 40), np.uint8))
    with pytest.raises(InputError, match="takes uint8 images, got float32"):
        runner(np.zeros((1, 50, 40, 3), np.float32))


@pytest.mark.slow
def test_e2e_vit_base_on_photos(tmp_path):
    """ViT-B/16, random weights, timm's bicubic preprocessing: model.e2e.onnx against Pillow
    + eager on the photos and the seeded pictures (minutes on 2 cores: --run-slow)."""
    from vit_export.images import load_pixels
    from vit_export.preprocessing import timm_preprocessing

    torch.manual_seed(0)
    model = create_model("vit_base_patch16_224").eval()
    prep = timm_preprocessing("vit_base_patch16_224.augreg_in21k_ft_in1k")
    photos = sorted(_photo_files(tmp_path / "photos").iterdir())
    raw = {"photos": ([load_pixels(p, prep) for p in photos], None)}
    report = export_bundle(model, tmp_path / "b", B.Description(model.config, prep),
                           ExportOptions(embed_preprocessing=True, validation=dict(
                               provider="cpu", batch_sizes=[1], raw_images=raw)))
    rows = [r for r in report.results if r.profile == "e2e"]
    assert report.passed and {r.inputs for r in rows} == {"pictures(seed=0)", "photos"}
    assert all(r.top1 == 1.0 and r.max_abs <= 0.1 for r in rows), rows


def test_torch_onnx_log_lines_go_to_our_debug_log_not_stderr(capfd, caplog):
    """torch.onnx logs through a stderr handler of its own (on a machine without torchvision,
    four 'Skipping torchvision::...' lines per export): inside an export step they become our
    debug records, and torch's handler is back afterwards."""
    import logging

    from vit_export.onnxio import captured

    torch_onnx = logging.getLogger("torch.onnx._internal.exporter._registration")
    handlers = logging.getLogger("torch.onnx").handlers[:]
    with caplog.at_level(logging.DEBUG, logger="vit_export"), captured("ONNX export"):
        torch_onnx.warning("torchvision is not installed. Skipping %s", "torchvision::nms")
    assert "Skipping" not in capfd.readouterr().err
    assert [r.getMessage() for r in caplog.records if r.name == "vit_export.onnxio"] == [
        ("ONNX export: torch.onnx._internal.exporter._registration: torchvision is not "
        "installed. Skipping torchvision::nms")]
    assert logging.getLogger("torch.onnx").handlers == handlers


def test_a_warning_to_the_root_logger_leaves_a_caller_without_handlers_as_it_was():
    """ONNX Runtime's quantizer warns with logging.warning, which gives a root logger that
    has no handlers a stderr handler for good: a Python caller that set up no logging saw
    its lines, and the handler stayed. Inside an export step neither happens. (pytest gives
    the root handlers of its own, so this runs where nothing has.)"""
    import subprocess
    import sys

    program = ("import logging\n"
               "from vit_export.onnxio import captured\n"
               "with captured('int8 quantization'):\n"
               "    logging.warning('Please consider to run pre-processing')\n"
               "print(logging.getLogger().handlers)\n")
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True,
                          check=True)
    assert (done.stdout, done.stderr) == ("[]\n", "")
