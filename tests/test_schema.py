"""schema.py: the kinds of JSON values and the one check every loader of a JSON file uses."""
from dataclasses import dataclass
from enum import IntEnum
from typing import Optional

import pytest

from vit_export.errors import BundleError
from vit_export.schema import (
    BOOLEAN,
    INTEGER,
    NUMBER,
    STRING,
    check_fields,
    dataclass_kinds,
    either,
    integer,
    list_of,
    object_of,
    one_of,
)


class Code(IntEnum):
    TWO = 2


@pytest.mark.parametrize("kind, name, good, bad", [
    (INTEGER, "an integer", [0, -3, 10 ** 400], [True, 1.0, "1", None]),
    (NUMBER, "a number", [0, 2.5, -1e308], [True, float("nan"), float("inf"), 10 ** 400, "1"]),
    (BOOLEAN, "a boolean", [True, False], [0, 1, "true", None]),
    (integer(2, 1024), "an integer in [2, 1024]", [2, 1024], [1, 1025, 2.0, True]),
    (integer(0), "an integer >= 0", [0, 7], [-1, False]),
    (integer(1, whole_floats=True), "a positive integer", [1, 4.0], [0, 2.5, True, "4"]),
    (list_of(NUMBER, 1, 64), "a list of 1 to 64 numbers", [[1], [0.5] * 64],
     [[], [0.5] * 65, (0.5,), [True], [float("nan")]]),
    (object_of(STRING), "an object of strings", [{}, {"a": "b"}], [{"a": 1}, [], None]),
    (one_of(0, 1, 2), "one of 0, 1, 2", [0, 2, Code.TWO], [True, 2.0, "2", 3]),
    (one_of("x.onnx"), "'x.onnx'", ["x.onnx"], ["y.onnx", None]),
    (either(NUMBER, list_of(NUMBER)), "a number or a list of numbers", [1, [1, 2]], [["1"]]),
    (STRING.or_null(), "a string or null", ["", None], [0]),
])
def test_each_kind_says_what_it_takes_and_takes_only_that(kind, name, good, bad):
    assert str(kind) == name
    assert all(kind.test(v) for v in good), [v for v in good if not kind.test(v)]
    assert not any(kind.test(v) for v in bad), [v for v in bad if kind.test(v)]


def test_check_fields_names_the_file_the_field_and_the_kind():
    kinds = {"depth": INTEGER, "name": STRING}
    check_fields({"depth": 2, "other": "free"}, kinds, "f.json", BundleError)
    with pytest.raises(BundleError, match=r"^f\.json: depth must be an integer, got True$"):
        check_fields({"depth": True}, kinds, "f.json", BundleError)
    with pytest.raises(BundleError, match=r"^f\.json: export\.name must be a string, got 1$"):
        check_fields({"name": 1}, kinds, "f.json", BundleError, "export")
    with pytest.raises(BundleError, match=r"^f\.json: `export` must be an object$"):
        check_fields([], kinds, "f.json", BundleError, "export")
    with pytest.raises(BundleError, match=r"^f\.json: expected a JSON object$"):
        check_fields(None, kinds, "f.json", BundleError)
    with pytest.raises(BundleError, match=r"^f\.json lacks depth$"):
        check_fields({}, kinds, "f.json", BundleError, required=("depth",))
    with pytest.raises(BundleError, match=r"^unknown export field\(s\): a, b$"):
        check_fields({"b": 1, "a": 1}, kinds, error=BundleError, section="export", closed=True)


def test_a_long_value_is_cut_to_keep_the_error_short():
    with pytest.raises(ValueError) as info:
        check_fields({"name": "x" * 10_000}, {"name": INTEGER})
    assert len(str(info.value)) < 120 and str(info.value).endswith("...")


def test_dataclass_kinds_come_from_the_field_types():
    @dataclass
    class Example:
        size: int
        ratio: float
        flag: bool
        label: Optional[str]
        values: tuple[float, ...]
        names: dict[str, str]

    kinds = dataclass_kinds(Example, values=list_of(NUMBER, 1, 3))
    assert {k: str(v) for k, v in kinds.items()} == {
        "size": "an integer", "ratio": "a number", "flag": "a boolean",
        "label": "a string or null", "values": "a list of 1 to 3 numbers",
        "names": "an object of strings"}
