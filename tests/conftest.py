"""Shared helpers and fixtures, and the suite's tiers:

    python -m pytest -m unit              the unit tier: pure library code, seconds, no torch
    python -m pytest                      the quick suite (slow tests skipped)
    python -m pytest --run-slow -n 0      everything
    python -m pytest -m cuda              the tests that mean something only on a GPU

This module imports torch, ONNX Runtime and the CLI only inside the helpers and fixtures that
need them, so that the unit tier never loads them.
"""
import functools
import json
import os
import re
import signal
import sys
import time
from pathlib import Path
from typing import Optional

import pytest

# The seed's table, as the style guide asks: small enough that a test exports in seconds.
TINY = dict(img_size=32, patch_size=8, embed_dim=64, depth=2, num_heads=4, num_classes=10)


def make_bundle(path: Path, exporter: str = "dynamo", seed: int = 0, labels=None,
                variants=(), **kwargs) -> Path:
    """The seed preset exported to `path`; `kwargs` are ExportOptions' fields, `variants`
    the ONNX variants by name (the flags that make them: api.variant_flags)."""
    import torch

    from vit_export import bundle as B
    from vit_export.api import variant_flags
    from vit_export.exporting import ExportOptions, export_bundle
    from vit_export.model import create_model

    torch.manual_seed(seed)
    model = create_model("vit_seed_tiny").eval()
    description = B.Description(model.config, B.Preprocessing.default_for(model.config),
                                labels=labels, name="vit_seed_tiny")
    flags = variant_flags(variants) if variants else {}
    options = ExportOptions(exporter=exporter, **flags, **kwargs)
    export_bundle(model, path, description, options)  # validates
    return path


# One block of width 32: AOTInductor compiles it in about 10 s on 2 cores (ViT-Ti: 15-20 s).
SMALL = ("--preset", "vit_seed_tiny", "--set", "depth=1", "--set", "embed_dim=32",
         "--set", "num_heads=2")


@pytest.fixture(scope="session")
def program_bundle(tmp_path_factory) -> Path:
    """--pt2 alone (seconds), at a dynamic size: the quick suite's program (test_pt2, and the
    attacks of test_trust, which copy it)."""
    out = tmp_path_factory.mktemp("pt2") / "dynamic"
    code, stdout, stderr = run("export", out, *SMALL, "--dynamic-size", "--pt2")
    assert code == 0, stdout + stderr
    assert "check: model.pt2: symbolic height axis on pixel_values: ok" in stdout
    return out


@pytest.fixture(scope="session")
def tiny_bundle(tmp_path_factory) -> Path:
    """A seed-sized bundle, exported once; tests that modify it copy it first."""
    labels = [f"class_{i}" for i in range(10)]
    return make_bundle(tmp_path_factory.mktemp("bundles") / "tiny", labels=labels)


DIGITS = Path(__file__).resolve().parent.parent / "models" / "digits"


def auto_device() -> str:
    """The device `--provider auto` really gets on this machine: CUDA where ONNX Runtime's
    CUDA provider loads and PyTorch sees a GPU, else CPU. Tests that leave the provider at
    its default expect this, so the suite holds with and without a GPU."""
    return "cpu" if no_cuda() else "cuda"


@pytest.fixture(scope="session")
def digits_bundle(tmp_path_factory) -> Path:
    """The shipped model exported as the README's main job exports it, once."""
    out = tmp_path_factory.mktemp("bundles") / "digits"
    code, _, stderr = run("export", out, "--from", DIGITS)
    assert code == 0, stderr
    return out


@pytest.fixture(scope="session")
def digit_images(tmp_path_factory) -> list[Path]:
    """The 360 held-out digits as PNG files (real images, read as any user's would be)."""
    import numpy as np
    from PIL import Image

    folder = tmp_path_factory.mktemp("digit-images")
    with np.load(DIGITS / "held_out.npz") as data:
        images, labels = data["images"], data["labels"]
    paths = []
    for i, (image, label) in enumerate(zip(images, labels)):
        paths.append(folder / f"{i:03d}_true_{label}.png")
        Image.fromarray(image).save(paths[-1])
    return paths


def rewrite_hash(bundle_dir: Path, name: str) -> None:
    """Make config.json agree with a file a test changed on purpose."""
    from vit_export import bundle as B

    config = json.loads((bundle_dir / B.CONFIG_FILE).read_text())
    config["files"][name] = B.sha256_file(bundle_dir / name)
    (bundle_dir / B.CONFIG_FILE).write_text(json.dumps(config))


