"""torch.export programs and AOTInductor packages: TorchScript's successors in a bundle.

`model.pt2` is an ExportedProgram (`torch.export.export`, saved by `torch.export.save`) with
a symbolic batch axis, and symbolic height and width for a dynamic-size model; it loads with
`torch.export.load` and runs its ATen graph in Python. `model.aoti.pt2` is the same program
compiled ahead of time by AOTInductor (`aoti_compile_and_package`) into a shared library for
one device, loaded with `torch._inductor.aoti_load_package` in Python or
`AOTIModelPackageLoader` in C++. Both carry the bundle's description: the program as an
extra file, the package in its metadata.

A package is machine code for one device, one CPU vector ISA and one torch release. The
loader would crash, or worse, run an illegal instruction, on anything else; so what the
package says it was compiled for (its `*_metadata.json`, which the loader itself reads) is
checked first, and a mismatch is one line.
"""
from __future__ import annotations

import io
import logging
import os
import platform
import shutil
import tempfile
import time
import weakref
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Optional

import torch

from . import bundle as B
from . import cpu
from .archives import (
    EXTRA_FILE,
    check_program,
    is_package,
    package_metadata,
    parse_description,
)
from .errors import BundleError, ExportError, ProviderError, first_line, param
from .verified import Loaded, read_once

AOTI_OPTIONS = {"freezing": True}  # weights folded in as constants (and prepacked on CPU)
# AOTInductor's words for the CPU vector ISA it compiled for (torch._inductor.cpu_vec_isa)
# -> the /proc/cpuinfo flags that run it; AVX-512 code needs AVX-512, and so on.
ISA_WORDS = {"AVX2": ("avx2",), "AVX512": ("avx512f",), "AVX512_VNNI": ("avx512_vnni",),
             "AMX_TILE": ("amx_bf16", "amx_int8")}


def dynamic_shapes(config) -> dict[int, Any]:
    """The input's symbolic axes for torch.export (and the dynamo ONNX exporter): batch in
    [1, 65536], and under a dynamic size height and width as whole patches."""
    axes = {0: torch.export.Dim(B.BATCH_DIM, min=1, max=1 << 16)}
    if config.dynamic_img_size:  # sides are whole patches: P * grid, grid >= 1
        most = B.MAX_IMAGE_SIDE // config.patch_size
        axes[2] = config.patch_size * torch.export.Dim("grid_h", min=1, max=most)
        axes[3] = config.patch_size * torch.export.Dim("grid_w", min=1, max=most)
    return axes


def export_program(model, x: torch.Tensor) -> torch.export.ExportedProgram:
    """`model` (eval mode) exported at the example input `x`, its axes symbolic."""
    try:
        return torch.export.export(model, (x,), dynamic_shapes={"x": dynamic_shapes(model.config)})
    except Exception as exc:  # torch.export raises many error types
        raise ExportError(f"torch.export failed: {first_line(exc)}") from None


def _input_value(program: torch.export.ExportedProgram) -> Any:
    """The fake tensor the program's input was traced as: its shape and dtype."""
    user_input = program.graph_signature.user_inputs[0]
    return next(n.meta["val"] for n in program.graph.nodes
                if n.op == "placeholder" and n.name == user_input)


def input_precision(program: torch.export.ExportedProgram) -> str:
    """What the program takes and computes in, as B.AOTI_PRECISIONS names it: fp16 for a
    .half() model exported at an fp16 input, else fp32."""
    return "fp16" if _input_value(program).dtype == torch.float16 else "fp32"


def package_precision(description: Any) -> str:
    """The precision a package's description says it was compiled in (export.aoti.precision),
    fp32 where it says none (packages made before fp16 ones were, a foreign package); a
    value we do not know is one line, never a guess at what to feed it."""
    export = description.get("export") if isinstance(description, dict) else None
    record = export.get("aoti") if isinstance(export, dict) else None
    made = record.get("precision", "fp32") if isinstance(record, dict) else "fp32"
    if made not in B.AOTI_PRECISIONS:
        raise BundleError(f"the package says it computes in {made!r}, not one of "
                          f"{', '.join(B.AOTI_PRECISIONS)}")
    return made


def symbolic_axes(program: torch.export.ExportedProgram) -> dict[int, Optional[tuple[int, int]]]:
    """Axis of the input -> (min, max) of its symbol in the program's range constraints, or
    None where the axis is a fixed size (baked in)."""
    value = _input_value(program)
    ranges = {str(k): v for k, v in program.range_constraints.items()}
    axes: dict[int, Optional[tuple[int, int]]] = {}
    for axis, size in enumerate(value.shape):
        symbols = list(size.node.expr.free_symbols) if isinstance(size, torch.SymInt) else []
        bound = ranges.get(str(symbols[0])) if len(symbols) == 1 else None
        if bound is None:  # a fixed size (or one no constraint bounds)
            axes[axis] = None
            continue
        scale = int(size.node.expr.subs(symbols[0], 1))  # height is patch * grid_h
        axes[axis] = (int(bound.lower) * scale, int(bound.upper) * scale)
    return axes


