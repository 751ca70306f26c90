"""The framework road: a model vit-export does not rebuild, exported as its framework builds it.

Where the native rebuild (`vit_export.model`) does not cover an architecture (BEiT's relative
position bias, Swin's windows, Hiera, SAM-ViT, LeViT, ...), the bundle's eager model is the
source framework's own module, built by that framework's code: timm's `create_model` for a
registered name whose module is one of TIMM_MODULES, a transformers class of a model type
in HF_MODULE_TYPES, or a torchvision builder of TORCHVISION_BUILDERS. Its weights are the
checkpoint's bytes, loaded as the framework loads them (timm's `checkpoint_filter_fn`,
transformers' `from_pretrained` given the state dict, torchvision's strict load_state_dict).

config.json records the road as `module`: {"framework": "timm", "name", "kwargs"},
{"framework": "transformers", "class", "config"} or {"framework": "torchvision", "builder",
"kwargs"}, checked by `check_record` before anything is built. Nothing in it names code: names and model types come from the allow-lists, timm's
keyword arguments from TIMM_KWARGS with plain values, a transformers config is data (no
auto_map or remote code; transformers' own eager attention), and integer buffers in the
weights must equal what the framework computes for them.
"""
from __future__ import annotations

import contextlib
import io
import math
import re
import sys
from typing import Any, Optional

from .errors import (
    BundleError,
    CheckpointError,
    ConfigError,
    FrameworkMissing,
    first_line,
)

# How an imported model is built: "native" (our rebuild), "framework" (its framework's own
# module) or "auto" (native where it is rebuilt, else the framework's)
ROADS = ("auto", "native", "framework")
# timm's model modules of vision transformers and their descendants
TIMM_MODULES = ("beit", "cait", "crossvit", "davit", "deit", "efficientformer",
                "efficientformer_v2", "eva", "gcvit", "hiera", "levit", "maxxvit", "mvitv2",
                "naflexvit", "nextvit", "pit", "swin_transformer", "swin_transformer_v2",
                "swin_transformer_v2_cr", "tiny_vit", "tnt", "twins", "vision_transformer",
                "vision_transformer_hybrid", "vision_transformer_relpos",
                "vision_transformer_sam", "vitamin", "volo", "xcit")
# create_model's keyword arguments a bundle may record (sizes and switches, never a layer
# or function): what a checkpoint of another size than the name's needs
TIMM_KWARGS = ("img_size", "in_chans", "num_classes", "global_pool", "patch_size",
               "embed_dim", "embed_dims", "dim", "depth", "depths", "num_heads", "heads",
               "mlp_ratio", "mlp_ratios", "window_size", "stages", "init_values", "qkv_bias",
               "class_token", "reg_tokens", "no_embed_class", "fc_norm", "qk_norm",
               "global_attn_indexes", "neck_chans", "depth_token_only", "key_dim", "q_pool",
               "use_abs_pos_emb", "use_rel_pos_bias", "use_shared_rel_pos_bias", "use_rel_pos",
               "base_dims", "stride", "dim_mul", "head_mul", "use_mean_pooling",
               "pos_embed", "dynamic_img_size", "attn_ratio", "mlp_ratio_stages")
# transformers model types of image encoders, built by their own class
HF_MODULE_TYPES = ("aimv2_vision_model", "beit", "cvt", "data2vec-vision", "deit", "dinov2",
                   "dinov2_with_registers", "donut-swin", "dpt", "hiera", "ijepa", "levit",
                   "mobilevit", "mobilevitv2", "pvt", "pvt_v2", "segformer", "swiftformer",
                   "swin", "swinv2", "vit", "vit_mae", "vit_msn", "vitdet", "yolos",
                   "clip_vision_model", "siglip_vision_model", "dinov3_vit")
# torchvision's builders of vision transformers (its ViTs are rebuilt natively; their
# builders are here for --road framework)
TORCHVISION_BUILDERS = ("swin_t", "swin_s", "swin_b", "swin_v2_t", "swin_v2_s", "swin_v2_b",
                        "maxvit_t", "vit_b_16", "vit_b_32", "vit_l_16", "vit_l_32", "vit_h_14")
