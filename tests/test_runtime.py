import numpy as np
import pytest

from vit_export import runtime
from vit_export.errors import BundleError, ProviderError

ON_GPU = runtime.torch_device("cuda") == "cuda"


def test_cpu_session_runs_on_cpu(tiny_bundle):
    runner = runtime.create_session(tiny_bundle / "model.onnx", "cpu")
    assert runner.provider == "cpu" and runner.session.get_providers()[0] == "CPUExecutionProvider"
    out = runner(np.zeros((3, 3, 32, 32), np.float32))
    assert out.shape == (3, 10) and out.dtype == np.float32


@pytest.mark.skipif(ON_GPU, reason="this machine has a GPU: CUDA would really run")
def test_cuda_request_that_runs_on_cpu_is_an_error(tiny_bundle):
    with pytest.raises(ProviderError, match="requested CUDAExecutionProvider.*CPUExecutionProvider"):
        runtime.create_session(tiny_bundle / "model.onnx", "cuda")


@pytest.mark.skipif(ON_GPU, reason="this machine has a GPU: auto would pick CUDA")
def test_auto_falls_back_to_cpu_and_says_why(tiny_bundle):
    runner = runtime.create_session(tiny_bundle / "model.onnx", "auto")
    assert runner.provider == "cpu" and runner.requested == "auto"
    assert runner.notes and "CPU" in runner.notes[0]


def test_bad_provider_and_missing_or_broken_model(tiny_bundle, tmp_path):
    with pytest.raises(ProviderError, match="unknown provider 'tpu'"):
        runtime.create_session(tiny_bundle / "model.onnx", "tpu")
    with pytest.raises(BundleError, match="does not exist"):
        runtime.create_session(tmp_path / "none.onnx", "cpu")
    broken = tmp_path / "broken.onnx"
    broken.write_bytes(b"\x08\x07garbage")
    with pytest.raises(BundleError, match="ONNX Runtime cannot load"):
        runtime.create_session(broken, "cpu")


def test_torchscript_runner_matches_onnx(tiny_bundle):
    x = np.random.default_rng(0).standard_normal((2, 3, 32, 32), dtype=np.float32)
    ts = runtime.load_torchscript(tiny_bundle / "model.ts")
    ort = runtime.create_session(tiny_bundle / "model.onnx", "cpu")
    np.testing.assert_allclose(ts(x), ort(x), atol=1e-5)
