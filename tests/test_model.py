import math

import pytest
import torch
from conftest import TINY

from vit_export.errors import ConfigError
from vit_export.model import (
    PRESETS,
    DropPath,
    ViTConfig,
    create_model,
    preset_config,
    resample_pos_embed,
    train_step_check,
)


def test_construction_rejects_indivisible_image_with_both_numbers():
    with pytest.raises(ConfigError, match="img_size 33 is not divisible by patch_size 8"):
        ViTConfig(**{**TINY, "img_size": 33})


def test_construction_rejects_indivisible_dim_with_both_numbers():
    with pytest.raises(ConfigError, match="embed_dim 66 is not divisible by num_heads 4"):
        ViTConfig(**{**TINY, "embed_dim": 66})


@pytest.mark.parametrize("field,value", [("depth", 0), ("drop_path_rate", 1.0),
                                         ("num_classes", -1), ("patch_size", 2.5)])
def test_construction_rejects_bad_values(field, value):
    with pytest.raises(ConfigError, match=field):
        ViTConfig(**{**TINY, field: value})


@pytest.mark.parametrize("values, message", [
    ({"depth": 0}, "depth must be a positive integer, got 0"),
    ({"patch_size": 2.5}, "patch_size must be a positive integer, got 2.5"),
    ({"img_size": True}, "img_size must be a positive integer, got True"),
    ({"num_classes": -1}, "num_classes must be >= 0, got -1"),
    ({"depth": 300}, "depth must be at most 256, got 300"),
    ({"num_classes": 2_000_000}, "num_classes must be at most 1e+06, got 2000000"),
    ({"mlp_ratio": math.nan}, "mlp_ratio must be > 0, got nan"),  # NaN passes the limit
    ({"norm_eps": 0.0}, "norm_eps must be in (0, 1], got 0.0"),
    ({"drop_path_rate": 1.0}, "drop_path_rate must be in [0, 1), got 1.0"),
    ({"representation_size": 0}, "representation_size must be positive or None, got 0"),
    ({"reg_tokens": 2.0}, "reg_tokens must be an integer >= 0, got 2.0"),
    ({"init_values": math.nan}, "init_values must be > 0 or None, got nan"),
    ({"output": "logits,logits"}, ("output must name one or more of logits, embedding, "
                                   "tokens, comma-separated, each once; got 'logits,logits'")),
    ({"pos_embed_interpolation": "nearest"},
     "pos_embed_interpolation must be bicubic or bilinear, got 'nearest'"),
    ({"rope_type": ""}, "rope_type must be one of cat, dinov3, mixed or none, got ''"),
    ({"rope_grid_offset": math.nan}, "rope_grid_offset must be in [0, 256], got nan"),
    ({"rope_grid_offset": 300}, "rope_grid_offset must be at most 256, got 300"),
    ({"attn_pool_mlp_ratio": 0.0}, "attn_pool_mlp_ratio must be > 0, got 0.0"),
    ({"img_size": 33}, "img_size 33 is not divisible by patch_size 8"),
    ({"projection_head": True, "num_classes": 0},
     "projection_head needs a head (num_classes > 0, its width)"),
    ({"num_classes": 0, "output": "logits"},
     "output logits needs a classifier head (num_classes > 0)"),
    ({"output": "logits", "projection_head": True},
     "output logits needs a classifier head; this model's head gives an embedding"),
    ({"normalize": True}, "normalize applies to an embedding output (output=embedding)"),
    ({"ref_feat_shape": 16},
     "ref_feat_shape is a positive grid side of rope_type cat, got 16 with rope_type None"),
    ({"global_pool": "map", "attn_pool_num_heads": 5},
     "attn_pool_num_heads must divide embed_dim 64, got 5"),
    ({"attn_pool_num_heads": 4},
     "attn_pool_num_heads applies to the attention pool (global_pool map)"),
    ({"global_pool": "avg", "distilled": True},
     "distilled (DeiT) needs the class token, no registers and global_pool token"),
    # two faults: the field's own check speaks before how the fields fit together
    ({"img_size": 33, "mlp_ratio": -1.0}, "mlp_ratio must be > 0, got -1.0"),
])
def test_each_check_of_the_config_gives_its_one_line(values, message):
    with pytest.raises(ConfigError) as info:
        ViTConfig(**{**TINY, **values})
    assert str(info.value) == message