# the transformers classes a bundle may name: an image model or its classification head
HF_CLASS_ENDINGS = ("Model", "ForImageClassification", "ForImageClassificationWithTeacher")
# What a config.json may hold that would make transformers look for code, kernels or files:
# dropped at every level (a vision_config too), and attention is transformers' own eager
# one (an attn_implementation may name a Hub kernel, fetched and loaded as native code)
HF_CODE_KEYS = ("auto_map", "custom_pipelines", "transformers_weights", "attn_implementation",
                "_attn_implementation", "_attn_implementation_internal",
                "experts_implementation", "_experts_implementation", "quantization_config",
                "kernel_config", "use_kernels")


# What makes transformers build another library's backbone by name or fetch its weights
# (DPT's hybrid): refused where set
HF_BACKBONE_KEYS = ("backbone", "use_timm_backbone", "use_pretrained_backbone",
                    "backbone_kwargs")


def without_code(values: Any) -> Any:
    """A config.json's values without HF_CODE_KEYS, at every level."""
    if isinstance(values, dict):
        return {k: without_code(v) for k, v in values.items() if k not in HF_CODE_KEYS}
    if isinstance(values, list):
        return [without_code(v) for v in values]
    return values


_WORD = re.compile(r"[A-Za-z0-9_]{1,100}")
_MAX_LIST = 64


def _plain(value: Any) -> bool:
    """A keyword argument's value as a bundle may hold it: a number, a switch, a short word,
    or a short list of numbers."""
    if isinstance(value, bool) or value is None:
        return True
    if isinstance(value, (int, float)):
        return math.isfinite(value)
    if isinstance(value, str):
        return bool(_WORD.fullmatch(value))
    if isinstance(value, (list, tuple)):
        return len(value) <= _MAX_LIST and all(
            isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
            for v in value)
    return False


def _code_keys(values: Any, where: str = "config") -> Optional[str]:
    """The first key of a transformers config (at any level) that would name code."""
    if isinstance(values, dict):
        for key, value in values.items():
            if key in HF_CODE_KEYS or (key in HF_BACKBONE_KEYS and value):
                return f"{where}.{key}"
            found = _code_keys(value, f"{where}.{key}")
            if found:
                return found
    if isinstance(values, list):
        for i, value in enumerate(values):
            found = _code_keys(value, f"{where}[{i}]")
            if found:
                return found
    return None


def check_record(record: Any, source: str = "config.json") -> dict[str, Any]:
    """A bundle's `module` record, checked as data (no framework imported): BundleError
    naming what does not fit."""
    def refuse(what: str):
        raise BundleError(f"{source}: module {what}")

    if not isinstance(record, dict):
        refuse("must be an object")
    framework = record.get("framework")
    if framework == "timm":
        if set(record) != {"framework", "name", "kwargs"}:
            refuse("of timm holds framework, name and kwargs only")
        name, kwargs = record["name"], record["kwargs"]
        if not isinstance(name, str) or not _WORD.fullmatch(name):
            refuse(f"name {name!r} is not a timm model name")
        if not isinstance(kwargs, dict):
            refuse("kwargs must be an object")
        for key, value in kwargs.items():
            if key not in TIMM_KWARGS:
                refuse(f"kwargs {key!r} is not one a bundle may set ({', '.join(TIMM_KWARGS)})")
            if not _plain(value):
                refuse(f"kwargs {key}: {value!r} is not a number, switch, word or list of "
                       f"numbers")
    elif framework == "transformers":
        if set(record) != {"framework", "class", "config"}:
            refuse("of transformers holds framework, class and config only")
        name, config = record["class"], record["config"]
        if not isinstance(name, str) or not _WORD.fullmatch(name) or \
                not name.endswith(HF_CLASS_ENDINGS):
            refuse(f"class {name!r} is not an image model or classifier class name")
        if not isinstance(config, dict) or config.get("model_type") not in HF_MODULE_TYPES:
            refuse(f"config's model_type must be one of {', '.join(HF_MODULE_TYPES)}")
        code = _code_keys(config)
        if code:
            refuse(f"{code} would name code, kernels or files")
    elif framework == "torchvision":
        if set(record) != {"framework", "builder", "kwargs"}:
            refuse("of torchvision holds framework, builder and kwargs only")
        if record["builder"] not in TORCHVISION_BUILDERS:
            refuse(f"builder {record['builder']!r} is not one of "
                   f"{', '.join(TORCHVISION_BUILDERS)}")
        kwargs = record["kwargs"]
        if not isinstance(kwargs, dict) or set(kwargs) - {"num_classes", "image_size"} or \
                not all(isinstance(v, int) and not isinstance(v, bool) and 0 < v <= 1 << 20
                        for v in kwargs.values()):
            refuse("kwargs of torchvision are num_classes and image_size, positive integers")
    else:
        refuse(f"framework {framework!r} is not timm, transformers or torchvision")
    return record


