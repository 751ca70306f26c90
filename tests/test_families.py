"""The ViT families people ship today, imported from timm (with the architecture it names)
and from Hugging Face folders, compared with the framework's own forward: eager <= 1e-5,
ONNX Runtime <= 1e-4 (relative to the output's scale), at two batch sizes and, with a
dynamic size, two image sizes. The tiny models and their random weights: tests/families.py.
"""
import argparse
import copy
import json

import numpy as np
import onnx
import pytest
import torch
from conftest import one_line, run
from families import (
    EMBED,
    HF_FAMILIES,
    HF_PATCH,
    TIMM_FAMILIES,
    hf_output,
    perturb,
    processor,
    save_hf,
    siglip2,
    siglip2_output,
    size_of,
    tiny_hf,
    tiny_timm,
)

from vit_export import bundle as B
from vit_export import runtime
from vit_export.checkpoints import load_checkpoint, timm_architecture
from vit_export.errors import CheckpointError, ConfigError, ExportError
from vit_export.exporting import example_size, export_onnx
from vit_export.exporting.variants import _converter_input, to_fp16, to_optimized
from vit_export.model import (
    VisionTransformer,
    ViTConfig,
    as_tuple,
    random_input,
    with_dynamic_size,
    with_output,
)
from vit_export.onnxio import node_scopes

timm = pytest.importorskip("timm")

FAMILIES = TIMM_FAMILIES


def imported(name: str, tmp_path, num_classes: int = 7):
    peer = tiny_timm(name, num_classes)
    path = tmp_path / "weights.pth"
    torch.save(peer.state_dict(), path)
    model, description = load_checkpoint(path, timm_name=name, overrides=size_of(peer))
    return peer, model, description


def inputs(model, batch: int, size=None, seed: int = 0) -> torch.Tensor:
    c = model.config
    h, w = size or (c.img_size, c.img_size)
    return torch.randn(batch, c.in_chans, h, w, generator=torch.Generator().manual_seed(seed))


def rel_error(expected: np.ndarray, got: np.ndarray) -> float:
    scale = float(np.abs(expected).max())
    assert scale > 1e-2  # the peer says something to compare
    return float(np.abs(expected - got).max()) / scale


def assert_runs_on_the_device_it_is_put_on(model):
    """The model and its input on a device other than CPU, at its size and under a dynamic
    size: eager, and the TorchScript trace export makes on CPU, run there and answer there.
    PyTorch's meta device (shapes, no data) stands in for CUDA on any machine: a tensor that
    forward makes on a fixed device (a rotary table) meets the model's there and
    fails as it failed on CUDA."""
    for m in (model, with_dynamic_size(model)):
        x = random_input(m.config, 2, size=example_size(m.config))
        with torch.no_grad():
            traced = torch.jit.trace(m, x, check_trace=False)
            expected = [o.shape for o in as_tuple(m(x))]
            for label, moved in (("eager", copy.deepcopy(m)), ("torchscript", traced)):
                try:
                    outs = as_tuple(moved.to("meta")(x.to("meta")))
                except RuntimeError as exc:
                    pytest.fail(f"{label}, dynamic size {m.config.dynamic_img_size}, on meta: "
                                f"{str(exc).strip().splitlines()[0]}")
                assert [(o.shape, o.device.type) for o in outs] == \
                    [(shape, "meta") for shape in expected], label


@pytest.mark.parametrize("name", FAMILIES)
def test_eager_matches_timm_with_and_without_the_head(name, tmp_path):
    for num_classes in (7, 0):
        peer, model, description = imported(name, tmp_path, num_classes)
        for batch in (1, 3):
            x = inputs(model, batch)
            with torch.no_grad():
                expected, ours = peer(x).numpy(), model(x).numpy()
            assert ours.shape == (batch, num_classes or EMBED)
            assert rel_error(expected, ours) <= 1e-5, (name, num_classes, batch)
        # a headless model's output is timm's own embedding, forward_head(pre_logits=True)
        with torch.no_grad():
            pooled = peer.forward_head(peer.forward_features(x), pre_logits=True).numpy()
            assert rel_error(pooled, model.forward_head(model.forward_features(x),
                                                        pre_logits=True).numpy()) <= 1e-5
    assert description.config.family_options() or name.startswith("vit_small_patch16")
    assert_runs_on_the_device_it_is_put_on(model)


# Each case is an ONNX export of a few seconds: in the quick run the dynamic-size export of
# the family with the most new options (registers, LayerScale, no_embed_class; a rotary
# family's runs in test_a_rotary_model_exports_and_validates_through_the_cli), all in CI.
QUICK_ONNX = (("vit_small_patch14_reg4_dinov2", "dynamic"),)


@pytest.mark.parametrize("name, kind", [
    (n, k) if (n, k) in QUICK_ONNX else pytest.param(n, k, marks=pytest.mark.slow)
    for n in FAMILIES for k in ("fixed", "dynamic")])
