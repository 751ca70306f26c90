"""Runners. Every assertion holds on a CPU-only machine and on one where CUDA works: a test
asks the runner which device really ran instead of assuming CPU."""
import numpy as np
import pytest
import torch

from vit_export import bundle as B
from vit_export import parity, runtime
from vit_export.errors import BundleError, ConfigError, InputError, ProviderError


def test_cpu_session_runs_on_cpu(tiny_bundle):
    runner = runtime.ort_runner(tiny_bundle / "model.onnx", "cpu")
    assert runner.device == "cpu" and runner.session.get_providers()[0] == "CPUExecutionProvider"
    out = runner(np.zeros((3, 3, 32, 32), np.float32))
    assert out.shape == (3, 10) and out.dtype == np.float32


def test_cuda_request_runs_on_cuda_or_fails_naming_why(tiny_bundle):
    problem = runtime.cuda_problem()
    try:
        runner = runtime.ort_runner(tiny_bundle / "model.onnx", "cuda")
    except ProviderError as exc:
        assert str(exc).startswith("requested CUDAExecutionProvider but ")
        assert problem is None or problem in str(exc)
        assert "\n" not in str(exc)
    else:
        assert runner.device == "cuda"
        assert runner.session.get_providers()[0] == "CUDAExecutionProvider"


def test_auto_reports_the_device_that_really_runs(tiny_bundle):
    runner = runtime.ort_runner(tiny_bundle / "model.onnx", "auto")
    truth = "cuda" if runner.session.get_providers()[0] == "CUDAExecutionProvider" else "cpu"
    assert runner.device == truth and runner.requested == "auto"
    # falling back to CPU is said, with the reason; running on CUDA needs no note
    assert bool(runner.notes) == (truth == "cpu")
    if truth == "cpu":
        assert runner.notes[0].startswith("CUDA not used: ")


def test_cuda_problem_is_one_line_naming_a_library_or_none():
    problem = runtime.cuda_problem()
    assert problem is None or ("\n" not in problem and (
        problem.startswith(("the CUDA provider cannot load lib",
                            "this onnxruntime has no CUDAExecutionProvider"))))


def test_bad_provider_and_missing_or_broken_model(tiny_bundle, tmp_path):
    with pytest.raises(ProviderError, match="unknown provider 'tpu'"):
        runtime.ort_runner(tiny_bundle / "model.onnx", "tpu")
    with pytest.raises(BundleError, match="does not exist"):
        runtime.ort_runner(tmp_path / "none.onnx", "cpu")
    broken = tmp_path / "broken.onnx"
    broken.write_bytes(b"\x08\x07garbage")
    with pytest.raises(BundleError, match="cannot read ONNX model .*broken.onnx: DecodeError"):
        runtime.ort_runner(broken, "cpu")  # parsed from the bytes read, before ONNX Runtime


def test_io_binding_reads_and_writes_on_the_runners_device(tiny_bundle):
    runner = runtime.ort_runner(tiny_bundle / "model.onnx", "auto")
    x = torch.randn(3, 3, 32, 32)
    bound = runner(x.to(runner.device))  # a tensor in: IO binding, a tensor out
    assert isinstance(bound, torch.Tensor) and bound.device.type == runner.device
    assert bound.shape == (3, 10) and bound.dtype == torch.float32
    np.testing.assert_allclose(bound.cpu().numpy(), runner(x.numpy()), atol=1e-6, rtol=0)


def test_torch_runner_takes_numpy_or_tensors(tiny_bundle):
    ts = runtime.load_torchscript(tiny_bundle / "model.ts")
    x = torch.randn(2, 3, 32, 32)
    out = ts(x)
    assert isinstance(out, torch.Tensor) and out.device.type == ts.device == "cpu"
    np.testing.assert_array_equal(out.numpy(), ts(x.numpy()))
    ort = runtime.ort_runner(tiny_bundle / "model.onnx", "cpu")
    np.testing.assert_allclose(ts(x.numpy()), ort(x.numpy()), atol=1e-5)