def timm_home(name: str) -> str:
    """The timm module (its file's stem) that registers model `name`; ConfigError where timm
    has no such model."""
    import timm

    base = name.split(".")[0]
    if not timm.is_model(base):
        raise ConfigError(f"timm {timm.__version__} has no model {base!r}")
    return timm.models.model_entrypoint(base).__module__.rsplit(".", 1)[-1]


def module_name(record: dict[str, Any]) -> str:
    """What a `module` record builds, as its framework names it: a timm model name, a
    transformers class or a torchvision builder."""
    return record.get("name") or record.get("class") or record.get("builder") or "?"


def torchvision_builder(weights: str) -> str:
    """The builder a torchvision weights enum names (Swin_T_Weights.IMAGENET1K_V1: swin_t)."""
    return weights.split(".")[0].lower().removesuffix("_weights")


def framework_builds(extras: dict[str, Any], timm_name: Optional[str],
                     torchvision_weights: Optional[str] = None) -> bool:
    """Whether the framework road can build the checkpoint its files and names describe: a
    config.json whose model_type is in HF_MODULE_TYPES, a --timm-name of TIMM_MODULES, or
    --torchvision-weights of one of TORCHVISION_BUILDERS."""
    if torchvision_weights:
        return torchvision_builder(torchvision_weights) in TORCHVISION_BUILDERS
    document = extras.get("config.json")
    if isinstance(document, dict) and "model_type" in document:
        return document.get("model_type") in HF_MODULE_TYPES
    if timm_name:
        try:
            return timm_home(timm_name) in TIMM_MODULES
        except ConfigError:
            return False
    return False


@contextlib.contextmanager
def quiet():
    """A framework's own warnings and progress bars kept out of what a command prints."""
    import logging
    import warnings

    before = logging.root.manager.disable
    logging.disable(logging.WARNING)  # transformers' load report, timm's notes
    try:
        with warnings.catch_warnings(), contextlib.redirect_stderr(io.StringIO()):
            warnings.simplefilter("ignore")
            yield
    finally:
        logging.disable(before)


def _check_buffers(model, state: dict[str, Any]) -> None:
    """An integer tensor among the weights is a buffer the framework computes (Swin's
    relative position index): it must be one of the model's, equal to the model's own."""
    import torch

    own = dict(model.named_buffers())
    for key, value in state.items():
        if value.is_floating_point() or (key.endswith("num_batches_tracked") and
                                         value.dim() == 0):  # BatchNorm's count: unused in eval
            continue
        # by name, or under the class's own prefix (transformers' "swin." of a classifier)
        mine = [b for name, b in own.items()
                if key == name or key.endswith("." + name) or name.endswith("." + key)]
        if not any(b.shape == value.shape and torch.equal(b, value) for b in mine):
            raise CheckpointError(f"{key} is an integer tensor the model does not compute "
                                  f"as it is; weights are floats")


def _fit(model, state: dict[str, Any]) -> None:
    _check_buffers(model, state)
    _shapes_fit(model, state)
    model.load_state_dict(state, strict=True)


def _shapes_fit(model, state: dict[str, Any]) -> None:
    """The state's keys and shapes against `model`'s, one line naming what does not fit;
    on the meta device before a real model is built, so a bundle's sizes cannot make a
    command build a model its weights do not hold (a record naming width 8192 with a 1 MB
    weights file)."""
    ours = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    missing = [k for k in ours if k not in state]
    unexpected = [k for k in state if k not in ours]
    wrong = [k for k in ours if k in state and tuple(state[k].shape) != ours[k]]
    if missing or unexpected or wrong:
        raise CheckpointError(
            f"the weights do not fit {type(model).__name__}: " + ", ".join(
                f"{len(keys)} {what} ({', '.join(keys[:3])})" for what, keys in
                (("missing", missing), ("unexpected", unexpected), ("wrong shape", wrong))
                if keys))