def test_onnx_matches_timm_at_two_batches_and_two_image_sizes(name, kind, tmp_path):
    peer, model, description = imported(name, tmp_path)
    P = model.config.patch_size
    if kind == "dynamic":  # timm's dynamic_img_size resamples pos_embed in its forward
        model, peer, sizes = with_dynamic_size(model), tiny_timm(name, dynamic=True), \
            [(4 * P, 2 * P), (2 * P, 5 * P)]
    else:
        sizes = [None]
    path = tmp_path / f"{kind}.onnx"
    export_onnx(model, path, B.Description(model.config, description.preprocessing).to_json())
    session = runtime.ort_runner(path, "cpu")
    for batch, size in [(1, sizes[0]), (3, sizes[-1])]:
        x = inputs(model, batch, size, seed=batch)
        with torch.no_grad():
            expected = peer(x).numpy()
        assert rel_error(expected, session(x.numpy())) <= 1e-4, (name, kind, batch, size)


@pytest.mark.slow  # 15 s; test_a_rotary_model_exports_and_validates_through_the_cli is quick
def test_fp16_keeps_the_rotary_tables_in_fp32(tmp_path):
    """The fp16 variant computes the rotary tables in fp32 (fp16 angles of far patches lose
    their phase): the table it feeds attention is the fp32 one rounded once, where converting
    it too gives errors several times larger. A pooled output that a LayerNorm makes (a graph
    output, fc_norm) keeps its producer."""
    for name, outputs in (("vit_small_patch16_rope_224", "tokens"),
                          ("vit_base_patch16_rope_reg1_gap_256", "embedding,tokens")):
        _, model, description = imported(name, tmp_path, num_classes=0)
        model = with_output(with_dynamic_size(model), outputs)
        path = tmp_path / f"{name}.onnx"
        export_onnx(model, path, B.Description(model.config, description.preprocessing).to_json())
        table = [n for n in onnx.load(str(path)).graph.node
                 if "rope" in node_scopes(n)][-1].output[0]
        side = 20 * model.config.patch_size  # a 20x20 grid: angles up to 19 radians
        x = inputs(model, 1, (side, side))
        with torch.no_grad():
            reference = model.rope(20, 20, x).numpy()
            expected = as_tuple(model(x))[0].numpy()
        errors = {}
        for label, keep in (("fp16 tables", []), ("fp32 tables", None)):
            proto = to_fp16(_converter_input(path), keep=keep)
            proto.graph.output.append(onnx.helper.make_tensor_value_info(
                table, onnx.TensorProto.FLOAT16, None))
            onnx.save(proto, str(tmp_path / "half.onnx"))
            session = runtime.ort_runner(tmp_path / "half.onnx", "cpu")
            *got, tables = session.session.run(None, {session.input.name: x.numpy()})
            errors[label] = float(np.abs(tables.astype(np.float64) - reference).max())
            assert rel_error(expected, got[0]) <= 2e-2, (name, label)
        assert errors["fp32 tables"] <= 2 ** -11, name  # one rounding of values in [-1, 1]
        if name == "vit_small_patch16_rope_224":
            assert errors["fp16 tables"] > 4 * errors["fp32 tables"], errors


@pytest.mark.slow
def test_a_dinov3_vit_s_with_dynamic_size_is_timms_at_three_sizes(tmp_path):
    """The rotary families' proof at full size: DINOv3 ViT-S, every weight random at order 1, exported
    with --dynamic-size, against timm's model at 224, 320 and 448x288."""
    name = "vit_small_patch16_dinov3"
    peer = perturb(timm.create_model(name, pretrained=False, num_classes=0))
    torch.save(peer.state_dict(), tmp_path / "dinov3.pth")
    out = tmp_path / "bundle"
    code, _, err = run("export", str(out), "--checkpoint", str(tmp_path / "dinov3.pth"),
                       "--timm-name", name, "--dynamic-size", "--provider", "cpu", "--quiet")
    assert code == 0, err
    session = runtime.ort_runner(out / B.ONNX_FILE, "cpu")
    for h, w in ((224, 224), (320, 320), (448, 288)):
        x = torch.randn(2, 3, h, w, generator=torch.Generator().manual_seed(h * w))
        with torch.no_grad():
            assert rel_error(peer(x).numpy(), session(x.numpy())) <= 1e-4, (h, w)


# Every rotary family at the size it was pretrained at (DINOv3 also at the 224 its processor
# crops), from timm's own weights, every one perturbed: export --checkpoint --timm-name as a
# new user runs it, validated at export, then ONNX Runtime against timm (the tiny
# grids above folded their tables in another layout). One model a family, the smallest: a
# minute or more each on 2 cores, and CI's whole run has 90 minutes. The other sizes of a
# family (EVA02 base, DINOv3 S+, ROPE-ViT with APE, the ROPE register-GAP base) passed the
# same test once on 2026-11-24; their layers are the tiny tests' above.
PRETRAINED = [("eva02_tiny_patch14_224", None), ("eva02_base_patch16_clip_224", None),
              ("vit_small_patch16_dinov3", None), ("vit_small_patch16_dinov3", 224),
              ("vit_small_patch16_rope_224", None), ("vit_small_patch16_rope_mixed_224", None),
              ("vit_pe_core_tiny_patch16_384", None)]


