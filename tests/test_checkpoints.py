"""Import real peers' checkpoints (random weights: no hub here) and compare with the peer."""
import numpy as np
import pytest
import torch
from click.testing import CliRunner
from safetensors.torch import save_file

from vit_export import bundle as B
from vit_export import parity, runtime
from vit_export.checkpoints import convert, detect_format, load_checkpoint, read_state_dict
from vit_export.cli import cli
from vit_export.errors import CheckpointError
from vit_export.export import export_bundle

timm = pytest.importorskip("timm")
torchvision = pytest.importorskip("torchvision")
transformers = pytest.importorskip("transformers")


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
    torch.manual_seed(0)
    if kind == "timm_tiny":
        return _timm("vit_tiny_patch16_224"), save_timm_wrapped, lambda m, x: m(x)
    if kind == "timm_base":
        return _timm("vit_base_patch16_224"), save_torch, lambda m, x: m(x)
    if kind == "deit_distilled":
        return _timm("deit_tiny_distilled_patch16_224"), save_timm_safetensors, lambda m, x: m(x)
    if kind == "hf":
        model = transformers.ViTForImageClassification(_hf_config()).eval()
        return model, save_hf, lambda m, x: m(pixel_values=x).logits
    if kind == "torchvision":
        return torchvision.models.vit_b_16().eval(), save_torch, lambda m, x: m(x)
    raise ValueError(kind)


PEERS = ["timm_tiny", "timm_base", "deit_distilled", "hf", "torchvision"]


@pytest.mark.parametrize("kind", PEERS)
def test_peer_parity_eager_torchscript_onnxruntime(kind, tmp_path):
    peer, save, forward = _peer(kind)
    ckpt = save(peer, tmp_path)
    model, description = load_checkpoint(ckpt)
    out = tmp_path / "bundle"
    assert export_bundle(model, out, description, validation=dict(provider="cpu")).passed
    ts = runtime.load_torchscript(out / B.TS_FILE)
    ort = runtime.create_session(out / B.ONNX_FILE, "cpu")
    c = model.config
    for batch in (1, 5):
        g = torch.Generator().manual_seed(batch)
        x = torch.randn(batch, c.in_chans, c.img_size, c.img_size, generator=g)
        with torch.no_grad():
            expected = forward(peer, x).numpy()
            ours = model(x).numpy()
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


def test_position_embedding_resampled_for_a_new_image_size(tmp_path):
    peer = _timm("vit_tiny_patch16_224")
    model, description = load_checkpoint(save_torch(peer, tmp_path),
                                         overrides={"img_size": "256"})
    assert model.pos_embed.shape == (1, 1 + 16 * 16, 192)
    notes = description.extra["import"]["notes"]
    assert any("resampled (bicubic) from a 14x14 to a 16x16" in n for n in notes)
    torch.testing.assert_close(model.pos_embed[:, 0], peer.pos_embed[:, 0])
    out = tmp_path / "b"
    export_bundle(model, out, description)
    assert parity.validate(out, [1, 3], provider="cpu").passed


def _cli(*args):
    result = CliRunner().invoke(cli, [str(a) for a in args])
    return result.exit_code, result.stdout, result.stderr


def test_cli_export_from_checkpoint_with_format(tmp_path):
    ckpt = save_torch(torchvision.models.vit_b_32().eval(), tmp_path)
    code, out, err = _cli("export", tmp_path / "b", "--checkpoint", ckpt, "--format",
                          "torchvision", "--batch-sizes", "1,3")
    assert code == 0, err
    assert "note: num_heads=12 assumed for width 768" in out and "PASS" in out
    d = B.read_bundle(tmp_path / "b").description
    assert d.preprocessing.mean == (0.485, 0.456, 0.406) and d.config.patch_size == 32


def test_missing_block_is_an_error_listing_keys(tmp_path):
    state = {k: v for k, v in _timm("vit_tiny_patch16_224").state_dict().items()
             if not k.startswith("blocks.5.")}
    torch.save(state, tmp_path / "cut.pth")
    code, _, err = _cli("export", tmp_path / "b", "--checkpoint", tmp_path / "cut.pth")
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
