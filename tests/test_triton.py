"""The Triton model repository: every config.pbtxt read with Triton's own schema and checked
against the ONNX graph it serves, and the TorchScript model run from the repository."""
import shutil

import numpy as np
import onnx
import pytest
import torch
from conftest import make_bundle, one_line, run
from google.protobuf import text_format

# Triton's schema comes with the serve extra; without it the repositories go unchecked here
model_config_pb2 = pytest.importorskip("tritonclient.grpc.model_config_pb2")
triton_to_np_dtype = pytest.importorskip("tritonclient.utils").triton_to_np_dtype

from vit_export import bundle as B
from vit_export import runtime
from vit_export.deploy import DEFAULT_MAX_BATCH_SIZE, triton
from vit_export.errors import BundleError
from vit_export.model import random_input

TINY_MODELS = ["vit_seed_tiny_onnx", "vit_seed_tiny_torchscript"]
VARIANT_MODELS = ["vit_seed_tiny_onnx", "vit_seed_tiny_onnx_fp16", "vit_seed_tiny_onnx_int8",
                  "vit_seed_tiny_onnx_opt", "vit_seed_tiny_onnx_opt_fp16",
                  "vit_seed_tiny_torchscript"]
GPU = triton.TritonOptions(device="cuda", max_batch_size=16, preferred_batch_sizes=(4, 8),
                            max_queue_delay_us=500, instances=2, tensorrt=True, torchscript=True)


@pytest.fixture(scope="module")
def repo(tiny_bundle, tmp_path_factory):
    """The tiny bundle (labels, no variants) served with the default options and its
    TorchScript model."""
    return triton.write_repository(tiny_bundle, tmp_path_factory.mktemp("triton") / "repo",
                                   triton.TritonOptions(torchscript=True)).path


@pytest.fixture(scope="module")
def variants_bundle(tmp_path_factory):
    """fp16 and optimized fp16 (with fp16 I/O), optimized and int8 models beside model.onnx,
    whose weights are in model.onnx.data; no labels: `export --precision fp16 --fp16-io
    --optimize --quantize int8`."""
    return make_bundle(tmp_path_factory.mktemp("bundles") / "variants", external_data=True,
                       precision="fp16", optimize=True, quantize="int8", fp16_io=True)


@pytest.fixture(scope="module")
def variants_repo(variants_bundle, tmp_path_factory):
    return triton.write_repository(variants_bundle,
                                   tmp_path_factory.mktemp("triton") / "repo", GPU).path


def read_config(folder):
    """config.pbtxt parsed with Triton's schema; an unknown field is a ParseError."""
    text = (folder / triton.CONFIG_FILE).read_text()
    return text_format.Parse(text, model_config_pb2.ModelConfig())


def np_dtype(data_type):
    """Triton's own mapping from a config data type to numpy (tritonclient.utils)."""
    return triton_to_np_dtype(model_config_pb2.DataType.Name(data_type).removeprefix("TYPE_"))




def listing(folder):
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


@pytest.mark.parametrize("which, count", [("repo", 1), ("variants_repo", 5)])
def test_onnx_configs_follow_tritons_schema_and_the_graph(request, which, count):
    checked = 0
    for folder in sorted(request.getfixturevalue(which).iterdir()):
        config = read_config(folder)
        assert config.name == folder.name
        if config.platform != "onnxruntime_onnx":
            continue
        assert config.backend == "onnxruntime" and config.max_batch_size >= 1
        graph = onnx.load(str(folder / "1" / "model.onnx"), load_external_data=False).graph
        for served, values in ((config.input, graph.input), (config.output, graph.output)):
            assert [t.name for t in served] == [v.name for v in values]
            for tensor, value in zip(served, values):
                shape = value.type.tensor_type.shape.dim
                assert shape[0].dim_param == B.BATCH_DIM  # Triton's batch axis, not in dims
                assert list(tensor.dims) == [d.dim_value or -1 for d in shape[1:]]
                assert np_dtype(tensor.data_type) == onnx.helper.tensor_dtype_to_np_dtype(
                    value.type.tensor_type.elem_type)
        checked += 1
    assert checked == count


