import json
import os
import re
import shutil

import pytest
from conftest import DELETE, set_at

from vit_export import bundle as B
from vit_export.errors import BundleError, ConfigError, NotJSONError
from vit_export.model import preset_config
from vit_export.parity import read_parity
from vit_export.preprocessing import PREPROCESSING_FIELDS


def test_staged_folder_renames_into_place_only_on_success(tmp_path):
    out = tmp_path / "out"
    with B.staged_folder(out) as staging:
        (staging / "a.txt").write_text("one")
        assert not out.exists()
    assert (out / "a.txt").read_text() == "one"
    assert [p.name for p in tmp_path.iterdir()] == ["out"]


def test_staged_folder_failure_leaves_nothing(tmp_path):
    out = tmp_path / "out"
    with pytest.raises(RuntimeError), B.staged_folder(out) as staging:
        (staging / "half.bin").write_bytes(b"x" * 100)
        raise RuntimeError("export broke")
    assert list(tmp_path.iterdir()) == []


def test_staged_folder_never_overwrites_without_force(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("precious")
    with pytest.raises(BundleError, match="already exists; use force ") as caught, \
            B.staged_folder(out):
        pass
    assert (out / "keep.txt").read_text() == "precious"
    # a Python caller reads the keyword, the command's user the flag, from the one message
    assert "already exists; use --force to replace it" in caught.value.cli_message()


def test_staged_folder_force_keeps_old_until_new_is_complete(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "old.txt").write_text("old")
    with pytest.raises(RuntimeError), B.staged_folder(out, force=True) as staging:
        (staging / "new.txt").write_text("new")
        raise RuntimeError("failed")
    assert (out / "old.txt").read_text() == "old"
    with B.staged_folder(out, force=True) as staging:
        (staging / "new.txt").write_text("new")
    assert sorted(p.name for p in out.iterdir()) == ["new.txt"]
    assert [p.name for p in tmp_path.iterdir()] == ["out"]


def test_atomic_write_text_is_world_readable_and_complete(tmp_path):
    target = tmp_path / "r.json"
    B.atomic_write_text(target, "{}")
    assert target.read_text() == "{}"
    assert os.stat(target).st_mode & 0o044 == 0o044
    assert [p.name for p in tmp_path.iterdir()] == ["r.json"]
    with pytest.raises(BundleError, match="does not exist"):
        B.atomic_write_text(tmp_path / "missing" / "r.json", "{}")


def test_atomic_write_json_refuses_nan_before_it_writes(tmp_path):
    target = tmp_path / "r.json"
    B.atomic_write_json(target, {"a": [1, 2.5]})
    assert target.read_text() == json.dumps({"a": [1, 2.5]}, indent=2)
    with pytest.raises(NotJSONError, match=r"^cannot write .*r\.json: a\[1\] is nan, and JSON "
                                           r"has no NaN or infinity$"):
        B.atomic_write_json(target, {"a": [1, float("nan")]})
    assert json.loads(target.read_text()) == {"a": [1, 2.5]}  # the old file, and nothing else
    assert [p.name for p in tmp_path.iterdir()] == ["r.json"]


def test_description_round_trip_and_checks():
    config = preset_config("vit_seed_tiny")
    prep = B.Preprocessing.default_for(config)
    d = B.Description(config, prep, labels=[str(i) for i in range(10)], name="x")
    back = B.Description.from_dict(json.loads(d.to_json()))
    assert back.config == config and back.preprocessing == prep and back.labels == d.labels
    with pytest.raises(ConfigError, match="3 labels for a model with 10 classes"):
        B.Description(config, prep, labels=["a", "b", "c"])
    with pytest.raises(BundleError, match="not a vit-export-bundle"):
        B.Description.from_dict({"model": {}})


def test_preprocessing_defaults_follow_timm():
    prep = B.Preprocessing.default_for(preset_config("vit_base_patch16_224"))
    # timm resizes to floor(224 / crop_pct 0.9) = 248 and crops with round-half-even offsets
    assert (prep.img_size, prep.resize_size, prep.interpolation) == (224, 248, "bicubic")
    assert (prep.crop_mode, prep.crop_offset) == ("center", "round")
    assert prep.mean == (0.5, 0.5, 0.5) and prep.std == (0.5, 0.5, 0.5)
    assert {prep.source_of(f) for f in PREPROCESSING_FIELDS} == {"default (guessed)"}
    with pytest.raises(ConfigError, match="resize_size 10 is smaller than img_size 32"):
        B.Preprocessing(32, 10, (0.5,), (0.5,))


def test_preprocessing_round_trip_keeps_every_field_and_source():
    prep = B.Preprocessing(224, 256, (0.485, 0.456, 0.406), (0.229, 0.224, 0.225), "bilinear",
                           "squash", "floor", 1 / 127.5, "white").with_source("--set")
    back = B.Preprocessing.from_dict(json.loads(json.dumps(prep.to_dict())))
    assert back == prep and back.source_of("alpha") == "--set"


def test_old_preprocessing_without_new_fields_reads_as_before():
    """config.json written before crop modes and sources existed: the steps it meant."""
    old = {"img_size": 8, "resize_size": 8, "mean": [0.3], "std": [0.4],
           "interpolation": "bilinear"}
    prep = B.Preprocessing.from_dict(old)
    assert (prep.crop_mode, prep.crop_offset, prep.alpha) == ("center", "floor", "drop")
    assert prep.rescale_factor == 1 / 255 and prep.sources == {}
    assert prep.source_of("mean").startswith("unrecorded")


@pytest.mark.parametrize("change,message", [
    ({"crop_mode": "letterbox"}, "crop_mode must be one of"),
    ({"crop_offset": "ceil"}, "crop_offset must be one of"),
    ({"interpolation": "area"}, "interpolation must be one of"),
    ({"alpha": "black"}, "alpha must be one of"),
    ({"rescale_factor": 0.0}, "rescale_factor must be positive"),
    ({"sources": {"crop_pct": "timm"}}, "sources name unknown preprocessing field"),
])
def test_preprocessing_rejects_what_no_pipeline_does(change, message):
    values = dict(img_size=224, resize_size=248, mean=(0.5,) * 3, std=(0.5,) * 3)
    with pytest.raises(ConfigError, match=message):
        B.Preprocessing(**values, **change)
    with pytest.raises(BundleError, match=message):  # as JSON holds it: lists, not tuples
        B.Preprocessing.from_dict({**values, "mean": [0.5] * 3, "std": [0.5] * 3, **change})


@pytest.mark.parametrize("change,message", [
    ({"img_size": True}, "preprocessing.img_size must be an integer, got True"),
    ({"mean": []}, "preprocessing.mean must be a list of 1 to 64 numbers, got []"),
    ({"std": [0.5, "x", 0.5]}, "preprocessing.std must be a list of 1 to 64 numbers"),
    ({"rescale_factor": "1/255"}, "preprocessing.rescale_factor must be a number"),
    ({"alpha": None}, "preprocessing.alpha must be a string, got None"),
    ({"sources": {"mean": 1}}, "preprocessing.sources must be an object of strings"),
    ({"crop": 0.9}, "unknown preprocessing field(s): crop"),
])
def test_preprocessing_from_json_takes_each_value_only_in_its_own_type(change, message):
    values = dict(img_size=224, resize_size=248, mean=[0.5] * 3, std=[0.5] * 3)
    with pytest.raises(BundleError, match=f"^{re.escape(message)}"):
        B.Preprocessing.from_dict({**values, **change})
    with pytest.raises(BundleError, match="^preprocessing lacks resize_size, mean$"):
        B.Preprocessing.from_dict({"img_size": 224, "std": [0.5]})


def test_a_bundle_file_is_verified_as_it_is_read(tiny_bundle, tmp_path):
    """read_bundle checks the folder; each file's sha256 is checked as the file is read for
    use, and the files nothing read are checked by check_unread (validate's verdict)."""
    copy = tmp_path / "b"
    shutil.copytree(tiny_bundle, copy)
    assert B.read_bundle(copy).config.embed_dim == 64
    data = (copy / B.ONNX_FILE).read_bytes()
    (copy / B.ONNX_FILE).write_bytes(data[: len(data) // 2])
    bundle = B.read_bundle(copy)
    for use in (lambda: bundle.onnx_model(B.ONNX_FILE), lambda: bundle.read_file(B.ONNX_FILE),
                bundle.check_unread):
        with pytest.raises(BundleError, match="model.onnx does not match its sha256"):
            use()
    (copy / B.ONNX_FILE).write_bytes(data)
    bundle = B.read_bundle(copy)
    model = bundle.onnx_model(B.ONNX_FILE)
    assert bundle.onnx_model(B.ONNX_FILE) is model  # read, hashed and parsed once
    assert bundle.read_file(B.ONNX_FILE) is model.loaded and model.proto is model.proto
    bundle.check_unread()
    assert bundle.checked == set(bundle.hashes)
    (copy / B.ONNX_FILE).unlink()
    with pytest.raises(BundleError, match="model.onnx is missing"):
        B.read_bundle(copy)


@pytest.mark.parametrize("path,value,message", [
    (("format_version",), "1", "format_version must be an integer >= 0, got '1'"),
    (("format_version",), -1, "format_version must be an integer >= 0, got -1"),
    (("format_version",), 2, "has format version 2; this vit-export reads up to 1"),
    (("labels",), "cat", "labels must be a list of strings or null, got 'cat'"),
    (("name",), 7, "name must be a string, got 7"),
    (("versions",), [], "versions must be an object, got []"),
    (("model",), None, "lacks model"),
    (("files",), [], "files must be an object mapping file names to sha256 strings, got []"),
    (("model", "depth"), 2.0, "depth must be an integer, got 2.0"),
    (("export", "export_batch"), True, "export.export_batch must be an integer in [2, 1024]"),
    (("export", "export_size"), [32, 0], "export.export_size must be [height, width]"),
    (("export", "e2e_model"), "x.onnx", "export.e2e_model must be 'model.e2e.onnx', got"),
    (("export", "onnx_models"), {"../m.onnx": "fp32"},
     "export.onnx_models must be an object mapping .onnx file names in the bundle to profile"),
    (("export", "aoti"), {"precision": "bf16"},
     "export.aoti must be an object whose precision, where given, is one of fp32, fp16, got"),
])
def test_read_bundle_names_the_field_and_its_kind(tiny_bundle, tmp_path, path, value, message):
    """One line naming config.json, the field and what it must be."""
    copy = tmp_path / "b"
    shutil.copytree(tiny_bundle, copy)
    config = json.loads((copy / B.CONFIG_FILE).read_text())
    set_at(config, path, DELETE if value is None else value)
    (copy / B.CONFIG_FILE).write_text(json.dumps(config))
    with pytest.raises(BundleError) as info:
        B.read_bundle(copy)
    assert str(info.value).startswith(str(copy / B.CONFIG_FILE)) and message in str(info.value)
    assert "\n" not in str(info.value)


def test_read_bundle_rejects_non_bundles(tmp_path):
    with pytest.raises(BundleError, match="does not exist"):
        B.read_bundle(tmp_path / "nope")
    with pytest.raises(BundleError, match="has no config.json"):
        B.read_bundle(tmp_path)
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(BundleError, match="not valid JSON"):
        B.read_bundle(tmp_path)


def test_load_eager_rejects_weights_that_do_not_fit(tiny_bundle, tmp_path):
    copy = tmp_path / "b"
    shutil.copytree(tiny_bundle, copy)
    config = json.loads((copy / B.CONFIG_FILE).read_text())
    config["model"]["depth"] = 3
    (copy / B.CONFIG_FILE).write_text(json.dumps(config))
    with pytest.raises(BundleError, match="does not fit config.json: missing"):
        B.load_eager(B.read_bundle(copy))


@pytest.mark.parametrize("name", [B.ONNX_FILE, B.TS_FILE])
def test_each_model_file_describes_itself(tiny_bundle, name):
    d = B.read_description(tiny_bundle / name)
    assert d.config == B.read_bundle(tiny_bundle).config
    assert d.labels == [f"class_{i}" for i in range(10)]
    assert d.versions["torch"] and d.export["export_batch"] == 2


def test_read_description_of_truncated_onnx(tiny_bundle, tmp_path):
    broken = tmp_path / "model.onnx"
    broken.write_bytes((tiny_bundle / B.ONNX_FILE).read_bytes()[:1000])
    with pytest.raises(BundleError, match="cannot read ONNX model"):
        B.read_description(broken)


def test_a_label_with_a_line_break_and_a_std_that_is_zero_in_float32_are_refused():
    """A newline in a label split infer's one line per input; std 1e-320 is positive in
    float64 and 0 in float32, so the bundle made every image non-finite."""
    config = preset_config("vit_seed_tiny")
    prep = B.Preprocessing.default_for(config)
    labels = [f"class {i}" for i in range(9)]
    assert B.Description(config, prep, labels=labels + ["ten, décimo"]).labels[-1] == \
        "ten, décimo"  # commas, spaces and non-ASCII letters are fine
    with pytest.raises(ConfigError, match=r"^label 9 \('ten\\nmore'\) holds a line break"):
        B.Description(config, prep, labels=labels + ["ten\nmore"])
    with pytest.raises(ConfigError, match=r"^std must be positive \(in float32"):
        B.Preprocessing(img_size=32, resize_size=32, mean=(0.5,) * 3, std=(1e-320, 0.5, 0.5))


@pytest.mark.slow  # an export of its own, 5-7 s: the quick suite keeps under 3 minutes
def test_an_unhashed_e2e_model_is_refused_like_any_file_that_would_run(tmp_path):
    """model.e2e.onnx taken out of config.json's sha256 list still ran under validate, which
    said PASS: every file that runs must be the one that was validated."""
    from conftest import make_bundle

    bundle = make_bundle(tmp_path / "b", embed_preprocessing=True)
    config = json.loads((bundle / B.CONFIG_FILE).read_text())
    del config["files"][B.E2E_FILE]
    (bundle / B.CONFIG_FILE).write_text(json.dumps(config))
    with pytest.raises(BundleError, match=f"{B.E2E_FILE} has no sha256 in {B.CONFIG_FILE}"):
        B.read_bundle(bundle)


@pytest.mark.parametrize("text, message", [
    ('{"passed": "yes"}', "passed must be a boolean, got 'yes'"),
    ('{"results": []}', "lacks passed"),
    ('[true]', "expected a JSON object"),
    ('{"passed": NaN}', "is not valid JSON"),
])
def test_a_parity_json_is_read_in_the_one_style_of_every_file(tmp_path, text, message):
    path = tmp_path / B.PARITY_FILE
    path.write_text(text)
    with pytest.raises(BundleError) as caught:
        read_parity(path)
    assert str(caught.value).startswith(str(path)) and message in str(caught.value)
