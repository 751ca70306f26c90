"""The kinds of value a JSON file we read may hold in each field, and the one check of them:
a bundle's config.json (its model, preprocessing and export), a Hugging Face config.json and
preprocessor_config.json. Every bad value is one line naming the file, the field and the kind
it must be. Booleans are not numbers here, and NaN and infinities are no numbers at all."""
from __future__ import annotations

import math
import types
import typing
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, fields, replace
from typing import Any


@dataclass(frozen=True)
class Kind:
    """What a field may hold: `name` says it in errors ("an integer in [2, 1024]"), `test`
    checks a value, `plural` names a list of them ("integers")."""
    name: str
    test: Callable[[Any], bool]
    plural: str = ""

    def __str__(self) -> str:
        return self.name

    def named(self, name: str) -> "Kind":
        return replace(self, name=name)

    def or_null(self) -> "Kind":
        return Kind(f"{self.name} or null", lambda v: v is None or self.test(v))


def _integer(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _number(v: Any) -> bool:  # finite: an int too big for a float is no number we compute with
    return _integer(v) and abs(v) < 2 ** 1023 or isinstance(v, float) and math.isfinite(v)


BOOLEAN = Kind("a boolean", lambda v: isinstance(v, bool), "booleans")
STRING = Kind("a string", lambda v: isinstance(v, str), "strings")
OBJECT = Kind("an object", lambda v: isinstance(v, dict), "objects")
NUMBER = Kind("a number", _number, "numbers")
INTEGER = Kind("an integer", _integer, "integers")


def _bounds(low: float | None, high: float | None) -> str:
    if low is not None and high is not None:
        return f" in [{low:g}, {high:g}]"
    return f" >= {low:g}" if low is not None else f" <= {high:g}" if high is not None else ""


def integer(low: int | None = None, high: int | None = None, whole_floats: bool = False) -> Kind:
    """An integer in [low, high]; `whole_floats`: 4.0 is one too (Hugging Face's configs)."""
    def test(v: Any) -> bool:
        whole = _integer(v) or whole_floats and _number(v) and float(v).is_integer()
        return whole and (low is None or v >= low) and (high is None or v <= high)
    name = "a positive integer" if (low, high) == (1, None) else f"an integer{_bounds(low, high)}"
    return Kind(name, test, "integers")


POSITIVE_NUMBER = Kind("a positive number", lambda v: _number(v) and v > 0, "positive numbers")


def list_of(item: Kind, low: int = 0, high: int | None = None,
            sequences: tuple[type, ...] = (list,)) -> Kind:
    """A list of `item`s, `low` to `high` long. `sequences`: what a list may be (Python's
    tuples where defaults of our own join the file's values)."""
    count = f"{low} to {high} " if high is not None else f"{low} or more " if low else ""
    return Kind(f"a list of {count}{item.plural}", lambda v: isinstance(v, sequences)
                and low <= len(v) <= (len(v) if high is None else high)
                and all(item.test(x) for x in v))


def object_of(item: Kind, nonempty: bool = False) -> Kind:
    """An object whose values are `item`s (its keys are strings in JSON)."""
    return Kind(f"an object of {item.plural}", lambda v: isinstance(v, dict)
                and (bool(v) or not nonempty) and all(item.test(x) for x in v.values()))


def one_of(*values: Any) -> Kind:
    """Exactly one of `values`, of its type (an IntEnum is an int): true is not 1, nor 1.0."""
    name = repr(values[0]) if len(values) == 1 else f"one of {', '.join(map(repr, values))}"
    return Kind(name, lambda v: any(isinstance(v, type(x)) and v == x
                                    and isinstance(v, bool) == isinstance(x, bool)
                                    for x in values))


def either(*kinds: Kind) -> Kind:
    return Kind(" or ".join(k.name for k in kinds), lambda v: any(k.test(v) for k in kinds))


def field_type(hint: Any) -> tuple[Any, bool]:
    """A dataclass field's type without Optional, and whether None is allowed."""
    args = typing.get_args(hint)
    if typing.get_origin(hint) in (typing.Union, types.UnionType) and type(None) in args:
        (inner,) = [a for a in args if a is not type(None)]
        return inner, True
    return hint, False


def kind_of(hint: Any) -> Kind:
    """The JSON kind of a Python type: int, float, bool, str, Optional[...] of them,
    tuple[X, ...] (a JSON list) and dict[str, X] (an object)."""
    base, optional = field_type(hint)
    origin, args = typing.get_origin(base), typing.get_args(base)
    kind = (list_of(kind_of(args[0])) if origin is tuple else
            object_of(kind_of(args[1])) if origin is dict else
            {int: INTEGER, float: NUMBER, bool: BOOLEAN, str: STRING}[base])
    return kind.or_null() if optional else kind


def dataclass_kinds(cls: type, **overrides: Kind) -> dict[str, Kind]:
    """The kind of each field of dataclass `cls`, read once from its types; `overrides`
    narrow some (a list's length)."""
    hints = typing.get_type_hints(cls)
    return {f.name: overrides.get(f.name) or kind_of(hints[f.name]) for f in fields(cls)}


def shown(value: Any, limit: int = 80) -> str:
    """repr of a value for an error: one line, and short."""
    text = repr(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def wrong(name: str, kind: Kind, value: Any) -> str:
    """The one-line error of a value that is not of its field's kind."""
    return f"{name} must be {kind}, got {shown(value)}"


def check_fields(values: Any, kinds: Mapping[str, Kind], where: str = "",
                 error: type[Exception] = ValueError, section: str = "",
                 required: Collection[str] = (), closed: bool = False) -> None:
    """Each field of `values` (an object read from JSON) that `kinds` names is of its kind,
    the `required` ones are there and, with `closed`, no others; else `error`, one line that
    starts with `where` (the file; empty where the caller names it) and names the field, as
    `section.field` within an object of the file."""
    prefix = f"{where}: " if where else ""
    owner = f"{prefix}{section}" if section else where
    if not isinstance(values, dict):
        raise error(f"{prefix}`{section}` must be an object" if section else
                    f"{prefix}expected a JSON object")
    unknown = sorted(set(values) - set(kinds)) if closed else []
    if unknown:
        raise error(f"{prefix}unknown {section or 'config'} field(s): {', '.join(unknown)}")
    missing = [name for name in required if name not in values]
    if missing:
        raise error(f"{owner} lacks {', '.join(missing)}")
    for name, value in values.items():
        kind = kinds.get(name)
        if kind is not None and not kind.test(value):
            raise error(prefix + wrong(f"{section}.{name}" if section else name, kind, value))
