"""The command line's vocabulary: one spelling, one meaning and one help text per concept,
as reusable click options (sqlite-utils' `output_options` is the model).

| concept           | spelling                                                            |
| ----------------- | ------------------------------------------------------------------- |
| device            | `--provider auto|cuda|cpu` (triton: `cpu|cuda`, the target's)       |
| one batch size    | `--batch-size N`                                                    |
| batch sizes       | `--batch-sizes N,N,...` (proved or timed)                           |
| server batches    | `--max-batch-size N` (serve and triton: one default)                |
| JSON on stdout    | `--json`                                                            |
| a JSON file       | `--report FILE` (replaced each run, as --junit, --markdown, --plot) |
| what exists       | `--force` replaces what a command makes (bundle, repository, output)|
| which model runs  | `--runtime NAME|auto`: runner names as reports and bench give them  |
| runtimes run too  | `--runtimes NAME[,NAME]`: opt-in runtimes (openvino), `--openvino`  |
| which runners     | `bench --runners NAME[,NAME]`: runner names, to time only those     |
| seed              | `--seed N`: every random thing the command makes                    |
"""
from __future__ import annotations

import math
import re
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Optional

import click

from .deploy import DEFAULT_MAX_BATCH_SIZE, INT32_MAX
from .runtime import AUTO, DEFAULT_PROVIDER, MAX_THREADS, PROVIDER_CHOICES, RUNNER_NAME

# bench times these batch sizes unless told
BENCH_BATCH_SIZES = "1,8,32"


class Number(click.ParamType):
    """A finite number in [low, high]: NaN and infinities are refused, not compared."""
    name = "FLOAT"

    def __init__(self, low: float, high: float):
        self.low, self.high = low, high

    def convert(self, value, param, ctx):
        try:
            number = float(value)
        except (TypeError, ValueError):
            self.fail(f"{value!r} is not a number", param, ctx)
        if not math.isfinite(number) or not self.low <= number <= self.high:
            self.fail(f"{value!r} is not a finite number in [{self.low:g}, {self.high:g}]",
                      param, ctx)
        return number


class BatchSizes(click.ParamType):
    name = "N[,N...]"

    def convert(self, value, param, ctx):
        if isinstance(value, list):
            return value
        try:
            sizes = [int(v) for v in str(value).split(",") if v.strip()]
        except ValueError:
            self.fail(f"{value!r} is not a comma-separated list of integers", param, ctx)
        if not sizes or any(s < 1 for s in sizes):
            self.fail(f"batch sizes must be integers >= 1, got {value!r}", param, ctx)
        return list(dict.fromkeys(sizes))  # 1,1 is batch 1 once, not timed (or run) twice


class Names(click.ParamType):
    """A comma-separated list of names, at least one, each once, each one that `fits`
    (`example` says what fits, in the error)."""
    name = "NAME[,NAME...]"

    def __init__(self, fits: Callable[[str], bool], example: str):
        self.fits, self.example = fits, example

    def convert(self, value, param, ctx):
        if isinstance(value, list):
            return value
        names = [v.strip() for v in str(value).split(",") if v.strip()]
        bad = next((n for n in names if not self.fits(n)), None)
        if not names or bad is not None or len(set(names)) != len(names):
            self.fail(f"{value!r}: name one or more {self.example}, comma-separated, each "
                      f"once", param, ctx)
        return names


class LaterChoice(click.Choice):
    """A choice among names a heavy module holds, read when first asked for (the command's
    own help, or its value checked), so the group's help and other commands need not load
    that module."""

    def __init__(self, load: Callable[[], tuple[str, ...]], case_sensitive: bool = True):
        self._load = load
        self._choices: Optional[tuple[str, ...]] = None
        self.case_sensitive = case_sensitive

    @property
    def choices(self) -> tuple[str, ...]:
        if self._choices is None:
            self._choices = tuple(self._load())
        return self._choices


def choice_names(choices: tuple[str, ...]) -> Names:
    """Names, each one of `choices`."""
    return Names(choices.__contains__, f"of {', '.join(choices)}")


def runner_names() -> Names:
    """Runner names by their shape (runtime.RUNNER_NAME); which of them a bundle has is
    checked when it is read."""
    return Names(lambda n: re.fullmatch(RUNNER_NAME, n) is not None,
                 "runners (e.g. onnxruntime,onnxruntime[model.int8.onnx])")


BATCH_SIZES = BatchSizes()
SEED = click.IntRange(0, 2 ** 32 - 1)


def provider_option_with(help: str) -> Callable:
    return click.option("--provider", type=click.Choice(PROVIDER_CHOICES),
                        default=DEFAULT_PROVIDER, show_default=True, help=help)


provider_option = provider_option_with(
    "Where it runs: ONNX Runtime's provider, and PyTorch on the same device; auto takes CUDA "
    "where a session really runs there. cuda that does not really run on CUDA is an error.")
def _runtime_names(opt_in: bool = True) -> tuple[str, ...]:
    """The registry's opt-in runtimes (those --runtimes adds), or all of them."""
    from .runtime.registry import RUNTIMES

    return tuple(r.name for r in RUNTIMES if r.opt_in or not opt_in)


