"""Foreign checkpoints (timm, Hugging Face, torchvision) -> our names, config and labels.

One module per source family (`timm`, `hf`, `torchvision`), each declaring its `Family`: how
its keys are recognised, the renames to ours (plus, for Hugging Face, fusing separate q/k/v
into qkv), the tensors it lays out otherwise, what its framework fixes in code and how its
config file reads. `formats` registers them and dispatches; `infer` reads the config off the
renamed weights' shapes, then the checkpoint's own config file, a named model, a preset and
explicit overrides win, in that order (`load`). Nothing is dropped silently: a key that does
not fit is reported with the counts of missing, unexpected and wrong-shape keys.
"""
from .family import Family, mlp_ratio_of, set_option
from .formats import FAMILIES, FORMAT_FIXED, FORMATS, RENAMES, convert, detect_format
from .hf import (
    HF_ACTIVATIONS,
    HF_BASES,
    HF_CONFIG_KINDS,
    HF_FIELDS,
    HF_MODEL_TYPES,
    HF_PATCH_EMBED,
    HF_RESAMPLED,
    HF_UNUSED,
    hf_architecture,
    hf_labels,
)
from .infer import HEADS_BY_WIDTH, NOT_IN_WEIGHTS, infer_config, unknown_architecture
from .load import (
    fit_report,
    import_files,
    load_checkpoint,
    load_model,
    named_architecture,
    named_sizes,
)
from .state import WRAPPER_KEYS, read_state_dict
from .timm import (
    EVA_DERIVED,
    EVA_KEYS,
    TIMM_VIT_FIELDS,
    TIMM_VIT_FIXED,
    timm_architecture,
    timm_model,
    timm_named,
    timm_sizes,
)
from .torchvision import torchvision_architecture, torchvision_sizes

__all__ = [
    "EVA_DERIVED",
    "EVA_KEYS",
    "FAMILIES",
    "FORMATS",
    "FORMAT_FIXED",
    "HEADS_BY_WIDTH",
    "HF_ACTIVATIONS",
    "HF_BASES",
    "HF_CONFIG_KINDS",
    "HF_FIELDS",
    "HF_MODEL_TYPES",
    "HF_PATCH_EMBED",
    "HF_RESAMPLED",
    "HF_UNUSED",
    "NOT_IN_WEIGHTS",
    "RENAMES",
    "TIMM_VIT_FIELDS",
    "TIMM_VIT_FIXED",
    "WRAPPER_KEYS",
    "Family",
    "convert",
    "detect_format",
    "fit_report",
    "hf_architecture",
    "hf_labels",
    "import_files",
    "infer_config",
    "load_checkpoint",
    "load_model",
    "mlp_ratio_of",
    "named_architecture",
    "named_sizes",
    "read_state_dict",
    "set_option",
    "timm_architecture",
    "timm_model",
    "timm_named",
    "timm_sizes",
    "torchvision_architecture",
    "torchvision_sizes",
    "unknown_architecture",
]