def test_node_placement_comes_from_onnx_runtimes_profile(tiny_bundle):
    x = np.zeros((1, 3, 32, 32), np.float32)
    placement = runtime.node_placement(tiny_bundle / "model.onnx", "cpu", x)
    assert {p for by in placement.values() for p in by} == {"CPUExecutionProvider"}
    # 2 blocks of qkv, q@k, attn@v, proj, fc1, fc2, plus the head: 13 matrix products, some
    # fused by ONNX Runtime's graph optimizer (scaled q@k into FusedMatMul, the head to Gemm)
    cpu = "CPUExecutionProvider"
    assert sum(placement.get(op, {}).get(cpu, 0) for op in ("MatMul", "FusedMatMul", "Gemm")) == 13
    assert placement["Conv"] == {"CPUExecutionProvider": 1}
    heavy = runtime.heavy_ops_on_cpu(placement)
    assert {"MatMul", "Conv", "Softmax", "LayerNormalization"} <= set(heavy)
    # as the CUDA check would judge a session that left these on the CPU
    check = parity.placement_check("model.onnx", placement, require_provider="cuda")
    assert not check.passed and "MatMul x" in check.detail and "heavy ops on CPU" in check.detail
    assert parity.placement_check("model.onnx", placement, None).passed
    gpu_like = {"MatMul": {"CUDAExecutionProvider": 12}, "Shape": {"CPUExecutionProvider": 2}}
    check = parity.placement_check("model.onnx", gpu_like, require_provider="cuda")
    assert check.passed and check.detail == "every heavy op on CUDA; shape ops on CPU: Shape"


def test_open_runners_puts_every_runner_on_one_device(tiny_bundle):
    found = B.read_bundle(tiny_bundle)
    runners = runtime.open_runners(found, "auto", trust_code=True)
    assert [r.name for r in runners.runners] == ["eager", "torchscript", "onnxruntime"]
    assert {r.device for r in runners.runners} == {runners.device}
    assert runners.onnx_files == {"onnxruntime": "model.onnx"}
    x = np.random.default_rng(0).standard_normal((2, 3, 32, 32), dtype=np.float32)
    reference = runners.reference(x)
    for runner in runners.candidates:
        np.testing.assert_allclose(runner(x), reference, atol=1e-4)
    only = runtime.open_runners(found, "cpu", runners=["onnxruntime"])
    assert [r.name for r in only.runners] == ["eager", "onnxruntime"]
    with pytest.raises(ConfigError, match="no runtime 'tensorrt' in this bundle; it has eager"):
        runtime.open_runners(found, "cpu", runners=["tensorrt"])


def test_deferred_runners_run_one_at_a_time_and_let_go(tiny_bundle):
    """Validation holds eager and one artifact at a time (a ViT-g is 4.5 GB a copy): each
    deferred runner opens when first called and is released once it has run every set,
    and its outputs are those of the runner opened up front."""
    found = B.read_bundle(tiny_bundle)
    opened = runtime.open_runners(found, "cpu", trust_code=True)
    deferred = runtime.open_runners(found, "cpu", deferred=True, trust_code=True)
    assert [r.name for r in deferred.runners] == ["eager", "torchscript", "onnxruntime"]
    later = deferred.candidates
    assert [r.opened for r in later] == [False, True]  # model.onnx told the device
    sets = parity.input_sets(found.config, [1, 3], seed=0)
    seen = []
    outputs = parity.run_stage(deferred.runners, sets, progress=seen.append)
    assert [r.opened for r in later] == [False, False]  # released after their run
    # the one open already runs first, then each deferred one on every set in turn
    assert [line.split(" on ")[0] for line in seen] == [
        "running eager", "running eager", "running onnxruntime", "running onnxruntime",
        "running torchscript", "running torchscript"]
    for row, want in zip(outputs, parity.run_stage(opened.runners, sets)):
        assert row.keys() == want.keys()
        for name in row:
            assert row[name].keys() == want[name].keys() == {"logits"}
            np.testing.assert_array_equal(row[name]["logits"], want[name]["logits"])


def test_global_state_is_restored():
    before = torch.backends.cuda.matmul.allow_tf32, torch.get_num_threads()
    with runtime.tf32(True), runtime.torch_threads(1):
        assert torch.backends.cuda.matmul.allow_tf32 and torch.get_num_threads() == 1
    assert (torch.backends.cuda.matmul.allow_tf32, torch.get_num_threads()) == before


