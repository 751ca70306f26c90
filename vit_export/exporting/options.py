"""What an export makes and how it is checked, as one validated value: `ExportOptions`.

Every rule about which options go together lives here, checked when the options are made,
so a Python caller and `vit-export export` are refused the same things with the same words
(the CLI shows the flags, a Python caller the keyword arguments: `errors.param()`), before
minutes of loading and exporting."""
from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

from ..bundle import AOTI_PRECISIONS, MAX_EXPORT_BATCH
from ..config import OUTPUTS
from ..errors import ExportError, OptionError, ProviderError, param, within
from ..images import DEFAULT_CALIBRATION_IMAGES, MIN_CALIBRATION_IMAGES
from ..onnxio import DEFAULT_OPSET

if TYPE_CHECKING:  # the command line reads this module's names for its help: kept light
    from ..parity import ValidateOptions
    from ..parity.budget import AccuracyBudget

EXPORTERS = ("dynamo", "torchscript")
DEFAULT_EXPORTER = "dynamo"  # see the docs, guides/exporters.md


class ExportOptionError(OptionError, ExportError):
    """Export options that cannot go together, or a value no export can honour (an
    ExportError, as before the options had their own type; the CLI exits 2 for it)."""


def package_device(provider: str) -> str:
    """The device export --aoti compiles model.aoti.pt2 for: the one validation runs eager
    on, CUDA only where ONNX Runtime's CUDA provider loads too (open_runners puts every
    runner where ONNX Runtime really runs)."""
    from .. import runtime

    return ("cuda" if provider in ("cuda", "auto") and runtime.torch_cuda()
            and runtime.cuda_problem() is None else "cpu")


def check_provider(provider: str) -> None:
    """--provider cuda where CUDA cannot run is refused before any work: validation, the
    last step, would refuse it after minutes of exporting (a ViT-B/16: 49 s here)."""
    from .. import runtime

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
    from .. import runtime

    if precision != "fp16" or package_device(provider) == "cuda":
        return
    why = ("this machine has none (PyTorch sees no CUDA device)" if not runtime.torch_cuda()
           else f"{param('provider', 'cpu')} compiles for the CPU"
           if provider == "cpu" else f"this export runs on the CPU: {runtime.cuda_problem()}")
    raise ProviderError(f"{param('aoti_precision', 'fp16')} compiles "
                        f"model.aoti.pt2 for CUDA, and {why}")


def _dynamic_needs_dynamo(exporter: str, how: str) -> None:
    """The antialiased bicubic resize a dynamic size needs is the dynamo exporter's only."""
    if exporter != "dynamo":
        raise ExportOptionError(f"{how} needs {param('exporter', 'dynamo')}: "
                                f"the {exporter} exporter cannot export the antialiased bicubic "
                                f"resize it needs")


def check_model_exporter(config, exporter: str) -> None:
    """A model that already takes any size (timm's dynamic_img_size) needs dynamo too."""
    if config.dynamic_img_size:
        _dynamic_needs_dynamo(exporter, "a dynamic-size model")


