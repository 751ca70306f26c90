"""Import real peers' checkpoints (random weights: no hub here) and compare with the peer."""
import re
import shutil

import numpy as np
import pytest
import torch
from click.testing import CliRunner
from safetensors.torch import load_file, save_file

from vit_export import bundle as B
from vit_export import parity, runtime
from vit_export.checkpoints import (
    convert,
    detect_format,
    hf_architecture,
    load_checkpoint,
    read_state_dict,
)
from vit_export.cli import cli
from vit_export.cli.app import command_flags
from vit_export.errors import CheckpointError, ConfigError
from vit_export.exporting import ExportOptions, export_bundle
from vit_export.model import preset_config
from vit_export.preprocessing import (
    apply_preprocessing_overrides,
    hf_preprocessing,
    resolve_preprocessing,
    timm_preprocessing,
    torchvision_preprocessing,
)

timm = pytest.importorskip("timm")
torchvision = pytest.importorskip("torchvision")
transformers = pytest.importorskip("transformers")

EXPORT_FLAGS = command_flags(cli.commands["export"])


def _timm(name, **kwargs):
    torch.manual_seed(0)
    return timm.create_model(name, pretrained=False, **kwargs).eval()


def _hf_config(**kwargs):
    values = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                  intermediate_size=256, image_size=32, patch_size=8, num_labels=5)
    return transformers.ViTConfig(**{**values, **kwargs})


def save_timm_wrapped(model, path):
    """How training scripts save: {"model": ...} around a DataParallel state dict."""
    torch.save({"model": {f"module.{k}": v for k, v in model.state_dict().items()},
                "epoch": torch.tensor(3)}, path / "checkpoint.pth")
    return path / "checkpoint.pth"


def save_timm_safetensors(model, path):
    save_file({k: v.contiguous() for k, v in model.state_dict().items()},
              str(path / "model.safetensors"))
    return path / "model.safetensors"


def save_torch(model, path):
    torch.save(model.state_dict(), path / "weights.pth")
    return path / "weights.pth"


def save_hf(model, path):
    model.save_pretrained(path / "hf")
    return path / "hf"


def _peer(kind):
    """A peer model with every weight perturbed: torchvision starts its head at zero (all
    logits 0, so a parity check on it is blind) and timm's LayerScale at 1e-5."""
    model, save, forward = _unperturbed_peer(kind)
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(0.02 * torch.randn(parameter.shape, generator=generator))
    return model, save, forward


def _unperturbed_peer(kind):
    torch.manual_seed(0)
    if kind == "timm_tiny":  # two of its twelve blocks: the weights say the depth
        return _timm("vit_tiny_patch16_224", depth=2), save_timm_wrapped, lambda m, x: m(x)
    if kind == "timm_base":
        return _timm("vit_base_patch16_224"), save_torch, lambda m, x: m(x)
    if kind == "timm_base_1block":  # ViT-B/16's width, heads and grid; one block: seconds
        return _timm("vit_base_patch16_224", depth=1), save_torch, lambda m, x: m(x)
    if kind == "deit_distilled":
        return (_timm("deit_tiny_distilled_patch16_224", depth=2), save_timm_safetensors,
                lambda m, x: m(x))
    if kind == "hf":
        model = transformers.ViTForImageClassification(_hf_config()).eval()
        return model, save_hf, lambda m, x: m(pixel_values=x).logits
    if kind == "torchvision":
        return torchvision.models.vit_b_16().eval(), save_torch, lambda m, x: m(x)
    if kind == "torchvision_1block":
        return _torchvision_vit(patch_size=16), save_torch, lambda m, x: m(x)
    raise ValueError(kind)


def _torchvision_vit(patch_size: int):
    """torchvision's ViT-B (vit_b_16 / vit_b_32) with one encoder layer: the same names,
    widths and heads as the weights enums describe, exported in seconds."""
    torch.manual_seed(0)
    return torchvision.models.VisionTransformer(
        image_size=224, patch_size=patch_size, num_layers=1, num_heads=12, hidden_dim=768,
        mlp_dim=3072).eval()


