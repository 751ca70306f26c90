"""The framework road: a model vit-export does not rebuild (BEiT, Swin, Hiera, ...) is
exported as its framework builds it, with a dynamic batch, and judged against that
framework's own forward, the model the user holds: model.onnx run by ONNX Runtime here is
compared with the peer module built in the test, not with anything of ours. A bundle's
`module` record names nothing outside the allow-lists, and what the road cannot honour is
refused in one line."""
import json

import numpy as np
import onnxruntime as ort
import pytest
import torch
from conftest import one_line, run
from families import perturb, save_hf, shrink

transformers = pytest.importorskip("transformers")
timm = pytest.importorskip("timm")


def onnx_against(peer, bundle, side, output=lambda out: out, batches=(1, 3, 5)) -> float:
    """The largest error of the bundle's model.onnx against the peer's own forward, scaled
    by the peer's largest value, over several batch sizes."""
    session = ort.InferenceSession(str(bundle / "model.onnx"), providers=["CPUExecutionProvider"])
    worst = 0.0
    for batch in batches:
        x = torch.randn(batch, 3, side, side, generator=torch.Generator().manual_seed(batch))
        with torch.no_grad():
            expected = output(peer(x)).numpy()
        got = session.run(None, {"pixel_values": x.numpy()})[0]
        assert got.shape == expected.shape
        worst = max(worst, float(np.abs(got - expected).max() / np.abs(expected).max()))
    return worst


def tiny_beit(num_classes=5):
    return perturb(timm.create_model("beit_base_patch16_224", pretrained=False, embed_dim=32,
                                     depth=2, num_heads=2, img_size=32,
                                     num_classes=num_classes))


BEIT_SIZES = ["--set", "embed_dim=32", "--set", "depth=2", "--set", "num_heads=2",
              "--set", "img_size=32"]


def test_timm_beit_exports_as_timm_builds_it_with_a_dynamic_batch(tmp_path):
    """timm's BEiT: dynamo cannot export its relative position bias under a symbolic batch,
    the TorchScript exporter can, and the record says so; the ONNX model is timm's forward
    at every batch, and validate --source rebuilds it from the checkpoint."""
    peer = tiny_beit()
    path = tmp_path / "beit.pth"
    torch.save(peer.state_dict(), path)
    out = tmp_path / "b"
    code, text, err = run("export", out, "--checkpoint", path, "--timm-name",
                          "beit_base_patch16_224", *BEIT_SIZES)
    assert code == 0, err
    assert "exported as timm builds it (beit_base_patch16_224)" in text
    config = json.loads((out / "config.json").read_text())
    assert config["module"] == {"framework": "timm", "name": "beit_base_patch16_224",
                                "kwargs": {"embed_dim": 32, "depth": 2, "num_heads": 2,
                                           "img_size": 32, "num_classes": 5}}
    assert config["export"]["exporter"] == "torchscript"
    assert config["export"]["fallback"]["dynamo_failed"]
    assert config["extra"]["import"]["road"] == "framework"
    assert onnx_against(peer, out, 32) < 1e-5
    code, text, err = run("validate", out, "--source", path)
    assert code == 0 and "source: timm" in text and "passed" in text, text + err
    code, text, _ = run("info", out)
    assert "model: timm's own beit_base_patch16_224, img 32" in text, text


@pytest.mark.parametrize("name, values, output", [
    ("SwinForImageClassification", dict(image_size=32, patch_size=4, embed_dim=16,
                                        depths=[1, 1], num_heads=[1, 2], window_size=4,
                                        num_labels=3), lambda out: out.logits),
    ("HieraModel", dict(image_size=[64, 64], embed_dim=16, depths=[1, 1, 1, 1],
                        num_heads=[1, 1, 1, 1], patch_stride=[4, 4],
                        masked_unit_size=[8, 8]), lambda out: out.pooler_output),
    ("BeitForImageClassification", dict(image_size=32, patch_size=16, hidden_size=32,
                                        num_hidden_layers=2, num_attention_heads=2,
                                        intermediate_size=64, num_labels=3,
                                        use_relative_position_bias=True),
     lambda out: out.logits),
])
def test_transformers_models_not_rebuilt_export_as_transformers_builds_them(
        tmp_path, name, values, output):
    config_class = getattr(transformers, name.replace("ForImageClassification", "Config")
                           .replace("Model", "Config"))
    torch.manual_seed(0)
    peer = perturb(getattr(transformers, name)(config_class(**values)))
    folder = save_hf(peer, tmp_path / "src")
    out = tmp_path / "b"
    code, _, err = run("export", out, "--checkpoint", folder)
    assert code == 0, err
    record = json.loads((out / "config.json").read_text())["module"]
    assert (record["framework"], record["class"]) == ("transformers", name)
    side = values["image_size"][0] if isinstance(values["image_size"], list) \
        else values["image_size"]
    with torch.no_grad():
        assert onnx_against(lambda x: peer(pixel_values=x), out, side, output) < 1e-5
    source = json.loads((out / "parity.json").read_text())["source"]
    assert source["status"] == "passed", source


