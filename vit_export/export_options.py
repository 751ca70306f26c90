"""What an export makes and how it is checked, as one validated value: `ExportOptions`.

Every rule about which options go together lives here, checked when the options are made,
so a Python caller and `vit-export export` are refused the same things with the same words
(the CLI shows the flags, a Python caller the keyword arguments: `errors.option()`), before
minutes of loading and exporting."""
from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

from .bundle import AOTI_PRECISIONS
from .config import OUTPUTS
from .errors import ExportError, OptionError, ProviderError, option
from .images import DEFAULT_CALIBRATION_IMAGES
from .onnxio import DEFAULT_OPSET

if TYPE_CHECKING:  # the command line reads this module's names for its help: kept light
    from .parity import ValidateOptions
    from .parity.budget import AccuracyBudget

EXPORTERS = ("dynamo", "torchscript")
DEFAULT_EXPORTER = "dynamo"  # see the docs, guides/exporters.md
FP16_VARIANTS = ("fp16", "optimized-fp16")  # the variants --fp16-io changes


class ExportOptionError(OptionError, ExportError):
    """Export options that cannot go together, or a value no export can honour (an
    ExportError, as before the options had their own type; the CLI exits 2 for it)."""


def package_device(provider: str) -> str:
    """The device export --aoti compiles model.aoti.pt2 for: the one validation runs eager
    on, CUDA only where ONNX Runtime's CUDA provider loads too (open_runners puts every
    runner where ONNX Runtime really runs)."""
    from . import runtime

    return ("cuda" if provider in ("cuda", "auto") and runtime.torch_cuda()
            and runtime.cuda_problem() is None else "cpu")


def check_provider(provider: str) -> None:
    """--provider cuda where CUDA cannot run is refused before any work: validation, the
    last step, would refuse it after minutes of exporting (a ViT-B/16: 49 s here)."""
    from . import runtime

    if provider != "cuda":
        return
    problem = runtime.cuda_problem() or (None if runtime.torch_cuda() else
                                         "PyTorch sees no CUDA device")
    if problem:
        raise ProviderError(f"requested CUDAExecutionProvider but {problem}")


def check_package_precision(precision: str, provider: str) -> None:
    """Refuse, before any work, a package precision `vit-export export` does not make here:
    an fp16 package is the CUDA deliverable (fp16 GEMMs), so the command needs the export to
    run on CUDA. A check of the command's, not of ExportOptions: `export_bundle` compiles an
    fp16 program for the CPU too (inductor does so cleanly), which is how the runner's casts
    and the fp16 profile are proved where no GPU is."""
    from . import runtime

    if precision != "fp16" or package_device(provider) == "cuda":
        return
    why = ("this machine has none (PyTorch sees no CUDA device)" if not runtime.torch_cuda()
           else f"{option('--provider cpu', 'provider=cpu')} compiles for the CPU"
           if provider == "cpu" else f"this export runs on the CPU: {runtime.cuda_problem()}")
    raise ProviderError(f"{option('--aoti-precision fp16', 'package_precision=fp16')} compiles "
                        f"model.aoti.pt2 for CUDA, and {why}")


def _dynamic_needs_dynamo(exporter: str, how: str) -> None:
    """The antialiased bicubic resize a dynamic size needs is the dynamo exporter's only."""
    if exporter != "dynamo":
        raise ExportOptionError(f"{how} needs {option('--exporter dynamo', 'exporter=dynamo')}: "
                                f"the {exporter} exporter cannot export the antialiased bicubic "
                                f"resize it needs")


def check_model_exporter(config, exporter: str) -> None:
    """A model that already takes any size (timm's dynamic_img_size) needs dynamo too."""
    if config.dynamic_img_size:
        _dynamic_needs_dynamo(exporter, "a dynamic-size model")


