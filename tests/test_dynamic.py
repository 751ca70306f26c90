"""Any image size (`export --dynamic-size`): our model against timm's dynamic_img_size, the
exported graphs against eager at several sizes, the static scan, and sizes that cannot be."""
import json

import numpy as np
import onnx
import pytest
import torch
from click.testing import CliRunner

from vit_export import bundle as B
from vit_export import parity, runtime
from vit_export.cli import cli
from vit_export.errors import InputError
from vit_export.exporting import export_bundle
from vit_export.model import create_model, size_values

# A ViT-B/16 geometry (224 pixels, patch 16, so the sizes are the ones people use) with a
# seed-sized width and depth, so a test exports in seconds.
SMALL = dict(img_size=224, patch_size=16, embed_dim=64, depth=2, num_heads=4, num_classes=10)
SIZES = [(224, 224), (160, 160), (288, 288), (224, 160)]


def _dims(value):
    return [d.dim_param or d.dim_value for d in value.type.tensor_type.shape.dim]


@pytest.fixture(scope="module")
def dynamic_bundle(tmp_path_factory):
    torch.manual_seed(0)
    model = create_model("vit_base_patch16_224", **SMALL, dynamic_img_size=True).eval()
    description = B.Description(model.config, B.Preprocessing.default_for(model.config))
    out = tmp_path_factory.mktemp("dynamic") / "b"
    export_bundle(model, out, description)
    return out


@pytest.mark.parametrize("size", SIZES)
def test_matches_timm_dynamic_img_size(size):
    timm = pytest.importorskip("timm")
    theirs = timm.models.vision_transformer.VisionTransformer(
        **SMALL, dynamic_img_size=True).eval()
    ours = create_model("vit_base_patch16_224", **SMALL, dynamic_img_size=True).eval()
    ours.load_state_dict(theirs.state_dict())  # timm's names: nothing to map
    torch.nn.init.normal_(ours.pos_embed, std=0.5)  # a position embedding that matters
    theirs.pos_embed.data.copy_(ours.pos_embed.data)
    x = torch.randn(2, 3, *size, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        error = (ours(x) - theirs(x)).abs().max().item()
        tokens = (ours.forward_features(x) - theirs.forward_features(x)).abs().max().item()
    assert error <= 1e-4 and tokens <= 1e-4, (size, error, tokens)


def test_bundle_is_dynamic_in_every_file(dynamic_bundle):
    config = json.loads((dynamic_bundle / B.CONFIG_FILE).read_text())
    assert config["model"]["dynamic_img_size"] is True
    assert config["io"]["height_axis"] == "height" and config["io"]["width_axis"] == "width"
    # grid 17 x 18: 15 x 16 would hold 16, the head width, so a baked 16 would be ambiguous
    assert config["export"]["export_size"] == [272, 288]
    proto = onnx.load(str(dynamic_bundle / B.ONNX_FILE))
    assert _dims(proto.graph.input[0]) == ["batch", 3, "height", "width"]
    assert _dims(proto.graph.output[0]) == ["batch", 10]
    resize = [n for n in proto.graph.node if n.op_type == "Resize"]
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in resize[0].attribute}
    assert len(resize) == 1 and attrs["antialias"] == 1 and attrs["mode"] == b"cubic"
    assert attrs["cubic_coeff_a"] == -0.5  # torch's antialiased bicubic is Pillow's kernel
    assert B.read_bundle(dynamic_bundle).io_shapes == ((3, "height", "width"), {"logits": (10,)})


def test_parity_at_every_size(dynamic_bundle):
    report = parity.validate(dynamic_bundle,
                             parity.ValidateOptions(batch_sizes=[1, 3], provider="cpu",
                                                    trust_code=True))
    assert report.passed, report.failures
    assert report.image_sizes == [list(s) for s in SIZES]
    seen = {(r.candidate, r.inputs) for r in report.results}
    for h, w in SIZES[1:]:
        assert ("onnxruntime", f"random(seed=0) {h}x{w}") in seen
        assert ("torchscript", f"random(seed=0) {h}x{w}") in seen
    assert max(r.max_abs for r in report.results) <= 1e-4
    names = {c.name: c for c in report.checks}
    assert names["model.onnx: symbolic height and width on pixel_values"].passed
    assert names["model.onnx: no baked image size in shape constants"].passed


