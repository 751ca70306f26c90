"""The package's layers only point down: LAYOUT lists the modules bottom-up, and a module
imports only modules listed above it (at the top of the file or inside a function: an import
deferred into a function still ties the two together). So no module imports one that imports
it back, and no private name crosses a module boundary. The documentation's Architecture page
shows LAYOUT as it stands here (docs/hooks/layout.py)."""
from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "vit_export"

# The layout, bottom-up: a new module gets a line here, at the layer it belongs to.
LAYOUT = """\
cli.py                 python cli.py ... (a shim over vit_export.cli)
vit_export/            listed bottom-up: a module imports only modules listed above it
                       (this test holds every import to this order)
  errors.py            the errors the library raises, each one line for the user
  lazy.py              a package's names loaded with their module when first asked for
  verified.py          each file read once into memory, its sha256 checked: the bytes
                       checked are the bytes loaded
  jsonio.py            the one JSON writer: two-space indent, no NaN or infinity (one line)
  schema.py            the kinds a JSON field may hold and the one check of them (config.json,
                       Hugging Face's config.json and preprocessor_config.json)
  timing.py            the one timing loop (bench, the GEMM peaks, benchmarks/)
  config.py            ViTConfig, its checks and presets, the names of what it builds (no torch)
  rope.py              rotary tables of the patch grid (timm's cat, dinov3, mixed)
  model.py             the model's modules (ViTConfig and presets re-exported)
  frameworks.py        the framework road: a timm or transformers module a bundle names,
                       checked as data against allow-lists, built by its own framework
  archives.py          what PyTorch's zip archives hold, read as zips: descriptions, and
                       whether torch.export.load would unpickle anything (refused first)
  cpu.py               the CPU's ISA and its fp32 / bf16 / int8 GEMM peaks
  fusion.py            our attention laid out as ONNX Runtime's optimizer fuses it (--optimize)
  onnxio.py            ONNX files written one way (opset, IR version, one file or external
                       data, checked), node scopes, third-party tools' output captured
  preprocessing/       how an image becomes the model's input, in one place:
    recipe.py          the Preprocessing a bundle records: fields, allowed values, checks
    sources.py         what timm / Hugging Face / torchvision say it is; --set overrides
    pipeline.py        ours, as each framework preprocesses; the frameworks' own pipelines
  bundle/              the bundle on disk, one module per job, every public name re-exported:
    names.py           the format, file, input and axis names (imports none of the rest)
    writes.py          atomic writes, staged folders moved into place when complete
    description.py     Description, config.json written with sha256s and read strictly
    onnxfiles.py       ONNX graphs parsed from bytes read once, external data found and read
    weights.py         weights.safetensors written and loaded into the eager model
    folder.py          Bundle, read_bundle (checked), ModelFile, read_model, read_description
  images.py            image files (checked), .npy, labelled .npz, folders, calibration sets
  checkpoints/         timm / Hugging Face / torchvision state dicts -> our names, config, labels
    files.py           a checkpoint's files read once and hashed (CheckpointFiles): what the
                       import, its record and source parity all read; recorded names only
    state.py           a checkpoint file or folder read into a state dict, checked
    family.py          what a source family declares (Family): keys, renames, layouts
    hf.py              Hugging Face's names, layouts and config.json
    torchvision.py     torchvision's names; the model a --torchvision-weights enum names
    timm.py            timm's names and Eva's layouts; a timm model's fields; timm's model
    formats.py         the registered families; format detection and key conversion
    infer.py           the config read off the weights' names and shapes
    framework.py       a checkpoint's `module` record on the framework road
    load.py            the dispatcher: load_checkpoint, load_model
  hub.py               models by name: a Hub repo or timm name resolved to a pinned commit
  embeddings.py        infer --embed's files: FILE.npy with its input order, or Parquet
  pt2.py               torch.export programs and AOTInductor packages: made, checked, loaded
  runtime/             runners, one module per job, every public name re-exported:
    base.py            the Runner protocol, InputSpec, providers, TF32 and threads set and
                       restored, whether CUDA loads, memory released, RunnerSet
    staging.py         host input through buffers reused across batches: pinned on CUDA, IO
                       binding, outputs on the device until read, the next batch's copy
                       overlapped with the current run (stream)
    ort.py             ONNX Runtime sessions with verified providers; the CUDA-graph runner
    pytorch.py         eager, TorchScript, torch.export program and AOTInductor runners
    ov_rows.py         a static int8 graph's tokens cut into OpenVINO's int8 row blocks
    ov.py              OpenVINO's CPU runners (an extra)
    registry.py        the runtimes, one registration each: runner names parsed, a bundle's
                       or a file's runners listed, extras checked (a runtime module
                       declares its Runtime; a new one is a module and a line here)
    choice.py          which runners a command opens: open_runners (every runner of a
                       bundle on one device), open_runner (one by name)
  gpu.py               the CUDA device's name and its fp32 / fp16 GEMM peaks
  preprocessing/graph.py  the preprocessing as an ONNX graph in front of the model
                       (model.e2e.onnx)
  parity/              run, then compare (pure, over whole input sets) -> ParityReport;
                       one module per job, every public name re-exported by the package:
    tolerance.py       Tolerance, the profiles by precision, overrides
    inputs.py          what the runners are fed: seeded random sets, a user's images and .npz
                       (InputSet), uint8 pictures for model.e2e.onnx (ImageSet)
    runs.py            RunResult: a run stage as data, every runner's outputs and where it ran
    saved.py           a RunResult as an .npz of plain arrays (validate --save-outputs),
                       read back with pickling off and checked
    compare.py         a candidate against the reference: metrics, verdict, neighbours;
                       whole runs, and one run's eager against another's runners
    report.py          Check, StageResult, ParityReport (parity.json)
    proof.py           parity.json read back: which runners it proves, on which device,
                       while the bundle holds the files it judged
    budget.py          a quantized model's accuracy budget: measured on labelled images,
                       judged (the drop in top-1 points, the lowest cosine)
    stages.py          per-stage divergence (--layers): stage values run, then compared
    checks.py          static checks: baked batch or size, declared precision, CUDA placement
    e2e.py             preprocessing checked: model.e2e.onnx, our pipeline vs the framework's
    source.py          the source framework's own model (transformers, timm, torchvision),
                       built from the bytes the import read, against eager and model.onnx
    ahead.py           the source's outputs computed by a second process while export works
                       on (its main), compared as the source's own run
    validation.py      ValidateOptions, the run stage (run_bundle), validate(): run -> compare
                       -> checks; judge_runs(): one saved run against another (compare)
  exporting/           export, one module per job, the public names re-exported lazily:
    variants.py        ONNX models derived from model.onnx: fp16, optimized, int8, static int8
    budget.py          static int8 within an accuracy budget: the most divergent blocks kept
                       in fp32, one at a time, until it holds
    options.py         ExportOptions: what an export makes, by the command's names, every
                       rule of which options go together checked when made
    onnx_model.py      model.onnx from a model: the exporter's graph made what we promise,
                       its weights pointed into weights.safetensors where that file holds them
    export.py          a model into a bundle: TorchScript trace and ONNX export, the variants,
                       the preprocessing graph and the programs, proved (parity) before the
                       bundle is moved into place
  performance.py       performance.json (bench --record) read back and checked
  choosing.py          --runtime auto's one policy: the fastest runner performance.json names,
                       still validated by parity.json on this device (resolve_runner)
  benchmarking/        timing harness -> BenchResult, one module per job, every public name
                       re-exported by the package:
    results.py         BenchRow, BenchResult; a model's FLOPs, each profile's GEMM precision
    peers.py           the peers (PyTorch's own fast paths, CUDA graphs, timm) timed beside
                       the bundle's runners: what bench times (runners_to_time)
    options.py         BenchOptions: what bench times and how long, checked when made
    choice.py          the fastest validated backend: recommended, recorded in
                       performance.json, set against one peer (against_peer)
    harness.py         bench(): every runner run once, then timed in turns -> BenchResult
  render.py            reports as text, Markdown and JUnit; the bench table
  deploy/              where a bundle goes to work; imports no Ray until it runs
    classify.py        a model opened once, asked many times: top-k answers or embeddings
                       for infer, serve and infer --ray alike
    oip.py             the Open Inference Protocol (KServe v2 REST): routes, metadata,
                       infer requests and answers as data, for serve's replicas
    triton.py          a Triton Inference Server model repository from a bundle
    ray/session.py     the Ray wing (only serve and infer --ray load it): Ray started or
                       joined one way (a context manager), quiet, one-line errors, and
                       Ray's process rules (orphans reaped, the exit that skips C's handlers)
    ray/front.py       the server's front on a cluster: asks another replica what a lost one held
    ray/serve.py       HTTP serving on Ray Serve (vit-export serve)
    ray/data.py        batch inference on Ray Data (infer --ray), resumable
    ray/__init__.py    the wing's package
  api.py               the front door: export, validate, open, infer, bench, serve, with the
                       command line's names (vit_export re-exports them lazily)
  options.py           the command line's vocabulary: one option per concept, reused
  cli/                 the click commands, one module per command or group of them; the
                       only place that prints or exits: flags, then options, then one
                       library call, then what it says
    app.py             the group, errors as one line and an exit code, shared checks
    cmd_export.py      presets, quick-test, export
    cmd_validate.py    validate, compare
    cmd_infer.py       infer, info
    cmd_bench.py       bench
    cmd_serve.py       triton, serve
    __main__.py        python -m vit_export.cli
models/digits          the shipped model
scripts/               training the shipped model; hostile_run.py, 200+ hostile cases
                       across the commands, each judged for the fail-closed promise;
                       cuda_smoke.py, the CUDA proof on any CUDA machine;
                       families_table.py, the ViT families tables of the docs;
                       rope_check.py, the rotary figures (DINOv3 ViT-S, fp16)
benchmarks/            measurements behind the defaults: exporters, CPU peers, ORT profile
                       (CPU, or GPU kernels with --provider cuda); results/ holds the logs
                       of the CUDA run
tests/                 one file per module, plus the CLI, the shipped model and
                       preprocessing against timm, Hugging Face and torchvision;
                       families.py builds the tiny timm and transformers families that
                       test_families.py and scripts/families_table.py compare with
"""