def test_fp16_io_model_is_served_as_fp16_and_the_rest_as_fp32(variants_repo):
    types = {folder.name: {model_config_pb2.DataType.Name(t.data_type)
                           for t in [*read_config(folder).input, *read_config(folder).output]}
             for folder in variants_repo.iterdir()}
    assert types == {name: {"TYPE_FP16" if name.endswith("fp16") else "TYPE_FP32"}
                     for name in VARIANT_MODELS}


@pytest.mark.parametrize("batch", [1, 5])
def test_torchscript_from_the_repository_matches_the_onnx_model(repo, tiny_bundle, batch):
    ts_folder, onnx_folder = repo / "vit_seed_tiny_torchscript", repo / "vit_seed_tiny_onnx"
    config, onnx_config = read_config(ts_folder), read_config(onnx_folder)
    assert (config.platform, config.backend) == ("pytorch_libtorch", "pytorch")
    assert [(t.name, list(t.dims), t.data_type) for t in config.input] == [
        ("pixel_values__0", list(onnx_config.input[0].dims), onnx_config.input[0].data_type)]
    assert [t.name for t in config.output] == ["logits__0"]
    x = random_input(B.read_bundle(tiny_bundle).config, batch)
    assert list(x.shape[1:]) == list(config.input[0].dims)
    module = runtime.load_torchscript(ts_folder / "1" / "model.pt").module
    with torch.inference_mode():
        logits = module(x)
    assert logits.dtype == torch.float32 and np_dtype(config.output[0].data_type) == np.float32
    assert list(logits.shape) == [batch, *config.output[0].dims]
    session = runtime.ort_runner(onnx_folder / "1" / "model.onnx", "cpu")
    assert np.abs(logits.numpy() - session(x.numpy())).max() <= 1e-4


def test_a_model_reading_weights_safetensors_has_it_beside_it(repo, tiny_bundle):
    """The default bundle's model.onnx reads its weights from weights.safetensors: the
    repository's model folder holds that file, the bundle's bytes, and runs by path."""
    version = repo / "vit_seed_tiny_onnx" / "1"
    assert sorted(p.name for p in version.iterdir()) == [B.ONNX_FILE, B.WEIGHTS_FILE]
    hashes = B.read_bundle(tiny_bundle).hashes
    assert B.sha256_file(version / B.WEIGHTS_FILE) == hashes[B.WEIGHTS_FILE]
    x = random_input(B.read_bundle(tiny_bundle).config, 3).numpy()
    served = runtime.ort_runner(version / B.ONNX_FILE, "cpu")(x)
    assert np.array_equal(served, runtime.ort_runner(tiny_bundle / B.ONNX_FILE, "cpu")(x))


def test_external_data_keeps_its_name_and_resolves(variants_bundle, variants_repo):
    version = variants_repo / "vit_seed_tiny_onnx" / "1"
    assert sorted(p.name for p in version.iterdir()) == [B.ONNX_FILE, B.ONNX_DATA_FILE]
    hashes = B.read_bundle(variants_bundle).hashes
    assert B.sha256_file(version / B.ONNX_DATA_FILE) == hashes[B.ONNX_DATA_FILE]
    x = random_input(B.read_bundle(variants_bundle).config, 3).numpy()
    served = runtime.ort_runner(version / "model.onnx", "cpu")(x)
    assert np.array_equal(served, runtime.ort_runner(variants_bundle / B.ONNX_FILE, "cpu")(x))
    for name in VARIANT_MODELS[1:4]:  # the variants hold their weights inside
        assert [p.name for p in (variants_repo / name / "1").iterdir()] == ["model.onnx"]


def test_labels_file_and_label_filename(repo, variants_repo):
    for folder in repo.iterdir():
        text = (folder / triton.LABELS_FILE).read_text()
        assert text == "".join(f"class_{i}\n" for i in range(10))
        assert [t.label_filename for t in read_config(folder).output] == ["labels.txt"]
    for folder in variants_repo.iterdir():  # a bundle without labels
        assert not (folder / triton.LABELS_FILE).exists()
        assert [t.label_filename for t in read_config(folder).output] == [""]