# ViT-B/16 itself (timm_base, torchvision) takes half a minute each on 2 cores: slow; the
# quick run takes the same code paths with one block (torchvision) or at timm's tiny size
# (timm_base_1block only adds ViT-B's width to timm_tiny's path: slow too).
PEERS = ["timm_tiny", pytest.param("timm_base_1block", marks=pytest.mark.slow),
         pytest.param("deit_distilled", marks=pytest.mark.slow),
         pytest.param("hf", marks=pytest.mark.slow),
         pytest.param("torchvision_1block", marks=pytest.mark.slow),
         pytest.param("timm_base", marks=pytest.mark.slow),
         pytest.param("torchvision", marks=pytest.mark.slow)]
# Where each peer's num_heads comes from: weights never show it (Hugging Face's config.json
# does). Every route a user has is taken once.
ARCHITECTURE = {
    "timm_tiny": dict(timm_name="vit_tiny_patch16_224.augreg_in21k_ft_in1k",
                      overrides={"num_heads": "3"}),  # 2 of 12 blocks: the name's depth is not

    "timm_base": dict(overrides={"num_heads": "12"}),
    "timm_base_1block": dict(overrides={"num_heads": "12"}),
    "deit_distilled": dict(timm_name="deit_tiny_distilled_patch16_224",
                           overrides={"num_heads": "3"}),
    "hf": {},
    "torchvision": dict(torchvision_weights="ViT_B_16_Weights.IMAGENET1K_V1"),
    "torchvision_1block": dict(torchvision_weights="ViT_B_16_Weights.IMAGENET1K_V1",
                               overrides={"num_heads": "12"}),  # 1 of 12 blocks
}


@pytest.mark.parametrize("kind", PEERS)
def test_peer_parity_eager_torchscript_onnxruntime(kind, tmp_path):
    peer, save, forward = _peer(kind)
    ckpt = save(peer, tmp_path)
    model, description = load_checkpoint(ckpt, **ARCHITECTURE[kind])
    out = tmp_path / "bundle"
    assert export_bundle(model, out, description,
                         ExportOptions(validation=dict(provider="cpu"))).passed
    ts = runtime.load_torchscript(out / B.TS_FILE)
    ort = runtime.ort_runner(out / B.ONNX_FILE, "cpu")
    c = model.config
    for batch in (1, 5):
        g = torch.Generator().manual_seed(batch)
        x = torch.randn(batch, c.in_chans, c.img_size, c.img_size, generator=g)
        with torch.no_grad():
            expected = forward(peer, x).numpy()
            ours = model(x).numpy()
        assert np.abs(expected).max() > 1e-2  # the peer says something to compare
        assert np.abs(ours - expected).max() <= 1e-5
        assert np.abs(ts(x.numpy()) - expected).max() <= 1e-4
        assert np.abs(ort(x.numpy()) - expected).max() <= 1e-4


def test_hf_labels_eps_and_transformers_4_names(tmp_path):
    config = _hf_config(id2label={i: f"kind_{i}" for i in range(5)},
                        label2id={f"kind_{i}": i for i in range(5)})
    torch.manual_seed(0)
    peer = transformers.ViTForImageClassification(config).eval()
    model, description = load_checkpoint(save_hf(peer, tmp_path))
    assert description.labels == [f"kind_{i}" for i in range(5)]
    assert model.config.norm_eps == 1e-12 and model.config.num_heads == 4
    # transformers 4.x saved other names for the same tensors; both map to ours
    old = {}
    for k, v in peer.state_dict().items():
        k = k.replace("vit.layers.", "vit.encoder.layer.")
        for new, legacy in (("attention.q_proj", "attention.attention.query"),
                            ("attention.k_proj", "attention.attention.key"),
                            ("attention.v_proj", "attention.attention.value"),
                            ("attention.o_proj", "attention.output.dense"),
                            ("mlp.fc1", "intermediate.dense"), ("mlp.fc2", "output.dense")):
            k = k.replace(new, legacy)
        old[k] = v
    converted = convert(old, "hf")
    for key, value in model.state_dict().items():
        torch.testing.assert_close(converted[key], value, rtol=0, atol=0)


def test_hf_vit_model_pooler_becomes_pre_logits(tmp_path):
    torch.manual_seed(0)
    peer = transformers.ViTModel(_hf_config()).eval()
    model, _ = load_checkpoint(save_hf(peer, tmp_path))
    assert model.config.num_classes == 0 and model.config.representation_size == 64
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(model(x), peer(pixel_values=x).pooler_output,
                                   atol=1e-5, rtol=0)