@pytest.mark.slow
@pytest.mark.parametrize("name, size", PRETRAINED)
def test_a_rotary_family_exports_and_validates_at_its_pretrained_size(name, size, tmp_path):
    peer = perturb(timm.create_model(name, pretrained=False,
                                     **({"img_size": size} if size else {})))
    torch.save(peer.state_dict(), tmp_path / "w.pth")
    side = peer.patch_embed.img_size[0]
    out = tmp_path / "bundle"
    code, stdout, err = run("export", out, "--checkpoint", tmp_path / "w.pth", "--timm-name",
                            name, *(["--set", f"img_size={size}"] if size else []),
                            "--provider", "cpu")
    assert code == 0, err
    assert "PASS" in stdout and B.read_bundle(out).config.img_size == side
    session = runtime.ort_runner(out / B.ONNX_FILE, "cpu")
    x = torch.randn(2, 3, side, side, generator=torch.Generator().manual_seed(side))
    with torch.no_grad():
        assert rel_error(peer(x).numpy(), session(x.numpy())) <= 1e-4


@pytest.mark.parametrize("name, missing", [
    ("beit_base_patch16_224", "Beit class"),
    ("vit_base_patch16_sapiens2", "RmsNorm"),  # Sapiens2 (grouped-query attention too)
    ("vit_medium_patch16_gap_256.sw_in12k", None),  # supported: the controls
    ("vit_small_patch16_dinov3", None),
])
def test_what_we_do_not_build_is_named_in_one_line(name, missing):
    with torch.device("meta"):
        model = timm.create_model(name.split(".")[0], pretrained=False)
    if missing is None:
        assert timm_architecture(model, name)["global_pool"] == "avg"
        return
    with pytest.raises(ConfigError, match=missing) as info:
        timm_architecture(model, name)
    assert "\n" not in str(info.value)


def test_a_checkpoint_from_timm_train_names_its_architecture(tmp_path):
    """timm's train.py saves {"arch": args.model, "args": Namespace, "state_dict": ...}."""
    name = "vit_small_patch14_reg4_dinov2"
    peer = tiny_timm(name)
    path = tmp_path / "checkpoint-3.pth"
    torch.save({"epoch": 3, "arch": name, "args": argparse.Namespace(model=name, lr=0.1),
                "state_dict": peer.state_dict(), "version": 2}, path)
    with pytest.raises(CheckpointError, match="embed_dim 96 in the weights, 384 in "
                       "vit_small_patch14_reg4_dinov2"):  # a tiny one: the name's heads are a guess
        load_checkpoint(path)
    model, description = load_checkpoint(path, overrides={"num_heads": "6"})
    assert description.config.reg_tokens == 4 and description.config.init_values == 1e-5
    assert any("arch key" in n for n in description.extra["import"]["notes"])
    x = inputs(model, 2)
    with torch.no_grad():
        assert rel_error(peer(x).numpy(), model(x).numpy()) <= 1e-5


@pytest.mark.parametrize("name, what", [("eva02_tiny_patch14_224", "rope_type"),
                                        ("vit_small_patch16_rope_mixed_224", "rope_type")])
def test_eva_weights_without_a_name_are_refused(name, what, tmp_path):
    """timm Eva weights do not hold their rotary tables: without --timm-name or --set, a model
    without rotation would take every key and compute something else."""
    peer = tiny_timm(name)
    path = tmp_path / "w.pth"
    torch.save(peer.state_dict(), path)
    heads = {"num_heads": str(peer.blocks[0].attn.num_heads), "norm_eps": "1e-6"}
    with pytest.raises(CheckpointError, match=what) as info:
        load_checkpoint(path, overrides={**heads, **size_of(peer)})
    assert "\n" not in str(info.value)
    if name.startswith("eva02"):  # said, it loads: what the name would have said
        model, _ = load_checkpoint(path, overrides={
            **heads, "rope_type": "cat", "ref_feat_shape": "16", "act_layer": "silu",
            "global_pool": "avg"})
        x = inputs(model, 2)
        with torch.no_grad():
            assert rel_error(peer(x).numpy(), model(x).numpy()) <= 1e-5
    assert ViTConfig.from_dict({"output": "none", "rope_type": "none"}).rope_type is None


def test_weights_alone_show_registers_pooling_and_layerscale(tmp_path):
    """Without a name, what the keys show is read off them (heads and eps still need --set)."""
    peer = tiny_timm("vit_medium_patch16_reg4_gap_256")
    path = tmp_path / "w.pth"
    torch.save(peer.state_dict(), path)
    model, _ = load_checkpoint(path, overrides={"num_heads": str(peer.blocks[0].attn.num_heads)})
    c = model.config
    assert (c.class_token, c.reg_tokens, c.no_embed_class, c.global_pool, c.fc_norm) == \
        (False, 4, True, "avg", True)
    x = inputs(model, 2)
    with torch.no_grad():
        assert rel_error(peer(x).numpy(), model(x).numpy()) <= 1e-5