def _built(make, record: dict[str, Any]):
    """`make()`'s module, its framework's errors one line naming the module."""
    try:
        with quiet():
            return make()
    except (CheckpointError, ConfigError):
        raise
    except Exception as exc:  # the framework's own building code: many error types
        built = module_name(record)
        raise ConfigError(f"{record['framework']} cannot build {built} as recorded: "
                          f"{type(exc).__name__}: {first_line(exc)}") from None


def _timm_module(record: dict[str, Any], state: Optional[dict], from_checkpoint: bool):
    import timm
    import torch

    name = record["name"]
    home = timm_home(name)
    if home not in TIMM_MODULES:
        raise ConfigError(f"timm's {name} is built in timm.models.{home}, not a vision "
                          f"transformer's module ({', '.join(TIMM_MODULES)})")

    def make():
        return timm.create_model(name, pretrained=False, **record["kwargs"])

    if state is not None and not from_checkpoint:
        with torch.device("meta"):
            _shapes_fit(_built(make, record), state)
    model = _built(make, record)
    if state is not None:
        filter_fn = getattr(sys.modules[type(model).__module__], "checkpoint_filter_fn", None)
        if from_checkpoint and filter_fn is not None:  # timm's own renames and resampling
            state = _built(lambda: filter_fn(state, model), record)
        _fit(model, state)
    return model


def _torchvision_module(record: dict[str, Any], state: Optional[dict]):
    """torchvision's builder `record` names, without its weights (torchvision's own ones are
    downloaded; these are the checkpoint's), built as the builder builds it."""
    import torch
    import torchvision

    builder = torchvision.models.get_model_builder(record["builder"])

    def make():
        return builder(weights=None, **record["kwargs"])

    if state is not None:
        with torch.device("meta"):
            _shapes_fit(_built(make, record), state)
    model = _built(make, record)
    if state is not None:
        _fit(model, state)
    return model


def hf_class(transformers, record: dict[str, Any], config):
    cls = getattr(transformers, record["class"], None)
    if not (isinstance(cls, type) and issubclass(cls, transformers.PreTrainedModel)
            and cls.__module__.startswith("transformers.models.")
            and not cls.__name__.endswith("PreTrainedModel")
            and isinstance(config, cls.config_class)):
        raise ConfigError(f"transformers {transformers.__version__} has no image class "
                          f"{record['class']} for model type {config.model_type!r}")
    return cls


def hf_config(transformers, values: dict[str, Any]):
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    model_type = values["model_type"]
    if model_type not in CONFIG_MAPPING:
        raise ConfigError(f"transformers {transformers.__version__} has no model type "
                          f"{model_type!r}")
    try:
        with quiet():
            return CONFIG_MAPPING[model_type].from_dict(values)
    except Exception as exc:  # transformers' own checks of its fields: many error types
        raise ConfigError(f"transformers cannot read the config as a {model_type} config: "
                          f"{first_line(exc)}") from None


def _hf_module(record: dict[str, Any], state: Optional[dict], from_checkpoint: bool):
    """transformers' class `record` names, built from its config as data, in fp32 whatever
    the config's dtype, with transformers' own eager attention."""
    import torch
    import transformers

    config = hf_config(transformers, record["config"])
    cls = hf_class(transformers, record, config)

    def make():
        return cls._from_config(config, attn_implementation="eager", dtype=torch.float32)

    if state is not None and not from_checkpoint:
        with torch.device("meta"):
            _shapes_fit(_built(make, record), state)
    model = _built(make, record)
    if state is None:
        return model
    _check_buffers(model, state)
    if not from_checkpoint:  # the module's own state dict, as a bundle holds it
        _fit(model, state)
        return model
    model, info = _built(lambda: cls.from_pretrained(  # prefixes, tied weights: its own way
        None, config=config, state_dict=state, output_loading_info=True,
        attn_implementation="eager", dtype=torch.float32, trust_remote_code=False), record)
    wrong = {k: list(info.get(k) or []) for k in ("missing_keys", "unexpected_keys",
                                                  "mismatched_keys")}
    if any(wrong.values()):
        raise CheckpointError(f"checkpoint does not fit transformers' {cls.__name__}: " +
                              ", ".join(f"{len(v)} {k.split('_')[0]} "
                                        f"({', '.join(map(str, v[:3]))})"
                                        for k, v in wrong.items() if v))
    return model