def test_detect_format():
    assert detect_format(_timm("vit_tiny_patch16_224").state_dict()) == "timm"
    assert detect_format(torchvision.models.vit_b_32().state_dict()) == "torchvision"
    with pytest.raises(CheckpointError, match="cannot tell the checkpoint format"):
        detect_format({"conv1.weight": 0, "fc.bias": 0})


@pytest.mark.slow  # a ViT-Ti export at 256: 6 s; test_families resamples at import quickly
def test_position_embedding_resampled_for_a_new_image_size(tmp_path):
    peer = _timm("vit_tiny_patch16_224", depth=2)  # the resample path; depth is the weights
    model, description = load_checkpoint(save_torch(peer, tmp_path),
                                         overrides={"img_size": "256", "num_heads": "3"})
    assert model.pos_embed.shape == (1, 1 + 16 * 16, 192)
    notes = description.extra["import"]["notes"]
    assert any("resampled (bicubic, antialiased, as timm) from a 14x14 to a 16x16" in n
               for n in notes)
    torch.testing.assert_close(model.pos_embed[:, 0], peer.pos_embed[:, 0])
    out = tmp_path / "b"
    export_bundle(model, out, description)
    assert parity.validate(out, parity.ValidateOptions(batch_sizes=[1, 3], provider="cpu")).passed


def _cli(*args):
    result = CliRunner().invoke(cli, [str(a) for a in args])
    return result.exit_code, result.stdout, result.stderr


@pytest.mark.slow  # quick suite under 3 min on a Zen 3 (2 cores): CI runs it
def test_cli_export_from_checkpoint_with_format(tmp_path):
    ckpt = save_torch(_torchvision_vit(patch_size=32), tmp_path)  # vit_b_32, one layer
    code, out, err = _cli("export", tmp_path / "b", "--checkpoint", ckpt, "--format",
                          "torchvision", "--batch-sizes", "1,3")
    assert code == 1 and out == "" and len(err.splitlines()) == 1
    assert err.startswith(f"Error: num_heads unknown: the weights of {ckpt} do not show it; "
                          f"pass --set num_heads=12 (the usual value for width 768)")
    assert not (tmp_path / "b").exists()
    code, out, err = _cli("export", tmp_path / "b", "--checkpoint", ckpt, "--format",
                          "torchvision", "--batch-sizes", "1,3", "--set", "num_heads=12")
    assert code == 0, err
    assert "PASS" in out
    d = B.read_bundle(tmp_path / "b").description
    assert d.preprocessing.mean == (0.485, 0.456, 0.406) and d.config.patch_size == 32


def test_format_that_contradicts_the_keys_is_refused(tmp_path):
    ckpt = save_torch(_timm("vit_tiny_patch16_224"), tmp_path)
    code, out, err = _cli("export", tmp_path / "b", "--checkpoint", ckpt, "--format", "hf",
                          "--set", "num_heads=3")
    assert code == 1 and out == ""
    assert err == "Error: --format hf, but the checkpoint's keys are timm's; pass --format " \
                  "timm or leave it out\n"
    assert not (tmp_path / "b").exists()


def test_hf_folder_without_config_json_needs_the_architecture_set(tmp_path):
    torch.manual_seed(0)
    peer = transformers.ViTForImageClassification(_hf_config()).eval()
    folder = save_hf(peer, tmp_path)
    (folder / "config.json").unlink()
    with pytest.raises(CheckpointError, match=r"^num_heads and norm_eps unknown: .* has no "
                       r"config.json; pass overrides=\{'num_heads': 1, 'norm_eps': 1e-12\} "
                       r".* name the model with preset, timm_name or torchvision_weights$") as e:
        load_checkpoint(folder)
    # the command line's user reads the flags to type, from the same error
    assert "pass --set num_heads=1 --set norm_eps=1e-12 " in e.value.cli_message(EXPORT_FLAGS)
    assert e.value.cli_message(EXPORT_FLAGS).endswith(
        "--preset, --timm-name or --torchvision-weights")
    model, _ = load_checkpoint(folder, overrides={"num_heads": "4", "norm_eps": "1e-12"})
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(model(x), peer(pixel_values=x).logits, atol=1e-5, rtol=0)


