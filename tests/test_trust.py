"""A bundle is data: each attack here is built as its author would build it (a crafted archive,
a re-hashed config.json, an edited performance.json), and no command run on it with its
defaults runs code from it. Each payload writes a marker file when it runs; a control at the
end of each test runs the same file the way PyTorch's own loader would, to show the payload
is real and the test can fail."""
import io
import json
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import one_line, rewrite_hash, run

from vit_export import bundle as B
from vit_export import cpu, parity


class _Touch:
    """Unpickled, it creates `marker`: what a hostile pickle does, harmlessly."""

    def __init__(self, marker: Path):
        self.marker = str(marker)

    def __reduce__(self):
        return open, (self.marker, "w")


def _pickle(marker: Path) -> bytes:
    buffer = io.BytesIO()
    torch.save(_Touch(marker), buffer)
    return buffer.getvalue()


def _rewrite_zip(path: Path, change) -> None:
    """Rewrite the zip at `path` member by member: change(name, data) -> data, or None to
    drop the member."""
    with zipfile.ZipFile(path) as archive:
        members = [(n, archive.read(n)) for n in archive.namelist()]
    with zipfile.ZipFile(path, "w") as archive:
        for name, data in members:
            data = change(name, data)
            if data is not None:
                archive.writestr(name, data)


def _performance(bundle: Path, backend: str, files=None) -> None:
    """performance.json as `bench --record` writes it, naming `backend` fastest at batch 1."""
    if files is None:
        files = json.loads((bundle / B.CONFIG_FILE).read_text())["files"]
    (bundle / B.PERFORMANCE_FILE).write_text(json.dumps({
        "device": "cpu", "cpu": cpu.isa().model, "files": files,
        "fastest_validated": {"1": {"backend": backend}}}))


@pytest.fixture
def sample(tmp_path) -> Path:
    path = tmp_path / "x.npy"
    np.save(path, np.zeros((3, 32, 32), np.float32))
    return path


def test_a_pickled_entry_in_model_pt2_is_refused_by_every_command(program_bundle, tmp_path,
                                                                   sample):
    bundle = tmp_path / "b"
    shutil.copytree(program_bundle, bundle)
    marker = tmp_path / "ran"
    pt2 = bundle / B.PT2_FILE

    def poison(name: str, data: bytes):
        if name.endswith("/data/weights/model_weights_config.json"):
            config = json.loads(data)
            first = next(iter(config["config"].values()))
            first["use_pickle"] = True
            return json.dumps(config)
        if name.endswith("/data/weights/weight_0"):
            return _pickle(marker)
        return data

    _rewrite_zip(pt2, poison)
    rewrite_hash(bundle, B.PT2_FILE)
    _performance(bundle, "pt2")
    commands = [("infer", bundle, sample), ("infer", bundle, sample, "--runtime", "pt2"),
                ("infer", pt2, sample), ("validate", bundle), ("validate", bundle,
                                                               "--trust-code"),
                ("bench", bundle, "--batch-sizes", "1", "--min-runs", "1",
                 "--min-seconds", "0"), ("info", bundle), ("info", pt2),
                ("triton", bundle, tmp_path / "repo")]
    for args in commands:
        code, _, stderr = run(*args)
        assert code == 1, (args, stderr)
        assert "is refused before torch reads it" in one_line(stderr), args
        assert "marks 'l" in stderr or "marks '" in stderr
        assert not marker.exists(), args
    assert not (tmp_path / "repo").exists()
    # the control: PyTorch's own loader runs the payload
    subprocess.run([sys.executable, "-c", f"import torch; torch.export.load({str(pt2)!r})"],
                   capture_output=True, cwd=tmp_path, check=False)  # it fails after the payload
    assert marker.exists()


@pytest.mark.slow  # an export of its own, 5-7 s: the quick suite keeps under 3 minutes
def test_sample_inputs_that_need_the_full_unpickler_are_refused(program_bundle, tmp_path,
                                                               sample):
    """torch.export.load reads sample inputs with weights_only=True, and where that fails,
    again with weights_only=False."""
    bundle = tmp_path / "b"
    shutil.copytree(program_bundle, bundle)
    marker = tmp_path / "ran"
    _rewrite_zip(bundle / B.PT2_FILE, lambda name, data: _pickle(marker)
                 if name.endswith("/data/sample_inputs/model.pt") else data)
    rewrite_hash(bundle, B.PT2_FILE)
    code, _, stderr = run("infer", bundle, sample, "--runtime", "pt2")
    assert code == 1
    assert "sample inputs are not plain tensors" in one_line(stderr)
    assert not marker.exists()
    load = f"import torch; torch.export.load({str(bundle / B.PT2_FILE)!r})"
    subprocess.run([sys.executable, "-c", load], capture_output=True, cwd=tmp_path,
                   check=False)  # it fails after the payload
    assert marker.exists()