def save_program(program: torch.export.ExportedProgram, path: Path, description_json: str
                 ) -> None:
    """model.pt2, with the description as an extra file; written atomically."""
    buffer = io.BytesIO()
    try:
        torch.export.save(program, buffer, extra_files={EXTRA_FILE: description_json})
    except Exception as exc:  # serialization raises many error types
        raise ExportError(f"torch.export.save failed: {first_line(exc)}") from None
    B.atomic_write_bytes(path, buffer.getvalue())


def check_compiler() -> str:
    """The C++ compiler AOTInductor will build with, or ExportError before any work."""
    from torch._inductor import cpp_builder

    try:
        return cpp_builder.get_cpp_compiler()
    except Exception as exc:  # InvalidCxxCompiler, or a failed probe of the compiler
        raise ExportError(f"{param('aoti', True)} compiles C++ and finds no working compiler "
                          f"(install g++ or set CXX): {first_line(exc)}") from None


def compile_package(program: torch.export.ExportedProgram, path: Path, description_json: str,
                    device: str) -> dict[str, Any]:
    """model.aoti.pt2: `program` compiled by AOTInductor for `device` ("cpu" or "cuda") with
    weight freezing, the description in its metadata. Compiled into a temporary file beside
    `path`, then renamed: atomic like every file of a bundle. Returns what to record, with
    the precision the program takes (`input_precision`): an fp16 program compiles for the
    CPU as cleanly as for CUDA (vit_seed_tiny with one block of width 32: 12-14 s on 2 cores)."""
    check_compiler()  # the host compiler builds a CUDA package's wrapper too
    if device == "cuda":
        from torch.export.passes import move_to_device_pass

        program = move_to_device_pass(program, "cuda")
    options = {**AOTI_OPTIONS, "aot_inductor.metadata": {B.METADATA_KEY: description_json}}
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(dir=path.parent, prefix=".aoti-") as tmp:
        staged = Path(tmp) / path.name
        try:
            torch._inductor.aoti_compile_and_package(program, package_path=str(staged),
                                                     inductor_configs=options)
        except Exception as exc:  # inductor and the C++ compiler raise many error types
            raise ExportError(f"AOTInductor compile failed: {first_line(exc)}") from None
        B.atomic_write_bytes(path, staged.read_bytes())
    made_for = package_metadata(path)
    return {"precision": input_precision(program),
            "device": made_for.get("AOTI_DEVICE_KEY", device),
            "cpu_isa": made_for.get("AOTI_CPU_ISA", ""),
            "compute_capability": made_for.get("AOTI_COMPUTE_CAPABILITY", ""),
            "options": dict(AOTI_OPTIONS), "compile_seconds": round(time.perf_counter() - start, 1),
            "bytes": path.stat().st_size}


# ---------------------------------------------------------------- reading and loading


def _release(version: str) -> str:
    return version.split("+")[0]


def package_problem(source: Path | Loaded, device: str) -> Optional[str]:
    """Why the package at `source` (a path, or its bytes as read once) cannot run on `device`
    in this process, or None: it was compiled for another device, for vector instructions
    this CPU lacks, or by another torch release (its code calls that release's C++ ABI)."""
    meta = package_metadata(source)
    path = source.path if isinstance(source, Loaded) else Path(source)
    made_for = meta.get("AOTI_DEVICE_KEY", "")
    if made_for != device:
        return (f"{path.name} was compiled for {made_for or 'an unknown device'} and this run "
                f"is on {device}; export {param('aoti', True)} on a {device} "
                f"machine makes one for it")
    machine = meta.get("AOTI_MACHINE", "")
    if machine and machine.lower() != platform.machine().lower():
        return (f"{path.name} was compiled for {machine} and this machine is "
                f"{platform.machine()}; compile it on this machine")
    if device == "cpu":  # the x86 words we know; others (INVALID_VEC_ISA: none) ask nothing
        here = cpu.isa().flags
        missing = [word for word in meta.get("AOTI_CPU_ISA", "").split()
                   if word in ISA_WORDS and not here & set(ISA_WORDS[word])]
        if missing:
            return (f"{path.name} was compiled for {meta['AOTI_CPU_ISA']} and this CPU has no "
                    f"{missing[0]} ({cpu.isa().summary}); compile it on this machine")
    description = parse_description(meta.get(B.METADATA_KEY))
    made_by = (description or {}).get("versions", {}).get("torch") if isinstance(
        description, dict) and isinstance(description.get("versions"), dict) else None
    if not isinstance(made_by, str):
        return f"{path.name} does not say which torch release compiled it"
    if _release(made_by) != _release(torch.__version__):
        return (f"{path.name} was compiled by torch {made_by} and this is torch "
                f"{torch.__version__}; AOTInductor code runs on the release that built it: "
                f"export {param('aoti', True)} again")
    return None