def test_from_dict_coerces_strings_and_rejects_unknown_fields():
    config = ViTConfig.from_dict({**TINY, "num_classes": "7", "qkv_bias": "false",
                                  "representation_size": "none"})
    assert config.num_classes == 7 and config.qkv_bias is False
    assert config.representation_size is None
    with pytest.raises(ConfigError, match="unknown config field"):
        ViTConfig.from_dict({"img_sise": 32})
    with pytest.raises(ConfigError, match="^depth must be an integer, got 'two'$"):
        ViTConfig.from_dict({"depth": "two"})


@pytest.mark.parametrize("values, strict, message", [
    ({"depth": "inf"}, False, "depth must be an integer, got 'inf'"),
    ({"mlp_ratio": 10 ** 400}, True, "mlp_ratio must be a number, got 1000"),
    ({"mlp_ratio": 10 ** 400}, False, "mlp_ratio must be a number, got 1000"),
    ({"depth": True}, True, "depth must be an integer, got True"),
])
def test_from_dict_refuses_values_no_float_holds_in_one_line(values, strict, message):
    """--set depth=inf and a JSON integer too big for a float were OverflowErrors."""
    with pytest.raises(ConfigError, match=f"^{message}"):
        ViTConfig.from_dict(values, strict=strict)


@pytest.mark.parametrize("batch", [1, 3])
def test_forward_shapes(batch):
    model = create_model("vit_seed_tiny").eval()
    x = torch.randn(batch, 3, 32, 32)
    assert model(x).shape == (batch, 10)
    tokens = model.forward_features(x)  # timm's meaning: every token after the final norm
    assert tokens.shape == (batch, 1 + 16, 64)
    assert model.forward_head(tokens, pre_logits=True).shape == (batch, 64)
    torch.testing.assert_close(model.forward_head(tokens), model(x))


def test_forward_features_and_head_mean_what_timm_means():
    timm = pytest.importorskip("timm")
    theirs = timm.create_model("vit_tiny_patch16_224", pretrained=False, img_size=32,
                               patch_size=8, depth=2, num_classes=10).eval()
    ours = create_model("vit_tiny_patch16_224", img_size=32, patch_size=8, depth=2,
                        num_classes=10).eval()
    ours.load_state_dict(theirs.state_dict())
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        tokens = theirs.forward_features(x)
        torch.testing.assert_close(ours.forward_features(x), tokens, atol=1e-5, rtol=0)
        for pre in (True, False):
            torch.testing.assert_close(ours.forward_head(tokens, pre_logits=pre),
                                       theirs.forward_head(tokens, pre_logits=pre),
                                       atol=1e-5, rtol=0)


def test_wrong_image_size_names_expected_and_actual():
    model = create_model("vit_seed_tiny")
    with pytest.raises(Exception, match="expected a 32x32 image, got 24x24"):
        model(torch.randn(1, 3, 24, 24))
    with pytest.raises(Exception, match="expected 3 input channels, got 1"):
        model(torch.randn(1, 1, 32, 32))


@pytest.mark.parametrize("name", list(PRESETS))
def test_presets_have_timm_sizes(name):
    with torch.device("meta"):
        model = create_model(name)
    params = sum(p.numel() for p in model.parameters())
    expected = {"vit_tiny_patch16_224": 5.717e6, "vit_small_patch16_224": 22.05e6,
                "vit_base_patch16_224": 86.57e6, "vit_base_patch32_224": 88.22e6,
                "vit_large_patch16_224": 304.3e6, "vit_huge_patch14_224": 632.0e6,
                "vit_seed_tiny": 0.11425e6}[name]
    assert params == pytest.approx(expected, rel=1e-3)


def test_overrides_apply_to_presets():
    config = preset_config("vit_base_patch16_224", num_classes=10, depth=2)
    assert (config.num_classes, config.depth, config.embed_dim) == (10, 2, 768)
    with pytest.raises(ConfigError, match="unknown preset"):
        preset_config("vit_gigantic")


def test_state_dict_names_follow_timm():
    keys = set(create_model("vit_seed_tiny").state_dict())
    for key in ["patch_embed.proj.weight", "cls_token", "pos_embed", "blocks.1.norm1.weight",
                "blocks.1.attn.qkv.weight", "blocks.1.attn.proj.bias", "blocks.1.norm2.bias",
                "blocks.1.mlp.fc1.weight", "blocks.1.mlp.fc2.bias", "norm.weight", "head.weight"]:
        assert key in keys