def test_a_damaged_program_is_one_line_without_torchs_traceback(program_bundle, tmp_path,
                                                                sample):
    bundle = tmp_path / "b"
    shutil.copytree(program_bundle, bundle)
    _rewrite_zip(bundle / B.PT2_FILE,
                 lambda name, data: None if name.endswith("/data/weights/weight_1") else data)
    rewrite_hash(bundle, B.PT2_FILE)
    code, stdout, stderr = run("infer", bundle, sample, "--runtime", "pt2")
    assert code == 1 and stdout == ""
    assert one_line(stderr).startswith(f"Error: cannot load torch.export program {bundle}")


def test_files_that_can_carry_code_run_only_when_named_or_trusted(program_bundle, tmp_path,
                                                                  sample):
    bundle = tmp_path / "b"
    shutil.copytree(program_bundle, bundle)
    code, stdout, _ = run("validate", bundle)
    assert code == 0
    assert "note: model.ts, model.pt2 not run: a file that can carry code runs only with " \
           "--trust-code" in stdout
    assert not [line for line in stdout.splitlines() if line.startswith(("torchscript", "pt2"))]
    code, stdout, _ = run("validate", bundle, "--trust-code")
    assert code == 0 and "not run" not in stdout
    assert [line for line in stdout.splitlines() if line.startswith("pt2 ")]
    for runner in ("torchscript", "pt2"):  # auto never picks one, however fast it was
        _performance(bundle, runner)
        code, stdout, _ = run("infer", bundle, sample, "--batch-size", "1")
        assert code == 0
        assert stdout.splitlines()[-1] == (
            f"1 input(s) on onnxruntime (cpu); performance.json names {runner}, but {runner} "
            f"runs a file that can carry code, which auto never picks (--runtime {runner} "
            f"runs it)")
        code, stdout, _ = run("infer", bundle, sample, "--runtime", runner)  # named: runs
        assert code == 0 and f"1 input(s) on {runner} (cpu)" in stdout


def test_verdicts_and_timings_hold_only_for_the_files_they_judged(tiny_bundle, tmp_path,
                                                                  sample):
    bundle = tmp_path / "b"
    shutil.copytree(tiny_bundle, bundle)
    assert parity.validated_runners(B.read_bundle(bundle)) >= {"eager", "onnxruntime"}
    _performance(bundle, "eager")
    code, stdout, _ = run("infer", bundle, sample, "--batch-size", "1")
    assert code == 0
    assert stdout.splitlines()[-1] == ("1 input(s) on eager (cpu); performance.json's "
                                       "fastest validated at batch 1")
    # a model swapped in afterwards, config.json re-hashed as its author would
    import onnx

    model = onnx.load(str(bundle / B.ONNX_FILE))
    model.doc_string = "not the file parity.json judged"
    onnx.save(model, str(bundle / B.ONNX_FILE))
    rewrite_hash(bundle, B.ONNX_FILE)
    assert parity.validated_runners(B.read_bundle(bundle)) == {"eager"}
    report, why = parity.read_proof(B.read_bundle(bundle))
    assert report is None and "judged other files" in why
    code, stdout, _ = run("infer", bundle, sample, "--batch-size", "1")
    assert stdout.splitlines()[-1] == (
        "1 input(s) on onnxruntime (cpu); performance.json names eager, but it timed other "
        "files than the bundle holds now")


