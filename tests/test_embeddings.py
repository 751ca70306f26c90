"""Embeddings: a bundle that gives one, how it is validated, and `infer --embed`,
proved against the source framework: its own image processor and model on real photos."""
import json

import numpy as np
import pytest
import torch
from conftest import DIGITS, one_line, run
from families import (
    EMBEDDERS,
    HF_PATCH,
    cosines,
    hf_embedder,
    hf_output,
    perturb,
    save_hf,
    tiny_hf,
    tiny_timm,
)

from vit_export import bundle as B
from vit_export import parity
from vit_export.embeddings import inputs_path, read

transformers = pytest.importorskip("transformers")

SIDE = 3 * HF_PATCH  # the tiny models' input side (families.tiny_hf: a 3 x 3 patch grid)


@pytest.mark.slow  # 7-11 s each on 2 cores of a Zen 3: the whole suite runs them
@pytest.mark.parametrize("name", EMBEDDERS)
def test_infer_embed_is_the_source_frameworks_embedding_of_real_photos(name, photo_files,
                                                                       tmp_path):
    """CLIP (image_embeds), SigLIP and DINOv2 (pooler_output) from Hugging Face folders with
    their processors: infer --embed on photos, grayscale and RGBA ones too, equals processor
    + model at cosine >= 0.99999, in Parquet, .npy and JSON alike; --normalize divides by the
    norm in the graph."""
    folder, expected = hf_embedder(name, tmp_path / "hf", photo_files)
    for normalize in (False, True):
        out = tmp_path / f"bundle{int(normalize)}"
        code, _, err = run("export", out, "--checkpoint", folder, "--provider", "cpu",
                           "--quiet", *(["--normalize"] if normalize else []))
        assert code == 0, err
        assert json.loads((out / B.CONFIG_FILE).read_text())["io"]["outputs"] == ["embedding"]
        code, stdout, err = run("infer", out, *photo_files, "--embed", "--output",
                                tmp_path / f"e{int(normalize)}.parquet")
        assert code == 0, err
        names, got = read(tmp_path / f"e{int(normalize)}.parquet")
        assert names == [str(f) for f in photo_files]
        assert cosines(expected, got).min() >= 0.99999, name
        norms = np.linalg.norm(got, axis=1)
        if normalize:
            assert np.abs(norms - 1).max() <= 1e-5
            assert np.abs(got - expected / np.linalg.norm(expected, axis=1,
                                                          keepdims=True)).max() <= 1e-5
        else:
            assert np.abs(got - expected).max() <= 1e-4 * np.abs(expected).max()
    # validate on the photos: neighbours agree, and our preprocessing is the processor's
    # (CLIP's resizes the shortest edge to its crop: the crop still squares a photo)
    code, stdout, err = run("validate", out, "--images", photo_files[0].parent, "--quiet")
    assert code == 0, stdout + err
    line = next(x for x in stdout.splitlines() if "our preprocessing vs Hugging Face" in x)
    assert f"{len(photo_files)} image(s): embedding max abs" in line
    assert "note: neighbours not judged on images: fewer than 31 images" in stdout
    code, _, err = run("infer", out, *photo_files, "--embed", "--output", tmp_path / "e.npy")
    assert code == 0, err
    npy_names, npy = read(tmp_path / "e.npy")
    assert npy_names == names and np.array_equal(npy, got)
    code, stdout, err = run("infer", out, *photo_files, "--embed", "--json")
    assert code == 0, err
    records = json.loads(stdout)["results"]
    assert [r["input"] for r in records] == names
    assert np.array_equal(np.array([r["embedding"] for r in records], np.float32), got)