@dataclasses.dataclass(frozen=True)
class ExportOptions:
    """What `export_bundle` makes and how it validates it; the defaults are those of
    `vit-export export`. Checked when made (`ExportOptionError`, `ProviderError`): each rule
    about which options go together is here and nowhere else."""
    exporter: str = DEFAULT_EXPORTER  # torch's ONNX exporter, "dynamo" or "torchscript"
    opset: int = DEFAULT_OPSET  # 17 or newer keeps LayerNorm one op
    # the example batch the graphs are exported at: 2 or more, so the batch axis stays dynamic
    batch: int = 2
    external_data: Optional[bool] = None  # model.onnx's weights in model.onnx.data; None: > 2 GB
    force: bool = False  # replace an existing bundle
    variants: Sequence[str] = ()  # derived ONNX models (variants.VARIANTS)
    fp16_io: bool = False  # the fp16 models take and give fp16 instead of fp32
    # images.CalibrationSet for the "static" variant, or the folder / .npz it is read from
    # (`calibrate_count` images, preprocessed as the bundle's model's)
    calibration: Any = None
    calibrate_count: int = DEFAULT_CALIBRATION_IMAGES
    # for the "static" variant: blocks kept in fp32 until it holds on the labelled images
    budget: Optional[AccuracyBudget] = None
    # a parity.ValidateOptions, or a mapping of its fields: the validation before the move
    validation: Optional[ValidateOptions | Mapping[str, Any]] = None
    # a labelled .npz validated on (and raw, for model.e2e.onnx), read with the model's
    # preprocessing; what a budget is measured on
    real_data: Optional[str | os.PathLike] = None
    embed_preprocessing: bool = False  # add model.e2e.onnx (uint8 images in)
    program: bool = False  # add model.pt2 (torch.export)
    package: bool = False  # add model.aoti.pt2 (AOTInductor)
    package_precision: Optional[str] = None  # the package's: "fp32" (None) or "fp16"
    dynamic_size: bool = False  # export a model that takes any multiple of the patch
    outputs: Optional[str] = None  # what the bundle gives: OUTPUTS, comma-separated
    normalize: bool = False  # L2-normalise the embedding in the graph

    def __post_init__(self) -> None:
        from .parity import ValidateOptions

        validation = self.validation
        if not isinstance(validation, ValidateOptions):
            validation = ValidateOptions(**dict(validation or {}))
        object.__setattr__(self, "validation", validation)
        object.__setattr__(self, "variants", tuple(self.variants))
        self._check_values()
        self._check_together()
        check_provider(validation.provider)  # before minutes of work

    @property
    def aoti_precision(self) -> str:
        """The precision model.aoti.pt2 is compiled at."""
        return self.package_precision or "fp32"

    def _check_values(self) -> None:
        """Values no export can honour."""
        from .variants import VARIANTS

        if self.exporter not in EXPORTERS:
            raise ExportOptionError(f"unknown exporter {self.exporter!r}; choose one of "
                                    f"{EXPORTERS}")
        unknown = [v for v in self.variants if v not in VARIANTS]
        if unknown:
            raise ExportOptionError(f"unknown model variant {unknown[0]!r}; choose from "
                                    f"{', '.join(VARIANTS)}")
        if self.batch < 2:
            raise ExportOptionError(f"export batch must be >= 2 so the batch axis is not "
                                    f"specialised, got {self.batch}")
        if self.package_precision not in (None, *AOTI_PRECISIONS):
            raise ExportOptionError(f"unknown package precision {self.package_precision!r}; "
                                    f"choose one of {', '.join(AOTI_PRECISIONS)}")
        names = self.outputs.split(",") if self.outputs is not None else []
        if not set(names) <= set(OUTPUTS) or len(set(names)) != len(names):
            raise ExportOptionError(f"{option('--outputs ' + str(self.outputs), 'outputs')}: "
                                    f"name one or more of {', '.join(OUTPUTS)}, "
                                    f"comma-separated, each once")

    def _check_together(self) -> None:
        """Options that need another one."""
        if self.fp16_io and not set(self.variants) & set(FP16_VARIANTS):
            raise ExportOptionError(f"{option('--fp16-io')} needs "
                                    f"{option('--precision fp16', 'an fp16 variant')}")
        if self.package_precision is not None and not self.package:
            raise ExportOptionError(f"{option('--aoti-precision', 'package_precision')} needs "
                                    f"{option('--aoti', 'package=True')}")
        if self.dynamic_size:
            _dynamic_needs_dynamo(self.exporter, option("--dynamic-size", "dynamic_size"))
        static = option("--quantize static", "the static variant")
        if ("static" in self.variants) != (self.calibration is not None):
            raise ExportOptionError(f"{static} needs {option('--calibrate PATH', 'calibration')}"
                                    f", and {option('--calibrate', 'calibration')} applies to "
                                    f"{static} only")
        if self.budget is not None and ("static" not in self.variants or not self.labelled):
            raise ExportOptionError(f"{option('--max-drop', 'budget')} needs {static} and "
                                    f"{option('--real-data FILE.npz', 'real_data')} (labelled "
                                    f"images the drop is measured on)")

    @property
    def labelled(self) -> bool:
        """Whether a labelled set is given: `real_data`, or a validation set with labels."""
        return self.real_data is not None or any(
            labels is not None for _, labels in (self.validation.real_inputs or {}).values())

    def calibration_path(self) -> Optional[Path]:
        """Where the calibration set is still to be read from, or None."""
        return (Path(self.calibration) if isinstance(self.calibration, (str, os.PathLike))
                else None)
