"""An accuracy budget for a quantized model: how many top-1 points it may lose against eager
fp32 on a labelled set, and how low one image's logit cosine may go; measured and judged here
(pure functions over whole logits), chosen at export and recorded in config.json."""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Optional

import numpy as np

from ..errors import ParityError
from .compare import cosines
from .report import Check

STATIC_FILE = "model.int8-static.onnx"  # the model a budget is recorded for


@dataclass(frozen=True)
class AccuracyBudget:
    """What a static int8 model may lose against eager fp32 on a labelled set."""
    max_drop: float  # top-1 accuracy points (of 100) lost against eager, at most
    min_cosine: Optional[float] = None  # the lowest per-image cosine of the logits, at least

    def __post_init__(self) -> None:
        if not 0 <= self.max_drop <= 100:
            raise ParityError(f"an accuracy budget's drop is 0 to 100 top-1 points, got "
                              f"{self.max_drop:g}")
        if self.min_cosine is not None and not -1 <= self.min_cosine <= 1:
            raise ParityError(f"an accuracy budget's cosine is -1 to 1, got "
                              f"{self.min_cosine:g}")

    @classmethod
    def from_record(cls, record: dict[str, Any]) -> "AccuracyBudget":
        """The budget config.json records (`export.static_int8.budget`), read and checked."""
        if not isinstance(record, dict) or not isinstance(record.get("kept_fp32", []), list) \
                or not all(isinstance(b, str) for b in record.get("kept_fp32", [])):
            raise ParityError(f"config.json's accuracy budget is not one: {record!r}")
        try:
            return cls(float(record["max_drop"]), None if record.get("min_cosine") is None
                       else float(record["min_cosine"]))
        except (KeyError, TypeError, ValueError):
            raise ParityError(f"config.json's accuracy budget is not one: {record!r}") from None


@dataclass(frozen=True)
class Measured:
    """A model's logits against eager's on one labelled set."""
    accuracy: float  # the model's top-1, in points (of 100)
    reference_accuracy: float  # eager fp32's, on the same images
    min_cosine: float  # the lowest per-image cosine against eager's logits
    images: int

    @property
    def drop(self) -> float:
        """Top-1 points lost against eager (negative: gained)."""
        return self.reference_accuracy - self.accuracy

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "drop": self.drop}


def measure(reference: np.ndarray, logits: np.ndarray, labels: np.ndarray) -> Measured:
    """`logits` [N, K] against eager's `reference` [N, K] on images whose classes are
    `labels` [N]."""
    labels = np.asarray(labels)
    return Measured(
        accuracy=float((logits.argmax(axis=1) == labels).mean() * 100),
        reference_accuracy=float((reference.argmax(axis=1) == labels).mean() * 100),
        min_cosine=float(cosines(reference.astype(np.float64),
                                 logits.astype(np.float64)).min()),
        images=len(labels))


def over_budget(budget: AccuracyBudget, measured: Measured) -> Optional[str]:
    """What breaks the budget, for people; None when it holds."""
    if measured.drop > budget.max_drop + 1e-9:
        return (f"loses {measured.drop:.2f} top-1 points against eager fp32 "
                f"({measured.accuracy:.2f}% vs {measured.reference_accuracy:.2f}%), budget "
                f"{budget.max_drop:g}")
    if budget.min_cosine is not None and measured.min_cosine < budget.min_cosine:
        return (f"gives one image a logit cosine of {measured.min_cosine:.6f} against eager "
                f"fp32, budget {budget.min_cosine:g}")
    return None


def budget_check(record: dict[str, Any], measured: Optional[Measured],
                 on: Optional[str] = None) -> Check:
    """The check validate adds for a static int8 model exported within a budget: `measured`
    on the labelled set `on` where one was given, else the measurement config.json records
    from the export."""
    budget = AccuracyBudget.from_record(record)
    if measured is None:
        found = record.get("measured") or {}
        try:
            measured = Measured(float(found["accuracy"]), float(found["reference_accuracy"]),
                                float(found["min_cosine"]), int(found["images"]))
        except (KeyError, TypeError, ValueError):
            raise ParityError("config.json's accuracy budget records no measurement") from None
        on = f"{found.get('inputs', 'the labelled set')}, as recorded at export"
    broken = over_budget(budget, measured)
    kept = record.get("kept_fp32") or []
    detail = (broken or f"loses {measured.drop:.2f} top-1 points (budget {budget.max_drop:g})"
              + (f", lowest cosine {measured.min_cosine:.6f} (budget {budget.min_cosine:g})"
                 if budget.min_cosine is not None else "")) + \
        f" on {on}" + (f"; kept in fp32: {', '.join(kept)}" if kept else "")
    return Check(f"{STATIC_FILE} within its accuracy budget", broken is None, detail)