def test_variants_are_models_and_files_match_the_bundle(repo, variants_repo, variants_bundle):
    assert sorted(p.name for p in repo.iterdir()) == TINY_MODELS
    assert sorted(p.name for p in variants_repo.iterdir()) == VARIANT_MODELS
    hashes = B.read_bundle(variants_bundle).hashes
    sources = {"onnx": B.ONNX_FILE, "onnx_fp16": "model.fp16.onnx", "onnx_opt": "model.opt.onnx",
               "onnx_int8": "model.int8.onnx", "torchscript": B.TS_FILE}
    for suffix, source in sources.items():
        version = variants_repo / f"vit_seed_tiny_{suffix}" / "1"
        served = version / ("model.pt" if source == B.TS_FILE else "model.onnx")
        assert B.sha256_file(served) == hashes[source]


def test_cpu_defaults(repo):
    for folder in repo.iterdir():
        config = read_config(folder)
        assert config.max_batch_size == DEFAULT_MAX_BATCH_SIZE == 16  # serve's too
        assert list(config.dynamic_batching.preferred_batch_size) == [DEFAULT_MAX_BATCH_SIZE]
        assert config.dynamic_batching.max_queue_delay_microseconds == 100
        assert [(g.kind, g.count) for g in config.instance_group] == [
            (model_config_pb2.ModelInstanceGroup.KIND_CPU, 1)]
        assert not config.HasField("optimization")


def test_gpu_options_and_accelerators(variants_repo):
    for folder in variants_repo.iterdir():
        config = read_config(folder)
        assert config.max_batch_size == 16
        assert list(config.dynamic_batching.preferred_batch_size) == [4, 8]
        assert config.dynamic_batching.max_queue_delay_microseconds == 500
        assert [(g.kind, g.count) for g in config.instance_group] == [
            (model_config_pb2.ModelInstanceGroup.KIND_GPU, 2)]
        accelerators = config.optimization.execution_accelerators.gpu_execution_accelerator
        if config.backend == "pytorch":
            assert not config.HasField("optimization")
            continue
        precision = "FP16" if folder.name.endswith("fp16") else "FP32"
        assert [(a.name, dict(a.parameters)) for a in accelerators] == [
            ("tensorrt", {"precision_mode": precision}), ("cuda", {"use_tf32": "0"})]


def test_a_batch_axis_baked_into_the_graph_is_refused(tmp_path):
    fixed = onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2, 3])
    graph = onnx.helper.make_graph([onnx.helper.make_node("Identity", ["x"], ["y"])], "g",
                                   [fixed], [onnx.helper.make_tensor_value_info(
                                       "y", onnx.TensorProto.FLOAT, ["batch", 3])])
    onnx.save(onnx.helper.make_model(graph), str(tmp_path / "m.onnx"))
    with pytest.raises(BundleError, match="^m.onnx: 'x' has no dynamic batch axis first"):
        triton.read_onnx_io(tmp_path / "m.onnx")


def test_cli_writes_the_repository_and_prints_one_line(tiny_bundle, tmp_path):
    code, out, err = run("triton", tiny_bundle, tmp_path / "repo", "--name", "digits",
                         "--torchscript")
    assert (code, err) == (0, "")
    assert out == (f"wrote {tmp_path / 'repo'}: 2 models (digits_onnx, digits_torchscript), "
                   f"KIND_CPU, max batch {DEFAULT_MAX_BATCH_SIZE}, labels\n")
    assert [read_config(tmp_path / "repo" / n).name for n in ("digits_onnx", "digits_torchscript")
            ] == ["digits_onnx", "digits_torchscript"]