@pytest.mark.parametrize("values, message", [
    ({"class_token": False}, "global_pool token needs the class token"),
    ({"global_pool": "max"}, "global_pool must be one of token, avg, map"),
    ({"act_layer": "relu"}, "act_layer must be one of"),
    ({"reg_tokens": -1}, "reg_tokens must be an integer >= 0"),
    ({"init_values": 0}, "init_values must be > 0"),
    ({"distilled": True, "reg_tokens": 2}, "distilled"),
    ({"global_pool": "token_avg", "class_token": False}, "token_avg needs the class token"),
    ({"global_pool": "token_avg", "fc_norm": True}, "token_avg takes no fc_norm"),
    ({"mlp_layer": "geglu"}, "mlp_layer must be one of mlp, swiglu_packed, swiglu"),
    ({"rope_type": "mrope"}, "rope_type must be one of cat, dinov3, mixed"),
    ({"rope_type": "cat", "embed_dim": 24, "num_heads": 4}, "head width divisible by 4"),
    ({"rope_type": "mixed", "rope_rotate_half": True}, "mixed rotates pairs"),
    ({"rope_type": "cat", "rope_grid_indexing": "yx"}, "ij or xy"),
    ({"rope_type": "cat", "rope_temperature": 0}, "rope_temperature must be > 0"),
    ({"ref_feat_shape": 16}, "ref_feat_shape is a positive grid side of rope_type cat"),
    ({"pos_embed": "sincos"}, "pos_embed must be one of learn, none"),
    ({"global_pool": "map", "attn_pool_num_heads": 5}, "attn_pool_num_heads must divide"),
    ({"attn_pool_mlp_ratio": 2.5}, "applies to the attention pool"),
    ({"pool_include_prefix": True}, "pool_include_prefix applies to the attention pool"),
    ({"rope_grid_offset": -1}, "rope_grid_offset must be in"),  # without rope_type too
    ({"rope_temperature": 1e12}, "rope_temperature must be at most"),
    ({"mlp_layer": "swiglu_packed", "embed_dim": 6, "num_heads": 2, "mlp_ratio": 2.5},
     "needs an even MLP width, got 15"),
])
def test_family_options_are_checked(values, message):
    with pytest.raises(ConfigError, match=message):
        ViTConfig.from_dict(values)


def test_family_options_read_from_json_only_in_their_own_types():
    assert ViTConfig.from_dict({"fc_norm": "true", "global_pool": "avg"}).fc_norm is True
    assert ViTConfig.from_dict({"fc_norm": None}, strict=True).fc_norm is None
    for bad, kind in (({"fc_norm": "true"}, "fc_norm must be a boolean or null"),
                      ({"act_layer": 1}, "act_layer must be a string"),
                      ({"reg_tokens": "4"}, "reg_tokens must be an integer")):
        with pytest.raises(ConfigError, match=f"^{kind}, got "):
            ViTConfig.from_dict(bad, strict=True)


@pytest.mark.slow  # quick suite under 3 min on a Zen 3 (2 cores): CI runs it
def test_a_headless_model_exports_its_embedding(tmp_path):
    """num_classes=0: the output is the pooled embedding, named so in the graph,
    config.json and info; infer, which classifies, refuses it in one line."""
    out = tmp_path / "headless"
    code, _, err = run("export", str(out), "--preset", "vit_seed_tiny", "--set",
                       "num_classes=0", "--set", "init_values=0.5", "--set", "reg_tokens=2",
                       "--provider", "cpu")
    assert code == 0, err
    graph = onnx.load(str(out / B.ONNX_FILE)).graph
    assert [o.name for o in graph.output] == ["embedding"]
    assert graph.output[0].type.tensor_type.shape.dim[1].dim_value == 64
    config = json.loads((out / B.CONFIG_FILE).read_text())
    assert config["io"]["outputs"] == ["embedding"] and config["model"]["reg_tokens"] == 2
    info = run("info", str(out))[1]
    assert "output: embedding [batch, 64] (no classifier" in info
    assert "architecture: reg_tokens 2, init_values 0.5" in info
    model = VisionTransformer(ViTConfig.from_dict(config["model"]))
    assert model(torch.zeros(1, 3, 32, 32)).shape == (1, 64)
    code, _, err = run("infer", str(out), str(tmp_path))
    assert code == 1
    assert one_line(err) == (f"Error: {out} gives an embedding (64 wide), not classes: use "
                             f"--embed")


# Hugging Face: save_pretrained folders (config.json and weights), as users download them.
transformers = pytest.importorskip("transformers")


def hf_imported(name: str, tmp_path, processor=None, **values):
    peer = tiny_hf(name, **values)
    model, description = load_checkpoint(save_hf(peer, tmp_path / name, processor))
    return peer, model, description


@pytest.mark.parametrize("name", HF_FAMILIES)
def test_eager_matches_hugging_face(name, tmp_path):
    """Our model is the transformers model's own output: logits, pooler_output, CLIP's
    projected image_embeds, MAE's class token."""
    peer, model, description = hf_imported(name, tmp_path)
    for batch in (1, 3):
        x = inputs(model, batch, seed=batch)
        expected = hf_output(name, peer, x).numpy()
        with torch.no_grad():
            ours = model(x).numpy()
        assert ours.shape == expected.shape
        assert rel_error(expected, ours) <= 1e-5, (name, batch)
    if description.config.num_classes == 0:
        assert description.config.output_names == ("embedding",)
    assert_runs_on_the_device_it_is_put_on(model)


