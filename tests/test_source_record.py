"""What an import refuses, and what its source record says it proved: asked to rebuild
(--road native), a model the rebuild does not cover is refused by the name its own files
give it, and an option the rebuild would not honour is refused by name before export; the
record lists the outputs compared and those not, at sizes that include the one the
checkpoint was trained at. (By default such models take the framework road:
test_framework_road.py.)"""
import json

import pytest
import torch
from conftest import one_line, run
from families import perturb, save_hf, timm_checkpoint, tiny_hf

transformers = pytest.importorskip("transformers")
timm = pytest.importorskip("timm")


def tiny_swin(folder):
    config = transformers.SwinConfig(embed_dim=16, depths=[1, 1], num_heads=[1, 2],
                                     image_size=32, patch_size=4, window_size=4)
    return save_hf(perturb(transformers.SwinModel(config)), folder)


def test_a_model_type_not_rebuilt_is_refused_by_its_name_not_by_its_keys(tmp_path):
    """Swin's folder names its model_type: the refusal says so, where it said "cannot tell
    the checkpoint format from its keys; pass --format"."""
    folder = tiny_swin(tmp_path / "swin")
    code, _, err = run("export", tmp_path / "b", "--checkpoint", folder, "--road", "native")
    assert code == 1 and one_line(err).startswith(
        "Error: config.json: model_type 'swin' is not supported (one of vit, deit"), err
    assert not (tmp_path / "b").exists()


def test_a_timm_name_not_rebuilt_is_refused_by_that_name(tmp_path):
    peer = perturb(timm.create_model("swin_tiny_patch4_window7_224", pretrained=False,
                                     depths=(1, 1), num_heads=(1, 2), embed_dim=16,
                                     img_size=56, window_size=7, num_classes=3))
    path = tmp_path / "swin.pth"
    torch.save(peer.state_dict(), path)
    code, _, err = run("export", tmp_path / "b", "--checkpoint", path, "--timm-name",
                       "swin_tiny_patch4_window7_224", "--road", "native")
    assert code == 1 and "swin_tiny_patch4_window7_224" in one_line(err), err
    assert "cannot tell the checkpoint format" not in err


def test_gelu_new_is_the_tanh_gelu_and_exports_with_its_source_rows(tmp_path):
    """hidden_act gelu_new is transformers' NewGELUActivation, the tanh approximation
    gelu_pytorch_tanh computes too: it was refused as unsupported."""
    peer = tiny_hf("ViTModel", hidden_act="gelu_new")
    out = tmp_path / "b"
    code, _text, err = run("export", out, "--checkpoint", save_hf(peer, tmp_path / "vit"))
    assert code == 0, err
    source = json.loads((out / "parity.json").read_text())["source"]
    assert (source["model"], source["status"]) == ("ViTModel", "passed"), source


def test_an_option_the_rebuild_would_not_honour_is_refused_by_name(tmp_path):
    """A ViT pooler with a ReLU: the rebuild's pooler is tanh, and the export was refused
    after the fact as "export does not match eager PyTorch"."""
    peer = tiny_hf("ViTModel", pooler_act="relu")
    code, _, err = run("export", tmp_path / "b", "--checkpoint",
                       save_hf(peer, tmp_path / "vit"), "--road", "native")
    assert code == 1 and one_line(err) == (
        "Error: config.json: pooler_act 'relu' is not supported (the pooler is rebuilt with "
        "tanh, as transformers' default)"), err


def test_the_record_lists_the_outputs_compared_and_those_not(tmp_path):
    """CLIP's tokens are after our final norm, not transformers' last_hidden_state: the
    record says tokens were not compared (and why), the embedding was."""
    peer = tiny_hf("CLIPVisionModel")
    out = tmp_path / "b"
    code, text, err = run("export", out, "--checkpoint", save_hf(peer, tmp_path / "clip"),
                          "--outputs", "embedding,tokens")
    assert code == 0, err
    source = json.loads((out / "parity.json").read_text())["source"]
    assert source["compared"] == ["embedding"] and source["status"] == "passed"
    assert source["not_compared"] == [("tokens not compared: transformers' CLIPVisionModel "
                                      "does not give it as such")]
    assert "against eager and model.onnx on embedding at" in text


def test_siglips_tokens_are_compared_with_its_last_hidden_state(tmp_path):
    """SigLIP norms every token (post_layernorm), as our tokens output: compared (they were
    left out)."""
    out = tmp_path / "b"
    code, _text, err = run("export", out, "--checkpoint",
                           save_hf(tiny_hf("SiglipVisionModel"), tmp_path / "siglip"),
                           "--outputs", "embedding,tokens")
    assert code == 0, err
    source = json.loads((out / "parity.json").read_text())["source"]
    assert source["compared"] == ["embedding", "tokens"] and source["status"] == "passed", source


def test_a_timm_checkpoint_exported_at_another_size_is_compared_at_its_own_too(tmp_path):
    """Trained at a 3x3 grid, exported at 4x4 with any size: the sizes compared include
    the 3x3 one the weights were trained at (it was left out)."""
    path, sets = timm_checkpoint(tmp_path, "vit_small_patch14_dinov2", img_size=56)
    out = tmp_path / "b"
    code, _, err = run("export", out, "--checkpoint", path, "--timm-name",
                       "vit_small_patch14_dinov2", *sets, "--dynamic-size", "--batch-sizes", "1")
    assert code == 0, err
    source = json.loads((out / "parity.json").read_text())["source"]
    assert source["native_size"] == 42 and [42, 42] in source["sizes"], source
    assert [56, 56] in source["sizes"] and source["status"] == "passed"


def test_siglip2_is_compared_with_transformers_fed_patches_as_its_processor_gives_them(
        tmp_path):
    """SigLIP2 takes patch sequences: its source rows patchify each image as its NaFlex
    processor does (they were skipped), at the export size and, with --dynamic-size, at
    other grids, one not square."""
    from families import siglip2

    out = tmp_path / "b"
    code, _text, err = run("export", out, "--checkpoint", save_hf(siglip2(), tmp_path / "s2"),
                           "--dynamic-size")
    assert code == 0, err
    source = json.loads((out / "parity.json").read_text())["source"]
    assert (source["model"], source["status"]) == ("Siglip2VisionModel", "passed"), source
    assert len(source["sizes"]) >= 3 and any(h != w for h, w in source["sizes"]), source