def test_torchscript_goes_into_the_repository_only_when_named_or_trusted(tiny_bundle,
                                                                         tmp_path):
    """Triton's libtorch backend runs model.ts's program: a bundle is data, so by default the
    repository holds its ONNX models only, and says what it left out."""
    code, out, err = run("triton", tiny_bundle, tmp_path / "repo", "--name", "digits")
    assert (code, err) == (0, "")
    assert out == (f"wrote {tmp_path / 'repo'}: 1 model (digits_onnx), KIND_CPU, max batch "
                   f"{DEFAULT_MAX_BATCH_SIZE}, labels\n"
                   f"note: model.ts not written: Triton's libtorch backend runs the TorchScript "
                   f"program it holds; --torchscript or --trust-code writes it\n")
    assert sorted(p.name for p in (tmp_path / "repo").iterdir()) == ["digits_onnx"]
    assert not list((tmp_path / "repo").rglob("model.pt"))
    for flag in ("--torchscript", "--trust-code"):
        code, out, err = run("triton", tiny_bundle, tmp_path / "repo", "--name", "digits",
                             flag, "--force")
        assert (code, err) == (0, "")
        assert out.startswith(f"wrote {tmp_path / 'repo'}: 2 models (digits_onnx, "
                              f"digits_torchscript)") and "note" not in out
    assert [m.name for m in triton.write_repository(
        tiny_bundle, tmp_path / "lib", triton.TritonOptions(name="x")).models] == ["x_onnx"]


def test_existing_repo_is_refused_without_force(tiny_bundle, tmp_path):
    target = tmp_path / "repo"
    target.mkdir()
    (target / "keep.txt").write_text("mine")
    code, out, err = run("triton", tiny_bundle, target)
    assert (code, out) == (1, "")
    assert one_line(err) == f"Error: {target} already exists; use --force to replace it"
    assert listing(target) == ["keep.txt"]
    code, _, _ = run("triton", tiny_bundle, target, "--force", "--torchscript")
    assert code == 0 and sorted(p.name for p in target.iterdir()) == TINY_MODELS


@pytest.mark.parametrize("where", ["b/repo", "b", "b/1/deeper", "."])
def test_repo_in_or_around_the_bundle_is_refused_and_nothing_written(tiny_bundle, tmp_path,
                                                                     where):
    """An output over what the command reads: a usage error, as every command's is."""
    bundle = tmp_path / "b"
    shutil.copytree(tiny_bundle, bundle)
    before = listing(tmp_path)
    target = tmp_path / where
    code, out, err = run("triton", bundle, target, "--force")
    assert (code, out) == (2, "")
    assert one_line(err) == (f"Error: the repository {target} would overwrite {bundle}, "
                               f"which this command reads")
    assert listing(tmp_path) == before


def test_modified_bundle_file_is_refused_and_nothing_written(tiny_bundle, tmp_path):
    bundle = tmp_path / "b"
    shutil.copytree(tiny_bundle, bundle)
    with open(bundle / B.TS_FILE, "r+b") as f:
        f.truncate(100)
    code, out, err = run("triton", bundle, tmp_path / "repo")
    assert (code, out) == (1, "")
    assert one_line(err) == (f"Error: {bundle / B.TS_FILE} does not match its sha256 in "
                               f"config.json (truncated or modified)")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["b"]


@pytest.mark.parametrize("args, message", [
    (["--max-batch-size", "8", "--preferred-batch-sizes", "4,16"],
     "preferred batch size 16 is not in [1, max batch size 8]"),
    (["--tensorrt"], "TF32 and TensorRT apply to --provider cuda only"),
    (["--name", "../up"], "model name '../up' must be letters, digits, '_', '-' or '.'"),
])
def test_options_that_do_not_fit_are_usage_errors(tiny_bundle, tmp_path, args, message):
    code, out, err = run("triton", tiny_bundle, tmp_path / "repo", *args)
    assert (code, out) == (2, "")
    assert err.strip().endswith(f"Error: {message}")
    assert not (tmp_path / "repo").exists()