@pytest.mark.parametrize("whole", ["CLIPModel", "SiglipModel"])
def test_a_whole_clip_or_siglip_model_exports_its_image_tower(whole, tmp_path):
    """CLIPModel / SiglipModel folders (what openai/clip-vit-* are): the text tower is left
    out, the image features are get_image_features'."""
    vision = dict(hidden_size=EMBED, num_hidden_layers=2, num_attention_heads=4,
                  intermediate_size=192, image_size=3 * HF_PATCH, patch_size=HF_PATCH)
    text = dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                intermediate_size=64, vocab_size=50000)
    config = getattr(transformers, whole.replace("Model", "Config"))(
        vision_config=vision, text_config=text)
    torch.manual_seed(0)
    peer = perturb(getattr(transformers, whole)(config))
    model, _ = load_checkpoint(save_hf(peer, tmp_path / whole))
    x = inputs(model, 2)
    with torch.no_grad():
        expected = peer.get_image_features(pixel_values=x)
        expected = getattr(expected, "pooler_output", expected).numpy()
        assert rel_error(expected, model(x).numpy()) <= 1e-5


@pytest.mark.parametrize("name", ["Dinov2Model", "Dinov2WithRegistersModel"])
def test_dinov2_runs_at_its_processors_crop_with_its_own_resampling(name, tmp_path):
    """DINOv2's table is for 518 pixels and its processor crops 224: transformers resamples
    the table it ships in every forward (bicubic; antialiased only with registers). The
    bundle keeps that table and resamples it once to the input's grid, at the crop and under
    a dynamic size at any other (resampling the crop's table again drifted by 3.6e-2)."""
    processor = transformers.BitImageProcessor(size={"shortest_edge": 48},
                                               crop_size={"height": 42, "width": 42})
    peer, model, description = hf_imported(name, tmp_path, processor, grid=4)
    assert (peer.config.image_size, model.config.img_size) == (56, 42)
    assert model.config.pos_embed_grid == 4  # the table as transformers ships it
    assert description.preprocessing.img_size == 42
    notes = " ".join(description.extra["import"]["notes"])
    assert ("bicubic, not antialiased" in notes) == (name == "Dinov2Model"), notes
    x = inputs(model, 2)
    assert rel_error(hf_output(name, peer, x).numpy(), model(x).detach().numpy()) <= 1e-5
    dynamic = with_dynamic_size(model)
    for size in [(2 * HF_PATCH, 2 * HF_PATCH), (3 * HF_PATCH, 2 * HF_PATCH),
                 (5 * HF_PATCH, 4 * HF_PATCH), (4 * HF_PATCH, 4 * HF_PATCH)]:
        x = inputs(model, 2, size)
        with torch.no_grad():
            assert rel_error(hf_output(name, peer, x).numpy(), dynamic(x).numpy()) <= 1e-5, size


@pytest.mark.parametrize("name", ["ViTModel", "CLIPVisionModel", "SiglipVisionModel",
                                  "Dinov2Model", "Dinov2WithRegistersModel"])
def test_dynamic_size_resamples_as_interpolate_pos_encoding(name, tmp_path):
    """Under --dynamic-size the table is resampled in the graph as transformers does it with
    interpolate_pos_encoding (DINOv2 always does): bicubic, antialiased only with registers."""
    peer, model, _ = hf_imported(name, tmp_path)
    dynamic = with_dynamic_size(model)
    assert model.config.pos_embed_antialias == (name == "Dinov2WithRegistersModel")
    kwargs = {} if name.startswith("Dinov2") else {"interpolate_pos_encoding": True}
    for size in [(4 * HF_PATCH, 2 * HF_PATCH), (2 * HF_PATCH, 5 * HF_PATCH)]:
        x = inputs(model, 2, size)
        with torch.no_grad():
            expected = HF_FAMILIES[name][3](peer(pixel_values=x, **kwargs)).numpy()
            assert rel_error(expected, dynamic(x).numpy()) <= 1e-5, size


@pytest.mark.parametrize("gated", [False, True])
def test_dinov3_from_hugging_face_at_any_size(gated, tmp_path):
    """DINOv3ViTModel (its plain MLP, and the gated one of ViT-S+ and larger): rotary
    positions from the input's grid, no table, so under --dynamic-size it is transformers'
    own forward at every size; its processor's crop is the size it runs at."""
    values = {"use_gated_mlp": True, "hidden_act": "silu"} if gated else {}
    peer, model, description = hf_imported("DINOv3ViTModel", tmp_path, processor(
        "DINOv3ViTModel"), **values)
    c = model.config
    assert (c.rope_type, c.pos_embed, c.reg_tokens, c.global_pool) == ("dinov3", "none", 4,
                                                                       "token")
    assert c.mlp_layer == ("swiglu" if gated else "mlp")
    assert description.preprocessing.resize_backend == "torch"
    dynamic = with_dynamic_size(model)
    for size in [None, (4 * HF_PATCH, 2 * HF_PATCH), (2 * HF_PATCH, 7 * HF_PATCH)]:
        x = inputs(model, 2, size)
        assert rel_error(hf_output("DINOv3ViTModel", peer, x).numpy(),
                         dynamic(x).detach().numpy()) <= 1e-5, size