def pytest_addoption(parser):
    parser.addoption("--run-slow", action="store_true",
                     help="The whole suite: also the tests marked slow (ViT-B/16 exports, Ray "
                          "clusters, the signal matrix) and every generated corruption case.")


# The unit tier: the test modules of pure library code. Neither they nor what they import
# load torch, ONNX Runtime, timm, transformers, Ray or OpenVINO (tests/test_house.py holds
# that), so `pytest -m unit` collects these alone and runs in seconds. A module joins once
# everything it imports at the top, and every test in it, is that light.
UNIT = frozenset({
    "test_cuda_smoke.py", "test_docs.py", "test_house.py", "test_images.py",
    "test_infer_options.py", "test_jsonio.py", "test_layers.py", "test_schema.py",
    "test_timing.py",
})
HEAVY = ("torch", "onnxruntime", "timm", "transformers", "ray", "openvino")


def unit_only(config) -> bool:
    """Whether the -m expression selects unit tests alone: `unit`, or `unit and ...`."""
    words = re.findall(r"\w+|\S", config.option.markexpr or "")
    return words[:1] == ["unit"] and (len(words) == 1 or words[1] == "and") and "or" not in words


def pytest_ignore_collect(collection_path, config):
    """Under -m unit the other test modules are not imported at all: their imports (torch
    and the rest) are most of a quick run's start."""
    if collection_path.suffix == ".py" and collection_path.name.startswith("test_") and \
            collection_path.name not in UNIT and unit_only(config):
        return True
    return None


def pytest_cmdline_main(config):
    """The unit tier runs in this process: xdist's workers, each importing pytest, this
    module and the tests, save nothing on seconds of work (measured on 2 cores: about 4 s
    either way on an idle machine, 4-5 s in one process against 7-10 s with -n auto beside
    other work). An explicit -n still counts."""
    given = config.invocation_params.args
    if unit_only(config) and not any(str(a).startswith(("-n", "--numprocesses")) for a in given):
        config.option.numprocesses = 0
        config.option.dist = "no"


# Which part of a generated test's cases an item runs (test_corruption's `cases`): False for
# the quarter the quick suite runs, True for the whole-suite part, its own item marked slow.
# So the quick pass and the slow pass of CI run different items.
FULL = False
GENERATED = {"test_corruption.py": "test_generated_"}  # module -> its generated tests' prefix


def pytest_generate_tests(metafunc):
    prefix = GENERATED.get(metafunc.definition.path.name)
    if prefix and metafunc.definition.originalname.startswith(prefix):
        metafunc.parametrize("generated_cases", [
            "quick", pytest.param("full", marks=pytest.mark.slow)], indirect=True)


@pytest.fixture(autouse=True)
def generated_cases(request):
    """Sets FULL for the item: the `full` part of a generated test, or anything else."""
    global FULL
    FULL = getattr(request, "param", None) == "full"
    return FULL


RAY_FILES = ("test_serve.py", "test_ray_data.py", "test_cluster.py")