@pytest.mark.cuda
def test_validate_on_cuda_places_the_model_on_cuda(tiny_bundle):
    report = parity.validate(tiny_bundle, parity.ValidateOptions(
        batch_sizes=[1, 3], provider="cuda", require_provider="cuda"))
    assert report.provider_used == report.torch_device == "cuda"
    assert report.placement["model.onnx"] and report.passed, report.failures


# ---------------------------------------------------------------- host input through staging

def _graph_model(path, input_type: int, output_dims: list, relu: bool = False):
    """A small real ONNX model: x [batch, 4] of `input_type`, cast to float, times a seeded
    [4, 3] matrix -> y [batch, *output_dims]; `relu`: x [batch, tokens] -> relu -> y
    [batch, tokens] (a size not known from the batch)."""
    import onnx
    from onnx import TensorProto as T
    from onnx import helper as h
    from onnx import numpy_helper

    weight = np.random.default_rng(0).standard_normal((4, 3)).astype(np.float32)
    nodes = [h.make_node("Cast", ["x"], ["xf"], to=T.FLOAT),
             h.make_node("Relu", ["xf"], ["y"]) if relu else
             h.make_node("MatMul", ["xf", "w"], ["y"])]
    graph = h.make_graph(
        nodes, "staged", [h.make_tensor_value_info("x", input_type,
                                                   ["batch", output_dims[0] if relu else 4])],
        [h.make_tensor_value_info("y", T.FLOAT, ["batch", *output_dims])],
        [] if relu else [numpy_helper.from_array(weight, "w")])
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 17)], ir_version=10)
    onnx.save(model, path)
    return path


def test_staged_host_input_gives_ort_own_run_over_growing_and_shorter_batches(tiny_bundle):
    runner = runtime.ort_runner(tiny_bundle / "model.onnx", "auto")
    assert runner.staging is not None  # logits [batch, 10]: staged on either device
    rng = np.random.default_rng(0)
    for rows in (3, 5, 2, 5, 1):  # grows to 5, then shorter batches reuse the first rows
        x = rng.standard_normal((rows, 3, 32, 32)).astype(np.float32)
        expected = runner.run_unstaged(x)
        got = runner.run_all(x)
        assert list(got) == ["logits"] and got["logits"].dtype == np.float32
        np.testing.assert_array_equal(got["logits"], expected["logits"])
        np.testing.assert_array_equal(runner(x), expected["logits"])
    assert max(slot.rows for slot in runner.staging._slots) == 5


def test_a_staged_batch_is_copied_at_submit_and_read_in_order(tiny_bundle):
    runner = runtime.ort_runner(tiny_bundle / "model.onnx", "auto")
    rng = np.random.default_rng(1)
    batches = [rng.standard_normal((4, 3, 32, 32)).astype(np.float32) for _ in range(5)]
    expected = [runner.run_unstaged(b)["logits"] for b in batches]
    # three in flight over the slots (two on CUDA, one on the CPU): each is read before
    # its slot is reused
    queued = [runner.submit(b.copy()) for b in batches[:3]]
    batches_copy = [b.copy() for b in batches]
    first = runner.submit(batches_copy[3])
    batches_copy[3][:] = 0  # the caller's array is free once submit returns
    for got, want in zip([q.result()["logits"] for q in queued], expected[:3]):
        np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(first.result()["logits"], expected[3])
    # stream: one batch of look-ahead, answers in order, the last one too
    streamed = [out["logits"] for out in runtime.stream(runner, iter(batches))]
    assert len(streamed) == 5
    for got, want in zip(streamed, expected):
        np.testing.assert_array_equal(got, want)
    assert list(runtime.stream(runner, [])) == []


def test_stream_of_a_runner_without_staging_runs_each_batch(tiny_bundle):
    eager = runtime.open_runner(tiny_bundle, "eager", "cpu")
    x = np.random.default_rng(2).standard_normal((2, 3, 32, 32)).astype(np.float32)
    (out,) = runtime.stream(eager, [x])
    np.testing.assert_allclose(out["logits"], eager(x), rtol=0, atol=0)