@pytest.mark.slow  # quick suite under 3 min on a Zen 3 (2 cores): CI runs it
def test_export_outputs_embedding_of_a_timm_classifier_is_forward_head_pre_logits(tmp_path):
    """--outputs embedding on a model with a classifier: timm's forward_head(pre_logits=True)
    (DINOv2 with registers: LayerScale, four registers), validated by cosine and by
    neighbours; infer then refuses to classify it, and --embed on a logits bundle is refused."""
    timm_model = tiny_timm("vit_small_patch14_reg4_dinov2", num_classes=7)
    checkpoint = tmp_path / "model.pth"
    torch.save(timm_model.state_dict(), checkpoint)
    out = tmp_path / "bundle"
    code, stdout, err = run("export", out, "--checkpoint", checkpoint, "--timm-name",
                            "vit_small_patch14_reg4_dinov2", "--set", "img_size=42", "--set", "num_heads=6",
                            "--outputs", "embedding", "--provider", "cpu")
    assert code == 0, err
    assert "nn@10" in stdout and "PASS" in stdout
    assert "output: embedding [batch, 96] (the pooled features before the head)" in \
        run("info", out)[1]
    x = torch.randn(5, 3, 42, 42, generator=torch.Generator().manual_seed(1))
    arrays = tmp_path / "arrays"
    arrays.mkdir()
    for i, row in enumerate(x.numpy()):
        np.save(arrays / f"{i}.npy", row)
    code, _, err = run("infer", out, arrays, "--embed", "--output", tmp_path / "e.npy")
    assert code == 0, err
    with torch.no_grad():
        expected = timm_model.forward_head(timm_model.forward_features(x),
                                           pre_logits=True).numpy()
    names, got = read(tmp_path / "e.npy")
    assert names == [str(arrays / f"{i}.npy") for i in range(5)]
    assert np.abs(got - expected).max() <= 1e-4 * np.abs(expected).max()
    assert json.loads(inputs_path(tmp_path / "e.npy").read_text()) == names
    code, _, err = run("infer", out, arrays)
    assert code == 1 and one_line(err) == (f"Error: {out} gives an embedding (96 wide), not "
                                           f"classes: use --embed")
    logits = tmp_path / "logits"
    assert run("export", logits, "--checkpoint", checkpoint, "--timm-name",
               "vit_small_patch14_reg4_dinov2", "--set", "img_size=42", "--set", "num_heads=6", "--provider", "cpu",
               "--quiet")[0] == 0
    code, _, err = run("infer", logits, arrays, "--embed")
    assert code == 1 and one_line(err) == (
        f"Error: {logits} gives logits, not an embedding: export it with --outputs embedding "
        f"(the pooled features before its head), or logits,embedding for both")


WANT = "name one or more of logits, embedding, tokens, comma-separated, each once"
NO_EMBEDDING = ("normalises the embedding, which this export does not give: add --outputs "
                "embedding")


@pytest.mark.parametrize("args, code, message", [
    (["--outputs", "logits,logits"], 2, f"Error: --outputs logits,logits: {WANT}"),
    (["--outputs", "probs"], 2, f"Error: --outputs probs: {WANT}"),
    (["--outputs", "logits,"], 2, f"Error: --outputs logits,: {WANT}"),
    (["--outputs", ""], 2, f"Error: --outputs '': {WANT}"),
    (["--normalize"], 2, f"Error: --normalize {NO_EMBEDDING}"),
    (["--outputs", "logits,tokens", "--normalize"], 2, f"Error: --normalize {NO_EMBEDDING}"),
    (["--set", "num_classes=0", "--outputs", "logits"], 1,
     "Error: output logits needs a classifier head (num_classes > 0)"),
    (["--set", "num_classes=0", "--outputs", "embedding,logits"], 1,
     "Error: output logits needs a classifier head (num_classes > 0)"),
])
def test_export_refuses_outputs_it_cannot_give(args, code, message, tmp_path):
    got, _, err = run("export", tmp_path / "out", "--preset", "vit_seed_tiny", *args)
    assert got == code and one_line(err) == message
    assert not (tmp_path / "out").exists()