def build_module(record: dict[str, Any], state: Optional[dict] = None,
                 from_checkpoint: bool = False):
    """The framework's module `record` names, in eval mode and fp32, with `state`'s weights
    where given (`from_checkpoint`: a checkpoint's, as the framework loads one: timm's own
    filter, transformers' from_pretrained; else the module's own state dict, as a bundle
    holds it, its shapes checked before the module is built)."""
    if record["framework"] == "timm":
        model = _timm_module(record, state, from_checkpoint)
    elif record["framework"] == "torchvision":
        model = _torchvision_module(record, state)
    else:
        model = _hf_module(record, state, from_checkpoint)
    return model.eval().float()


def output_names(record: dict[str, Any], module) -> tuple[str, ...]:
    """What the framework module gives as its answer: logits where it classifies, else its
    pooled embedding."""
    if record["framework"] == "timm":
        return ("logits",) if getattr(module, "num_classes", 0) else ("embedding",)
    if record["framework"] == "torchvision":
        return ("logits",)
    return ("embedding",) if record["class"].endswith("Model") else ("logits",)


def _hf_resizes(module) -> bool:
    """Whether a transformers model's forward takes `interpolate_pos_encoding` (resamples its
    position table to the input's grid where asked)."""
    import inspect

    return "interpolate_pos_encoding" in inspect.signature(module.forward).parameters


def module_outputs(record: dict[str, Any], module, x, any_size: bool = False) -> tuple:
    """The module's outputs for a batch `x`, in `output_names`' order; `any_size`: at any
    size the framework runs it at (a transformers model told `interpolate_pos_encoding`)."""
    if record["framework"] == "timm":
        if getattr(module, "num_classes", 0):
            return (module(x),)
        return (module.forward_head(module.forward_features(x), pre_logits=True),)
    if record["framework"] == "torchvision":
        return (module(x),)
    resize = {"interpolate_pos_encoding": True} if any_size and _hf_resizes(module) else {}
    out = module(pixel_values=x, **resize)
    if record["class"].endswith("Model"):
        pooled = getattr(out, "pooler_output", None)
        if pooled is None:
            raise CheckpointError(f"transformers' {record['class']} gives no pooled embedding "
                                  f"(pooler_output); export its classification head instead")
        return (pooled,)
    return (out.logits,)


def _framework_model_class():
    import torch

    class FrameworkModel(torch.nn.Module):
        """The framework's own module as a bundle's eager model: pixel values in, the
        outputs `config.output_names` names out, as a tuple. `config` holds the inputs and
        outputs (image size, channels, widths); `record` what the module is."""

        def __init__(self, module, record: dict[str, Any], config) -> None:
            super().__init__()
            self.module = module
            self.record = record
            self.config = config

        def forward(self, x):
            return module_outputs(self.record, self.module, x, self.config.dynamic_img_size)

    return FrameworkModel


def framework_model(module, record: dict[str, Any], config):
    """The module wrapped as a bundle's eager model (see FrameworkModel)."""
    return _framework_model_class()(module, record, config).eval()


def with_any_size(model):
    """A framework model that takes any multiple of its patch (`dynamic_img_size`), where
    its framework runs it at other sizes: tried at two (one tall, one wide; a transformers
    model told to resample its position table), each giving the same output widths as at
    its own size. ConfigError naming the size and the framework's error where it does not."""
    import torch

    config = model.config.replace(dynamic_img_size=True)
    trial = framework_model(model.module, model.record, config)
    P, side = config.patch_size, config.img_size
    sizes = [(side + 2 * P, max(P, side - 2 * P)), (max(P, side - 3 * P), side + P)]
    with torch.no_grad():
        widths = [o.shape[1:] for o in model(torch.zeros(1, config.in_chans, side, side))]
        for h, w in sizes:
            try:
                with quiet():
                    got = trial(torch.zeros(2, config.in_chans, h, w))
            except Exception as exc:  # the framework's own size checks: many error types
                raise ConfigError(f"{model.record['framework']}'s {module_name(model.record)} "
                                  f"runs at its own size only ({side}x{side}; at {h}x{w}: "
                                  f"{type(exc).__name__}: {first_line(exc)})") from None
            if [o.shape[1:] for o in got] != widths or any(o.shape[0] != 2 for o in got):
                raise ConfigError(f"{model.record['framework']}'s {module_name(model.record)} "
                                  f"gives other output shapes at {h}x{w} than at {side}x{side}")
    return trial