@pytest.mark.slow
def test_dinov3_from_hugging_face_exports_and_validates_at_224(tmp_path):
    """DINOv3ViTModel with transformers' default config (ViT-S/16, its processor's 224)."""
    config = transformers.DINOv3ViTConfig(num_register_tokens=4)
    torch.manual_seed(0)
    peer = perturb(transformers.DINOv3ViTModel(config))
    folder = save_hf(peer, tmp_path / "hf", transformers.DINOv3ViTImageProcessor(
        size={"height": 224, "width": 224}))
    out = tmp_path / "bundle"
    code, stdout, err = run("export", out, "--checkpoint", folder, "--provider", "cpu")
    assert code == 0, err
    assert "PASS" in stdout and B.read_bundle(out).config.img_size == 224
    x = torch.randn(2, 3, 224, 224, generator=torch.Generator().manual_seed(224))
    session = runtime.ort_runner(out / B.ONNX_FILE, "cpu")
    assert rel_error(hf_output("DINOv3ViTModel", peer, x).numpy(), session(x.numpy())) <= 1e-4


def test_dinov3s_processor_is_reproduced_pixel_for_pixel(photo_files):
    """DINOv3ViTImageProcessor rescales first and resizes float32 pixels with torch (no PIL
    backend): resize_backend "torch" gives its very pixels."""
    from PIL import Image

    from vit_export.preprocessing import hf_preprocessing, preprocess

    reference = transformers.DINOv3ViTImageProcessor(size={"height": 224, "width": 224})
    prep = hf_preprocessing(reference.to_dict())
    assert (prep.resize_backend, prep.interpolation, prep.crop_mode) == ("torch", "bilinear",
                                                                         "squash")
    for path in photo_files:
        image = Image.open(path)
        expected = reference(image.convert("RGB"), return_tensors="pt")["pixel_values"][0]
        assert np.abs(preprocess(image, prep) - expected.numpy()).max() <= 1e-6, path


@pytest.mark.slow  # quick suite under 3 min on a Zen 3 (2 cores): CI runs it
def test_siglip2_naflex_at_any_grid(tmp_path):
    """Siglip2VisionModel (NaFlex): a Linear patch embedding (a Conv2d here) and a table
    resampled bilinearly, antialiased, to each image's grid. At the table's grid and, under
    --dynamic-size, at any other, eager and ONNX Runtime are SigLIP2's own pooled output."""
    peer = siglip2()
    processor = transformers.Siglip2ImageProcessorPil(max_num_patches=9, patch_size=HF_PATCH)
    model, description = load_checkpoint(save_hf(peer, tmp_path / "siglip2", processor))
    c = model.config
    assert (c.img_size, c.pos_embed_interpolation, c.global_pool) == (3 * HF_PATCH, "bilinear",
                                                                      "map")
    assert description.preprocessing.img_size == 3 * HF_PATCH
    assert any("NaFlex" in n for n in description.extra["import"]["notes"])
    x = inputs(model, 2)
    with torch.no_grad():
        assert rel_error(siglip2_output(peer, x).numpy(), model(x).numpy()) <= 1e-5
    dynamic = with_dynamic_size(model)
    path = tmp_path / "dynamic.onnx"
    export_onnx(dynamic, path, B.Description(dynamic.config, description.preprocessing).to_json())
    session = runtime.ort_runner(path, "cpu")
    for size in [(4 * HF_PATCH, 2 * HF_PATCH), (2 * HF_PATCH, 7 * HF_PATCH)]:
        x = inputs(model, 2, size)
        expected = siglip2_output(peer, x).numpy()
        with torch.no_grad():
            assert rel_error(expected, dynamic(x).numpy()) <= 1e-5, size
        assert rel_error(expected, session(x.numpy())) <= 1e-4, size


def test_siglip2_table_is_transformers_resize_at_every_grid():
    """Our resize of SigLIP2's table is transformers' resize_positional_embeddings at every
    grid to 12x12 from a 4x4 table, exactly: one patch wide too, where torch's CPU kernel
    gives every row the first row's values (not the formula, which ours gives otherwise)."""
    from transformers.models.siglip2.modeling_siglip2 import Siglip2VisionEmbeddings

    from vit_export.model import resample_pos_embed

    g, D = 4, 24
    weight = torch.randn(g * g, D, generator=torch.Generator().manual_seed(0))
    for h in range(1, 13):
        for w in range(1, 13):
            expected = Siglip2VisionEmbeddings.resize_positional_embeddings(
                weight.reshape(g, g, D), torch.tensor([[h, w]]), h * w)[0]
            ours = resample_pos_embed(weight[None], (h, w), 0, mode="bilinear")[0]
            assert torch.equal(expected, ours), (h, w)