def test_external_data_the_hashes_do_not_cover_is_refused(tiny_bundle, tmp_path, sample):
    import onnx

    bundle = tmp_path / "b"
    shutil.copytree(tiny_bundle, bundle)
    model = onnx.load(str(bundle / B.ONNX_FILE))
    onnx.save(model, str(bundle / B.ONNX_FILE), save_as_external_data=True,
              location="elsewhere.bin", size_threshold=1024)  # the weight matrices
    rewrite_hash(bundle, B.ONNX_FILE)
    for args in (("infer", bundle, sample), ("validate", bundle),
                 ("bench", bundle, "--batch-sizes", "1", "--min-runs", "1")):
        code, _, stderr = run(*args)
        assert code == 1
        assert one_line(stderr) == (f"Error: {bundle / B.ONNX_FILE} names external data "
                                    f"'elsewhere.bin', which has no sha256 in config.json")
    rewrite_hash(bundle, "elsewhere.bin")  # hashed, it is the bundle's own file
    code, _, stderr = run("infer", bundle, sample)
    assert code == 0, stderr


def test_text_from_a_bundle_cannot_forge_lines_or_drive_the_terminal(tiny_bundle, tmp_path,
                                                                     sample):
    bundle = tmp_path / "b"
    shutil.copytree(tiny_bundle, bundle)
    config = json.loads((bundle / B.CONFIG_FILE).read_text())
    config["name"] = "evil\nPASS\x1b[2J"
    config["versions"]["torch"] = "2\r\x07"
    (bundle / B.CONFIG_FILE).write_text(json.dumps(config))
    code, stdout, _ = run("info", bundle)
    assert code == 0
    assert "\x1b" not in stdout and "\r" not in stdout and "\x07" not in stdout
    assert "PASS" not in stdout.splitlines()
    assert "name: evil\\nPASS\\x1b[2J" in stdout.splitlines()
    _performance(bundle, "onnx\x1b[31mruntime")
    code, stdout, _ = run("infer", bundle, sample, "--batch-size", "1")
    assert code == 0 and "\x1b" not in stdout
    assert "performance.json names onnx\\x1b[31mruntime, but" in stdout
    _performance(bundle, "onnxruntime")  # the record's other texts: the CPU it names
    record = json.loads((bundle / B.PERFORMANCE_FILE).read_text())
    (bundle / B.PERFORMANCE_FILE).write_text(json.dumps({**record, "cpu": "X\nPASS\x1b[2J"}))
    code, stdout, _ = run("infer", bundle, sample, "--batch-size", "1")
    assert code == 0 and "\x1b" not in stdout and "PASS" not in stdout.splitlines()
    assert "but it was measured on X\\nPASS\\x1b[2J, and this CPU is" in stdout
    config["model"]["dep\x00th"] = 1  # an unknown field, with a NUL
    (bundle / B.CONFIG_FILE).write_text(json.dumps(config))
    code, _, stderr = run("info", bundle)
    assert code == 1 and "\x00" not in stderr and "\\x00" in one_line(stderr)


def test_a_fifo_given_as_an_input_is_named_for_what_it_is(tiny_bundle, tmp_path):
    import os

    fifo = tmp_path / "pipe.png"
    os.mkfifo(fifo)
    code, _, stderr = run("infer", tiny_bundle, fifo)
    assert code == 1
    assert one_line(stderr) == f"Error: {fifo} is not a regular file or folder"


def _library_that_writes(marker: Path, folder: Path) -> Path:
    """A shared library whose constructor creates `marker`: it runs the moment the library
    is loaded, before any symbol is looked up."""
    compiler = shutil.which("g++") or shutil.which("cc")
    if compiler is None:
        pytest.skip("no C compiler to build the payload")
    source = folder / "payload.c"
    source.write_text('#include <stdio.h>\n__attribute__((constructor)) static void run(void)'
                      f' {{ FILE *f = fopen("{marker}", "w"); if (f) fclose(f); }}\n')
    library = folder / "payload.so"
    subprocess.run([compiler, "-shared", "-fPIC", "-x", "c", str(source), "-o", str(library)],
                   check=True, capture_output=True)
    return library