def test_staging_takes_uint8_and_fp16_input_and_leaves_unknown_sizes_to_ort(tmp_path):
    from onnx import TensorProto as T

    rng = np.random.default_rng(3)
    for input_type, x in [(T.UINT8, rng.integers(0, 255, (6, 4), dtype=np.uint8)),
                          (T.FLOAT16, rng.standard_normal((6, 4)).astype(np.float16))]:
        path = _graph_model(tmp_path / f"m{input_type}.onnx", input_type, [3])
        runner = runtime.ort_runner(path, "cpu")
        assert runner.staging is not None
        want = x.astype(np.float32) @ np.random.default_rng(0).standard_normal(
            (4, 3)).astype(np.float32)
        np.testing.assert_allclose(runner.run_all(x)["y"], want, rtol=1e-6, atol=1e-5)
    with pytest.raises(Exception, match="takes uint8 images, got float32"):
        runtime.ort_runner(tmp_path / f"m{T.UINT8}.onnx", "cpu").run_all(
            np.zeros((1, 4), np.float32))
    # an output whose size is not known from the batch (tokens of a dynamic-size model):
    # ONNX Runtime's own run
    path = _graph_model(tmp_path / "tokens.onnx", T.FLOAT, ["tokens"], relu=True)
    runner = runtime.ort_runner(path, "cpu")
    assert runner.staging is None
    assert runner.run_all(np.ones((2, 7), np.float32))["y"].shape == (2, 7)
    with pytest.raises(ProviderError, match="^staging needs outputs whose size is known"):
        runtime.Staging(runner.session, "cpu")


def test_staging_on_cuda_needs_the_sessions_stream(tiny_bundle):
    session = runtime.ort_runner(tiny_bundle / "model.onnx", "cpu").session
    with pytest.raises(ProviderError) as caught:
        runtime.Staging(session, "cuda")
    assert str(caught.value) == "staging on CUDA needs the session's compute stream"