def test_siglip2_one_patch_wide_or_high_is_transformers_own(tmp_path):
    """A grid one patch wide (192x16, 32x16), one high (16x192), one patch (16x16), the
    table's height one wide (64x16) and 224x224, from a 4x4 table of patch 16: eager and
    model.onnx under --dynamic-size are transformers' own pooled output to 1e-5 of its
    largest value. (At width 1 torch's CPU resize repeats the table's first row; ours did
    not, and was 2.4e-3 off at 192x16.)"""
    peer = siglip2(grid=4, patch=16)
    model, description = load_checkpoint(save_hf(peer, tmp_path / "siglip2"))
    dynamic = with_dynamic_size(model)
    path = tmp_path / "dynamic.onnx"
    export_onnx(dynamic, path, B.Description(dynamic.config, description.preprocessing).to_json())
    session = runtime.ort_runner(path, "cpu")
    for size in [(192, 16), (16, 192), (16, 16), (32, 16), (64, 16), (224, 224)]:
        x = inputs(model, 2, size, seed=size[0] + size[1])
        expected = siglip2_output(peer, x).numpy()
        with torch.no_grad():
            assert rel_error(expected, dynamic(x).numpy()) <= 1e-5, size
        assert rel_error(expected, session(x.numpy())) <= 1e-5, size


def test_siglip2s_processor_is_reproduced_for_square_images(photo_files):
    """Siglip2's NaFlex processor resizes a square image to the square grid of its patch
    budget: the pixels of its patches are ours. (Other aspect ratios get other grids there;
    the import says so in a note.)"""
    from PIL import Image

    from vit_export.preprocessing import hf_preprocessing, preprocess

    P = 16
    reference = transformers.Siglip2ImageProcessorPil(max_num_patches=256, patch_size=P)
    prep = hf_preprocessing(reference.to_dict())
    assert (prep.img_size, prep.crop_mode, prep.interpolation) == (256, "squash", "bilinear")
    for path in photo_files:
        image = Image.open(path).convert("RGB")
        side = min(image.size)
        image = image.crop((0, 0, side, side))
        out = reference(image, return_tensors="pt")
        h, w = out["spatial_shapes"][0].tolist()
        expected = out["pixel_values"][0][:h * w].reshape(h, w, P, P, 3).permute(4, 0, 2, 1, 3)
        expected = expected.reshape(3, h * P, w * P).numpy()
        assert (h, w) == (16, 16)
        assert np.abs(preprocess(image, prep) - expected).max() <= 1e-6, path


@pytest.mark.slow  # 10 s; the rotary families' exports and parity stay in the quick suite
def test_a_rotary_model_exports_and_validates_through_the_cli(tmp_path):
    """The user's path for a timm DINOv3: export --timm-name --dynamic-size with the fp16
    variant (the scan proves the tables come from the input's grid), validate --layers naming
    the rotary stages, info; --optimize, which cannot fuse rotary attention, says so in
    one line."""
    name = "vit_small_patch16_dinov3"
    peer = tiny_timm(name, num_classes=0)
    torch.save(peer.state_dict(), tmp_path / "w.pth")
    out = tmp_path / "bundle"
    common = ["--checkpoint", str(tmp_path / "w.pth"), "--timm-name", name, "--set",
              f"img_size={peer.patch_embed.img_size[0]}", "--set", "num_heads=6",
              "--provider", "cpu"]
    code, stdout, err = run("export", str(out), *common, "--dynamic-size", "--precision", "fp16")
    assert code == 0, err
    assert "model.fp16.onnx: rotary tables computed from the input's grid: ok" in stdout
    code, stdout, err = run("validate", str(out), "--layers")
    assert code == 0, err
    for stage in ("model.fp16.onnx rotary table", "model.onnx block 1 rotary attention"):
        assert stage in stdout, stage
    assert "rope_type dinov3" in run("info", str(out))[1]
    with pytest.raises(ExportError, match="fuses plain attention; this model's rotates"):
        to_optimized(out / B.ONNX_FILE, B.read_bundle(out).description.config)


@pytest.mark.parametrize("key, value", [("use_gated_mlp", True), ("num_register_tokens", 7),
                                        ("patch_size", 16), ("hidden_size", 128)])
def test_a_config_json_that_contradicts_the_weights_is_refused(key, value, tmp_path):
    """The model is built as config.json says: weights of another MLP, register count, patch
    or width do not fit it, and that is one line, not a bundle of what the weights say."""
    folder = save_hf(tiny_hf("DINOv3ViTModel"), tmp_path / "hf")
    doc = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**doc, key: value}))
    with pytest.raises((CheckpointError, ConfigError)) as info:
        load_checkpoint(folder)
    assert "\n" not in str(info.value)


@pytest.mark.slow  # quick suite under 3 min on a Zen 3 (2 cores): CI runs it
def test_a_mixed_rotary_model_as_deep_as_the_export_batch_is_not_a_baked_batch(tmp_path):
    """ROPE-ViT mixed's tables are [depth, heads, N, 2d]: with depth 2 and the export batch 2,
    the table's reshapes start with 2, and they are not the batch."""
    from vit_export.exporting import example_size
    from vit_export.parity import scan_graph

    _, model, description = imported("vit_small_patch16_rope_mixed_224", tmp_path)
    model = with_dynamic_size(model)
    assert model.config.depth == 2
    path = tmp_path / "model.onnx"
    export_onnx(model, path, B.Description(model.config, description.preprocessing).to_json(),
                batch=2)
    checks = {c.name: c for c in scan_graph(path, 2, model.config, example_size(model.config))}
    assert checks["model.onnx: no baked batch in shape constants"].passed


