"""The source framework's outputs computed by a second process while export works on
(`parity.SourceAhead`): they are what the source gives when built and run here, a source
the child cannot build is skipped with the same reason (and runs nothing there either), and
where the child gives no answer the source is built here, as validate --source builds it.

Each case is a tiny DINOv2 folder, read as export reads it, and the bundle exported from it.
"""
import dataclasses
import json
import os
import signal

import numpy as np
import pytest
from conftest import run
from families import save_hf, tiny_hf

from vit_export import bundle as B
from vit_export import parity, runtime
from vit_export.checkpoints import read_recorded
from vit_export.deploy.ray.session import alive
from vit_export.parity.ahead import SourceAhead
from vit_export.parity.source import SourceSkipped, build_source, source_inputs, source_sizes

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.slow  # exports and second processes, 20 s


@pytest.fixture(scope="module")
def imported(tmp_path_factory):
    """A tiny DINOv2 folder (dynamic size: the source rows run at four sizes) and the
    bundle exported from it."""
    root = tmp_path_factory.mktemp("ahead")
    folder = save_hf(tiny_hf("Dinov2Model"), root / "dinov2")
    out = root / "bundle"
    code, _, err = run("export", out, "--checkpoint", folder, "--dynamic-size")
    assert code == 0, err
    return folder, out


def started(folder, bundle, seed=0):
    description = B.read_bundle(bundle).description
    files = read_recorded(folder, description.extra["import"]["files"])
    ahead = SourceAhead.start(description, files, seed)
    assert ahead is not None, "the child did not start"
    return description, files, ahead


def test_the_child_answers_what_the_source_gives_built_here(imported):
    """Every output at every size, bit for bit what the source built in this process gives
    on one thread (as the child runs it), and the same record."""
    folder, bundle = imported
    description, files, ahead = started(folder, bundle)
    try:
        answered = ahead.answered(description, 0)
    finally:
        ahead.close()
    assert answered is not None
    here = build_source(description, files)
    sizes = source_sizes(description.config, here.native)
    assert len(sizes) > 1 and answered.record() == here.record()
    with runtime.torch_threads(1):
        for _, x in source_inputs(description.config, 0, sizes):
            got, expected = answered.run(x), here.run(x)
            assert got.keys() == expected.keys()
            for name in expected:
                assert np.array_equal(got[name], expected[name]), name


def test_a_source_the_child_cannot_build_is_skipped_with_the_reason_given_here(imported,
                                                                              tmp_path):
    """A folder whose config.json names a model type transformers does not define (and the
    code that would make it): skipped with the line the source built here gives, nothing
    run by either process."""
    folder, bundle = imported
    evil = tmp_path / "evil"
    evil.mkdir()
    marker = tmp_path / "ran"
    (evil / "modeling_evil.py").write_text(f"open({str(marker)!r}, 'w').close()\n")
    (evil / "config.json").write_text(json.dumps({
        "model_type": "evil_vit", "auto_map": {"AutoModel": "modeling_evil.EvilModel"}}))
    (evil / "model.safetensors").write_bytes((folder / "model.safetensors").read_bytes())
    description = B.read_bundle(bundle).description
    files = read_recorded(evil, {n: B.sha256_file(evil / n)
                                 for n in ("config.json", "model.safetensors")})
    description = dataclasses.replace(description, extra={
        **description.extra, "import": {**description.extra["import"],
                                        "files": files.digests()}})
    with pytest.raises(SourceSkipped) as here:
        build_source(description, files)
    ahead = SourceAhead.start(description, files, 0)
    try:
        with pytest.raises(SourceSkipped) as there:
            ahead.answered(description, 0)
    finally:
        ahead.close()
    assert str(there.value) == str(here.value) and "evil_vit" in str(here.value)
    assert not marker.exists()


def test_the_childs_working_directory_runs_nothing(imported, tmp_path, monkeypatch):
    """Exported from inside a folder holding .py files named as the modules the source
    imports (safetensors, transformers): the child imports the installed ones, and its
    answer is the source's."""
    folder, bundle = imported
    marker = tmp_path / "ran"
    evil = tmp_path / "cwd"
    evil.mkdir()
    for name in ("safetensors", "transformers", "numpy", "vit_export"):
        (evil / f"{name}.py").write_text(f"open({str(marker)!r}, 'w').close()\n")
    monkeypatch.chdir(evil)
    description, _, ahead = started(folder, bundle)
    try:
        answered = ahead.answered(description, 0)
    finally:
        ahead.close()
    assert answered is not None and not marker.exists()


