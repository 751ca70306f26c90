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