@pytest.mark.parametrize("folded", [None, "[N, 2d]", "[N, d/2, 2]", "[depth, heads, N, 2d]"])
def test_a_rotary_table_folded_for_the_example_grid_fails_the_dynamic_size_scan(folded,
                                                                                 tmp_path):
    """Under a dynamic size the tables must follow the input's grid: a constant holding the
    example's patch count, in any layout an exporter folds it to, fails the scan even beside
    Sin and Cos nodes; without it the same graph passes."""
    from vit_export.parity import scan_graph

    config = ViTConfig.from_dict({"img_size": 48, "patch_size": 16, "embed_dim": EMBED,
                                  "num_heads": 4, "depth": 2, "rope_type": "dinov3",
                                  "pos_embed": "none", "dynamic_img_size": True})
    (h, w), d = example_size(config), EMBED // 4
    n = (h // 16) * (w // 16)
    dims = {"[N, 2d]": [n, 2 * d], "[N, d/2, 2]": [n, d // 2, 2],
            "[depth, heads, N, 2d]": [2, 4, n, 2 * d]}.get(folded)
    helper = onnx.helper
    nodes = [helper.make_node("ReduceMean", ["pixel_values"], ["mean"], keepdims=0),
             helper.make_node("Sin", ["mean"], ["sin"]),
             helper.make_node("Cos", ["sin"], ["logits"])]
    tables = [helper.make_tensor("table", onnx.TensorProto.FLOAT, dims,
                                 np.zeros(int(np.prod(dims)), np.float32))] if dims else []
    graph = helper.make_graph(
        nodes, "vit", [helper.make_tensor_value_info("pixel_values", onnx.TensorProto.FLOAT,
                                                     ["batch", 3, "height", "width"])],
        [helper.make_tensor_value_info("logits", onnx.TensorProto.FLOAT, ["batch"])], tables)
    onnx.save(helper.make_model(graph), tmp_path / "model.onnx")
    checks = {c.name: c for c in scan_graph(tmp_path / "model.onnx", 2, config, (h, w))}
    check = checks["model.onnx: rotary tables computed from the input's grid"]
    assert check.passed == (folded is None), check.detail
    assert check.detail.endswith(f"table {dims}" if dims else "none")


@pytest.mark.slow  # quick suite under 3 min on this Zen 3: CI runs it
def test_a_hugging_face_folder_exports_and_validates_through_the_cli(tmp_path):
    """The user's path: export --checkpoint FOLDER (validated before it is written), info."""
    folder = save_hf(tiny_hf("Dinov2WithRegistersModel"), tmp_path / "hf")
    out = tmp_path / "bundle"
    code, _, err = run("export", str(out), "--checkpoint", str(folder), "--provider", "cpu",
                       "--quiet")
    assert code == 0, err
    session = runtime.ort_runner(out / B.ONNX_FILE, "cpu")
    model, _ = load_checkpoint(folder)
    x = inputs(model, 3)
    expected = hf_output("Dinov2WithRegistersModel", tiny_hf("Dinov2WithRegistersModel"), x)
    assert rel_error(expected.numpy(), session(x.numpy())) <= 1e-4
    info = run("info", str(out))[1]
    assert "output: embedding [batch, 96]" in info and "reg_tokens 4" in info


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.slow) for n in HF_FAMILIES])
def test_onnx_matches_hugging_face(name, tmp_path):
    peer, model, description = hf_imported(name, tmp_path)
    path = tmp_path / "model.onnx"
    export_onnx(model, path, B.Description(model.config, description.preprocessing).to_json())
    session = runtime.ort_runner(path, "cpu")
    for batch in (1, 3):
        x = inputs(model, batch, seed=batch)
        assert rel_error(hf_output(name, peer, x).numpy(), session(x.numpy())) <= 1e-4


@pytest.mark.parametrize("build, message", [
    (lambda: transformers.ResNetModel(transformers.ResNetConfig(
        embedding_size=8, hidden_sizes=[8, 16], depths=[1, 1])),
     "model_type 'resnet' is not supported"),
    (lambda: transformers.SiglipVisionModel(transformers.SiglipVisionConfig(
        hidden_size=EMBED, num_hidden_layers=1, num_attention_heads=4, intermediate_size=192,
        vision_use_head=False)),
     "vision_use_head is false"),
    (lambda: transformers.Dinov2Model(transformers.Dinov2Config(
        hidden_size=EMBED, num_hidden_layers=1, num_attention_heads=4, use_swiglu_ffn=True)),
     "SwiGLU MLP is not supported yet"),
])
def test_hugging_face_models_we_do_not_build_are_one_line(build, message, tmp_path):
    save_hf(build(), tmp_path / "hf")
    code, _, err = run("export", str(tmp_path / "out"), "--checkpoint", str(tmp_path / "hf"))
    assert code == 1 and message in one_line(err), err
    assert not (tmp_path / "out").exists()
