"""How an image becomes the model's input, in one place: the Preprocessing a bundle records,
its fields' allowed values and checks (recipe.py), what timm, Hugging Face and torchvision say
it is (sources.py), our Python pipeline and those frameworks' own (pipeline.py), and the same
steps as an ONNX graph in front of the model (graph.py). The main names of the first three
are importable from the package; graph.py is not imported here, as it needs bundle.py and
export.py, which import this package."""
from .pipeline import framework_pipeline, pixels, preprocess
from .recipe import (
    ALPHA_MODES,
    CROP_MODES,
    CROP_OFFSETS,
    GUESSED,
    INTERPOLATIONS,
    MAX_IMAGE_SIDE,
    PREPROCESSING_FIELDS,
    PREPROCESSING_KINDS,
    RESIZE_BACKENDS,
    TORCH_INTERPOLATIONS,
    Preprocessing,
)
from .sources import (
    apply_preprocessing_overrides,
    hf_preprocessing,
    resolve_preprocessing,
    split_overrides,
    timm_preprocessing,
    torchvision_preprocessing,
)

__all__ = [
    "ALPHA_MODES", "CROP_MODES", "CROP_OFFSETS", "GUESSED", "INTERPOLATIONS", "MAX_IMAGE_SIDE",
    "PREPROCESSING_FIELDS", "PREPROCESSING_KINDS", "RESIZE_BACKENDS", "TORCH_INTERPOLATIONS",
    "Preprocessing", "apply_preprocessing_overrides", "framework_pipeline", "hf_preprocessing",
    "pixels", "preprocess", "resolve_preprocessing", "split_overrides", "timm_preprocessing",
    "torchvision_preprocessing",
]