def test_runners_take_other_sizes_and_match_eager(dynamic_bundle):
    found = B.read_bundle(dynamic_bundle)
    runners = runtime.open_runners(found, "cpu")
    for h, w in [(64, 304), (16, 16)]:  # sizes validate did not try, one of one patch
        x = np.random.default_rng(0).standard_normal((1, 3, h, w)).astype(np.float32)
        eager = runners.reference(x)
        for runner in runners.candidates:
            assert np.abs(runner(x) - eager).max() <= 1e-4, (runner.name, h, w)


@pytest.mark.parametrize("size", [(225, 224), (224, 200)])
def test_size_not_a_multiple_of_the_patch_is_one_line(dynamic_bundle, size):
    found = B.read_bundle(dynamic_bundle)
    x = np.zeros((1, 3, *size), np.float32)
    for runner in runtime.open_runners(found, "cpu").runners:
        with pytest.raises(InputError, match=f"a {size[0]}x{size[1]} input: height and width "
                                             f"must be multiples of the patch size 16"):
            runner(x)


def test_fixed_size_model_refuses_another_size(tiny_bundle):
    runner = runtime.ort_runner(tiny_bundle / B.ONNX_FILE, "cpu")
    with pytest.raises(InputError, match=r"a 24x24 input: this model takes 32x32 only"):
        runner(np.zeros((1, 3, 24, 24), np.float32))


def test_scan_finds_a_baked_size(dynamic_bundle, tmp_path):
    """A planted bug: a Reshape whose shape is a constant holding the example's token count."""
    proto = onnx.load(str(dynamic_bundle / B.ONNX_FILE))
    reshape = next(n for n in proto.graph.node if n.op_type == "Reshape")
    proto.graph.initializer.append(onnx.numpy_helper.from_array(
        np.array([-1, 17 * 18 + 1, 64], np.int64), "baked_shape"))
    reshape.input[1] = "baked_shape"
    onnx.save(proto, str(tmp_path / "model.onnx"))
    config = B.read_bundle(dynamic_bundle).config
    checks = {c.name: c for c in parity.scan_graph(tmp_path / "model.onnx", 2, config,
                                                   [272, 288])}
    baked = checks["model.onnx: no baked image size in shape constants"]
    assert not baked.passed and "[-1, 307, 64] (tokens)" in baked.detail
    assert size_values(config, 17, 18)[307] == "tokens"


def test_cli_dynamic_size_needs_the_dynamo_exporter(tmp_path):
    result = CliRunner().invoke(cli, ["export", str(tmp_path / "b"), "--preset", "vit_seed_tiny",
                                      "--dynamic-size", "--exporter", "torchscript"])
    assert result.exit_code == 2
    assert result.output.strip().splitlines() == [
        ("Error: --dynamic-size needs --exporter dynamo: the torchscript exporter cannot export "
        "the antialiased bicubic resize it needs")]
    assert not (tmp_path / "b").exists()
    # the same model asked for with --set is the same usage error (it was exit 1)
    result = CliRunner().invoke(cli, ["export", str(tmp_path / "b"), "--preset", "vit_seed_tiny",
                                      "--set", "dynamic_img_size=true", "--exporter",
                                      "torchscript"])
    assert result.exit_code == 2
    assert result.output.strip().splitlines() == [
        ("Error: a dynamic-size model needs --exporter dynamo: the torchscript exporter "
         "cannot export the antialiased bicubic resize it needs")]
    assert not (tmp_path / "b").exists()


@pytest.mark.slow  # 8 s; the quick run exports a dynamic size in test_families and here
def test_cli_export_and_validate_dynamic_size(tmp_path):
    out = tmp_path / "b"
    result = CliRunner().invoke(cli, ["export", str(out), "--preset", "vit_seed_tiny",
                                      "--dynamic-size", "--provider", "cpu", "--quiet"])
    assert result.exit_code == 0, result.output
    assert "random(seed=0) 24x24" in result.output and "random(seed=0) 32x24" in result.output
    result = CliRunner().invoke(cli, ["info", str(out)])
    assert "model: img 32 (any multiple of the patch), patch 8" in result.output