@pytest.mark.parametrize("doc, message", [
    ({"num_attention_heads": "4"}, "num_attention_heads must be a positive integer, got '4'"),
    ({"num_attention_heads": 2.5}, "num_attention_heads must be a positive integer, got 2.5"),
    ({"num_attention_heads": True}, "num_attention_heads must be a positive integer, got True"),
    ({"layer_norm_eps": float("nan")}, "layer_norm_eps must be a positive number, got nan"),
    ({"layer_norm_eps": -1e-6}, "layer_norm_eps must be a positive number"),
    ({"layer_norm_eps": 10 ** 400}, "layer_norm_eps must be a positive number, got 1000"),
    ({"qkv_bias": "yes"}, "qkv_bias must be a boolean, got 'yes'"),
    ({"num_register_tokens": -1}, "num_register_tokens must be an integer >= 0 or null, got -1"),
    ({"model_type": "dinov3_vit", "use_gated_mlp": 1}, "use_gated_mlp must be a boolean, got 1"),
    ({"model_type": "dinov3_vit", "rope_theta": 0}, "rope_theta must be a positive number, got 0"),
    ({"hidden_act": "relu"}, "hidden_act 'relu' is not supported"),
    ({"hidden_act": ["gelu"]}, "hidden_act ['gelu'] is not supported"),
    ({"model_type": "beit"}, "model_type 'beit' is not supported"),
    ({"model_type": "clip", "vision_config": None}, "a clip model without a vision_config"),
    ({"id2label": ["a", "b"]},
     "id2label must be an object mapping class ids to strings or null, got ['a', 'b']"),
    ([1, 2], "expected a JSON object"),
])
def test_hf_config_json_is_type_checked(doc, message):
    with pytest.raises(CheckpointError, match=r"^config\.json: .*" + re.escape(message)):
        hf_architecture(doc)


@pytest.mark.parametrize("doc, message", [
    ({"do_resize": 1}, "do_resize must be a boolean, got 1"),
    ({"rescale_factor": 0}, "rescale_factor must be a positive number, got 0"),
    ({"image_mean": [0.5, "x", 0.5]}, "image_mean must be a number or a list of 1 to 64 numbers"),
    ({"image_std": []}, "image_std must be a number or a list of 1 to 64 numbers, got []"),
    ({"resample": True}, "resample must be a Pillow resample code (0-5), got True"),
    ({"resample": 2.0}, "resample must be a Pillow resample code (0-5), got 2.0"),
    ({"size": {"height": 0, "width": 0}}, "size must be a side in [1, 8192] or an object of them"),
    ({"do_center_crop": True, "crop_size": "224"},
     "crop_size must be a side in [1, 8192] or an object of them, got '224'"),
    ({"image_processor_type": "Siglip2ImageProcessor", "max_num_patches": 0},
     "max_num_patches must be an integer in [1, 8192], got 0"),
    ([224], "expected a JSON object"),
])
def test_hf_preprocessor_config_json_is_type_checked(doc, message):
    with pytest.raises(CheckpointError,
                       match=r"^preprocessor_config\.json: " + re.escape(message)):
        hf_preprocessing(doc)
    if isinstance(doc, dict) and "crop_size" in doc:  # not read without the center crop
        assert hf_preprocessing({**doc, "do_center_crop": False}).crop_mode == "squash"


def test_missing_block_is_an_error_listing_keys(tmp_path):
    state = {k: v for k, v in _timm("vit_tiny_patch16_224").state_dict().items()
             if not k.startswith("blocks.5.")}
    torch.save(state, tmp_path / "cut.pth")
    code, _, err = _cli("export", tmp_path / "b", "--checkpoint", tmp_path / "cut.pth",
                        "--set", "num_heads=3")
    assert code == 1 and len(err.strip().splitlines()) == 1
    assert err.startswith("Error: checkpoint does not fit the model: 12 missing "
                          "(blocks.5.norm1.weight, blocks.5.norm1.bias, blocks.5.attn.qkv.weight"
                          ", ...), 0 unexpected, 0 wrong shape")
    assert not (tmp_path / "b").exists()