@pytest.mark.slow  # quick suite under 3 min on this Zen 3: CI runs it
def test_infer_embed_refuses_bad_outputs_and_writes_nothing(tmp_path, digit_images):
    embedded = tmp_path / "emb"
    assert run("export", embedded, "--preset", "vit_seed_tiny", "--set", "in_chans=1",
               "--set", "img_size=8", "--set", "patch_size=4", "--outputs", "embedding",
               "--quiet", "--provider", "cpu")[0] == 0
    code, _, err = run("infer", embedded, *digit_images[:2], "--embed", "--output",
                       tmp_path / "e.csv")
    assert code == 2 and one_line(err) == (f"Error: --output {tmp_path / 'e.csv'}: embeddings "
                                           f"are written as FILE.npy or FILE.parquet")
    code, _, err = run("infer", embedded, *digit_images[:2], "--embed", "--output",
                       tmp_path / "missing" / "e.npy")
    assert code == 2 and "missing" in one_line(err)
    code, _, err = run("infer", embedded, *digit_images[:2], "--embed", "--ray", "--output",
                       tmp_path / "e.npy")  # refused before Ray starts
    assert code == 2 and one_line(err) == (f"Error: --output {tmp_path / 'e.npy'}: --ray "
                                           f"--embed writes FILE.parquet (or JSON lines to "
                                           f"FILE.jsonl)")
    code, _, err = run("infer", embedded, *digit_images[:2], "--ray", "--output",
                       tmp_path / "classes.parquet")
    assert code == 2 and one_line(err) == (f"Error: --output {tmp_path / 'classes.parquet'}: "
                                           f"--ray writes classes as JSON lines (FILE.jsonl); "
                                           f"Parquet is for --embed")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["emb"]
    # a second run replaces a .npy and its input order together, leaving nothing staged, and
    # only when told: without --force what is there stays
    for count, force in ((3, ()), (2, ("--force",))):
        assert run("infer", embedded, *digit_images[:count], "--embed", "--output",
                   tmp_path / "e.npy", *force)[0] == 0
        names, values = read(tmp_path / "e.npy")
        assert names == [str(f) for f in digit_images[:count]] and len(values) == count
        code, _, err = run("infer", embedded, *digit_images[:1], "--embed", "--output",
                           tmp_path / "e.npy")
        assert code == 1 and one_line(err) == (f"Error: {tmp_path / 'e.npy'} exists; use "
                                               f"--force to replace it")
        assert read(tmp_path / "e.npy")[0] == names
    assert sorted(p.name for p in tmp_path.iterdir()) == ["e.inputs.json", "e.npy", "emb"]


