import json
import math

import pytest

from vit_export.errors import NotJSONError, VitExportError
from vit_export.jsonio import dumps

DATA = {"passed": True, "rows": [{"name": "é", "max_abs": 1.5e-06}], "labels": None}


def test_every_json_is_indented_as_parity_json_always_was_and_records_take_one_line():
    assert dumps(DATA) == json.dumps(DATA, indent=2)
    assert dumps(DATA, line=True) == json.dumps(DATA)
    assert "\n" not in dumps(DATA, line=True)
    assert json.loads(dumps(DATA)) == DATA


@pytest.mark.parametrize("data, message", [
    ({"rows": [{"name": "a"}, {"max_abs": math.nan}]},
     "cannot write r.json: rows[1].max_abs is nan, and JSON has no NaN or infinity"),
    ({"speedup": math.inf},
     "cannot write r.json: speedup is inf, and JSON has no NaN or infinity"),
    ([-math.inf], "cannot write r.json: [0] is -inf, and JSON has no NaN or infinity"),
    (math.nan, "cannot write r.json: the value is nan, and JSON has no NaN or infinity"),
])
def test_nan_and_infinity_are_one_line_naming_where_they_sit(data, message):
    for line in (False, True):
        with pytest.raises(NotJSONError) as info:
            dumps(data, line=line, what="r.json")
        assert str(info.value) == message
        assert isinstance(info.value, VitExportError) and isinstance(info.value, ValueError)


def test_a_key_given_twice_is_refused_wherever_it_sits(tiny_bundle, tmp_path):
    """Readers differ on which of two equal keys counts (Python's json takes the last), so a
    description that gives one twice, at any depth, is refused in one line, as a bundle's
    config.json is by every command."""
    import shutil

    from conftest import one_line, run

    from vit_export.errors import BundleError
    from vit_export.jsonio import parse_json

    assert parse_json('{"a": 1, "b": {"c": 2}}', "x") == {"a": 1, "b": {"c": 2}}
    with pytest.raises(BundleError, match=r"^x is not valid JSON: the key 'c' is given twice "
                                          r"in one object$"):
        parse_json('{"a": 1, "b": [{"c": 2, "c": 3}]}', "x")
    copy = tmp_path / "b"
    shutil.copytree(tiny_bundle, copy)
    text = (copy / "config.json").read_text()
    (copy / "config.json").write_text(text.replace('{', '{"format": "x", ', 1))
    code, _, err = run("info", copy)
    assert code == 1 and "the key 'format' is given twice in one object" in one_line(err)


def test_a_frameworks_own_file_keeps_the_reading_its_framework_shares():
    """transformers reads a checkpoint's config.json with Python's json, as we do: the last
    of two equal keys counts for both, so there is nothing to disagree on and it is read."""
    from vit_export.jsonio import parse_json

    assert parse_json('{"a": 1, "a": 2}', "x", unique_keys=False) == {"a": 2}