def test_wrong_head_size_is_an_error(tmp_path):
    ckpt = save_torch(_timm("vit_tiny_patch16_224", num_classes=10), tmp_path)
    code, _, err = _cli("export", tmp_path / "b", "--checkpoint", ckpt,
                        "--preset", "vit_tiny_patch16_224")
    assert code == 1
    assert "2 wrong shape (head.weight [10, 192] vs model [1000, 192], head.bias [10] vs " \
           "model [1000])" in err
    assert not (tmp_path / "b").exists()


def test_random_bin_file_is_an_error(tmp_path):
    junk = tmp_path / "pytorch_model.bin"
    junk.write_bytes(np.random.default_rng(0).bytes(4096))
    code, _, err = _cli("export", tmp_path / "b", "--checkpoint", junk)
    assert code == 1 and err.startswith(f"Error: cannot read checkpoint {junk}: ")
    assert len(err.strip().splitlines()) == 1 and not (tmp_path / "b").exists()


def test_read_state_dict_rejects_non_tensor_pickles(tmp_path):
    torch.save({"epoch": 3, "lr": 0.1}, tmp_path / "meta.pth")
    with pytest.raises(CheckpointError, match="holds no state dict of tensors"):
        read_state_dict(tmp_path / "meta.pth")
    with pytest.raises(CheckpointError, match="expected .pth"):
        (tmp_path / "x.onnx").write_bytes(b"")
        read_state_dict(tmp_path / "x.onnx")


# Preprocessing imported with the weights: named by the user, read from the checkpoint's
# folder, or guessed and said so. tests/test_preprocessing.py proves the pixels.

def test_hf_folder_brings_its_preprocessor_config(tmp_path):
    torch.manual_seed(0)
    peer = transformers.ViTForImageClassification(_hf_config()).eval()
    folder = save_hf(peer, tmp_path)
    transformers.ViTImageProcessorPil(
        size={"height": 36, "width": 36}, do_center_crop=True,
        crop_size={"height": 32, "width": 32}, resample=3,
        image_mean=[0.485, 0.456, 0.406], image_std=[0.229, 0.224, 0.225]).save_pretrained(folder)
    _, description = load_checkpoint(folder)
    prep = description.preprocessing
    assert (prep.img_size, prep.resize_size, prep.crop_mode) == (32, 36, "squash")
    assert (prep.interpolation, prep.crop_offset, prep.std) == ("bicubic", "floor",
                                                                (0.229, 0.224, 0.225))
    assert prep.source_of("resize_size") == "hf preprocessor_config.json"
    assert prep.source_of("alpha") == "hf ViTImageProcessor default"  # no do_convert_rgb
    assert not any("guessed" in n for n in description.extra["import"]["notes"])


