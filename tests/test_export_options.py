"""ExportOptions: each rule about which export options go together, with the command's names
(the front door's keywords are the flags' names), checked before any work; one message
read by a Python caller as keyword arguments and by the command's user as flags, found in
click's own table of the command."""
from __future__ import annotations

import pytest
import torch

import vit_export
from vit_export.cli import cli
from vit_export.cli.app import command_flags
from vit_export.errors import ExportError, OptionError, ProviderError
from vit_export.exporting.options import ExportOptionError, ExportOptions

EXPORT_FLAGS = command_flags(cli.commands["export"])


@pytest.mark.parametrize("keywords, python, flags", [
    (dict(fp16_io=True), "fp16_io needs precision='fp16'", "--fp16-io needs --precision fp16"),
    (dict(fp16_io=True, optimize=True), "fp16_io needs precision='fp16'",
     "--fp16-io needs --precision fp16"),
    (dict(aoti_precision="fp16"), "aoti_precision needs aoti=True",
     "--aoti-precision needs --aoti"),
    (dict(dynamic_size=True, exporter="torchscript"),
     ("dynamic_size=True needs exporter='dynamo': the torchscript exporter cannot export the "
     "antialiased bicubic resize it needs"),
     "--dynamic-size needs --exporter dynamo: the torchscript exporter"),
    (dict(quantize="static"), ("quantize='static' needs calibrate='PATH', and calibrate "
     "applies to quantize='static' only"), ("--quantize static needs --calibrate PATH, and "
     "--calibrate applies to --quantize static only")),
    (dict(calibrate="images/"), "quantize='static' needs calibrate='PATH'",
     "--quantize static needs --calibrate PATH"),
    (dict(max_drop=1, quantize="int8", real_data="x.npz"),
     "max_drop needs quantize='static' and real_data='FILE.npz' (labelled images",
     "--max-drop needs --quantize static and --real-data FILE.npz"),
    (dict(max_drop=1, quantize="static", calibrate="images/"),
     "max_drop needs quantize='static' and real_data='FILE.npz'", "--max-drop needs"),
    (dict(budget_min_cosine=0.9), ("budget_min_cosine is part of an accuracy budget: give "
     "max_drop"), "--budget-min-cosine is part of an accuracy budget: give --max-drop"),
    (dict(outputs="logits,logits"), ("outputs='logits,logits': name one or more of logits, "
     "embedding, tokens"), "--outputs logits,logits: name one or more"),
    (dict(export_batch_size=1), "export_batch_size=1: the graphs are traced at a batch of 2",
     "--export-batch-size 1: the graphs are traced"),
    (dict(export_batch_size=5000), "export_batch_size=5000 is not an integer in [2, 1024]",
     "--export-batch-size 5000 is not an integer in [2, 1024]"),
    (dict(opset="18"), "opset='18' is not an integer >= 17", "--opset 18 is not an integer"),
    (dict(calibrate_count=0), "calibrate_count=0 is not an integer >= 16",
     "--calibrate-count 0 is not an integer >= 16"),
    (dict(max_drop=float("nan")), "max_drop=nan is not a finite number in [0, 100]",
     "--max-drop nan is not"),
    (dict(precision="fp8"), "precision='fp8': choose one of fp32, fp16", "--precision fp8:"),
    (dict(exporter="tensorrt"), "exporter='tensorrt': choose one of dynamo, torchscript",
     "--exporter tensorrt:"),
    (dict(aoti=True, aoti_precision="bf16"), "aoti_precision='bf16': choose one of",
     "--aoti-precision bf16: choose one of"),
])
def test_each_rule_in_the_callers_spelling(keywords, python, flags):
    with pytest.raises(ExportOptionError) as caught:
        ExportOptions(**keywords)
    assert str(caught.value).startswith(python)
    assert "--" not in str(caught.value)  # a Python caller reads keyword arguments
    assert caught.value.cli_message(EXPORT_FLAGS).startswith(flags)
    assert isinstance(caught.value, ExportError) and isinstance(caught.value, OptionError)


def test_every_keyword_the_rules_name_is_a_flag_of_the_command():
    """The one vocabulary: each field of ExportOptions is the name of an export flag."""
    import dataclasses

    fields = {f.name for f in dataclasses.fields(ExportOptions)} - {"validation"}
    assert fields <= set(EXPORT_FLAGS), fields - set(EXPORT_FLAGS)


def test_what_goes_together_is_accepted():
    options = ExportOptions(precision="fp16", optimize=True, fp16_io=True, aoti=True,
                            aoti_precision="fp32", validation={"provider": "cpu"})
    assert options.variants == ("fp16", "optimized", "optimized-fp16")
    assert options.validation.provider == "cpu"
    assert options.package_precision == "fp32" and ExportOptions().package_precision == "fp32"
    budget = ExportOptions(quantize="static", calibrate="images/", real_data="x.npz",
                           max_drop=1)
    assert budget.labelled and budget.budget.max_drop == 1


@pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA runs here")
def test_a_provider_that_cannot_run_is_refused_when_the_options_are_made():
    with pytest.raises(ProviderError, match="requested CUDAExecutionProvider"):
        ExportOptions(validation={"provider": "cuda"})


def test_the_front_door_refuses_options_before_loading_anything(tmp_path):
    """fp16_io without an fp16 model, or an unknown keyword: refused before the checkpoint
    (here, one that does not exist) is read."""
    for keywords, said in ((dict(fp16_io=True), "fp16_io needs precision='fp16'"),
                           (dict(aoti_precision="fp16"), "aoti_precision needs aoti=True"),
                           (dict(pricision="fp16"), "unknown keyword 'pricision'")):
        with pytest.raises(OptionError) as caught:
            vit_export.export(tmp_path / "missing.pth", tmp_path / "b", **keywords)
        assert str(caught.value).startswith(said)
    assert not (tmp_path / "b").exists()


def test_library_errors_name_keywords_and_the_cli_its_flags(tmp_path):
    from vit_export.deploy.ray.data import refuse_existing
    from vit_export.embeddings import check_format
    from vit_export.errors import VitExportError

    infer = command_flags(cli.commands["infer"])
    with pytest.raises(VitExportError) as caught:
        check_format(tmp_path / "e.csv")
    assert str(caught.value).startswith(f"output='{tmp_path / 'e.csv'}': embeddings are "
                                        f"written")
    assert caught.value.cli_message(infer).startswith(f"--output {tmp_path / 'e.csv'}: "
                                                      f"embeddings")
    (tmp_path / "out.jsonl").write_text("")
    with pytest.raises(VitExportError) as caught:
        refuse_existing(tmp_path / "out.jsonl", resume=False, force=False)
    assert str(caught.value).endswith("pass resume to continue that run, or force to start over")
    assert caught.value.cli_message(infer).endswith("pass --resume to continue that run, or "
                                                    "--force to start over")