def test_threads_sharing_a_staged_runner_each_get_their_own_answers(tmp_path):
    """A runner is shared by the threads of a server: one thread's read of the reused output
    buffers must not be overwritten by another's batch (it was, 26 times in 300, before the
    read took the staging's lock)."""
    import threading

    from onnx import TensorProto as T

    runner = runtime.ort_runner(_graph_model(tmp_path / "wide.onnx", T.FLOAT, [20000],
                                             relu=True), "cpu")
    assert runner.staging is not None
    wrong = []

    def ask(seed: int) -> None:
        rng = np.random.default_rng(seed)
        for _ in range(60):
            x = rng.standard_normal((32, 20000)).astype(np.float32)
            if not np.array_equal(runner.run_all(x)["y"], np.maximum(x, 0)):
                wrong.append(seed)

    threads = [threading.Thread(target=ask, args=(seed,)) for seed in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert wrong == []


def test_staging_answers_an_empty_batch_and_refuses_what_is_not_numbers(tmp_path):
    from onnx import TensorProto as T

    runner = runtime.ort_runner(_graph_model(tmp_path / "m.onnx", T.FLOAT, [3]), "cpu")
    empty = runner.run_all(np.zeros((0, 4), np.float32))
    assert empty["y"].shape == (0, 3) and empty["y"].dtype == np.float32
    with pytest.raises(InputError, match=r"^input of dtype object: expected real numbers$"):
        runner.run_all(np.array([[1, 2, 3, 4]], dtype=object))
    with pytest.raises(InputError, match=r"^input of dtype complex64: expected real numbers$"):
        runner.run_all(np.zeros((1, 4), np.complex64))
    ints = np.arange(8).reshape(2, 4)  # int64, as np.arange gives: cast as it is copied in
    np.testing.assert_allclose(runner.run_all(ints)["y"],
                               runner.run_unstaged(ints.astype(np.float32))["y"], rtol=1e-6)


def test_what_a_runner_refuses_it_refuses_staged_or_not(tiny_bundle, tmp_path):
    """The staged runner and ONNX Runtime's own run (an output of unknown size) refuse the
    same inputs in the same line; a model's empty batch and fp16 overflow are said as such."""
    from onnx import TensorProto as T

    unstaged = runtime.ort_runner(_graph_model(tmp_path / "t.onnx", T.FLOAT, ["tokens"],
                                               relu=True), "cpu")
    staged = runtime.ort_runner(_graph_model(tmp_path / "m.onnx", T.FLOAT, [4], relu=True),
                                "cpu")
    assert unstaged.staging is None and staged.staging is not None
    for runner in (unstaged, staged):
        for bad in (np.array([[1, 2, 3, 4]], dtype=object), np.zeros((1, 4), np.complex64),
                    np.array([["1.5", "2", "3", "4"]])):
            with pytest.raises(InputError, match=r"^input of dtype .*: expected real numbers$"):
                runner.run_all(bad)
    bundled = runtime.ort_runner(tiny_bundle / "model.onnx", "cpu")
    with pytest.raises(InputError, match=r"^input of shape \[0, 3, 32, 32\]: an empty batch"):
        bundled(np.zeros((0, 3, 32, 32), np.float32))
    eager = runtime.open_runner(B.read_bundle(tiny_bundle), "eager", "cpu")
    for runner in (unstaged, bundled, eager):  # no array: said, not an AttributeError
        for bad in ([[0.0]], None, "abc"):
            with pytest.raises(InputError, match=r"^input of type \w+: expected a numpy array "
                                                 r"or a torch tensor$"):
                runner(bad)
    half = runtime.ort_runner(_graph_model(tmp_path / "h.onnx", T.FLOAT16, [3]), "cpu")
    with pytest.raises(InputError, match=r"takes fp16 input, and this input holds values "
                                         r"beyond fp16's range \(\+-65504\)"):
        half.run_all(np.full((1, 4), 1e5, np.float32))
    assert half.run_all(np.full((1, 4), 6e4, np.float32))["y"].shape == (1, 3)


def test_torch_tensors_are_held_to_what_numpy_input_is(tmp_path):
    """From Python, a complex tensor was cut to its real part and run, and a float tensor
    into model.e2e.onnx (uint8 images) ended in ONNX Runtime's traceback: each is one line
    now, as the same numpy input is; a uint8 tensor of images runs as its numpy twin."""
    from conftest import DIGITS, run

    out = tmp_path / "digits"
    assert run("export", out, "--from", DIGITS, "--embed-preprocessing")[0] == 0
    bundle = B.read_bundle(out)
    model = runtime.open_runner(bundle, "onnxruntime", "cpu")
    images = runtime.open_runner(bundle, "onnxruntime[model.e2e.onnx]", "cpu")
    x = torch.linspace(-1, 1, 2 * 64).reshape(2, 1, 8, 8)
    for call in (model, model.run_all):
        with pytest.raises(InputError, match=r"^input of dtype torch.complex64: expected real "
                                             r"numbers$"):
            call(x.to(torch.complex64) + 1j)
    pixels = torch.arange(2 * 64, dtype=torch.uint8).reshape(2, 8, 8, 1)
    for call in (images, images.run_all):
        with pytest.raises(InputError, match="takes uint8 images, got torch.float32"):
            call(pixels.float())
    got = images.run_all(pixels)
    want = images.run_all(pixels.numpy())
    assert set(got) == set(want) and all(np.array_equal(got[k].numpy(), want[k]) for k in want)
    assert np.array_equal(images(pixels), images(pixels.numpy()))


def test_a_model_that_fails_while_it_runs_is_one_line(tmp_path):
    """A graph that loads but cannot give its output for this input (a Reshape baked to a
    batch of 2, run at 1): ONNX Runtime's RuntimeError was infer's traceback."""
    import onnx
    from conftest import DIGITS, one_line, run
    from onnx import helper, numpy_helper

    out = tmp_path / "digits"
    assert run("export", out, "--from", DIGITS)[0] == 0
    model = onnx.load(out / "model.onnx")
    pixels = model.graph.input[0].name
    model.graph.initializer.append(numpy_helper.from_array(np.array([2, 1, 8, 8]), "two"))
    for node in model.graph.node:
        node.input[:] = ["baked" if name == pixels else name for name in node.input]
    model.graph.node.insert(0, helper.make_node("Reshape", [pixels, "two"], ["baked"]))
    onnx.save(model, tmp_path / "baked.onnx")
    code, _, err = run("infer", tmp_path / "baked.onnx", DIGITS / "samples" / "true_2_006.png")
    assert code == 1 and one_line(err).startswith(
        "Error: ONNX Runtime failed while running the model: RuntimeError: ")