def test_a_package_is_never_loaded_unless_named(tiny_bundle, tmp_path, sample):
    """model.aoti.pt2 with a library whose constructor runs on load, metadata saying it was
    compiled here for this CPU and torch, hashed in config.json, named fastest by
    performance.json: the default commands never load it."""
    bundle = tmp_path / "b"
    shutil.copytree(tiny_bundle, bundle)
    marker = tmp_path / "ran"
    library = _library_that_writes(marker, tmp_path)
    description = json.loads((bundle / B.CONFIG_FILE).read_text())
    meta = {"AOTI_DEVICE_KEY": "cpu", "AOTI_CPU_ISA": "", B.METADATA_KEY: json.dumps(
        {**description, "versions": {"torch": torch.__version__}})}
    with zipfile.ZipFile(bundle / B.AOTI_FILE, "w") as archive:
        root = "model.aoti/data/aotinductor/model/"
        archive.writestr(root + "model_wrapper_metadata.json", json.dumps(meta))
        archive.write(library, root + "model.wrapper.so")
        archive.writestr("model.aoti/archive_format", "pt2")
    rewrite_hash(bundle, B.AOTI_FILE)
    _performance(bundle, "aoti")
    code, stdout, _ = run("infer", bundle, sample, "--batch-size", "1")
    assert code == 0
    assert stdout.splitlines()[-1].startswith("1 input(s) on onnxruntime (cpu); "
                                              "performance.json names aoti, but aoti runs a "
                                              "file that can carry code")
    code, stdout, _ = run("validate", bundle)
    assert code == 0 and "model.aoti.pt2 not run" in stdout
    code, stdout, _ = run("bench", bundle, "--batch-sizes", "1", "--min-runs", "1",
                          "--min-seconds", "0")
    assert code == 0 and "aoti" not in stdout.split("note:")[0]
    assert run("info", bundle)[0] == 0 and run("triton", bundle, tmp_path / "repo")[0] == 0
    assert not marker.exists()
    # the control: loaded as a library, the payload runs
    subprocess.run([sys.executable, "-c", f"import ctypes; ctypes.CDLL({str(library)!r})"],
                   check=True)
    assert marker.exists()


def test_a_package_that_fails_to_load_leaves_nothing_in_tmp(tiny_bundle, tmp_path, sample):
    """AOTInductor's loader unpacks a package into TMPDIR/aotinductor_* and left two such
    folders behind each time it failed: it is given a folder of its own, removed."""
    import glob
    import tempfile

    bundle = tmp_path / "b"
    shutil.copytree(tiny_bundle, bundle)
    source = tmp_path / "empty.c"
    source.write_text("int nothing = 0;\n")
    compiler = shutil.which("g++") or shutil.which("cc")
    if compiler is None:
        pytest.skip("no C compiler to build the library")
    subprocess.run([compiler, "-shared", "-fPIC", "-x", "c", str(source), "-o",
                    str(tmp_path / "empty.so")], check=True, capture_output=True)
    description = json.loads((bundle / B.CONFIG_FILE).read_text())
    meta = {"AOTI_DEVICE_KEY": "cpu", B.METADATA_KEY: json.dumps(
        {**description, "versions": {"torch": torch.__version__}})}
    with zipfile.ZipFile(bundle / B.AOTI_FILE, "w") as archive:  # its loader finds no model
        archive.writestr("p/data/aotinductor/model/x_wrapper_metadata.json", json.dumps(meta))
        archive.write(tmp_path / "empty.so", "p/data/aotinductor/model/x.so")
        archive.writestr("p/archive_format", "pt2")
    rewrite_hash(bundle, B.AOTI_FILE)
    temp = tempfile.gettempdir()

    def unpacked():
        return set(glob.glob(f"{temp}/aotinductor_*")) | set(glob.glob(f"{temp}/vx-aoti-*"))

    before = unpacked()
    code, _, stderr = run("infer", bundle, sample, "--runtime", "aoti")
    assert code == 1
    assert one_line(stderr).startswith(f"Error: cannot load AOTInductor package {bundle}")
    assert unpacked() == before


def _write_members(path: Path, members, compressed=()) -> None:
    """A zip of (name, data) pairs, in order, duplicates kept; `compressed` names the
    members to deflate."""
    import warnings

    with warnings.catch_warnings(), zipfile.ZipFile(path, "w") as archive:
        warnings.simplefilter("ignore", UserWarning)  # zipfile's "Duplicate name"
        for name, data in members:
            archive.writestr(name, data, zipfile.ZIP_DEFLATED if name in compressed
                             else zipfile.ZIP_STORED)


