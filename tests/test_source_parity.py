"""Parity with the model the user brought: every family against its own framework's forward
(transformers, timm, torchvision), at its native size, at an export size other than the
native one, and, where the family accepts other sizes, at two more (one not square); every
weight perturbed. Then the source rows that export and validate show, and what they say
when the source cannot run.

The reference in the matrix is the framework's own model built here, in the test, never our
code: transformers' forward (interpolate_pos_encoding where a size differs from its
image_size), timm's model built at the export size with timm's own checkpoint_filter_fn.
"""
import json
import shutil

import numpy as np
import onnxruntime as ort
import pytest
import torch
from conftest import one_line, run
from families import (
    EMBED,
    HF_FAMILIES,
    TIMM_FAMILIES,
    perturb,
    save_hf,
    size_of,
    source_matrix,
    timm_checkpoint,
    tiny_hf,
    tiny_timm,
)

from vit_export.checkpoints import load_checkpoint

transformers = pytest.importorskip("transformers")
timm = pytest.importorskip("timm")

TOLERANCE = 1e-4  # the fp32 profile's, scaled by the output's largest value


def scaled_error(expected: np.ndarray, got: np.ndarray) -> float:
    scale = float(np.abs(expected).max())
    assert scale > 1e-2  # the reference says something to compare
    return float(np.abs(expected - got).max()) / scale


def batch(size, n: int = 2, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed * 1009 + size[0] * 31 + size[1])
    return torch.randn(n, 3, *size, generator=g)


# In the quick run, the families whose tables resample differently (transformers' plain and
# antialiased bicubic, with and without the prefix; timm's, registers, rotary with a table);
# all of them in CI.
QUICK_MATRIX = ("Dinov2Model", "Dinov2WithRegistersModel", "CLIPVisionModel",
                "SiglipVisionModel", "vit_small_patch14_reg4_dinov2",
                "vit_small_patch16_rope_ape_224", "vit_pe_core_tiny_patch16_384")


@pytest.mark.parametrize("framework, name", [
    (f, n) if n in QUICK_MATRIX else pytest.param(f, n, marks=pytest.mark.slow)
    for f, names in (("transformers", [*HF_FAMILIES, "Siglip2VisionModel"]),
                     ("timm", TIMM_FAMILIES)) for n in names])
def test_every_family_matches_its_framework_at_every_size(framework, name, tmp_path):
    """timm families trained at 3x3 patches and exported at 4x4, transformers ones with a
    table for 4x4 exported at 3x3; then the export size, the native one, 2x2 and 5x3: each
    the framework's own forward (transformers' with interpolate_pos_encoding where a size
    is not its image_size; DINOv2 resamples in every forward; timm's model built at the
    export size through its checkpoint_filter_fn)."""
    errors = source_matrix(framework, name, tmp_path)
    assert len(errors) == 4 and any(h != w for h, w in errors)
    assert max(errors.values()) <= TOLERANCE, errors


def test_a_torchvision_vit_at_another_size_is_resampled_as_torchvision_does(tmp_path):
    """torchvision resamples the table once as it loads (interpolate_embeddings: bicubic,
    align_corners); its forward takes its image_size only, so a dynamic size is refused."""
    pytest.importorskip("torchvision")
    from torchvision.models.vision_transformer import VisionTransformer, interpolate_embeddings

    torch.manual_seed(0)
    peer = perturb(VisionTransformer(64, 16, 1, 4, 64, 128, num_classes=7))
    path = tmp_path / "vit.pth"
    torch.save(peer.state_dict(), path)
    model, description = load_checkpoint(path, overrides={"img_size": "96", "num_heads": "4"})
    reference = VisionTransformer(96, 16, 1, 4, 64, 128, num_classes=7).eval()
    reference.load_state_dict(interpolate_embeddings(96, 16, peer.state_dict()))
    x = batch((96, 96))
    with torch.no_grad():
        assert scaled_error(reference(x).numpy(), model(x).numpy()) <= TOLERANCE
    assert any("align_corners" in n for n in description.extra["import"]["notes"])
    code, _, err = run("export", tmp_path / "b", "--checkpoint", path, "--set",
                       "num_heads=4", "--dynamic-size")
    assert code == 1 and "torchvision's VisionTransformer runs at its image_size only" in \
        one_line(err), err
    assert not (tmp_path / "b").exists()