# what the child runs instead of building the source, for each way of giving no answer
INSTEAD = {"hung": "import time; time.sleep(600)",
           "garbage": "import sys; sys.stdout.write('{\"status\": \"built\"}\\n junk')",
           "died": "import os; os._exit(3)"}


@pytest.mark.parametrize("why", ["died", "hung", "garbage", "another seed"])
def test_without_the_childs_answer_the_source_is_built_here(imported, monkeypatch, why):
    """The child died before it answered, hung (here the wait ends after 3 s),
    wrote what is not an answer, or was asked for other inputs than the validation runs:
    validate builds the source here, its rows pass, and the child is gone."""
    from vit_export.parity import ahead as module

    folder, bundle = imported
    monkeypatch.setattr(module, "PATIENCE", 0.0)
    monkeypatch.setattr(module, "WAIT_AT_LEAST", 3.0)
    if why in INSTEAD:
        monkeypatch.setattr(module, "CHILD", INSTEAD[why])
    _, _, ahead = started(folder, bundle, seed=5 if why == "another seed" else 0)
    child = ahead._child
    try:
        steps = []
        report = parity.validate(bundle, parity.ValidateOptions(source=ahead),
                                 progress=steps.append)
    finally:
        ahead.close()
    assert report.passed and report.source["status"] == "passed", report.source
    assert any(s.startswith("building the source framework's model from the files")
               for s in steps), steps
    assert child.poll() is not None


# An export that starts the child (its program: the guard `main` sets first, then a hang)
# and is then killed outright, as a user's SIGKILL or the OOM killer ends it.
KILLED_PARENT = r"""
import os, signal, sys
from vit_export import bundle as B
from vit_export.checkpoints import read_recorded
from vit_export.parity import ahead
ahead.CHILD = ("import sys, json; sys.path[:] = sys.argv[1:]; "
               "from vit_export.parity.ahead import end_with_parent; "
               "end_with_parent(json.loads(sys.stdin.buffer.read())['parent']); "
               "print('guarded', flush=True); import time; time.sleep(600)")
description = B.read_bundle(sys.argv[2]).description
files = read_recorded(sys.argv[1], description.extra["import"]["files"])
child = ahead.SourceAhead.start(description, files, 0)._child
assert child.stdout.readline() == b"guarded\n"  # killed only once the child is guarded
print(child.pid, flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_the_child_ends_with_the_export_however_the_export_ends(imported, tmp_path):
    """An export killed outright (SIGKILL: no `close`, no finally) takes its child with it,
    even one that hangs: nothing it started is left running."""
    import subprocess
    import sys
    import time

    folder, bundle = imported
    done = subprocess.run([sys.executable, "-c", KILLED_PARENT, str(folder), str(bundle)],
                          capture_output=True, text=True, cwd=tmp_path, timeout=120,
                          check=False)
    assert done.returncode == -9, done.stderr
    pid = int(done.stdout)
    try:
        deadline = time.monotonic() + 20
        while alive(pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not alive(pid), "the child outlived the export"
    finally:
        if alive(pid):
            os.kill(pid, signal.SIGKILL)


def test_export_compares_what_the_second_process_computed(imported, tmp_path, monkeypatch):
    """export's own run (the tiny model taken as big enough for a second process): the
    source built and run there, its rows passed, and never built in the export's own
    process. As it is, the tiny model's source is built here: no second process."""
    from vit_export.exporting import export

    folder, _ = imported
    code, _, err = run("export", tmp_path / "small", "--checkpoint", folder, "--progress")
    assert code == 0, err
    assert "second process" not in err
    assert "building the source framework's model from the files" in err
    monkeypatch.setattr(export, "SOURCE_BESIDE_FROM", 0)
    out = tmp_path / "b"
    code, _, err = run("export", out, "--checkpoint", folder, "--dynamic-size",
                          "--progress")
    assert code == 0, err
    assert "building and running the source framework's model in a second process" in err
    assert "building the source framework's model from the files" not in err
    source = json.loads((out / B.PARITY_FILE).read_text())["source"]
    assert source["status"] == "passed" and len(source["sizes"]) > 1