def _two_configs(members, marker: Path, evil_name: str, at: int):
    """`members` of a model.pt2 with weight_0 a pickle, a second weights config marking it
    pickled named `evil_name` (under the same folder) inserted at `at`, the clean config
    last: Python's zipfile and torch's reader may each read a different one."""
    config = next(n for n, _ in members if n.endswith("/data/weights/model_weights_config.json"))
    clean = dict(members)[config]
    values = json.loads(clean)
    next(iter(values["config"].values()))["use_pickle"] = True
    rest = [(n, _pickle(marker) if n.endswith("/data/weights/weight_0") else d)
            for n, d in members if n != config]
    evil = (config.rsplit("/", 1)[0] + "/" + evil_name, json.dumps(values).encode())
    return rest[:at] + [evil] + rest[at:] + [(config, clean)]


@pytest.mark.slow  # several seconds: the whole suite runs it
def test_a_model_pt2_that_zipfile_and_torch_read_two_ways_is_refused(program_bundle, tmp_path,
                                                                     sample):
    """Python's zipfile takes the last of two members of one name and matches names exactly;
    torch's reader finds a name by a case-blind binary search. Two weights configs, one
    pickled, passed the check (it read the clean one) and torch unpickled the other."""
    with zipfile.ZipFile(program_bundle / B.PT2_FILE) as archive:
        members = [(n, archive.read(n)) for n in archive.namelist()]
    ran = []
    # where the second config sits decides which one torch's binary search lands on (torch
    # 2.14.1 takes the pickled one at these places); zipfile always takes the clean one
    for evil_name, at in (("Model_weights_config.json", 2), ("model_weights_config.JSON", 6),
                          ("model_weights_config.json", 4), ("model_weights_config.json", 13)):
        bundle = tmp_path / f"b{len(ran)}"
        shutil.copytree(program_bundle, bundle)
        marker = tmp_path / f"ran{len(ran)}"
        _write_members(bundle / B.PT2_FILE, _two_configs(members, marker, evil_name, at))
        rewrite_hash(bundle, B.PT2_FILE)
        for args in (("infer", bundle, sample, "--runtime", "pt2"),
                     ("infer", bundle / B.PT2_FILE, sample), ("validate", bundle,
                                                              "--trust-code")):
            code, _, stderr = run(*args)
            assert code == 1, (evil_name, at, args, stderr)
            line = one_line(stderr)
            assert "is refused before torch reads it" in line, line
            assert ("names" in line and "twice" in line) or "differ only in case" in line, line
            assert not marker.exists(), args
        # the control: PyTorch's own loader, on the same file
        load = f"import torch; torch.export.load({str(bundle / B.PT2_FILE)!r})"
        subprocess.run([sys.executable, "-c", load], capture_output=True, cwd=tmp_path,
                       check=False)
        ran.append(marker.exists())
    assert any(ran[:2]) and any(ran[2:]), ran  # each kind ran torch's payload


def test_a_member_that_would_inflate_beyond_its_budget_is_refused_before_it_is_read(
        program_bundle, tmp_path, sample):
    """A model.pt2 of 0.3 MB whose sample inputs inflate to 64 MiB of zeros: refused from
    the sizes the archive declares, before anything is decompressed."""
    import tracemalloc

    bundle = tmp_path / "b"
    shutil.copytree(program_bundle, bundle)
    buffer = io.BytesIO()
    torch.save(torch.zeros(64 << 20, dtype=torch.uint8), buffer)
    with zipfile.ZipFile(bundle / B.PT2_FILE) as archive:
        members = [(n, buffer.getvalue() if n.endswith("/data/sample_inputs/model.pt")
                    else archive.read(n)) for n in archive.namelist()]
    del buffer
    bomb = next(n for n, _ in members if n.endswith("/data/sample_inputs/model.pt"))
    _write_members(bundle / B.PT2_FILE, members, compressed={bomb})
    del members
    assert (bundle / B.PT2_FILE).stat().st_size < 1 << 20
    rewrite_hash(bundle, B.PT2_FILE)
    tracemalloc.start()
    try:
        code, _, stderr = run("info", bundle)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert code == 1, stderr
    assert "declares" in one_line(stderr) and "sample_inputs/model.pt" in one_line(stderr)
    assert peak < 32 << 20, peak