def dinov2_folder(tmp_path):
    """A Dinov2Model as facebook/dinov2 ships it, small: its table for an 8x8 grid (112 px),
    its processor cropping 56 px (a 4x4 grid)."""
    peer = tiny_hf("Dinov2Model", grid=8)
    processor = transformers.BitImageProcessor(size={"shortest_edge": 64},
                                               crop_size={"height": 56, "width": 56})
    return peer, save_hf(peer, tmp_path / "dinov2", processor)


def test_a_dinov2_dynamic_size_bundle_is_transformers_at_every_size(tmp_path):
    """export --dynamic-size of a DINOv2 folder whose table is not at the crop: model.onnx
    is transformers' own forward at the crop and at sizes other than the crop, non-square
    too (resampling the crop's table again was 1e-2 off, with every row saying ok), and the
    report holds its source rows: transformers against eager and model.onnx."""
    peer, folder = dinov2_folder(tmp_path)
    out = tmp_path / "bundle"
    code, text, err = run("export", out, "--checkpoint", folder, "--dynamic-size",
                          "--outputs", "embedding,tokens")
    assert code == 0, err
    session = ort.InferenceSession(str(out / "model.onnx"), providers=["CPUExecutionProvider"])
    for size in [(56, 56), (42, 42), (56, 42), (112, 112)]:
        x = batch(size)
        embedding, tokens = session.run(None, {"pixel_values": x.numpy()})
        with torch.no_grad():
            answer = peer(pixel_values=x)
        assert scaled_error(answer.pooler_output.numpy(), embedding) <= TOLERANCE, size
        assert scaled_error(answer.last_hidden_state[:, 1:].numpy(), tokens) <= TOLERANCE, size
    parity = json.loads((out / "parity.json").read_text())
    source = parity["source"]
    assert (source["framework"], source["model"], source["status"]) == \
        ("transformers", "Dinov2Model", "passed")
    assert set(source["files"]) == {"config.json", "preprocessor_config.json",
                                    "model.safetensors"}
    assert [56, 56] in source["sizes"] and [112, 112] in source["sizes"]
    assert any(h != w for h, w in source["sizes"])
    rows = [r for r in parity["results"] if r["reference"] == "transformers"]
    assert {r["candidate"] for r in rows} == {"eager", "onnxruntime"}
    assert {r["output"] for r in rows} == {"embedding", "tokens"}
    assert {r["batch"] for r in rows if " " not in r["inputs"]} == {1, 3}
    assert all(r["passed"] for r in rows)
    assert "eager (vs transformers)" in text and "source: transformers" in text


def test_validate_compares_the_source_only_where_it_is_named(tmp_path):
    """validate repeats the source rows on the checkpoint named with --source, each file
    checked against the import record's sha256; without it, one line says the source was
    not compared and how to ask (a bundle's record names no place to look). A named file
    that differs, or is gone, is an error: never a pass, never a silent skip."""
    _, folder = dinov2_folder(tmp_path)
    out = tmp_path / "bundle"
    assert run("export", out, "--checkpoint", folder)[0] == 0
    code, text, err = run("validate", out, "--junit", tmp_path / "j.xml")
    assert code == 0, err
    assert "source: not compared, skipped: the checkpoint it was imported from (config.json, " \
        "preprocessor_config.json, model.safetensors) was not named (validate --source PATH)" \
        in text
    assert "vs transformers" not in text and "<skipped" in (tmp_path / "j.xml").read_text()
    code, text, err = run("validate", out, "--source", folder)
    assert code == 0 and "source: transformers" in text and ": passed" in text, err
    weights = folder / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-1] + b" ")
    code, _, err = run("validate", out, "--source", folder)
    assert code == 1 and one_line(err) == (
        f"Error: {weights} is not the file the bundle was imported from (its sha256 differs "
        f"from the import record's)")
    shutil.rmtree(folder)
    code, _, err = run("validate", out, "--source", folder)
    assert code == 1 and one_line(err) == f"Error: {folder} does not exist"