class RuntimeNames(Names):
    """The opt-in runtimes of the registry, by name; a runtime that always runs, or a
    runner's name, is pointed to what it means (bench --runners names runners)."""

    def __init__(self):
        super().__init__(lambda n: n in _runtime_names(),
                         f"of the opt-in runtimes ({', '.join(_runtime_names())})")

    def convert(self, value, param, ctx):
        names = value if isinstance(value, list) else \
            [v.strip() for v in str(value).split(",") if v.strip()]
        hint = ": bench --runners names runners" if ctx and ctx.command.name == "bench" else ""
        for name in names:
            if name in _runtime_names(opt_in=False) and name not in _runtime_names():
                self.fail(f"{name!r} always runs: --runtimes adds the opt-in runtimes "
                          f"({', '.join(_runtime_names())}){hint}", param, ctx)
            if name not in _runtime_names() and re.fullmatch(RUNNER_NAME, name):
                self.fail(f"{name!r} is a runner, not a runtime "
                          f"({', '.join(_runtime_names(opt_in=False))}){hint}", param, ctx)
        return super().convert(value, param, ctx)


def _runtimes_help() -> str:
    from .runtime.registry import RUNTIMES

    optional = ", ".join(f"{r.name} ({r.title}; the {r.extra} extra)" for r in RUNTIMES
                         if r.opt_in)
    always = ", ".join(r.name for r in RUNTIMES if not r.opt_in)
    return (f"Also run these opt-in runtimes, comma-separated: {optional}. The others "
            f"({always}) always run.")


runtimes_option = click.option(
    "--runtimes", type=RuntimeNames(), default=None, metavar="NAME[,NAME...]",
    help=_runtimes_help())
openvino_option = click.option(
    "--openvino", is_flag=True, help="The same as --runtimes openvino.")


def runtimes_of(runtimes, openvino: bool) -> tuple[str, ...]:
    """--runtimes with --openvino's "openvino" added: what the front door takes."""
    return tuple(dict.fromkeys([*(runtimes or ()), *(("openvino",) if openvino else ())]))
json_option = click.option("--json", "as_json", is_flag=True,
                           help="Print JSON on stdout instead of text.")
# The files a command can also write besides what it prints, each replaced if it exists:
# name -> (flag, parameter, help).
REPORTS = {
    "report": ("--report", "report_path",
               "Also write the full result as JSON to FILE (replaced if it exists)."),
    "junit": ("--junit", "junit_path",
              ("Also write JUnit XML to FILE (one test case per pair, batch, check and stage; "
               "replaced if it exists).")),
    "markdown": ("--markdown", "markdown_path",
                 ("Also write a Markdown summary for a pull-request comment to FILE (replaced "
                  "if it exists).")),
    "plot": ("--plot", "plot_path",
             ("Also write a PNG of throughput against batch size to FILE (replaced if it "
              "exists; needs matplotlib).")),
}


def report_options(*also: str) -> Callable:
    """--report FILE, then each of `also` in the order given (the other REPORTS a command
    writes: "junit", "markdown", "plot"), as one decorator."""
    def decorate(command):
        for name in reversed(("report", *also)):  # the last applied is listed first
            flag, parameter, help = REPORTS[name]
            command = click.option(flag, parameter, help=help,
                                   type=click.Path(dir_okay=False, path_type=Path))(command)
        return command
    return decorate


report_option = report_options()
runtime_option = click.option(
    "--runtime", "runtime", metavar="NAME", default=AUTO, show_default=True,
    help="Which model runs, by the runner names validate and bench report: eager, "
    "torchscript, pt2, aoti, onnxruntime, onnxruntime[FILE] (another ONNX model of the "
    "bundle, e.g. onnxruntime[model.int8.onnx]), openvino, openvino[FILE], openvino-bf16, "
    "openvino-bf16[FILE] (an int8 model, bf16 where it is not int8). "
    "auto: the one `bench --record` wrote to performance.json as fastest validated at the "
    "largest recorded batch size not above this command's (else the smallest), when it was "
    "measured on this device and CPU, on the files the bundle holds, and is not a file that "
    "can carry code (torchscript, pt2 and aoti run only when named); else onnxruntime (a "
    "model file: what it is).")
trust_code_option = click.option(
    "--trust-code", is_flag=True, help="Also run the bundle's files that can carry code "
    "(model.ts, model.pt2, model.aoti.pt2: TorchScript, an ATen graph, a native library). "
    "Without it only ONNX models and the safetensors weights run: use it on bundles you "
    "made or trust.")


def threads_option(help: str) -> Callable:
    return click.option("--threads", type=click.IntRange(1, MAX_THREADS), default=None,
                        help=help)


def seed_option(what: str) -> Callable:
    return click.option("--seed", default=0, show_default=True, type=SEED,
                        help=f"Seed of every random thing: {what}.")


def batch_size_option(default: int, help: str) -> Callable:
    return click.option("--batch-size", default=default, show_default=True,
                        type=click.IntRange(min=1), help=help)


def batch_sizes_option(default: Optional[str], help: str) -> Callable:
    return click.option("--batch-sizes", type=BATCH_SIZES, default=default,
                        show_default=default is not None, help=help)


def max_batch_size_option(help: str, high: int = INT32_MAX) -> Callable:
    return click.option("--max-batch-size", default=DEFAULT_MAX_BATCH_SIZE, show_default=True,
                        type=click.IntRange(1, high), help=help)


def force_option(what: str) -> Callable:
    return click.option("--force", is_flag=True, help=f"Replace {what} if it exists.")


def progress_option(command):
    """--progress/--quiet: steps on stderr; by default only when stderr is a terminal."""
    return click.option(
        "--progress/--quiet", "progress", default=None,
        help="Show each step on stderr with the elapsed time, or nothing [default: shown "
             "when stderr is a terminal].")(command)


class Progress:
    """Steps of long work on stderr, with the time since the command started."""

    def __init__(self, shown: Optional[bool]):
        self.shown = sys.stderr.isatty() if shown is None else shown
        self.start = time.perf_counter()

    def __call__(self, step: str) -> None:
        if self.shown:
            click.echo(f"[{time.perf_counter() - self.start:7.1f}s] {step}", err=True)