def pytest_configure(config):
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if workers > 1 and not unit_only(config):  # one worker per core: torch's own threads
        import torch  # would only fight each other

        torch.set_num_threads(max(1, (os.cpu_count() or 1) // workers))
    config.addinivalue_line("markers", "slow: minutes on 2 cores; run with --run-slow")
    config.addinivalue_line("markers", "unit: pure library code, seconds in all, no torch "
                                       "(the modules in conftest.UNIT)")
    config.addinivalue_line("markers", "cuda: means something only on a GPU; skipped where "
                                       "PyTorch sees none or ONNX Runtime's CUDA provider "
                                       "does not load")


@functools.cache
def no_cuda() -> Optional[str]:
    """Why CUDA does not run here, or None where ONNX Runtime's CUDA provider loads and
    PyTorch sees a GPU."""
    from vit_export import runtime

    problem = runtime.cuda_problem()
    if problem is None and not runtime.torch_cuda():
        problem = "PyTorch sees no CUDA device"
    return problem


def pytest_runtest_setup(item):
    if item.get_closest_marker("cuda") and no_cuda():  # before its fixtures export anything
        pytest.skip(f"needs CUDA: {no_cuda()}")


# A process that ran the tests itself (CI's `--run-slow -n 0`) leaves by os._exit once
# pytest is done with everything it reports and returns: the exit handlers of the C++
# libraries loaded into it (Ray's core worker, once a test ran ray.init here; ONNX Runtime,
# OpenVINO, torch) run after that and could crash it. CI, 2026-11-25: "909 passed,
# 2 skipped", then "terminate called after throwing an instance of 'std::bad_alloc'" and exit
# 134. The CLI leaves a process in which Ray's driver ran the same way (exit_process).
_sessions: list = []


def pytest_sessionfinish(session, exitstatus):
    _sessions.append(session)


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config):
    ran_here = not os.environ.get("PYTEST_XDIST_WORKER") and \
        not getattr(config.option, "numprocesses", None)  # not xdist's controller either
    if ran_here and _sessions:
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
        os._exit(int(_sessions[-1].exitstatus))


ONE_WORKER_FILES = ("test_bench.py", "test_dynamic.py", "test_triton.py", "test_parity.py")


@pytest.hookimpl(tryfirst=True)  # the unit mark is on before -m selects
def pytest_collection_modifyitems(config, items):
    # Under pytest-xdist (the default, see pyproject.toml), tests that start a Ray cluster
    # run one after another on one worker: two local clusters would fight over 2 cores.
    # The files whose module fixtures export a bundle run on one worker, so it is exported
    # once, not once per worker.
    for item in items:
        if item.path.name in UNIT:
            item.add_marker(pytest.mark.unit)
        if item.path.name in RAY_FILES:
            item.add_marker(pytest.mark.xdist_group("ray"))
        elif item.path.name in ONE_WORKER_FILES:
            item.add_marker(pytest.mark.xdist_group(item.path.stem))
    # the multi-node cluster tests last: in one process (CI's slow tier) a serve test's
    # Ctrl-C run after them did not stop within its time, twice, where alone it did
    items.sort(key=lambda item: item.path.name == "test_cluster.py")
    if config.getoption("--run-slow"):
        return
    skip = pytest.mark.skip(reason="slow: run with --run-slow")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def embedding_bundle(tmp_path_factory) -> Path:
    """The shipped digits model giving its pooled embedding, L2-normalised."""
    out = tmp_path_factory.mktemp("bundles") / "digits-embedding"
    code, _, err = run("export", out, "--from", DIGITS, "--outputs", "embedding",
                       "--normalize", "--provider", "cpu", "--quiet")
    assert code == 0, err
    return out


def default_sigint() -> None:
    """In a child, before it runs (`preexec_fn`): SIGINT as an interactive user has it. A test
    run started in the background of a non-interactive shell (or under nohup) ignores SIGINT,
    its children inherit that, Python keeps it, and the CLI then leaves Ctrl-C ignored as it
    should: they would never see the interrupt a test sends."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def run(*args):
    """The CLI in-process: (exit code, stdout, stderr)."""
    from click.testing import CliRunner

    from vit_export.cli import cli

    result = CliRunner().invoke(cli, [str(a) for a in args])
    return result.exit_code, result.stdout, result.stderr


def h100_peers_result() -> dict:
    """A `bench --peers` result (BenchResult.to_dict()) as `bench --provider cuda --peers
    timm-compile-ro-fp16,cuda-graph` writes it: eager's, model.opt.fp16.onnx's and its CUDA
    graph's img/s and peak shares are the H100 run's of 2026-11-24
    (/work/shared/cuda-2026-11-24/bench.log),
    timm-compile-ro-fp16's with device input are that day's peers.json. Made up, to test the
    choice: timm-compile-ro-fp16's host rows, an int8 model faster than all but not
    validated, and timm-compile-fp16 left out."""
    rows = []

    def row(backend, io, batch, images_per_s, peak=0.0, precision="fp16", validated=True,
            peer=False):
        p50 = batch / images_per_s * 1e3
        rows.append(dict(backend=backend, device="cuda", io=io, batch=batch, runs=10,
                         p50_ms=p50, p90_ms=p50, p99_ms=p50, images_per_s=images_per_s,
                         gflops=0.0, peak_fraction=peak, speedup=1.0, peak_rss_mb=0.0,
                         precision=precision, validated=validated, peer=peer))

    fused, graph = "onnxruntime[model.opt.fp16.onnx]", "onnxruntime[model.opt.fp16.onnx]+cuda-graph"
    for io, b1, b64 in [("host", 232.49, 1002.99), ("device", 250.56, 1085.15)]:
        row("eager", io, 1, b1, precision="fp32")
        row("eager", io, 64, b64, 0.74, precision="fp32")
    for io, b1, b64, peak in [("host", 624.63, 5163.16, 0.24), ("device", 595.91, 9106.25, 0.42)]:
        row(fused, io, 1, b1, 0.03)
        row(fused, io, 64, b64, peak)
        row("onnxruntime[model.int8.onnx]", io, 1, 5000.0, validated=False)
        row("onnxruntime[model.int8.onnx]", io, 64, 50000.0, validated=False)
    for io, b1, b64 in [("host", 1172.79, 5687.69), ("device", 1405.54, 9338.17)]:
        row(graph, io, 1, b1, 0.06, peer=True)
        row(graph, io, 64, b64, 0.43, peer=True)
    for io, b1, b64 in [("host", 1200.0, 6000.0), ("device", 1527.5, 10242.9)]:
        row("timm-compile-ro-fp16", io, 1, b1, peer=True)
        row("timm-compile-ro-fp16", io, 64, b64, peer=True)
    return {"model": "/tmp/vit-cuda/base", "device": "cuda", "gpu": "NVIDIA H100 80GB HBM3",
            "batch_sizes": [1, 64], "rows": rows,
            "notes": ["timm-compile-fp16 left out: compiler failed"]}


DELETE = object()  # set_at's value that removes the key


def set_at(document, path, value) -> None:
    """document[path[0]][path[1]]... = value (DELETE: the key removed), in place."""
    target = document
    for key in path[:-1]:
        target = target[key]
    if value is DELETE:
        del target[path[-1]]
    else:
        target[path[-1]] = value


def same_as_infer(logits, records: list[dict], atol: float = 1e-5) -> bool:
    """Whether raw logits [N, K] give what `infer --json` said of the same inputs (`records`,
    in order): the same classes in the same order, each probability within `atol` (a
    server batches requests as it gets them; infer, as it reads them)."""
    import numpy as np

    z = np.exp(logits - logits.max(axis=1, keepdims=True))
    probs = z / z.sum(axis=1, keepdims=True)
    for p, record in zip(probs, records, strict=True):
        top = np.argsort(-p)[:len(record["top"])]
        if [int(i) for i in top] != [t["class"] for t in record["top"]] or \
                any(abs(float(p[i]) - t["prob"]) > atol for i, t in zip(top, record["top"])):
            return False
    return True


def one_line(stderr: str) -> str:
    """The one non-empty line an error writes to stderr."""
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1, stderr
    return lines[0]


@pytest.fixture(scope="session")
def photo_files(tmp_path_factory) -> list[Path]:
    """scikit-learn's two real photos, crops of them, and grayscale and RGBA copies, as
    files (what users embed)."""
    import numpy as np
    from PIL import Image
    from sklearn.datasets import load_sample_images

    china, flower = (Image.fromarray(a) for a in load_sample_images().images)
    folder = tmp_path_factory.mktemp("photos")
    rgba = flower.copy()
    alpha = np.zeros(flower.size[::-1], np.uint8)
    alpha[:, flower.size[0] // 3:] = 255  # a third of it transparent
    rgba.putalpha(Image.fromarray(alpha))
    images = {"china.jpg": china, "flower.png": flower,
              "china_crop.png": china.crop((200, 100, 424, 324)),
              "flower_portrait.png": flower.crop((170, 0, 470, 427)),
              "china_gray.png": china.convert("L"), "flower_rgba.png": rgba}
    for name, image in images.items():
        image.save(folder / name, **({"quality": 92} if name.endswith(".jpg") else {}))
    return sorted(folder.iterdir())


def marked(mark: str) -> list[str]:
    """The live processes whose environment holds `mark`: a run and everything it started
    (Ray's raylet, GCS, agents and workers inherit it, whatever title they give themselves)."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if f"VX_TEST_RUN={mark}".encode() in (proc / "environ").read_bytes().split(b"\0"):
                status = (proc / "status").read_text()
                if "\nState:\tZ" not in status:  # a zombie is gone, only not yet reaped
                    found.append(f"{proc.name} {(proc / 'cmdline').read_bytes()[:80]!r}")
        except OSError:  # gone meanwhile, or not ours to read
            continue
    return found


def end_marked(mark: str, seconds: float = 60) -> list[str]:
    """Wait up to `seconds` for the processes `mark` names (this one aside) to be gone; end
    those left by PID, so the next test starts clean, and return them: a test asserts there
    were none, as its processes must end themselves."""
    deadline = time.monotonic() + seconds
    while (left := [p for p in marked(mark) if int(p.split()[0]) != os.getpid()]) and \
            time.monotonic() < deadline:
        time.sleep(0.5)
    for line in left:
        try:
            os.kill(int(line.split()[0]), signal.SIGKILL)
        except ProcessLookupError:
            pass
    return left