@dataclasses.dataclass(frozen=True)
class ExportOptions:
    """What `export_bundle` makes and how it validates it, by the names `vit-export export`'s
    flags and `vit_export.export`'s keywords give them; the defaults are theirs. Checked when
    made (`ExportOptionError`, `ProviderError`): each rule about which options go together is
    here and nowhere else."""
    exporter: str = DEFAULT_EXPORTER  # torch's ONNX exporter, "dynamo" or "torchscript"
    opset: int = DEFAULT_OPSET  # 17 or newer keeps LayerNorm one op
    # the example batch the graphs are traced at: 2 or more, so the batch axis stays dynamic
    export_batch_size: int = 2
    external_data: Optional[bool] = None  # model.onnx's weights in model.onnx.data; None: > 2 GB
    force: bool = False  # replace an existing bundle
    precision: str = "fp32"  # "fp16" adds model.fp16.onnx (and, optimized, model.opt.fp16.onnx)
    optimize: bool = False  # add model.opt.onnx, ONNX Runtime's transformer fusions
    # "int8" (dynamic), "static", or both ("int8,static"): model.int8[-static].onnx
    quantize: Optional[str | Sequence[str]] = None
    fp16_io: bool = False  # the fp16 models take and give fp16 instead of fp32
    # quantize="static"'s calibration images: an images.CalibrationSet, or the folder / .npz
    # it is read from (`calibrate_count` images, preprocessed as the bundle's model's)
    calibrate: Any = None
    calibrate_count: int = DEFAULT_CALIBRATION_IMAGES
    # quantize="static" within an accuracy budget: blocks kept in fp32 until the top-1 drop
    # on the labelled images is at most `max_drop` points (and the lowest cosine at least
    # `budget_min_cosine`)
    max_drop: Optional[float] = None
    budget_min_cosine: Optional[float] = None
    # a parity.ValidateOptions, or a mapping of its fields: the validation before the move
    validation: Optional[ValidateOptions | Mapping[str, Any]] = None
    # a labelled .npz validated on (and raw, for model.e2e.onnx), read with the model's
    # preprocessing; what a budget is measured on
    real_data: Optional[str | os.PathLike] = None
    embed_preprocessing: bool = False  # add model.e2e.onnx (uint8 images in)
    pt2: bool = False  # add model.pt2 (torch.export)
    aoti: bool = False  # add model.aoti.pt2 (AOTInductor)
    aoti_precision: Optional[str] = None  # the package's: "fp32" (None) or "fp16"
    dynamic_size: bool = False  # export a model that takes any multiple of the patch
    outputs: Optional[str] = None  # what the bundle gives: OUTPUTS, comma-separated
    normalize: bool = False  # L2-normalise the embedding in the graph

    def __post_init__(self) -> None:
        from ..parity import ValidateOptions

        validation = self.validation
        if not isinstance(validation, ValidateOptions):
            validation = ValidateOptions(**dict(validation or {}))
        object.__setattr__(self, "validation", validation)
        if isinstance(self.quantize, str):
            object.__setattr__(self, "quantize", tuple(self.quantize.split(",")))
        object.__setattr__(self, "quantize", tuple(dict.fromkeys(self.quantize or ())))
        self._check_values()
        self._check_together()
        check_provider(validation.provider)  # before minutes of work

    @property
    def variants(self) -> tuple[str, ...]:
        """The ONNX models derived from model.onnx (variants.VARIANTS) the options ask for."""
        fp16 = self.precision == "fp16"
        return tuple(kind for kind, wanted in (
            ("fp16", fp16), ("optimized", self.optimize),
            ("optimized-fp16", self.optimize and fp16)) if wanted) + self.quantize

    @property
    def package_precision(self) -> str:
        """The precision model.aoti.pt2 is compiled at."""
        return self.aoti_precision or "fp32"

    @property
    def budget(self) -> Optional[AccuracyBudget]:
        """The accuracy budget static int8 is made within, or None."""
        from ..parity.budget import AccuracyBudget

        return None if self.max_drop is None else \
            AccuracyBudget(self.max_drop, self.budget_min_cosine)

    def _check_values(self) -> None:
        """Values no export can honour."""
        from .variants import PRECISIONS, QUANTIZATIONS

        if self.exporter not in EXPORTERS:
            raise ExportOptionError(f"{param('exporter', self.exporter)}: choose one of "
                                    f"{', '.join(EXPORTERS)}")
        if self.precision not in PRECISIONS:
            raise ExportOptionError(f"{param('precision', self.precision)}: choose one of "
                                    f"{', '.join(PRECISIONS)}")
        if not set(self.quantize) <= set(QUANTIZATIONS):
            raise ExportOptionError(f"{param('quantize', ','.join(self.quantize))}: choose "
                                    f"{' or '.join(QUANTIZATIONS)}, or both")
        if isinstance(self.export_batch_size, int) and self.export_batch_size < 2:
            raise ExportOptionError(f"{param('export_batch_size', self.export_batch_size)}: "
                                    f"the graphs are traced at a batch of 2 or more, so the "
                                    f"batch axis is not specialised")
        within("export_batch_size", self.export_batch_size, 2, MAX_EXPORT_BATCH, whole=True,
               error=ExportOptionError)
        within("opset", self.opset, 17, whole=True, error=ExportOptionError)
        within("calibrate_count", self.calibrate_count, MIN_CALIBRATION_IMAGES, whole=True,
               error=ExportOptionError)
        for name, low, high in (("max_drop", 0, 100), ("budget_min_cosine", -1, 1)):
            if getattr(self, name) is not None:
                within(name, getattr(self, name), low, high, error=ExportOptionError)
        if self.aoti_precision not in (None, *AOTI_PRECISIONS):
            raise ExportOptionError(f"{param('aoti_precision', self.aoti_precision)}: choose "
                                    f"one of {', '.join(AOTI_PRECISIONS)}")
        names = self.outputs.split(",") if self.outputs is not None else []
        if not set(names) <= set(OUTPUTS) or len(set(names)) != len(names):
            raise ExportOptionError(f"{param('outputs', self.outputs)}: name one or more of "
                                    f"{', '.join(OUTPUTS)}, comma-separated, each once")

    def _check_together(self) -> None:
        """Options that need another one."""
        if self.fp16_io and self.precision != "fp16":
            raise ExportOptionError(f"{param('fp16_io')} needs {param('precision', 'fp16')}")
        if self.aoti_precision is not None and not self.aoti:
            raise ExportOptionError(f"{param('aoti_precision')} needs {param('aoti', True)}")
        if self.dynamic_size:
            _dynamic_needs_dynamo(self.exporter, param("dynamic_size", True))
        static = param("quantize", "static")
        if ("static" in self.quantize) != (self.calibrate is not None):
            raise ExportOptionError(f"{static} needs {param('calibrate', 'PATH')}, and "
                                    f"{param('calibrate')} applies to {static} only")
        if self.budget_min_cosine is not None and self.max_drop is None:
            raise ExportOptionError(f"{param('budget_min_cosine')} is part of an accuracy "
                                    f"budget: give {param('max_drop')}")
        if self.max_drop is not None and ("static" not in self.quantize or not self.labelled):
            raise ExportOptionError(f"{param('max_drop')} needs {static} and "
                                    f"{param('real_data', 'FILE.npz')} (labelled images the "
                                    f"drop is measured on)")

    @property
    def labelled(self) -> bool:
        """Whether a labelled set is given: `real_data`, or a validation set with labels."""
        return self.real_data is not None or any(
            labels is not None for _, labels in (self.validation.real_inputs or {}).values())

    def calibration_path(self) -> Optional[Path]:
        """Where the calibration set is still to be read from, or None."""
        return (Path(self.calibrate) if isinstance(self.calibrate, (str, os.PathLike))
                else None)