def layout_order(layout: str) -> list[str]:
    """The modules a layout lists, in its order, as dotted names. A folder line (`parity/`)
    names the package, whose __init__ re-exports its modules: it ranks after the last of
    them. A line may name a module in a folder (`preprocessing/graph.py`) where its layer
    is."""
    listing = re.split(r"\nvit_export/ *[^\n]*\n", layout, maxsplit=1)[1]
    order: list[str] = []
    folder, pending = None, None  # the folder being listed; its package, ranked at its end
    for line in listing.splitlines():
        if line and not line.startswith(" "):
            break  # the package's listing ends: models/, scripts/, ...
        match = re.match(r"^( {2,4})([\w/]+\.py|\w+/)\s", line + " ")
        if not match:  # a description's next line
            continue
        indent, name = len(match.group(1)), match.group(2)
        if indent <= 2 and pending:
            order.append(pending)
            folder = pending = None
        if name.endswith("/"):
            folder = name.rstrip("/")
            pending = f"vit_export.{folder}"
            continue
        path = f"{folder}/{name}" if indent > 2 and folder else name
        order.append("vit_export." + path.removesuffix(".py").removesuffix("/__init__")
                     .replace("/", "."))
    if pending:
        order.append(pending)
    return order


def modules() -> dict[str, Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def imports(name: str, path: Path, known: set[str]) -> list[tuple[str, int, str]]:
    """(module imported, line, private name or "") for every import of the package in one
    module, and every private attribute it reads from a module it imported."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    tree = ast.parse(path.read_text(), str(path))
    found, aliases = [], {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            if not source.startswith("vit_export"):
                continue
            for alias in node.names:
                target = f"{source}.{alias.name}"
                if target in known:  # `from . import runtime`
                    found.append((target, node.lineno, ""))
                    aliases[alias.asname or alias.name] = target
                else:
                    private = alias.name.startswith("_") and not alias.name.startswith("__")
                    found.append((source, node.lineno, alias.name if private else ""))
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("vit_export"):
                    found.append((alias.name, node.lineno, ""))
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                and node.value.id in aliases and node.attr.startswith("_")
                and not node.attr.startswith("__")):
            found.append((aliases[node.value.id], node.lineno, node.attr))
    return sorted(set(found))


def problems(layout: str) -> list[str]:
    known = modules()
    order = layout_order(layout)
    rank = {name: i for i, name in enumerate(order)}
    out = [f"{name} is not in the layout (LAYOUT in tests/test_layers.py)"
           for name in sorted(known) if name not in rank and name != "vit_export"]
    out += [f"the layout lists {name}, which is not a module" for name in order
            if name not in known]
    for name, path in sorted(known.items()):
        if name not in rank:
            continue
        for target, line, private in imports(name, path, set(known)):
            # importing a.b.c runs a.b's __init__ too, unless a.b is being imported already
            # (the module's own package)
            chain = target.split(".")
            targets = [".".join(chain[:i]) for i in range(2, len(chain) + 1)]
            where = f"{path.relative_to(ROOT)}:{line}"
            for t in targets:
                if name == t or name.startswith(t + "."):
                    continue
                if t in rank and rank[t] > rank[name]:
                    out.append(f"{where}: {name} imports {t}, listed below it")
            if private and target != name:
                out.append(f"{where}: {name} takes the private {target}.{private}")
    return out


def test_the_layout_lists_every_module_and_imports_point_down():
    found = problems(LAYOUT)
    assert not found, "\n".join(found)


@pytest.mark.parametrize("line, problem", [
    # a module moved above one it imports: the import now points up
    ("  errors.py            moved", "imports vit_export.errors, listed below it"),
])
def test_an_import_pointing_up_is_found(line, problem):
    """The check can fail: errors.py listed last makes every module that imports it point
    up, and a module missing from the Layout is named."""
    lines = [x for x in LAYOUT.split("\n") if not re.match(r"^\s+errors\.py\s", x)]
    last = next(i for i, x in enumerate(lines) if x.startswith("    __main__.py "))
    moved = "\n".join(lines[:last + 1] + [line] + lines[last + 1:])
    assert any(problem in p for p in problems(moved))
    dropped = "\n".join(lines)
    assert any(p.startswith("vit_export.errors is not in the layout") for p in problems(dropped))


def test_a_private_name_taken_across_modules_is_found(tmp_path):
    (tmp_path / "vit_export").mkdir()
    (tmp_path / "vit_export" / "a.py").write_text("from . import b\nb._hidden()\n"
                                                  "from .b import _other\n")
    found = imports("vit_export.a", tmp_path / "vit_export" / "a.py",
                    {"vit_export.a", "vit_export.b"})
    assert ("vit_export.b", 2, "_hidden") in found and ("vit_export.b", 3, "_other") in found