@pytest.mark.slow  # an export and its validation, 10 s
def test_a_source_that_disagrees_fails_the_export_and_nothing_is_written(tmp_path,
                                                                         monkeypatch):
    """Where our import differs from the source framework, the source rows fail and the
    bundle is not written, as for any parity failure: here the import's resampling is made
    to antialias where transformers' DINOv2 does not."""
    from vit_export.checkpoints import hf

    _, folder = dinov2_folder(tmp_path)
    original = hf.hf_architecture

    def antialiased(doc):
        model_type, values = original(doc)
        return model_type, {**values, "pos_embed_antialias": True}

    monkeypatch.setattr(hf, "hf_architecture", antialiased)
    code, text, err = run("export", tmp_path / "b", "--checkpoint", folder, "--dynamic-size")
    assert code == 1, err
    assert "(vs transformers)" in text + err and "FAIL" in text + err
    assert not (tmp_path / "b").exists()


@pytest.mark.slow  # an export and its validation, 6 s
def test_a_timm_checkpoint_exports_with_timm_source_rows(tmp_path):
    path, sets = timm_checkpoint(tmp_path, "vit_small_patch14_dinov2")
    out = tmp_path / "bundle"
    code, text, err = run("export", out, "--checkpoint", path, "--timm-name",
                          "vit_small_patch14_dinov2", *sets)
    assert code == 0, err
    source = json.loads((out / "parity.json").read_text())["source"]
    assert (source["framework"], source["model"], source["status"]) == \
        ("timm", "vit_small_patch14_dinov2", "passed")
    assert "logits" in text and "onnxruntime (vs timm)" in text


@pytest.mark.slow  # ViT-S/14 at its pretrained size: about a minute
def test_dinov2_small_as_it_ships_matches_transformers_at_every_size(tmp_path):
    """facebook/dinov2-small's architecture (its table for 518 px, its processor cropping
    224), every weight perturbed, exported with --dynamic-size: model.onnx is transformers'
    own forward at 224, 518, 154 and 224x168 (the table resampled again from the crop's
    was 3.6e-2 off at 154 px), and the source rows say so."""
    config = transformers.Dinov2Config(hidden_size=384, num_hidden_layers=12,
                                       num_attention_heads=6, image_size=518, patch_size=14)
    torch.manual_seed(0)
    peer = perturb(transformers.Dinov2Model(config), seed=1)
    with torch.no_grad():  # LayerScale near 0.5, not timm's 1e-5 nor our perturbation's 1
        for layer in peer.encoder.layer:
            layer.layer_scale1.lambda1.mul_(0.5)
            layer.layer_scale2.lambda1.mul_(0.5)
    processor = transformers.BitImageProcessor(size={"shortest_edge": 256},
                                               crop_size={"height": 224, "width": 224})
    folder = save_hf(peer, tmp_path / "dinov2-small", processor)
    out = tmp_path / "bundle"
    code, _text, err = run("export", out, "--checkpoint", folder, "--dynamic-size",
                          "--outputs", "embedding,tokens")
    assert code == 0, err
    session = ort.InferenceSession(str(out / "model.onnx"), providers=["CPUExecutionProvider"])
    for size in [(224, 224), (518, 518), (154, 154), (224, 168)]:
        x = batch(size, 1)
        embedding, tokens = session.run(None, {"pixel_values": x.numpy()})
        with torch.no_grad():
            answer = peer(pixel_values=x)
        assert scaled_error(answer.pooler_output.numpy(), embedding) <= TOLERANCE, size
        assert scaled_error(answer.last_hidden_state[:, 1:].numpy(), tokens) <= TOLERANCE, size
    assert json.loads((out / "parity.json").read_text())["source"]["status"] == "passed"


def _export_source(tmp_path, folder, *flags):
    out = tmp_path / "bundle"
    code, text, err = run("export", out, "--checkpoint", folder, *flags)
    assert code == 0, err
    return json.loads((out / "parity.json").read_text())["source"], text


def test_a_vit_saved_without_its_pooler_is_compared_on_its_class_token(tmp_path):
    """DINO's ViTs are saved without the pooler (add_pooling_layer=False): transformers
    fills one with random weights, and pooler_output is noise. The source compares the
    class token after the final norm, what the bundle gives."""
    config = transformers.ViTConfig(hidden_size=EMBED, num_hidden_layers=2,
                                    num_attention_heads=4, intermediate_size=192,
                                    image_size=42, patch_size=14)
    torch.manual_seed(0)
    peer = perturb(transformers.ViTModel(config, add_pooling_layer=False))
    source, _ = _export_source(tmp_path, save_hf(peer, tmp_path / "dino"))
    assert (source["model"], source["status"]) == ("ViTModel", "passed"), source