def test_a_parquet_file_this_command_did_not_write_is_one_line_on_resume(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from vit_export.deploy.ray import data as batch
    from vit_export.errors import InputError

    path = tmp_path / "foreign.parquet"
    pq.write_table(pa.table({"input": ["a"], "embedding": [[1.0, 2.0]]}), path)  # list<double>
    with pytest.raises(InputError, match="not embeddings this command wrote"):
        batch.read_records([path])


def test_neighbour_agreement_counts_overlap_and_excuses_near_ties():
    rng = np.random.default_rng(0)
    ref = rng.standard_normal((40, 16))
    assert parity.neighbour_agreement(ref, ref, 10) == (1.0, 1.0)
    assert parity.neighbour_agreement(ref, 3 * ref, 10) == (1.0, 1.0)  # cosine: scale-free
    shuffled = ref[rng.permutation(40)]
    raw, decisive = parity.neighbour_agreement(ref, shuffled, 10)
    assert raw < 0.6 and decisive < 0.6  # unrelated spaces: about 10/39 by chance
    assert parity.neighbour_agreement(ref, shuffled, 10, block=7) == (raw, decisive)
    with pytest.raises(ValueError):  # 11 rows: every other row is a neighbour
        parity.neighbour_agreement(ref[:11], shuffled[:11], 10)
    # too few images to judge: not judged, rather than passed by construction
    m = parity.compare(ref[:30], shuffled[:30], parity.PROFILES["int8"], output="embedding",
                       neighbours=True)
    assert m["top1"] is None
    # two neighbours a hair apart in cosine swap places: a near-tie, excused with a margin
    a = np.array([[1.0, 0.0], [0.8, 0.6], [0.7999, -0.6], [-1.0, 0.0]])
    b = a.copy()
    b[2] = [0.8, -0.59]  # now nearer to row 0 than row 1 is, by a hair
    raw, decisive = parity.neighbour_agreement(a, b, 1)
    assert raw < 1.0 and decisive < 1.0
    assert parity.neighbour_agreement(a, b, 1, margin=1e-3)[1] == 1.0
    m = parity.compare(ref, shuffled, parity.PROFILES["fp32"], output="embedding",
                       neighbours=True)
    assert not m["passed"] and any("top-10 neighbour agreement" in f for f in m["failures"])
    # random inputs have no neighbours worth keeping: values and direction only
    m = parity.compare(ref, ref + 1e-7, parity.PROFILES["fp32"], output="embedding")
    assert m["passed"] and m["top1"] is None and m["top1_decisive"] is None
    # an int8 embedding whose neighbours mostly hold passes its profile; one that lost
    # them does not, whatever its cosine
    close = ref + 0.02 * rng.standard_normal(ref.shape)
    m = parity.compare(ref, close, parity.PROFILES["int8"], output="embedding", neighbours=True)
    assert m["top1_decisive"] >= parity.PROFILES["int8"].min_neighbours and m["passed"], m


def test_the_clip_projection_is_the_embedding_and_the_seed_models_logits_stay():
    """CLIPVisionModelWithProjection's head is its visual_projection: the bundle's output
    is the embedding (image_embeds), not logits; a preset still gives logits."""
    from vit_export.model import ViTConfig

    assert ViTConfig(num_classes=10).output_names == ("logits",)
    assert ViTConfig(num_classes=0).output_names == ("embedding",)
    config = ViTConfig(num_classes=32, projection_head=True)
    assert config.output_names == ("embedding",) and config.output_shape("embedding") == (32,)
    config = ViTConfig(num_classes=10, output="embedding,logits,tokens", embed_dim=96,
                       num_heads=4, img_size=32, patch_size=8)
    assert [config.output_shape(n) for n in config.output_names] == [(96,), (10,), (16, 96)]
    assert config.replace(dynamic_img_size=True).output_shape("tokens") == ("patches", 96)


def test_perturbed_weights_make_the_embedding_comparison_see_something(tmp_path):
    """A guard on this file's premise: the tiny models' embeddings differ between photos
    (random weights at order 1), so cosine and neighbours can fail."""
    peer = tiny_hf("Dinov2Model")
    x = torch.randn(4, 3, SIDE, SIDE, generator=torch.Generator().manual_seed(0))
    e = hf_output("Dinov2Model", perturb(peer, 1), x).numpy()
    assert cosines(e[:2], e[2:]).max() < 0.999


@pytest.mark.slow  # quick suite under 3 min on a Zen 3 (2 cores): CI runs it
def test_every_variant_gives_the_embedding(tmp_path):
    """fp16, dynamic int8 and the preprocessing graph carry the same one output, named
    embedding, as model.onnx and TorchScript's description; each validated at export."""
    import onnx

    out = tmp_path / "variants"
    code, stdout, err = run("export", out, "--preset", "vit_seed_tiny", "--set",
                            "init_values=0.5", "--outputs", "embedding", "--normalize",
                            "--precision", "fp16", "--quantize", "int8",
                            "--embed-preprocessing", "--provider", "cpu")
    assert code == 0, err
    files = sorted(p.name for p in out.glob("*.onnx"))
    assert files == ["model.e2e.onnx", "model.fp16.onnx", "model.int8.onnx", "model.onnx"]
    for name in files:
        graph = onnx.load(str(out / name), load_external_data=False).graph
        assert [o.name for o in graph.output] == ["embedding"], name
        assert graph.output[0].type.tensor_type.shape.dim[1].dim_value == 64, name
    for name in ("onnxruntime[model.fp16.onnx]", "onnxruntime[model.int8.onnx]",
                 "onnxruntime[model.e2e.onnx]"):
        assert any(line.startswith(name) and line.endswith("ok")
                   for line in stdout.splitlines()), (name, stdout)
    config = B.read_description(out / B.TS_FILE).config
    assert (config.output_names, config.normalize) == (("embedding",), True)


@pytest.mark.slow  # quick suite under 3 min on a Zen 3 (2 cores): CI runs it
def test_one_bundle_gives_logits_embedding_and_tokens_from_every_file(tmp_path, digit_images):
    """--outputs logits,embedding,tokens: every file of the bundle (model.onnx, its fp16,
    int8 and preprocessing variants, TorchScript, the torch.export program) gives the three
    outputs in that order, each validated against eager by what it is (logits by top-1, the
    embedding by direction, the tokens by each token's cosine); info and config.json list
    them; infer classifies with the logits and --embed answers with the embedding."""
    import onnx

    from vit_export.runtime import load_torch_file

    out = tmp_path / "three"
    code, stdout, err = run("export", out, "--from", DIGITS, "--outputs",
                            "logits,embedding,tokens", "--precision", "fp16", "--quantize",
                            "int8", "--embed-preprocessing", "--pt2", "--provider", "cpu")
    assert code == 0, err
    assert json.loads((out / B.CONFIG_FILE).read_text())["io"]["outputs"] == [
        "logits", "embedding", "tokens"]
    for name in sorted(p.name for p in out.glob("*.onnx")):
        graph = onnx.load(str(out / name), load_external_data=False).graph
        assert [(o.name, [d.dim_param or d.dim_value for d in o.type.tensor_type.shape.dim])
                for o in graph.output] == [("logits", ["batch", 10]), ("embedding", ["batch", 64]),
                                           ("tokens", ["batch", 16, 64])], name
    rows = [line.split() for line in stdout.splitlines() if line.startswith(("torchscript",
                                                                             "pt2", "onnxruntime"))]
    for runner in ("torchscript", "pt2", "onnxruntime", "onnxruntime[model.fp16.onnx]",
                   "onnxruntime[model.int8.onnx]", "onnxruntime[model.e2e.onnx]"):
        compared = [word for row in rows if row[0] == runner for word in row
                    if word in ("logits", "embedding", "tokens")]  # the output column
        assert sorted(set(compared)) == ["embedding", "logits", "tokens"], (runner, stdout)
    assert all(row[-1] == "ok" for row in rows) and "PASS" in stdout
    assert ("profile int8: max abs <= inf, max rel <= 0.25, cosine >= 0.99, top-1 >= 0.95, "
            "nn@10 >= 0.9, token cosine >= 0.98") in stdout
    assert run("info", out)[1].count("output: ") == 3
    assert "output: tokens [batch, 16, 64] (the patch tokens, the prefix left out)" in \
        run("info", out)[1]
    # the tokens are forward_features' patch tokens, the embedding forward_head's pre-logits
    eager = B.load_eager(B.read_bundle(out))
    x = torch.randn(3, 1, 8, 8, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        logits, embedding, tokens = eager(x)
        features = eager.forward_features(x)
        assert torch.equal(tokens, features[:, 1:])
        assert torch.equal(embedding, eager.forward_head(features, pre_logits=True))
        assert torch.equal(logits, eager.forward_head(features))
    traced = load_torch_file("torchscript", out / B.TS_FILE)
    got = traced.run_all(x.numpy())
    assert list(got) == ["logits", "embedding", "tokens"]
    assert np.abs(got["tokens"] - tokens.numpy()).max() <= 1e-5
    code, stdout, _ = run("infer", out, *digit_images[:3], "--top-k", "1", "--json")
    assert code == 0 and len(json.loads(stdout)["results"]) == 3
    code, stdout, _ = run("infer", out, *digit_images[:3], "--embed", "--json")
    embedded = json.loads(stdout)["results"]
    assert code == 0 and [len(r["embedding"]) for r in embedded] == [64, 64, 64]


@pytest.mark.slow  # quick suite under 3 min on a Zen 3 (2 cores): CI runs it
def test_tokens_of_a_dynamic_size_bundle_follow_the_image(tmp_path):
    """DINOv2 with registers from timm: the tokens output is timm's forward_features with
    the class token and four registers left out, [batch, patches, D], its patch count
    symbolic under --dynamic-size and right at other sizes."""
    import onnxruntime as ort

    timm_model = tiny_timm("vit_small_patch14_reg4_dinov2", num_classes=0)
    checkpoint = tmp_path / "model.pth"
    torch.save(timm_model.state_dict(), checkpoint)
    out = tmp_path / "bundle"
    code, _, err = run("export", out, "--checkpoint", checkpoint, "--timm-name",
                       "vit_small_patch14_reg4_dinov2", "--set", "img_size=42", "--set", "num_heads=6", "--outputs",
                       "embedding,tokens", "--dynamic-size", "--provider", "cpu", "--quiet")
    assert code == 0, err
    session = ort.InferenceSession(str(out / B.ONNX_FILE), providers=["CPUExecutionProvider"])
    assert [(o.name, o.shape) for o in session.get_outputs()] == [
        ("embedding", ["batch", 96]), ("tokens", ["batch", "patches", 96])]
    timm_dynamic = tiny_timm("vit_small_patch14_reg4_dinov2", num_classes=0, dynamic=True)
    for h, w in ((42, 42), (28, 56)):
        x = torch.randn(2, 3, h, w, generator=torch.Generator().manual_seed(h))
        embedding, tokens = session.run(None, {"pixel_values": x.numpy()})
        with torch.no_grad():
            features = timm_dynamic.forward_features(x)
        expected = features[:, 5:].numpy()
        assert tokens.shape == (2, (h // 14) * (w // 14), 96)
        assert np.abs(tokens - expected).max() <= 1e-4 * np.abs(expected).max(), (h, w)
        pooled = timm_dynamic.forward_head(features, pre_logits=True).numpy()
        assert np.abs(embedding - pooled).max() <= 1e-4 * np.abs(pooled).max(), (h, w)


def test_tokens_are_judged_token_by_token():
    """One patch token of fifty turned by 22 degrees: the per-token cosine sees it (0.93,
    under int8's token floor) where a cosine over the flattened sample would not (0.9986,
    above int8's per-sample floor); tokens have no decisions to agree on."""
    rng = np.random.default_rng(0)
    ref = rng.standard_normal((2, 50, 16))
    cand = ref.copy()
    token = ref[1, 7]
    away = rng.standard_normal(16)
    away -= away @ token / (token @ token) * token  # orthogonal to the token
    cand[1, 7] = token + 0.4 * np.linalg.norm(token) * away / np.linalg.norm(away)
    int8 = parity.PROFILES["int8"]
    m = parity.compare(ref, cand, int8, output="tokens")
    assert m["cosine"] == pytest.approx(1 / np.sqrt(1.16)) and m["top1"] is None
    assert m["failures"] == [f"token cosine {m['cosine']:.7f} < {int8.min_token_cosine}"]
    flat = parity.compare(ref.reshape(2, -1), cand.reshape(2, -1), int8, output="embedding")
    assert flat["cosine"] > int8.min_cosine and flat["passed"]
    close = ref + 1e-9 * rng.standard_normal(ref.shape)
    assert parity.compare(ref, close, parity.PROFILES["fp32"], output="tokens")["passed"]
    assert parity.profile_tolerance("int8", {"min_cosine": 0.5}).min_token_cosine == 0.5


@pytest.mark.parametrize("name, prefix", [
    ("Dinov2Model", 1), pytest.param("Dinov2WithRegistersModel", 5, marks=pytest.mark.slow)])
def test_tokens_are_transformers_patch_tokens(name, prefix, tmp_path):
    """From a Hugging Face folder, --outputs embedding,tokens: the tokens are transformers'
    last_hidden_state with the class token (and registers) left out, the embedding its
    pooler_output, in model.onnx and TorchScript alike."""
    import onnxruntime as ort

    from vit_export.runtime import load_torch_file

    peer = tiny_hf(name)
    folder = save_hf(peer, tmp_path / "hf")
    out = tmp_path / "bundle"
    code, _, err = run("export", out, "--checkpoint", folder, "--outputs", "embedding,tokens",
                       "--provider", "cpu", "--quiet")
    assert code == 0, err
    x = torch.randn(3, 3, SIDE, SIDE, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        theirs = peer(pixel_values=x)
    patches = theirs.last_hidden_state[:, prefix:].numpy()
    pooled = theirs.pooler_output.numpy()
    session = ort.InferenceSession(str(out / B.ONNX_FILE), providers=["CPUExecutionProvider"])
    traced = load_torch_file("torchscript", out / B.TS_FILE).run_all(x.numpy())
    for embedding, tokens in (session.run(None, {"pixel_values": x.numpy()}),
                              (traced["embedding"], traced["tokens"])):
        assert tokens.shape == (3, 9, 96)
        assert np.abs(tokens - patches).max() <= 1e-4 * np.abs(patches).max()
        assert np.abs(embedding - pooled).max() <= 1e-4 * np.abs(pooled).max()