@pytest.mark.slow  # quick suite under 3 min on a Zen 3 (2 cores): CI runs it
def test_the_e2e_model_is_served_on_raw_uint8_pixels(tmp_path):
    """model.e2e.onnx takes uint8 images of any size: Triton gets it as a model of its own,
    [-1, -1, C] UINT8 in, so a client sends the decoded image as it is."""
    bundle = make_bundle(tmp_path / "e2e", embed_preprocessing=True)
    repo = triton.write_repository(bundle, tmp_path / "repo").path
    config = read_config(repo / "vit_seed_tiny_onnx_e2e")
    (served,) = config.input
    assert (served.name, model_config_pb2.DataType.Name(served.data_type), list(served.dims)) \
        == (B.E2E_INPUT_NAME, "TYPE_UINT8", [-1, -1, 3])
    copied = repo / "vit_seed_tiny_onnx_e2e" / "1" / "model.onnx"
    assert copied.read_bytes() == (bundle / B.E2E_FILE).read_bytes()


@pytest.mark.slow  # quick suite under 3 min on a Zen 3 (2 cores): CI runs it
def test_an_embedding_bundle_is_served_as_its_embedding_without_labels(tmp_path):
    """The digits model exported for its embedding keeps its class names in config.json,
    but Triton gets the output `embedding` [D] and no labels.txt: they name no axis of it."""
    from pathlib import Path

    bundle = tmp_path / "emb"
    digits = Path(__file__).resolve().parent.parent / "models" / "digits"
    code, _, err = run("export", bundle, "--from", digits, "--outputs",
                       "embedding", "--provider", "cpu", "--quiet")
    assert code == 0, err
    width = B.read_description(bundle).config.embedding_width
    repo = triton.write_repository(bundle, tmp_path / "repo").path
    for folder in repo.iterdir():
        config = read_config(folder)
        assert [(t.name, list(t.dims), t.label_filename) for t in config.output] == [
            ("embedding" if folder.name.endswith("_onnx") else "embedding__0", [width], "")]
        assert not (folder / triton.LABELS_FILE).exists()


@pytest.mark.slow  # quick suite under 3 min on a Zen 3 (2 cores): CI runs it
def test_every_output_is_listed_and_only_the_logits_get_the_labels(tmp_path):
    """The digits model with its logits, embedding and patch tokens: each model's
    config.pbtxt lists the three with their dims, in the bundle's order (a client asks for
    the embedding alone by its name), and labels.txt belongs to the logits only, also where
    an embedding is as wide as the classes."""
    from pathlib import Path

    import onnxruntime as ort

    bundle = tmp_path / "three"
    digits = Path(__file__).resolve().parent.parent / "models" / "digits"
    code, _, err = run("export", bundle, "--from", digits, "--outputs",
                       "logits,embedding,tokens", "--provider", "cpu", "--quiet")
    assert code == 0, err
    repo = triton.write_repository(bundle, tmp_path / "repo").path
    for folder in repo.iterdir():
        config = read_config(folder)
        index = {} if folder.name.endswith("_onnx") else {"logits": "__0", "embedding": "__1",
                                                           "tokens": "__2"}
        assert [(t.name, list(t.dims), t.label_filename) for t in config.output] == [
            (f"logits{index.get('logits', '')}", [10], triton.LABELS_FILE),
            (f"embedding{index.get('embedding', '')}", [64], ""),
            (f"tokens{index.get('tokens', '')}", [16, 64], "")], folder.name
    onnx_model = triton.plan_models(B.read_bundle(bundle), "same")[0]
    as_wide = triton.render_config(onnx_model, triton.TritonOptions(), num_labels=64)
    assert as_wide.count("label_filename") == 0  # 64 wide: the embedding, not classes
    # what a Triton client's request for one output comes to on the ONNX backend
    session = ort.InferenceSession(str(repo / "vit_digits_8x8_onnx" / "1" / "model.onnx"),
                                   providers=["CPUExecutionProvider"])
    x = np.random.default_rng(0).standard_normal((3, 1, 8, 8)).astype(np.float32)
    (alone,) = session.run(["embedding"], {"pixel_values": x})
    assert np.array_equal(alone, session.run(None, {"pixel_values": x})[1])
