"""A checkpoint on the framework road (`vit_export.frameworks`): the `module` record its
files and names give, checked as a bundle's is (`check_record`) before anything is built."""
from __future__ import annotations

import re
from typing import Any

from ..errors import CheckpointError, ConfigError, first_line, param
from ..frameworks import (
    HF_CLASS_ENDINGS,
    HF_MODULE_TYPES,
    TIMM_KWARGS,
    check_record,
    hf_class,
    hf_config,
    torchvision_builder,
    without_code,
)


def _coerce(value: str) -> Any:
    """A --set string as the JSON value it spells (64, true, [1, 1]), else the string."""
    import json

    try:
        return json.loads(value)
    except ValueError:
        return value


def _head_width(state: dict[str, Any]) -> int:
    """The classes a timm checkpoint's head gives (its last head Linear's rows), 0 where it
    has none."""
    heads = [k for k in state if re.fullmatch(
        r"(head|fc|classifier)(\.\d+)?(\.fc|\.l|\.linear)?\.weight", k) and state[k].dim() == 2]
    return int(state[heads[-1]].shape[0]) if heads else 0


def timm_record(timm_name: str, state: dict[str, Any], overrides: dict[str, Any]
                ) -> dict[str, Any]:
    """The record of a timm checkpoint on the framework road: the name (without its tag),
    the head's classes, and --set values as create_model's keyword arguments."""
    kwargs = {k: _coerce(v) if isinstance(v, str) else v for k, v in overrides.items()}
    wrong = sorted(set(kwargs) - set(TIMM_KWARGS))
    if wrong:
        raise ConfigError(f"{param('overrides', {wrong[0]: kwargs[wrong[0]]})}: timm models "
                          f"exported as timm builds them take {', '.join(TIMM_KWARGS)}")
    kwargs.setdefault("num_classes", _head_width(state))
    record = {"framework": "timm", "name": timm_name.split(".")[0], "kwargs": kwargs}
    return check_record(record, "the import")


def torchvision_record(weights: str, state: dict[str, Any]) -> dict[str, Any]:
    """The record of a torchvision checkpoint on the framework road: the builder its weights
    enum names and the head's classes (its last Linear's rows, torchvision's `head` or
    `heads.head`; MaxViT's `classifier.5`)."""
    heads = [k for k in state if re.fullmatch(r"(heads?(\.head)?|classifier\.\d+)\.weight", k)
             and state[k].dim() == 2]
    kwargs = {"num_classes": int(state[heads[-1]].shape[0])} if heads else {}
    record = {"framework": "torchvision", "builder": torchvision_builder(weights),
              "kwargs": kwargs}
    return check_record(record, "the import")


def hf_record(document: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    """The record of a transformers checkpoint on the framework road: the class its
    config.json's `architectures` names (an image model or classifier of its model type),
    else the model type's base model, and the config as data."""
    import transformers
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING
    from transformers.models.auto.modeling_auto import MODEL_MAPPING

    if overrides:
        raise ConfigError(f"{param('overrides', overrides)}: a transformers model exported as "
                          f"transformers builds it is built as its config.json says")
    values = without_code(document)
    model_type = values.get("model_type")
    if model_type not in HF_MODULE_TYPES or model_type not in CONFIG_MAPPING:
        raise CheckpointError(f"config.json: model_type {model_type!r} is not one vit-export "
                              f"exports as transformers builds it ({', '.join(HF_MODULE_TYPES)})")
    try:
        config = hf_config(transformers, values)
    except ConfigError as exc:
        raise CheckpointError(f"config.json: {first_line(exc)}") from None
    names = values.get("architectures") or []
    name = names[0] if isinstance(names, list) and names and isinstance(names[0], str) else ""
    record = {"framework": "transformers", "class": name, "config": values}
    try:
        if not name.endswith(HF_CLASS_ENDINGS):
            raise ConfigError(name)
        hf_class(transformers, record, config)
    except ConfigError:
        record["class"] = MODEL_MAPPING[type(config)].__name__
    return check_record(record, "the import")
