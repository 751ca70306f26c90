"""Foreign checkpoints (timm, Hugging Face, torchvision) -> our names, config and labels.

One module per source family (`timm`, `hf`, `torchvision`), each declaring its `Family`: how
its keys are recognised, the renames to ours (plus, for Hugging Face, fusing separate q/k/v
into qkv), the tensors it lays out otherwise, what its framework fixes in code and how its
config file reads. `formats` registers them and dispatches; `infer` reads the config off the
renamed weights' shapes, then the checkpoint's own config file, a named model, a preset and
explicit overrides win, in that order (`load`). Nothing is dropped silently: a key that does
not fit is reported with the counts of missing, unexpected and wrong-shape keys.
"""
from __future__ import annotations

from ..lazy import lazy_names

# Each public name's module. The package loads a module when one of its names is first
# asked for, so that what needs one family's names (the Hub's checks read config.json
# through `hf`) does not load torch with the rest.
_HOMES = {
    "DINOV3_KINDS": "hf",
    "CheckpointFiles": "files",
    "EVA_DERIVED": "timm",
    "EVA_KEYS": "timm",
    "FAMILIES": "formats",
    "FORMATS": "formats",
    "FORMAT_FIXED": "formats",
    "Family": "family",
    "HEADS_BY_WIDTH": "infer",
    "HF_ACTIVATIONS": "hf",
    "HF_BASES": "hf",
    "HF_CONFIG_KINDS": "hf",
    "HF_FIELDS": "hf",
    "HF_MODEL_TYPES": "hf",
    "HF_PATCH_EMBED": "hf",
    "HF_RESAMPLED": "hf",
    "HF_UNUSED": "hf",
    "NOT_IN_WEIGHTS": "infer",
    "RENAMES": "formats",
    "TIMM_VIT_FIELDS": "timm",
    "TIMM_VIT_FIXED": "timm",
    "WRAPPER_KEYS": "state",
    "convert": "formats",
    "detect_format": "formats",
    "fit_report": "load",
    "hf_architecture": "hf",
    "hf_labels": "hf",
    "infer_config": "infer",
    "load_checkpoint": "load",
    "load_model": "load",
    "mlp_ratio_of": "family",
    "named_architecture": "load",
    "named_sizes": "load",
    "read_checkpoint": "files",
    "read_recorded": "files",
    "read_state_dict": "state",
    "set_option": "family",
    "timm_architecture": "timm",
    "timm_model": "timm",
    "timm_named": "timm",
    "timm_sizes": "timm",
    "torchvision_architecture": "torchvision",
    "torchvision_sizes": "torchvision",
    "unknown_architecture": "infer",
}

__getattr__, __dir__ = lazy_names(__name__, globals(), _HOMES)