def test_hf_legacy_feature_extractor_and_unsupported_sizes():
    legacy = {"feature_extractor_type": "ViTFeatureExtractor", "size": 384, "resample": 2,
              "do_normalize": True, "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5]}
    prep = hf_preprocessing(legacy)
    assert (prep.img_size, prep.resize_size, prep.crop_mode) == (384, 384, "squash")
    assert prep.rescale_factor == 1 / 255
    assert prep.source_of("rescale_factor") == "hf ViTImageProcessor default"
    with pytest.raises(CheckpointError, match="224x300 is not square"):
        hf_preprocessing({"size": {"height": 224, "width": 300}})
    with pytest.raises(CheckpointError, match="do_resize is false"):
        hf_preprocessing({"do_resize": False})


def test_timm_name_with_another_img_size_scales_the_resize(tmp_path):
    ckpt = save_torch(_timm("vit_tiny_patch16_224"), tmp_path)
    _, description = load_checkpoint(ckpt, timm_name="vit_tiny_patch16_224.augreg_in21k_ft_in1k",
                                      overrides={"img_size": "256"})
    prep = description.preprocessing
    assert (prep.img_size, prep.resize_size) == (256, 284)  # timm: floor(256 / 0.9)
    assert prep.source_of("img_size") == "model img_size"
    assert prep.source_of("mean") == "timm pretrained_cfg vit_tiny_patch16_224.augreg_in21k_ft_in1k"
    assert any("is for 224x224 inputs; the model takes 256" in n
               for n in description.extra["import"]["notes"])


def test_torchvision_weights_and_guesses_name_their_source():
    config = preset_config("vit_base_patch16_224")
    prep, notes = resolve_preprocessing(
        config, "torchvision", torchvision_weights="ViT_B_16_Weights.IMAGENET1K_SWAG_E2E_V1")
    assert (prep.img_size, prep.resize_size, prep.interpolation) == (224, 224, "bicubic")
    assert prep.source_of("mean") == "torchvision ViT_B_16_Weights.IMAGENET1K_SWAG_E2E_V1"
    assert "crops to 384; the model takes 224" in notes[0]
    prep, notes = resolve_preprocessing(config, "hf", overrides={"mean": "0.4", "std": "0.2"})
    assert (prep.crop_mode, prep.interpolation, prep.mean) == ("squash", "bilinear", (0.4,) * 3)
    assert prep.source_of("std") == "--set" and prep.source_of("resize_size") == "default (guessed)"
    assert notes == [("preprocessing guessed (img_size, resize_size, interpolation, crop_mode, "
                     "crop_offset, rescale_factor, alpha, resize_backend); name its source "
                     "with --timm-name or --torchvision-weights, or state it with --set "
                     "preprocessing.FIELD=VALUE")]
    prep, notes = resolve_preprocessing(config, preset="vit_base_patch16_224")
    assert prep.source_of("crop_mode").startswith("timm pretrained_cfg vit_base_patch16_224.")
    assert notes == []
    # a preset refining torchvision weights names their architecture, not their training
    prep, _ = resolve_preprocessing(config, "torchvision", preset="vit_base_patch16_224")
    assert prep.mean == (0.485, 0.456, 0.406) and prep.source_of("mean") == "default (guessed)"


def test_set_preprocessing_values():
    prep = timm_preprocessing("vit_base_patch16_224.augreg_in21k_ft_in1k")
    prep = apply_preprocessing_overrides(prep, {"crop_pct": "0.875", "rescale_factor": "1/255",
                                                "interpolation": "bilinear"})
    assert (prep.resize_size, prep.rescale_factor, prep.interpolation) == (256, 1 / 255,
                                                                           "bilinear")
    assert prep.source_of("resize_size") == "--set crop_pct=0.875"
    for overrides, message in (({"crop_pct": "wide"}, "'preprocessing.crop_pct': 'wide'}: not a valid value"),
                               ({"mean": "0.5,0.5"}, "mean has 2 channels but std 3"),
                               ({"img_size": "32"}, "follows the model"),
                               ({"crop": "1"}, "unknown preprocessing field 'crop'")):
        with pytest.raises(ConfigError, match=message):
            apply_preprocessing_overrides(prep, overrides)
    with pytest.raises(ConfigError, match="timm has no pretrained config 'vit_nope'"):
        timm_preprocessing("vit_nope")
    with pytest.raises(ConfigError, match="torchvision has no weights 'ViT_B_16_Weights.NOPE'"):
        torchvision_preprocessing("ViT_B_16_Weights.NOPE")


@pytest.mark.slow  # a CLI export; test_families exports a checkpoint through the CLI quickly
def test_cli_export_records_named_preprocessing(tmp_path):
    out = tmp_path / "b"
    code, stdout, err = _cli("export", out, "--preset", "vit_seed_tiny", "--timm-name",
                             "vit_small_patch16_224.augreg_in21k", "--set",
                             "preprocessing.interpolation=bilinear", "--batch-sizes", "1,3")
    assert code == 0, err
    prep = B.read_bundle(out).description.preprocessing
    assert prep.interpolation == "bilinear" and prep.source_of("interpolation") == "--set"
    assert prep.source_of("std") == "timm pretrained_cfg vit_small_patch16_224.augreg_in21k"
    code, stdout, _ = _cli("info", out)
    line = next(t for t in stdout.splitlines() if t.startswith("preprocessing from: "))
    assert line[len("preprocessing from: "):].split("; ") == [
        "model img_size (img_size)",
        ("timm pretrained_cfg vit_small_patch16_224.augreg_in21k, crop_pct 0.9 at img_size 32 "
        "(resize_size)"),
        "timm pretrained_cfg vit_small_patch16_224.augreg_in21k (mean, std, crop_mode)",
        "--set (interpolation)",
        "timm create_transform (crop_offset, rescale_factor, alpha, resize_backend)"]


@pytest.mark.parametrize("args,code,message", [
    (["--preset", "vit_seed_tiny", "--timm-name", "vit_nope"], 1,
     "Error: timm has no pretrained config 'vit_nope'"),
    (["--preset", "vit_seed_tiny", "--set", "preprocessing.crop=1"], 1,
     "Error: unknown preprocessing field 'crop'"),
    (["--from", "models/digits", "--timm-name", "vit_base_patch16_224"], 2,
     ("--set, --preset, --timm-name and --torchvision-weights apply to a checkpoint or a "
     "preset, not a bundle")),
])
def test_cli_preprocessing_errors(tmp_path, args, code, message):
    result, _, err = _cli("export", tmp_path / "b", *args)
    assert result == code and message in err and not (tmp_path / "b").exists()


@pytest.mark.parametrize("kind, stored", [
    ("float8", lambda t: t.to(torch.float8_e4m3fn)), ("complex", lambda t: t.to(torch.complex64)),
    ("int8", lambda t: (t * 100).to(torch.int8)), ("bool", lambda t: t > 0),
    ("sparse", lambda t: t.to_sparse()), ("meta", lambda t: t.to("meta")),
])
def test_weights_that_are_no_float_tensors_are_refused_not_taken_as_numbers(tmp_path, kind,
                                                                            stored):
    """float8, meta, sparse and quantized tensors were tracebacks; complex weights lost their
    imaginary part; bool and int8 were taken as numbers."""
    state = _timm("vit_tiny_patch16_224", depth=1).state_dict()
    state["head.weight"] = stored(state["head.weight"])
    torch.save(state, tmp_path / "w.pth")
    code, out, err = _cli("export", tmp_path / "b", "--checkpoint", tmp_path / "w.pth",
                          "--set", "num_heads=3")
    assert (code, out) == (1, "") and len(err.splitlines()) == 1
    assert err.startswith(f"Error: {tmp_path / 'w.pth'}: head.weight is ")
    assert not (tmp_path / "b").exists()


def test_a_bundle_folder_with_a_complex_weight_is_refused(tmp_path):
    """--from a bundle folder: weights.safetensors is read by the same check."""
    from conftest import DIGITS, rewrite_hash

    folder = tmp_path / "digits"
    shutil.copytree(DIGITS, folder)
    state = load_file(str(folder / B.WEIGHTS_FILE))
    state["head.weight"] = state["head.weight"].to(torch.complex64)
    save_file(state, str(folder / B.WEIGHTS_FILE))
    rewrite_hash(folder, B.WEIGHTS_FILE)
    code, out, err = _cli("export", tmp_path / "b", "--from", folder)
    assert (code, out) == (1, "")
    assert err == (f"Error: {folder / B.WEIGHTS_FILE}: head.weight is torch.complex64, not a "
                   f"float weight (float32, float16, bfloat16, float64)\n")


def test_a_name_whose_width_or_depth_the_weights_contradict_is_refused(tmp_path):
    """A 48-wide, 3-head checkpoint named as vit_small_patch16_224 (384 wide, 6 heads): the
    name's heads would be taken for weights of another width, and the export would compute
    another model than timm's with those weights. Refused naming both; heads stated, it is
    timm's model."""
    peer = _timm("vit_small_patch16_224", embed_dim=48, num_heads=3, depth=2, img_size=32)
    with torch.no_grad():
        for p in peer.parameters():
            p.add_(0.1 * torch.randn(p.shape))
    ckpt = save_torch(peer, tmp_path)
    code, _, err = _cli("export", tmp_path / "b", "--checkpoint", ckpt, "--timm-name",
                        "vit_small_patch16_224", "--quiet")
    assert code == 1 and not (tmp_path / "b").exists()
    assert err.strip().splitlines() == [
        (f"Error: {ckpt} does not fit the model it is named as (embed_dim 48 in the weights, "
        f"384 in vit_small_patch16_224; depth 2 in the weights, 12 in vit_small_patch16_224): "
        f"its heads and norms would be guessed from another model; name the right one, or "
        f"--set num_heads=N")]
    model, _ = load_checkpoint(ckpt, timm_name="vit_small_patch16_224",
                               overrides={"num_heads": "3"})
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        assert torch.allclose(model(x), peer(x), atol=1e-5)


@pytest.mark.parametrize("fields", [
    {"reg_tokens": 2, "init_values": 1e-5, "no_embed_class": True, "pre_norm": True},
    {"global_pool": "map", "mlp_layer": "swiglu_packed", "act_layer": "silu"},
    pytest.param({}, marks=pytest.mark.slow),
    pytest.param({"global_pool": "avg", "qk_norm": True, "class_token": False,
                  "fc_norm": False}, marks=pytest.mark.slow),
    pytest.param({"act_layer": "quick_gelu"}, marks=pytest.mark.slow),
])
def test_timm_peer_model_computes_what_ours_does(fields):
    """bench's timm peers: timm's own VisionTransformer built to our config and holding our
    weights, every weight perturbed (LayerScale starts at 1e-5, which would hide a wrong
    branch), gives our model's logits."""
    from vit_export.checkpoints import timm_model
    from vit_export.model import VisionTransformer, ViTConfig

    config = ViTConfig(img_size=16, patch_size=4, embed_dim=32, depth=2, num_heads=2,
                       num_classes=5, **fields)
    ours = VisionTransformer(config).eval()
    torch.manual_seed(0)
    with torch.no_grad():
        for p in ours.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    theirs = timm_model(config, ours.state_dict())
    assert type(theirs).__module__ == "timm.models.vision_transformer"
    x = torch.randn(3, 3, 16, 16)
    with torch.no_grad():
        torch.testing.assert_close(theirs(x), ours(x), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("fields, message", [
    ({"rope_type": "cat", "pos_embed": "none"}, "rope_type is 'cat'"),
    ({"output": "embedding"}, "it gives embedding, timm's gives logits"),
    ({"mlp_layer": "swiglu", "act_layer": "silu"}, "mlp_layer 'swiglu'"),
])
def test_timm_peer_model_refuses_what_timm_vit_does_not_build(fields, message):
    from vit_export.checkpoints import timm_model
    from vit_export.model import VisionTransformer, ViTConfig

    config = ViTConfig(img_size=16, patch_size=4, embed_dim=32, depth=2, num_heads=2,
                       num_classes=5, **fields)
    with pytest.raises(ConfigError) as info:
        timm_model(config, VisionTransformer(config).state_dict())
    assert str(info.value) == f"timm's VisionTransformer does not build this model: {message}"


def test_a_family_is_one_declaration_the_dispatcher_iterates_over(monkeypatch):
    """A new source family is a Family registered in formats.FAMILIES: detection and
    conversion find it there, with no branch of their own."""
    from vit_export.checkpoints import formats
    from vit_export.checkpoints.family import Family

    odd = Family("odd", [(r"^stem\.", "patch_embed.proj.")],
                 lambda keys: "stem.weight" in keys, fixed={"norm_eps": 1e-6})
    monkeypatch.setitem(formats.FAMILIES, "odd", odd)
    state = {"stem.weight": torch.zeros(8, 3, 4, 4)}
    assert detect_format(state) == "odd"
    assert list(convert(state, "odd")) == ["patch_embed.proj.weight"]


def test_a_format_the_keys_contradict_names_the_option_in_each_spelling():
    """The library's message names the keyword argument; the CLI's, from the same error, the
    flag (as `export --format` prints it)."""
    keys = ["patch_embed.proj.weight", "blocks.0.norm1.weight"]
    with pytest.raises(CheckpointError) as info:
        detect_format(keys, "hf")
    assert str(info.value) == ("fmt='hf', but the checkpoint's keys are timm's; pass "
                               "fmt='timm' or leave it out")
    assert info.value.cli_message(EXPORT_FLAGS) == ("--format hf, but the checkpoint's keys are timm's; "
                                        "pass --format timm or leave it out")


@pytest.mark.parametrize("name, said", [
    ("vit_small_r26_s32_224", "embeds its patches with a HybridEmbed"),
    ("beit_base_patch16_224", "is built by timm's Beit class"),
])
def test_a_timm_name_the_rebuild_does_not_cover_is_one_line_naming_what(name, said):
    """What the native rebuild does not build is a ConfigError naming it (the framework road
    then takes it), never an AttributeError from reading a module it lacks (a hybrid ViT's
    CNN stem has no norm)."""
    pytest.importorskip("timm")
    from vit_export.checkpoints.timm import timm_named

    with pytest.raises(ConfigError, match=f"^timm's '{name}' {said}"):
        timm_named(name)