def test_mae_saved_with_its_training_mask_ratio_is_compared_unmasked(tmp_path):
    """facebook/vit-mae-* keep mask_ratio 0.75: the source masked three patches in four at
    random (1.4e-1 off, another answer each run); it is built at mask_ratio 0."""
    peer = tiny_hf("ViTMAEModel", mask_ratio=0.75)
    source, _ = _export_source(tmp_path, save_hf(peer, tmp_path / "mae"))
    assert (source["model"], source["status"]) == ("ViTMAEModel", "passed"), source


def test_deit_with_its_teacher_is_compared_on_its_logits(tmp_path):
    """Its heads are cls_classifier and distillation_classifier, no `classifier`: it was
    recorded as skipped."""
    peer = tiny_hf("DeiTForImageClassificationWithTeacher")
    source, text = _export_source(tmp_path, save_hf(peer, tmp_path / "deit"))
    assert (source["status"], "eager (vs transformers)" in text) == ("passed", True), source


@pytest.mark.slow  # several seconds: the whole suite runs it
def test_a_source_is_built_from_the_recorded_weights_and_no_others(tmp_path):
    """A folder imported from pytorch_model.bin (read through the safe load only), then given
    a model.safetensors nobody checked: transformers would read the new file (4.55 off). The
    source is built from the pickle's tensors the record names, as the import was, and
    passes."""
    peer = tiny_hf("Dinov2Model")
    folder = save_hf(peer, tmp_path / "dinov2")
    (folder / "model.safetensors").unlink()  # weights as a pickle, as older repos hold them
    torch.save(peer.state_dict(), folder / "pytorch_model.bin")
    out = tmp_path / "bundle"
    assert run("export", out, "--checkpoint", folder)[0] == 0
    perturb(peer, seed=5).save_pretrained(tmp_path / "other")
    shutil.copy(tmp_path / "other" / "model.safetensors", folder)
    code, text, err = run("validate", out, "--source", folder)
    assert code == 0, err
    source = json.loads((out / "parity.json").read_text())["source"]
    assert set(source["files"]) == {"config.json", "pytorch_model.bin"}
    assert "source: transformers" in text and "pytorch_model.bin" in text and ": passed" in text


@pytest.mark.slow  # several seconds: the whole suite runs it
def test_a_relative_source_path_is_read_from_where_validate_runs(tmp_path, monkeypatch):
    peer = tiny_hf("Dinov2Model")
    save_hf(peer, tmp_path / "dinov2")
    monkeypatch.chdir(tmp_path)
    assert run("export", "bundle", "--checkpoint", "dinov2")[0] == 0
    assert json.loads((tmp_path / "bundle" / "config.json").read_text())["extra"]["import"][
        "checkpoint"] == "dinov2"  # a name, never a path of this machine
    code, text, err = run("validate", "bundle", "--source", "dinov2")
    assert code == 0 and "source: transformers" in text and ": passed" in text, text + err


def test_the_torchscript_exporter_is_refused_where_the_table_is_resampled_antialiased(
        tmp_path):
    """DINOv2 with registers resamples its shipped table antialiased in forward, which the
    TorchScript-based exporter cannot export: one line, not its traceback."""
    peer = tiny_hf("Dinov2WithRegistersModel", grid=4)
    code, _, err = run("export", tmp_path / "b", "--checkpoint",
                       save_hf(peer, tmp_path / "reg"), "--set", "img_size=42",
                       "--exporter", "torchscript")
    assert code == 1 and one_line(err) == (
        "Error: this model resamples its 4x4 position table to the 3x3 grid in forward, "
        "antialiased, as its source does; the torchscript exporter cannot export that "
        "resize: use the dynamo exporter")
    assert not (tmp_path / "b").exists()


@pytest.mark.slow  # an export and its validation
def test_a_timm_projection_head_is_compared_on_its_projection(tmp_path):
    """--set projection_head=true makes the head the embedding: the source compared timm's
    pre-logits features instead (a shape mismatch)."""
    peer = tiny_timm("vit_small_patch14_dinov2", num_classes=32)
    path = tmp_path / "weights.pth"
    torch.save(peer.state_dict(), path)
    sets = [a for k, v in {**size_of(peer), "projection_head": "true"}.items()
            for a in ("--set", f"{k}={v}")]
    source, _ = _export_source(tmp_path, path, "--timm-name", "vit_small_patch14_dinov2",
                               *sets)
    assert (source["framework"], source["status"]) == ("timm", "passed"), source