def _scaled_copies(bundle: Path, folder: Path) -> dict[str, Path]:
    """Another model.onnx, model.ts and model.pt2 of the same shapes: every float weight
    times 1.5, so every answer differs."""
    import onnx
    from onnx import numpy_helper

    model = onnx.load(str(bundle / B.ONNX_FILE))
    for tensor in model.graph.initializer:
        array = numpy_helper.to_array(tensor)
        if array.dtype == np.float32:
            tensor.CopyFrom(numpy_helper.from_array(array * 1.5, tensor.name))
    onnx.save(model, str(folder / B.ONNX_FILE))
    extra = {f"{B.METADATA_KEY}.json": ""}  # the description each carries
    traced = torch.jit.load(str(bundle / B.TS_FILE), _extra_files=extra)
    with torch.no_grad():
        for parameter in traced.parameters():
            parameter.mul_(1.5)
    torch.jit.save(traced, str(folder / B.TS_FILE), _extra_files=extra)
    program = torch.export.load(str(bundle / B.PT2_FILE), extra_files=extra)
    with torch.no_grad():
        for value in program.state_dict.values():
            value.mul_(1.5)
    torch.export.save(program, str(folder / B.PT2_FILE), extra_files=extra)
    from safetensors.torch import load_file, save_file

    save_file({k: v * 1.5 for k, v in load_file(bundle / B.WEIGHTS_FILE).items()},
              folder / B.WEIGHTS_FILE)
    return {"onnxruntime": folder / B.ONNX_FILE, "torchscript": folder / B.TS_FILE,
            "pt2": folder / B.PT2_FILE, "eager": folder / B.WEIGHTS_FILE}


@pytest.mark.parametrize("runner", ["onnxruntime", "torchscript", "pt2", "eager",
                                    "eager-mapped"])
def test_a_model_renamed_over_the_checked_file_is_not_the_one_run(program_bundle, tmp_path,
                                                                  monkeypatch, runner):
    """A file hashed by its path and opened again by its path is two files: another model
    renamed over it between the two ran unhashed. Here the rename happens at the worst
    moment, as the loader is called; the answers must be the checked model's. The eager
    weights are read once with model.onnx's (which reads them as its external data), or,
    where model.onnx keeps its own (`eager-mapped`), mapped by safetensors."""
    import os

    import onnxruntime
    import safetensors

    from vit_export import runtime
    from vit_export.bundle import weights

    bundle = tmp_path / "b"
    shutil.copytree(program_bundle, bundle)
    config = json.loads((bundle / B.CONFIG_FILE).read_text())
    assert config["export"]["weights_in"] == B.WEIGHTS_FILE
    if runner == "eager-mapped":
        del config["export"]["weights_in"]
        (bundle / B.CONFIG_FILE).write_text(json.dumps(config))
        runner = "eager"
        loader = (safetensors, "safe_open")
    else:
        loader = {"onnxruntime": (onnxruntime, "InferenceSession"),
                  "torchscript": (torch.jit, "load"), "pt2": (torch.export, "load"),
                  "eager": (weights, "_state_from_bytes")}[runner]
    others = tmp_path / "others"
    others.mkdir()
    other = _scaled_copies(bundle, others)[runner]
    target = bundle / other.name
    x = np.random.default_rng(0).standard_normal((2, 3, 32, 32)).astype(np.float32)
    expected = runtime.open_runner(bundle, runner, "cpu")(x)
    swapped = []

    def swapping(load):
        def swap_then_load(*args, **kwargs):
            if not swapped:  # what the attacker's rename does, at the worst moment
                shutil.copy(other, tmp_path / "staged")
                os.replace(tmp_path / "staged", target)
                swapped.append(target)
            return load(*args, **kwargs)
        return swap_then_load

    monkeypatch.setattr(*loader, swapping(getattr(*loader)))
    answers = runtime.open_runner(bundle, runner, "cpu")(x)
    monkeypatch.undo()
    assert swapped == [target]
    np.testing.assert_array_equal(answers, expected)
    # the control: the file on disk now is another model, with other answers
    assert B.sha256_file(target) != json.loads((bundle / B.CONFIG_FILE).read_text())["files"][
        target.name]
    if runner == "eager":  # the weights are no model file of their own: hashed, they run
        rewrite_hash(bundle, B.WEIGHTS_FILE)
        other_run = runtime.open_runner(bundle, runner, "cpu")
    else:
        other_run = runtime.open_runner(target, runner, "cpu")
    assert np.abs(other_run(x) - expected).max() > 1e-3


