"""The runtime registry: each runtime declares its runners once, and choosing, listing and
checking names go through it; errors state the fact, and name the option the way the
caller types it (a keyword argument from Python, a flag from the CLI)."""
import dataclasses
import re

import numpy as np
import pytest
from conftest import DIGITS, run

from vit_export import bundle as B
from vit_export import runtime
from vit_export.errors import ConfigError, ProviderError
from vit_export.runtime import registry


def test_runner_names_parse_to_their_runtime():
    for name, owner in [("eager", "pytorch"), ("torchscript", "pytorch"), ("aoti", "pytorch"),
                        ("onnxruntime", "onnxruntime"),
                        ("onnxruntime[model.int8.onnx]", "onnxruntime"),
                        ("openvino", "openvino"), ("openvino[model.fp16.onnx]", "openvino"),
                        ("openvino-bf16", "openvino"),
                        ("openvino-bf16[model.int8-static.onnx]", "openvino")]:
        assert registry.parse(name).name == owner
        assert re.fullmatch(runtime.RUNNER_NAME, name)
    for name in ("tensorrt", "onnxruntime[a/b.onnx]", "openvino-fp8", ""):
        assert registry.parse(name) is None and not re.fullmatch(runtime.RUNNER_NAME, name)
    assert runtime.FILE_RUNNERS == {".onnx": ("onnxruntime", "openvino", "openvino-bf16"),
                                    ".ts": ("torchscript",), ".pt2": ("pt2", "aoti")}
    assert runtime.CODE_RUNNERS == ("torchscript", "pt2", "aoti")


def test_check_runtimes_names_the_missing_extras(monkeypatch):
    assert runtime.check_runtimes(()) == {}
    with pytest.raises(ConfigError, match="unknown runtime 'tensorrt'; choose from pytorch, "
                                          "onnxruntime, openvino"):
        runtime.check_runtimes(["onnxruntime", "tensorrt"])
    missing = dataclasses.replace(registry.by_name("openvino"), extra="no_such_module_here")
    monkeypatch.setattr(registry, "RUNTIMES", (*registry.RUNTIMES[:2], missing))
    assert runtime.check_runtimes(("onnxruntime", "openvino")) == {
        "openvino": runtime.OPENVINO_EXTRA}
    assert registry.missing_extra("openvino-bf16") == runtime.OPENVINO_EXTRA
    assert registry.missing_extra("onnxruntime[model.int8.onnx]") is None


def test_a_new_runtime_is_one_registration(tiny_bundle, monkeypatch):
    """A runtime the registry lists is offered by the bundle, opened by name and timed with
    the rest; nothing else names it."""
    def runners(bundle):
        return {"echo": runtime.Target("model.onnx")}

    def open_echo(name, target, source, provider, threads, tf32):
        inner = runtime.ort_runner(source.onnx_model(target.file), provider, name=name)
        return inner

    echo = runtime.Runtime(name="echo", title="Echo", pattern="echo", files={},
                           runners=runners, file_runners=lambda path: {}, open=open_echo)
    monkeypatch.setattr(registry, "RUNTIMES", (*registry.RUNTIMES, echo))
    found = B.read_bundle(tiny_bundle)
    assert runtime.runner_names(found)[-1] == "echo"
    assert runtime.open_runner(found, "echo", "cpu").name == "echo"
    opened = runtime.open_runners(found, "cpu", runners=["echo"])
    assert [r.name for r in opened.runners] == ["eager", "echo"]
    x = np.zeros((1, 3, 32, 32), np.float32)
    np.testing.assert_allclose(opened.runners[1](x), opened.reference(x), atol=1e-4)


def test_errors_name_the_option_as_the_caller_types_it(tiny_bundle):
    found = B.read_bundle(tiny_bundle)
    with pytest.raises(ConfigError) as caught:
        runtime.open_runners(found, "cpu", runners=["openvino"])
    assert str(caught.value) == "runtime openvino is OpenVINO's: add runtimes='openvino'"
    assert caught.value.cli_message() == "runtime openvino is OpenVINO's: add --runtimes openvino"
    with pytest.raises(ProviderError) as caught:
        runtime.open_runner(found, "openvino", "cuda")
    assert caught.value.cli_message() == ("--runtime openvino runs on the CPU; --provider "
                                          "cuda cannot be honoured")
    assert "provider='cuda'" in str(caught.value) and "--" not in str(caught.value)
    with pytest.raises(Exception) as caught:
        runtime.open_runner(found, "pt2", "cpu")
    assert caught.value.cli_message().endswith("(export --pt2)")
    assert str(caught.value).endswith("(export pt2=True)")


def test_a_folder_whose_config_lists_no_model_onnx_is_refused_in_one_line():
    # the shipped model's source folder: config.json and weights, no graph of its own
    code, out, err = run("validate", DIGITS, "--provider", "cpu")
    assert code == 1, out + err
    assert err == (f"Error: {DIGITS / 'model.onnx'} has no sha256 in config.json, so it may "
                   f"not be the file that was validated\n")


def test_validate_takes_the_runtimes_to_run_by_name_as_bench_does():
    from vit_export.benchmarking import BenchOptions
    from vit_export.parity import ValidateOptions

    assert ValidateOptions(runtimes=["openvino"]).runtimes == ("openvino",)
    assert ValidateOptions().runtimes == ()
    assert BenchOptions(runtimes=["openvino"]).runtimes == ValidateOptions(
        runtimes=["openvino"]).runtimes  # one field, one spelling, for both jobs
    with pytest.raises(ConfigError, match="unknown runtime 'tensorrt'"):
        ValidateOptions(runtimes=("tensorrt",))


def test_a_bundle_model_named_for_its_default_runner_says_which():
    assert registry.absent("openvino-bf16[model.onnx]") == \
        " (model.onnx's bf16 runner is openvino-bf16)"
    assert registry.absent("openvino[model.onnx]") == " (model.onnx's runner is openvino)"