def test_init_weights_trunc_normal_and_layernorm():
    torch.manual_seed(0)
    model = create_model("vit_base_patch16_224", depth=1)
    fc1 = model.blocks[0].mlp.fc1.weight
    assert fc1.std().item() == pytest.approx(0.02, rel=0.02)  # truncated at +-2, as timm
    assert fc1.mean().item() == pytest.approx(0.0, abs=1e-4)
    assert torch.all(model.blocks[0].norm1.weight == 1) and torch.all(model.norm.bias == 0)
    assert torch.all(model.head.bias == 0)


def test_drop_path_rates_rise_linearly():
    model = create_model("vit_seed_tiny", depth=5, drop_path_rate=0.2)
    rates = [b.drop_path.drop_prob for b in model.blocks]
    assert rates == pytest.approx([0.0, 0.05, 0.1, 0.15, 0.2])


def test_drop_path_drops_whole_samples_and_rescales():
    torch.manual_seed(0)
    layer = DropPath(0.5).train()
    out = layer(torch.ones(4000, 3, 2))
    per_sample = out.reshape(4000, -1)
    assert set(torch.unique(per_sample).tolist()) <= {0.0, 2.0}
    assert torch.all(per_sample.min(1).values == per_sample.max(1).values)
    assert per_sample.mean().item() == pytest.approx(1.0, abs=0.05)
    assert torch.equal(layer.eval()(torch.ones(3, 2)), torch.ones(3, 2))


def test_representation_size_adds_tanh_pre_logits():
    model = create_model("vit_seed_tiny", representation_size=32).eval()
    x = torch.randn(2, 3, 32, 32)
    features = model.forward_head(model.forward_features(x), pre_logits=True)
    assert features.shape == (2, 32) and features.abs().max() <= 1.0
    assert model.head.in_features == 32
    assert "pre_logits.fc.weight" in model.state_dict()


def test_distilled_averages_both_heads():
    model = create_model("vit_seed_tiny", distilled=True).eval()
    x = torch.randn(2, 3, 32, 32)
    tokens = model.forward_features(x)
    assert tokens.shape == (2, 2 + 16, 64)
    expected = (model.head(tokens[:, 0]) + model.head_dist(tokens[:, 1])) / 2
    torch.testing.assert_close(model(x), expected)


def test_patch_norm_option():
    model = create_model("vit_seed_tiny", patch_norm=True)
    assert isinstance(model.patch_embed.norm, torch.nn.LayerNorm)


def test_attention_matches_torch_sdpa():
    torch.manual_seed(0)
    model = create_model("vit_seed_tiny").eval()
    attn = model.blocks[0].attn
    x = torch.randn(2, 17, 64)
    q, k, v = attn.qkv(x).reshape(2, 17, 3, 4, 16).permute(2, 0, 3, 1, 4)
    ref = torch.nn.functional.scaled_dot_product_attention(q, k, v)
    ref = attn.proj(ref.transpose(1, 2).reshape(2, 17, 64))
    torch.testing.assert_close(attn(x), ref, atol=1e-6, rtol=1e-5)
    assert attn.scale == 16 ** -0.5


def test_train_step_check_runs_one_real_step():
    result = train_step_check(preset_config("vit_seed_tiny"), batch=2, seed=0)
    assert result["logits_shape"] == (2, 10)
    assert math.isfinite(result["loss"]) and result["loss"] == pytest.approx(math.log(10), abs=0.5)
    assert result["updated"] and len(result["pred"]) == 2


def test_resample_pos_embed_keeps_prefix_and_grid():
    pos = torch.randn(1, 1 + 16, 8)
    assert torch.equal(resample_pos_embed(pos, 4, 1), pos)  # interpolated, exactly a copy
    bigger = resample_pos_embed(pos, 6, 1)
    assert bigger.shape == (1, 1 + 36, 8)
    torch.testing.assert_close(bigger[:, :1], pos[:, :1])
    constant = torch.ones(1, 1 + 16, 8)
    torch.testing.assert_close(resample_pos_embed(constant, 7, 1), torch.ones(1, 50, 8))


@pytest.mark.parametrize("size", [(6, 6), (3, 3), (3, 5)])
def test_resample_pos_embed_is_timms(size):
    """timm's resample_abs_pos_embed, as its checkpoint filter and dynamic_img_size call it
    (bicubic, antialias on): the same numbers, growing, shrinking and non-square."""
    layers = pytest.importorskip("timm.layers")
    pos = torch.randn(1, 1 + 16, 8)
    theirs = layers.resample_abs_pos_embed(pos, new_size=size, num_prefix_tokens=1)
    torch.testing.assert_close(resample_pos_embed(pos, size, 1), theirs, atol=1e-6, rtol=0)