def _varint(n: int) -> bytes:
    out = b""
    while n > 0x7F:
        out += bytes([n & 0x7F | 0x80])
        n >>= 7
    return out + bytes([n])


def test_external_data_named_in_a_long_varint_is_found(tiny_bundle, tmp_path, sample):
    """The check for external data scanned model.onnx for b"\\x0a\\x08location", the key as
    protobuf writes it; a parser also takes the length 8 written in two bytes (\\x88\\x00),
    and ONNX Runtime read the unhashed file that entry names."""
    import onnx
    import onnxruntime
    from onnx import numpy_helper

    bundle = tmp_path / "b"
    shutil.copytree(tiny_bundle, bundle)
    model = onnx.load(str(bundle / B.ONNX_FILE))
    moved = max(model.graph.initializer, key=lambda t: numpy_helper.to_array(t).size)
    data = numpy_helper.to_array(moved).tobytes()
    (bundle / "elsewhere.bin").write_bytes(data)
    stub = onnx.TensorProto(name=moved.name, dims=moved.dims, data_type=moved.data_type,
                            data_location=onnx.TensorProto.EXTERNAL)
    model.graph.initializer.remove(moved)

    def entry(key: bytes, value: bytes, long_key: bool) -> bytes:
        key_length = b"\x88\x00" if long_key else _varint(len(key))  # 8, in two bytes
        body = b"\x0a" + key_length + key + b"\x12" + _varint(len(value)) + value
        return b"\x6a" + _varint(len(body)) + body  # TensorProto.external_data (13)

    tensor = (stub.SerializeToString() + entry(b"location", b"elsewhere.bin", True)
              + entry(b"length", str(len(data)).encode(), False))
    graph = b"\x2a" + _varint(len(tensor)) + tensor  # GraphProto.initializer (5)
    # ModelProto.graph (7) a second time: a parser merges it into the first
    (bundle / B.ONNX_FILE).write_bytes(model.SerializeToString() + b"\x3a"
                                       + _varint(len(graph)) + graph)
    assert b"\x0a\x08location" not in (bundle / B.ONNX_FILE).read_bytes()
    rewrite_hash(bundle, B.ONNX_FILE)
    for args in (("infer", bundle, sample), ("validate", bundle)):
        code, _, stderr = run(*args)
        assert code == 1, (args, stderr)
        assert one_line(stderr) == (f"Error: {bundle / B.ONNX_FILE} names external data "
                                    f"'elsewhere.bin', which has no sha256 in config.json")
    # the controls: ONNX Runtime reads that file itself; hashed, it is the bundle's own
    session = onnxruntime.InferenceSession(str(bundle / B.ONNX_FILE),
                                           providers=["CPUExecutionProvider"])
    assert session.get_inputs()[0].name == B.INPUT_NAME
    rewrite_hash(bundle, "elsewhere.bin")
    code, stdout, stderr = run("infer", bundle, sample)
    assert code == 0, stderr
    assert run("infer", tiny_bundle, sample)[1] == stdout.replace(str(bundle), str(tiny_bundle))


def test_triton_refuses_external_data_hidden_where_only_a_whole_walk_finds_it(tiny_bundle,
                                                                             tmp_path):
    import onnx
    from onnx import TensorProto, helper

    bundle = tmp_path / "b"
    shutil.copytree(tiny_bundle, bundle)
    model = onnx.load(str(bundle / B.ONNX_FILE))
    values = helper.make_tensor("hidden", TensorProto.FLOAT, [1], [0.0])
    values.ClearField("float_data")
    values.data_location = TensorProto.EXTERNAL
    for key, value in (("location", "elsewhere.bin"), ("offset", "0"), ("length", "4")):
        values.external_data.add(key=key, value=value)
    indices = helper.make_tensor("hidden_indices", TensorProto.INT64, [1], [0])
    model.graph.sparse_initializer.append(helper.make_sparse_tensor(values, indices, [4]))
    onnx.save(model, str(bundle / B.ONNX_FILE))
    rewrite_hash(bundle, B.ONNX_FILE)
    code, _, stderr = run("triton", bundle, tmp_path / "repo")
    assert code == 1
    assert one_line(stderr) == (f"Error: {bundle / B.ONNX_FILE} keeps tensor 'hidden' outside "
                                f"the graph's initializers in external data, which is not read")
    assert not (tmp_path / "repo").exists()