def _square(value: Any, what: str) -> Optional[int]:
    """A side from a size that is a number or [height, width] (square only); None for what
    is neither (CvT's patch sizes, one per stage)."""
    if isinstance(value, (list, tuple)) and len(value) > 2:
        return None
    if isinstance(value, (list, tuple)):
        if len(set(value)) != 1:
            raise CheckpointError(f"{what} {list(value)} is not square; vit-export exports "
                                  f"square inputs")
        value = value[0]
    return int(value) if isinstance(value, (int, float)) and value else None


def _sizes(record: dict[str, Any], module, side: Optional[int]) -> tuple[int, int, int]:
    """(image side, channels, patch side) the module is built for (`side`: the size its
    weights were trained at, where the module does not say)."""
    if record["framework"] == "torchvision":
        img = record["kwargs"].get("image_size") or side or 224
        channels, patch = 3, getattr(module, "patch_size", None)
    elif record["framework"] == "timm":
        from timm.data import resolve_model_data_config

        channels, _, side = resolve_model_data_config(module)["input_size"]
        embed = getattr(module, "patch_embed", None) or getattr(module, "embeds", None)
        patch = _square(getattr(embed, "patch_size", None), "patch_size")
        img = (_square(record["kwargs"].get("img_size"), "img_size") or
               _square(getattr(embed, "img_size", None), "img_size") or int(side))
    else:
        config = module.config
        img = _square(getattr(config, "image_size", None), "image_size") or 224
        channels = int(getattr(config, "num_channels", 3))
        patch = _square(getattr(config, "patch_size", None) or
                        getattr(config, "patch_stride", None), "patch_size")
    if not patch or img % patch:
        patch = next(p for p in (16, 14, 8, 4, 2, 1) if img % p == 0)
    return img, int(channels), patch


def io_config(record: dict[str, Any], module, side: Optional[int] = None):
    """The ViTConfig of a framework module's inputs and outputs: its image size, channels
    and patch, and each output's width measured on one image. The architecture fields
    (depth, heads) are not the module's: `module` in config.json says what it is."""
    import torch

    from .config import ViTConfig

    img, channels, patch = _sizes(record, module, side)
    names = output_names(record, module)
    with torch.no_grad():
        outputs = module_outputs(record, module, torch.zeros(1, channels, img, img))
    if any(o.dim() != 2 for o in outputs):
        raise CheckpointError(f"{module_name(record)} gives "
                              f"{[list(o.shape) for o in outputs]}, not one vector per image")
    width = int(outputs[0].shape[1])
    return ViTConfig(img_size=img, patch_size=patch, in_chans=channels, depth=1, num_heads=1,
                     num_classes=width if names == ("logits",) else 0,
                     embed_dim=width if names == ("embedding",) else
                     int(getattr(module, "num_features", 0) or
                         getattr(getattr(module, "config", None), "hidden_size", 0) or width))


def load_framework_eager(description, state: dict[str, Any]):
    """A framework-road bundle's eager model: the module its `module` record names, built by
    the framework, given the bundle's weights (the wrapper's state dict: `module.` keys)."""
    record = description.module
    prefix = "module."
    if not all(k.startswith(prefix) for k in state):
        raise BundleError(f"weights.safetensors holds keys outside the module "
                          f"({next(k for k in state if not k.startswith(prefix))})")
    inner = {k[len(prefix):]: v for k, v in state.items()}
    try:
        __import__(record["framework"])
    except ImportError:
        raise FrameworkMissing(f"this bundle's eager model is {record['framework']}'s own "
                               f"{module_name(record)}, and {record['framework']} is not "
                               f"installed (pip install {record['framework']})") from None
    try:
        module = build_module(record, inner)
    except (CheckpointError, ConfigError) as exc:
        raise BundleError(f"weights.safetensors does not fit config.json's module: "
                          f"{first_line(exc)}") from None
    return framework_model(module, record, description.config)
