"""ExportOptions: each rule about which export options go together, from Python as the CLI
has them (the same words, the keyword arguments where the CLI names its flags), checked
before any work."""
from __future__ import annotations

import pytest
import torch

from vit_export import bundle as B
from vit_export.errors import ExportError, OptionError, ProviderError
from vit_export.export import export_bundle
from vit_export.export_options import ExportOptionError, ExportOptions
from vit_export.model import VisionTransformer, preset_config
from vit_export.parity.budget import AccuracyBudget


@pytest.mark.parametrize("keywords, message", [
    (dict(fp16_io=True), "fp16_io needs an fp16 variant"),
    (dict(fp16_io=True, variants=["optimized"]), "fp16_io needs an fp16 variant"),
    (dict(package_precision="fp16"), "package_precision needs package=True"),
    (dict(package_precision="fp32"), "package_precision needs package=True"),
    (dict(dynamic_size=True, exporter="torchscript"),
     ("dynamic_size needs exporter=dynamo: the torchscript exporter cannot export the "
     "antialiased bicubic resize it needs")),
    (dict(variants=["static"]), ("the static variant needs calibration, and calibration "
                                "applies to the static variant only")),
    (dict(calibration="images/"), "the static variant needs calibration"),
    (dict(budget=AccuracyBudget(1), variants=["int8"], real_data="x.npz"),
     "budget needs the static variant and real_data (labelled images"),
    (dict(budget=AccuracyBudget(1), variants=["static"], calibration="images/"),
     "budget needs the static variant and real_data"),
    (dict(outputs="logits,logits"), "outputs: name one or more of logits, embedding, tokens"),
    (dict(batch=1), "export batch must be >= 2"),
    (dict(variants=["fp8"]), "unknown model variant 'fp8'"),
    (dict(exporter="tensorrt"), "unknown exporter 'tensorrt'"),
    (dict(package=True, package_precision="bf16"), "unknown package precision 'bf16'"),
])
def test_each_rule_is_refused_when_the_options_are_made(keywords, message):
    with pytest.raises(ExportOptionError) as caught:
        ExportOptions(**keywords)
    assert message in str(caught.value)
    assert "--" not in str(caught.value)  # a Python caller reads keyword arguments
    assert isinstance(caught.value, ExportError) and isinstance(caught.value, OptionError)


def test_the_cli_reads_the_same_rule_with_its_flags():
    with pytest.raises(ExportOptionError) as caught:
        ExportOptions(package_precision="fp16")
    assert caught.value.cli_message() == "--aoti-precision needs --aoti"
    with pytest.raises(ExportOptionError) as caught:
        ExportOptions(fp16_io=True, variants=["int8"])
    assert caught.value.cli_message() == "--fp16-io needs --precision fp16"


def test_what_goes_together_is_accepted():
    options = ExportOptions(variants=["fp16"], fp16_io=True, package=True,
                            package_precision="fp32", validation={"provider": "cpu"})
    assert options.variants == ("fp16",) and options.validation.provider == "cpu"
    assert options.aoti_precision == "fp32" and ExportOptions().aoti_precision == "fp32"
    budget = ExportOptions(variants=["static"], calibration="images/", real_data="x.npz",
                           budget=AccuracyBudget(1))
    assert budget.labelled


@pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA runs here")
def test_a_provider_that_cannot_run_is_refused_when_the_options_are_made():
    with pytest.raises(ProviderError, match="requested CUDAExecutionProvider"):
        ExportOptions(validation={"provider": "cuda"})


def test_export_bundle_refuses_fp16_io_without_an_fp16_model_before_any_work(tmp_path):
    model = VisionTransformer(preset_config("vit_seed_tiny")).eval()
    description = B.Description(model.config,
                                B.Preprocessing.default_for(model.config))
    for keywords in (dict(fp16_io=True), dict(package_precision="fp16")):
        with pytest.raises(ExportOptionError):
            export_bundle(model, tmp_path / "b", description, **keywords)
        with pytest.raises(ExportOptionError):  # the options and a keyword replaced in them
            export_bundle(model, tmp_path / "b", description, ExportOptions(), **keywords)
    assert not (tmp_path / "b").exists()


def test_library_errors_name_keywords_and_the_cli_its_flags(tmp_path):
    from vit_export.deploy.raydata import refuse_existing
    from vit_export.embeddings import check_format
    from vit_export.errors import VitExportError

    with pytest.raises(VitExportError) as caught:
        check_format(tmp_path / "e.csv")
    assert str(caught.value).startswith(f"output={tmp_path / 'e.csv'}: embeddings are written")
    assert caught.value.cli_message().startswith(f"--output {tmp_path / 'e.csv'}: embeddings")
    (tmp_path / "out.jsonl").write_text("")
    with pytest.raises(VitExportError) as caught:
        refuse_existing(tmp_path / "out.jsonl", resume=False, force=False)
    assert str(caught.value).endswith("pass resume to continue that run, or force to start over")
    assert caught.value.cli_message().endswith("pass --resume to continue that run, or --force "
                                               "to start over")