def test_road_framework_exports_a_rebuilt_family_as_transformers_builds_it(tmp_path):
    """--road framework takes transformers' own ViTModel where the rebuild would serve;
    --road native refuses what it does not rebuild (test_source_record.py)."""
    torch.manual_seed(0)
    peer = perturb(transformers.ViTModel(transformers.ViTConfig(
        hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
        image_size=28, patch_size=14)))
    folder = save_hf(peer, tmp_path / "vit")
    out = tmp_path / "b"
    code, _, err = run("export", out, "--checkpoint", folder, "--road", "framework")
    assert code == 0, err
    assert json.loads((out / "config.json").read_text())["module"]["class"] == "ViTModel"
    assert onnx_against(lambda x: peer(pixel_values=x).pooler_output, out, 28) < 1e-5


@pytest.fixture(scope="module")
def beit_bundle(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("road")
    path = tmp / "beit.pth"
    torch.save(tiny_beit().state_dict(), path)
    code, _, err = run("export", tmp / "b", "--checkpoint", path, "--timm-name",
                       "beit_base_patch16_224", *BEIT_SIZES)
    assert code == 0, err
    return tmp / "b"


def _copy_with_module(bundle, tmp_path, module):
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(bundle, copy)
    config = json.loads((copy / "config.json").read_text())
    config["module"] = module
    (copy / "config.json").write_text(json.dumps(config))
    return copy


@pytest.mark.parametrize("module, said", [
    ({"framework": "timm", "name": "beit_base_patch16_224",
      "kwargs": {"act_layer": "gelu"}}, "kwargs 'act_layer' is not one a bundle may set"),
    ({"framework": "timm", "name": "beit_base_patch16_224",
      "kwargs": {"img_size": "../x"}}, "is not a number, switch, word or list of numbers"),
    ({"framework": "timm", "name": "os.system", "kwargs": {}}, "is not a timm model name"),
    ({"framework": "transformers", "class": "BeitModel",
      "config": {"model_type": "beit", "auto_map": {"AutoModel": "x.Y"}}},
     "config.auto_map would name code"),
    ({"framework": "transformers", "class": "BeitModel",
      "config": {"model_type": "custom"}}, "config's model_type must be one of"),
    ({"framework": "transformers", "class": "DPTModel",
      "config": {"model_type": "dpt", "backbone_config": {"use_pretrained_backbone": True}}},
     "config.backbone_config.use_pretrained_backbone would name code"),
    ({"framework": "transformers", "class": "AutoTokenizer",
      "config": {"model_type": "beit"}}, "is not an image model or classifier class name"),
    ({"framework": "torchvision", "builder": "resnet18", "kwargs": {}},
     "builder 'resnet18' is not one of swin_t"),
    ({"framework": "torchvision", "builder": "swin_t", "kwargs": {"norm_layer": "x"}},
     "kwargs of torchvision are num_classes and image_size"),
    ({"framework": "torchvision", "builder": "swin_t", "kwargs": {"num_classes": 1 << 40}},
     "kwargs of torchvision are num_classes and image_size"),
    ({"framework": "torch.hub", "name": "x"}, "framework 'torch.hub' is not timm,"),
])
def test_a_module_record_that_names_code_is_refused_before_anything_is_built(
        beit_bundle, tmp_path, module, said):
    copy = _copy_with_module(beit_bundle, tmp_path, module)
    for command in (("info", copy), ("validate", copy)):
        code, _, err = run(*command)
        assert code == 1 and said in one_line(err), err


def test_a_timm_name_outside_the_vision_transformers_is_refused_when_built(beit_bundle,
                                                                          tmp_path):
    copy = _copy_with_module(beit_bundle, tmp_path, {"framework": "timm", "name": "resnet18",
                                                     "kwargs": {"num_classes": 5}})
    code, _, err = run("validate", copy)
    assert code == 1 and "timm.models.resnet, not a vision transformer's module" in \
        one_line(err), err


def test_without_the_framework_eager_is_skipped_in_one_line_and_the_rest_still_runs(
        beit_bundle):
    """On a machine without timm a timm-road bundle still validates (its graphs, checked
    and compared with model.onnx, which export proved against timm's forward) and infers;
    eager is one note, and asking for it by name is one error line."""
    import subprocess
    import sys

    def without_timm(*args):
        code = ("import sys; sys.modules['timm'] = None; from vit_export.cli import main; "
                "main()")
        done = subprocess.run([sys.executable, "-c", code, *map(str, args)],
                              check=False, capture_output=True, text=True, timeout=600)
        return done.returncode, done.stdout, done.stderr

    code, text, err = without_timm("validate", beit_bundle, "--batch-sizes", "1,3",
                                   "--trust-code")
    assert code == 0, text + err
    assert ("note: eager not run: this bundle's eager model is timm's own "
            "beit_base_patch16_224, and timm is not installed (pip install timm)") in text
    assert "torchscript (vs onnxruntime) fp32        3" in text and "\nPASS" in text, text
    assert "no baked batch in shape constants: ok" in text
    from pathlib import Path

    samples = Path(__file__).resolve().parents[1] / "models" / "digits" / "samples"
    code, text, err = without_timm("infer", beit_bundle, samples, "--top-k", "1")
    assert code == 0 and "8 input(s) on onnxruntime" in text, text + err
    code, _, err = without_timm("infer", beit_bundle, samples, "--runtime", "eager")
    assert code == 1 and "timm is not installed" in one_line(err), err


@pytest.mark.parametrize("kind", ["naflexvit", "swin"])
def test_a_framework_model_that_runs_at_any_size_exports_with_a_dynamic_size(tmp_path, kind):
    """timm's NaFlexViT and transformers' Swin run at other sizes: --dynamic-size exports
    them with a symbolic height and width, and the ONNX model is the framework's own forward
    at sizes the export never saw (tall, wide, a grid of one)."""
    if kind == "naflexvit":
        peer = perturb(timm.create_model("naflexvit_base_patch16_gap", pretrained=False,
                                         embed_dim=32, depth=2, num_heads=2, num_classes=5))
        path = tmp_path / "naflex.pth"
        torch.save(peer.state_dict(), path)
        named = ["--timm-name", "naflexvit_base_patch16_gap", "--set", "embed_dim=32",
                 "--set", "depth=2", "--set", "num_heads=2"]
        # five aspect ratios (1:1, 1:10, 5:1, 1:4, 3:5), a grid of one among them
        forward, sizes = peer, [(384, 384), (16, 160), (240, 48), (64, 256), (96, 160),
                                (16, 16)]
    else:
        torch.manual_seed(0)
        config = transformers.SwinConfig(image_size=64, patch_size=4, embed_dim=16,
                                         depths=[1, 1], num_heads=[1, 2], window_size=4,
                                         num_labels=5)
        peer = perturb(transformers.SwinForImageClassification._from_config(
            config, attn_implementation="eager")).eval()
        path = save_hf(peer, tmp_path / "swin")
        named = []

        def forward(x):
            return peer(pixel_values=x, interpolate_pos_encoding=True).logits
        sizes = [(64, 64), (32, 72), (100, 36)]
    out = tmp_path / "b"
    code, text, err = run("export", out, "--checkpoint", path, *named, "--dynamic-size")
    assert code == 0, err
    assert "symbolic height and width on pixel_values: ok" in text and "source:" in text
    assert json.loads((out / "config.json").read_text())["model"]["dynamic_img_size"]
    session = ort.InferenceSession(str(out / "model.onnx"), providers=["CPUExecutionProvider"])
    for h, w in sizes:
        x = torch.randn(2, 3, h, w, generator=torch.Generator().manual_seed(h * w))
        with torch.no_grad():
            expected = forward(x).numpy()
        got = session.run(None, {"pixel_values": x.numpy()})[0]
        assert np.abs(got - expected).max() / np.abs(expected).max() < 1e-5, (h, w)


def test_a_framework_model_of_one_size_refuses_a_dynamic_size_in_one_line(tmp_path):
    path = tmp_path / "cait.pth"
    torch.save(perturb(timm.create_model("cait_xxs24_224", pretrained=False, depth=2,
                                         num_classes=5, img_size=64)).state_dict(), path)
    code, _, err = run("export", tmp_path / "b", "--checkpoint", path, "--timm-name",
                       "cait_xxs24_224", "--set", "depth=2", "--set", "img_size=64",
                       "--dynamic-size")
    assert code != 0 and one_line(err).startswith(
        "Error: --dynamic-size: timm's cait_xxs24_224 runs at its own size only (64x64; at "
        "96x32: AssertionError"), err
    assert not (tmp_path / "b").exists()


def test_what_the_framework_road_cannot_honour_is_refused_in_one_line(beit_bundle, tmp_path):
    path = tmp_path / "beit.pth"
    torch.save(tiny_beit().state_dict(), path)
    code, _, err = run("export", tmp_path / "b", "--checkpoint", path, "--timm-name",
                       "beit_base_patch16_224", *BEIT_SIZES, "--dynamic-size")
    assert code != 0 and "--dynamic-size" in one_line(err), err
    assert not (tmp_path / "b").exists()
    code, _, err = run("validate", beit_bundle, "--layers")
    assert code != 0 and "--layers" in one_line(err), err
    code, _, err = run("export", tmp_path / "c", "--preset", "vit_seed_tiny", "--road",
                       "framework")
    assert code != 0 and "--road" in one_line(err), err


@pytest.mark.slow  # BEiT-B/16 at its pretrained size: 86M weights, a minute or more
def test_beit_base_at_its_pretrained_size_matches_timm(tmp_path):
    peer = perturb(timm.create_model("beit_base_patch16_224", pretrained=False))
    shrink(peer)  # order-1 weights overflow twelve blocks
    path = tmp_path / "beit.safetensors"
    from safetensors.torch import save_file

    save_file({k: v.contiguous() for k, v in peer.state_dict().items()}, path)
    out = tmp_path / "b"
    code, _, err = run("export", out, "--checkpoint", path, "--timm-name",
                       "beit_base_patch16_224.in22k_ft_in22k_in1k", "--batch-sizes", "1,3")
    assert code == 0, err
    assert onnx_against(peer, out, 224, batches=(1, 2)) < 1e-4


def _hf_beit_bundle(tmp_path, **values):
    torch.manual_seed(0)
    config = transformers.BeitConfig(image_size=32, patch_size=16, hidden_size=32,
                                     num_hidden_layers=2, num_attention_heads=2,
                                     intermediate_size=64, num_labels=3,
                                     use_relative_position_bias=True, **values)
    peer = perturb(transformers.BeitForImageClassification(config))
    folder = save_hf(peer, tmp_path / "src")
    out = tmp_path / "b"
    code, _, err = run("export", out, "--checkpoint", folder)
    assert code == 0, err
    return peer, folder, out


def test_the_source_is_built_from_the_checkpoints_config_not_from_the_bundles_record(
        tmp_path):
    """A bundle made from an edited checkpoint (another LayerNorm epsilon) whose import
    record claims the untouched one: validate --source builds transformers' model from
    the named checkpoint's own config.json, so the rows fail (they passed, built from the
    bundle's record)."""
    import hashlib

    torch.manual_seed(0)
    peer = perturb(transformers.ViTModel(transformers.ViTConfig(
        hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
        image_size=28, patch_size=14)))
    honest = save_hf(peer, tmp_path / "honest")
    edited = save_hf(peer, tmp_path / "edited")
    config = json.loads((edited / "config.json").read_text())
    (edited / "config.json").write_text(json.dumps({**config, "layer_norm_eps": 0.5}))
    out = tmp_path / "b"
    code, _, err = run("export", out, "--checkpoint", edited, "--road", "framework")
    assert code == 0, err
    described = json.loads((out / "config.json").read_text())
    described["extra"]["import"]["files"]["config.json"] = hashlib.sha256(
        (honest / "config.json").read_bytes()).hexdigest()
    (out / "config.json").write_text(json.dumps(described))
    code, text, _ = run("validate", out, "--source", honest)
    assert code == 1 and "source: transformers" in text and "failed" in text, text


def test_a_config_dtype_does_not_round_the_checkpoints_weights(tmp_path):
    """A config.json saying bfloat16 over fp32 weights: transformers' from_pretrained would
    round them to bf16 (dtype "auto"); the bundle keeps them as they are."""
    peer, _, out = _hf_beit_bundle(tmp_path, dtype="bfloat16")
    with torch.no_grad():
        assert onnx_against(lambda x: peer.float()(pixel_values=x), out, 32,
                            lambda o: o.logits) < 1e-5


@pytest.mark.parametrize("edit, said", [
    ({"hidden_act": "os.system"}, ("transformers cannot build BeitForImageClassification as "
                                  "recorded: KeyError")),
    ({"num_labels": 7}, "weights do not fit BeitForImageClassification: 2 wrong shape"),
    ({"num_hidden_layers": 48, "hidden_size": 4096, "intermediate_size": 16384},
     "weights do not fit BeitForImageClassification"),
])
def test_a_hand_edited_transformers_record_is_one_line_before_any_weight_is_made(
        tmp_path, edit, said):
    """What transformers cannot build, or a record whose sizes the weights do not hold (a
    ViT-g's from a tiny file), is one line: the sizes are checked on the meta device, so no
    model of the record's size is built first."""
    _, _, out = _hf_beit_bundle(tmp_path)
    config = json.loads((out / "config.json").read_text())
    if "num_labels" in edit:
        config["module"]["config"]["id2label"] = {str(i): f"c{i}" for i in range(7)}
        config["module"]["config"]["label2id"] = {f"c{i}": i for i in range(7)}
    config["module"]["config"].update(edit)
    (out / "config.json").write_text(json.dumps(config))
    code, _, err = run("validate", out)
    assert code == 1 and said in one_line(err), err


def test_a_pretrained_model_base_class_is_not_an_image_class(tmp_path):
    _, _, out = _hf_beit_bundle(tmp_path)
    config = json.loads((out / "config.json").read_text())
    config["module"]["class"] = "BeitPreTrainedModel"
    (out / "config.json").write_text(json.dumps(config))
    code, _, err = run("validate", out)
    assert code == 1 and "has no image class BeitPreTrainedModel" in one_line(err), err


def _save(module, path):
    from safetensors.torch import save_file

    save_file({k: v.contiguous() for k, v in module.state_dict().items()}, path)
    return path


@pytest.mark.slow  # torchvision's Swin-T and Swin-V2-T at their own sizes: 28M weights each
@pytest.mark.parametrize("builder, weights, side", [
    ("swin_t", "Swin_T_Weights.IMAGENET1K_V1", 224),
    ("swin_v2_t", "Swin_V2_T_Weights.IMAGENET1K_V1", 256),
])
def test_torchvision_swin_exports_as_torchvision_builds_it(tmp_path, builder, weights, side):
    """torchvision's Swin (a window mask reshaped from constants, an integer relative
    position index among its weights): exported as its builder builds it, with a dynamic
    batch, the size its weights name, and validate --source rebuilding it."""
    torchvision = pytest.importorskip("torchvision")
    torch.manual_seed(0)
    peer = perturb(torchvision.models.get_model_builder(builder)(weights=None, num_classes=7))
    shrink(peer)  # order-1 weights overflow twelve blocks
    path = _save(peer, tmp_path / f"{builder}.safetensors")
    out = tmp_path / "b"
    code, text, err = run("export", out, "--checkpoint", path, "--torchvision-weights",
                          weights, "--batch-sizes", "1,3")
    assert code == 0, err
    assert f"exported as torchvision builds it ({builder})" in text
    config = json.loads((out / "config.json").read_text())
    assert config["module"] == {"framework": "torchvision", "builder": builder,
                                "kwargs": {"num_classes": 7}}
    assert config["model"]["img_size"] == side
    assert onnx_against(peer, out, side, batches=(1, 2)) < 1e-4
    code, text, err = run("validate", out, "--source", path, "--batch-sizes", "1")
    assert code == 0 and "source: torchvision" in text and "passed" in text, text + err
    code, text, _ = run("info", out)
    assert f"model: torchvision's own {builder}, img {side}" in text, text


@pytest.mark.slow  # transformers' Swin-T at its own size (swin-tiny-patch4-window7-224)
def test_transformers_swin_at_its_pretrained_size_matches_transformers(tmp_path):
    torch.manual_seed(0)
    peer = perturb(transformers.SwinForImageClassification(
        transformers.SwinConfig(num_labels=5)).eval())
    shrink(peer)  # order-1 weights overflow twelve blocks
    folder = tmp_path / "swin"
    save_hf(peer, folder)
    out = tmp_path / "b"
    code, text, err = run("export", out, "--checkpoint", folder, "--batch-sizes", "1,3")
    assert code == 0, err
    assert "exported as transformers builds it (SwinForImageClassification)" in text
    assert onnx_against(lambda x: peer(pixel_values=x).logits, out, 224,
                        batches=(1, 2)) < 1e-4