@contextmanager
def _quiet_loaders():
    """torch.export.load logs a caught deserialization error with its traceback as a warning
    before it raises another: the error is ours to report, in one line."""
    before = logging.root.manager.disable
    logging.disable(logging.CRITICAL)
    try:
        yield
    finally:
        logging.disable(before)


def read_program(source: str | os.PathLike | Loaded,
                 extra_files: Optional[dict[str, str]] = None) -> torch.export.ExportedProgram:
    """The ExportedProgram in model.pt2, the one way we load one: its bytes are read once (a
    path here, or a bundle's file as `Bundle.read_file` checked it), the archive in them is
    read first (`archives.check_program`), and one that torch's reader would read otherwise
    than zipfile, or that would make torch unpickle, is refused before torch reads those same
    bytes; a damaged one is one line, without torch's logged traceback."""
    loaded = source if isinstance(source, Loaded) else read_once(source)
    path = loaded.path
    check_program(loaded)
    try:
        with _quiet_loaders():
            return torch.export.load(io.BytesIO(loaded.data), extra_files=extra_files)
    except Exception as exc:  # deserialization raises many error types
        raise BundleError(f"cannot load torch.export program {path}: {first_line(exc)}") \
            from None


def load_program(source: str | os.PathLike | Loaded, device: str = "cpu") -> tuple[Any, Any]:
    """model.pt2's ExportedProgram module on `device` (`read_program`, from the bytes read
    once), and the description it carries (None when it carries none that parses); runtime
    makes it a runner."""
    loaded = source if isinstance(source, Loaded) else read_once(source)
    path = loaded.path  # CUDA checked by the caller (runtime.load_torch_file)
    if is_package(loaded):
        how = param("runtime", "aoti")
        raise BundleError(f"{path} is an AOTInductor package; run it with {how}")
    extra = {EXTRA_FILE: ""}
    program = read_program(loaded, extra)
    try:
        if device != "cpu":
            from torch.export.passes import move_to_device_pass

            program = move_to_device_pass(program, device)
        module = program.module()
    except Exception as exc:  # torch raises many error types
        raise BundleError(f"cannot load torch.export program {path}: {first_line(exc)}") \
            from None
    return module, parse_description(extra[EXTRA_FILE])


def load_package(source: str | os.PathLike | Loaded, device: str = "cpu") -> tuple[Any, Any]:
    """model.aoti.pt2's compiled model on `device` and the description it carries, refused in
    one line when it was compiled for another device, ISA or torch release
    (`package_problem`). The loader unpacks the package into a folder of its own under
    TMPDIR and leaves it behind when it fails: it is given a private TMPDIR, removed on
    failure."""
    loaded = source if isinstance(source, Loaded) else read_once(source)
    path = loaded.path  # CUDA checked by the caller (runtime.load_torch_file)
    if not is_package(loaded):
        how = param("runtime", "pt2")
        raise BundleError(f"{path} is a torch.export program, not an AOTInductor package; run "
                          f"it with {how}")
    problem = package_problem(loaded, device)
    if problem:
        raise ProviderError(problem)
    scratch = tempfile.mkdtemp(prefix="vx-aoti-")
    before = os.environ.get("TMPDIR")
    os.environ["TMPDIR"] = scratch
    try:
        with _quiet_loaders():
            compiled = torch._inductor.aoti_load_package(io.BytesIO(loaded.data))
    except Exception as exc:  # the C++ loader raises RuntimeError with its own report
        shutil.rmtree(scratch, ignore_errors=True)
        raise BundleError(f"cannot load AOTInductor package {path}: {first_line(exc)}") \
            from None
    finally:
        if before is None:
            os.environ.pop("TMPDIR", None)
        else:
            os.environ["TMPDIR"] = before
    # what it unpacked is read while it runs (CUDA kernels load lazily): gone with it
    weakref.finalize(compiled, shutil.rmtree, scratch, True)
    return compiled, parse_description(compiled.get_metadata().get(B.METADATA_KEY))
