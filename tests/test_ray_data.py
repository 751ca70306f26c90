"""`infer --ray`: batch inference on Ray Data gives what `infer` gives, and resumes."""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from conftest import marked, one_line, run

pytest.importorskip("ray.data")

ROOT = Path(__file__).resolve().parent.parent


def single_process(bundle, inputs) -> list[dict]:
    code, stdout, stderr = run("infer", bundle, *inputs, "--top-k", 3, "--json")
    assert code == 0, stderr
    return json.loads(stdout)["results"]


def records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.mark.slow  # a Ray cluster: seconds to start on 2 cores
def test_ray_data_with_two_workers_is_identical_to_infer(digits_bundle, digit_images, tmp_path):
    import logging

    from vit_export.deploy.ray import session as cluster

    before = {name: logging.getLogger(name).level for name in cluster.RAY_LOGGERS}
    out = tmp_path / "results.jsonl"
    code, stdout, stderr = run("infer", digits_bundle, digit_images[0].parent, "--top-k", 3,
                               "--ray", "--workers", 2, "--output", out)
    assert code == 0, stderr
    # the run (in this process) set Ray's loggers to ERROR while it ran, and gave them back
    assert {name: logging.getLogger(name).level for name in cluster.RAY_LOGGERS} == before
    assert "360 file(s) classified on Ray Data with 2 worker(s)" in stdout
    assert records(out) == single_process(digits_bundle, [digit_images[0].parent])
    assert not (tmp_path / ".results.jsonl.partial").exists()


@pytest.mark.slow  # a Ray cluster: seconds to start on 2 cores
def test_resume_classifies_only_what_is_missing(digits_bundle, digit_images, tmp_path):
    out = tmp_path / "results.jsonl"
    half = digit_images[:100]
    code, _, stderr = run("infer", digits_bundle, *half, "--top-k", 3, "--ray",
                          "--output", out)
    assert code == 0, stderr
    assert records(out) == single_process(digits_bundle, half)
    code, _, stderr = run("infer", digits_bundle, *half, "--top-k", 3, "--ray", "--output", out)
    assert code == 1
    assert one_line(stderr) == f"Error: {out} exists; pass --resume to continue that run, " \
                               f"or --force to start over"

    # a crash left a progress file: whole records, and a line it cut short
    partial = tmp_path / ".results.jsonl.partial"
    extra = single_process(digits_bundle, digit_images[100:150])
    partial.write_text("".join(json.dumps(r) + "\n" for r in extra) + extra[0]["input"][:9])
    code, stdout, stderr = run("infer", digits_bundle, *digit_images[:200], "--top-k", 3,
                               "--ray", "--output", out, "--resume")
    assert code == 0, stderr
    # the progress file's records of 100:150 have no record of what made them (no run
    # wrote it): they are classified again, not trusted
    assert "100 file(s) classified on Ray Data with 1 worker(s)" in stdout
    assert "100 done before" in stdout
    assert records(out) == single_process(digits_bundle, digit_images[:200])
    assert not partial.exists()
    # --force starts over: the 200 records are replaced by the run's own, nothing kept
    code, stdout, stderr = run("infer", digits_bundle, *digit_images[:20], "--top-k", 3,
                               "--ray", "--output", out, "--force")
    assert code == 0, stderr
    assert "20 file(s) classified" in stdout and "0 done before" in stdout
    assert records(out) == single_process(digits_bundle, digit_images[:20])


def _midway(process: subprocess.Popen, partial: Path, seconds: float = 120) -> None:
    """Wait until a running `infer --ray` has written finished batches to its progress
    file; it must still be running then."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and process.poll() is None:
        if partial.exists() and partial.stat().st_size > 0:
            break
        time.sleep(0.05)
    assert process.poll() is None, process.returncode


@pytest.mark.slow  # a Ray cluster: seconds to start on 2 cores
def test_stopped_run_resumes_to_the_same_answer(digits_bundle, digit_images, tmp_path):
    """SIGTERM in the middle of a real run: the output is absent, the finished batches are
    kept, and --resume completes it."""
    out = tmp_path / "results.jsonl"
    partial = tmp_path / ".results.jsonl.partial"
    folder = digit_images[0].parent
    process = subprocess.Popen(
        [sys.executable, str(ROOT / "cli.py"), "infer", str(digits_bundle), str(folder),
         "--top-k", "3", "--batch-size", "4", "--ray", "--output", str(out)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        _midway(process, partial)
        os.kill(process.pid, signal.SIGTERM)
        _, stderr = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode == 128 + signal.SIGTERM, stderr
    assert stderr.splitlines() == ["inferring on Ray Data",  # click's progress label
                                   "Error: stopped by SIGTERM; nothing half-written was left"]
    assert not out.exists()
    done = len(records(partial))
    assert 0 < done < 360
    code, stdout, stderr = run("infer", digits_bundle, folder, "--top-k", 3, "--ray",
                               "--output", out, "--resume")
    assert code == 0, stderr
    assert f"{done} done before" in stdout
    assert records(out) == single_process(digits_bundle, [folder])


@pytest.mark.slow  # a Ray cluster: seconds to start on 2 cores
def test_a_bad_image_stops_the_run_and_keeps_what_was_done(digits_bundle, digit_images,
                                                            tmp_path):
    folder = tmp_path / "images"
    folder.mkdir()
    for path in digit_images[:20]:
        (folder / path.name).write_bytes(path.read_bytes())
    (folder / "999_broken.png").write_bytes(b"\x89PNG\r\n\x1a\n not really")
    out = tmp_path / "results.jsonl"
    code, _, stderr = run("infer", digits_bundle, folder, "--ray", "--batch-size", 4,
                          "--output", out)
    assert code == 1
    assert one_line(stderr) == f"Error: {folder / '999_broken.png'} is not an image Pillow " \
                               f"can read"
    assert not out.exists()
    assert len(records(tmp_path / ".results.jsonl.partial")) == 20


@pytest.mark.parametrize("args, message", [
    (["--output", "{out}"], "--output applies to --ray only"),
    (["--resume"], "--resume applies to --ray only"),
    (["--workers", "2"], "--workers applies to --ray only"),
    (["--ray"], "--ray needs --output FILE.jsonl for its records"),
    (["--ray", "--json", "--output", "{out}"],
     "--json prints to stdout; with --ray the records go to --output as JSON lines"),
    (["--ray", "--output", "{bundle}/config.json"],
     "--output {bundle}/config.json would overwrite {bundle}, which this command reads"),
])
def test_ray_options_are_usage_errors(digits_bundle, digit_images, tmp_path, args, message):
    fill = dict(out=tmp_path / "r.jsonl", bundle=digits_bundle)
    code, _, stderr = run("infer", digits_bundle, digit_images[0],
                          *[a.format(**fill) for a in args])
    assert code == 2
    assert one_line(stderr) == "Error: " + message.format(**fill)


def test_a_cluster_that_is_not_there_or_a_provider_that_is_not_is_one_line(digits_bundle,
                                                                          digit_images,
                                                                          tmp_path):
    """Refused before any Ray worker runs, and nothing is left beside the output."""
    out = tmp_path / "r.jsonl"
    code, _, stderr = run("infer", digits_bundle, digit_images[0], "--ray", "--output", out,
                          "--address", "127.0.0.1:1")
    assert code == 1
    assert one_line(stderr) == "Error: cannot join the Ray cluster at 127.0.0.1:1: " \
                               "Connection refused"
    code, _, stderr = run("infer", digits_bundle, digit_images[0], "--ray", "--output", out,
                          "--provider", "cuda")
    assert code == 1
    assert one_line(stderr).startswith("Error: requested CUDAExecutionProvider but ")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("workers, cluster, node, expected", [
    (1, 2, 2, (2.0, 2)), (2, 2, 2, (1.0, 1)), (1, 16, 8, (8.0, 8)),  # an actor is on one node
    (3, 2, 2, (2 / 3, 1)),  # more workers than cores: a share of one, and all of them start
])
def test_pool_size_shares_out_the_cores(workers, cluster, node, expected):
    from vit_export.deploy.ray.data import _pool_size

    assert _pool_size(workers, cluster, node) == pytest.approx(expected)


def test_a_device_or_fifo_as_the_ray_output_is_refused_before_ray_starts(digits_bundle,
                                                                          digit_images, tmp_path):
    """The progress file was renamed onto a device node, destroying it."""
    import os
    import stat

    fifo = tmp_path / "records"
    os.mkfifo(fifo)
    code, out, err = run("infer", digits_bundle, *digit_images[:2], "--ray", "--output", fifo)
    assert (code, out) == (2, "")
    assert one_line(err) == (f"Error: --output {fifo} is a device or FIFO; --ray writes a "
                             f"resumable file: give a regular file")
    assert stat.S_ISFIFO(fifo.stat().st_mode) and sorted(tmp_path.iterdir()) == [fifo]


@pytest.mark.slow  # a Ray cluster: seconds to start on 2 cores
def test_resume_continues_only_the_same_run(digits_bundle, tiny_bundle, digit_images,
                                            tmp_path):
    """The records kept by --resume come from this model, these options and these inputs
    as they are now: mixed answers were kept whole."""
    out = tmp_path / "results.jsonl"
    images = digit_images[:20]
    code, _, stderr = run("infer", digits_bundle, *images, "--top-k", 3, "--ray", "--output",
                          out)
    assert code == 0, stderr
    before = out.read_bytes()
    sha = json.loads((tmp_path / ".results.jsonl.run.json").read_text())["model"]
    for args, message in [
        ((digits_bundle, *images, "--top-k", 1), ("--resume with --top-k 1, but the records "
         f"of {out} were made with --top-k 3; --force starts over")),
        ((tiny_bundle, *images, "--top-k", 3), "--resume with model (sha256 "),
        ((digits_bundle, *digit_images[20:30], "--top-k", 3), (f"{out} holds records of 20 "
         f"input(s) this run does not name (the first: {images[0]}); resume with the same "
         f"inputs")),
    ]:
        code, stdout, stderr = run("infer", *args, "--ray", "--output", out, "--resume")
        assert (code, stdout) == (1, ""), stderr
        assert one_line(stderr).startswith("Error: " + message), stderr
        assert out.read_bytes() == before
    assert f"were made with model (sha256 {sha})" in one_line(run(
        "infer", tiny_bundle, *images, "--top-k", 3, "--ray", "--output", out, "--resume")[2])
    # a no-op resume leaves the output as it is, one input named twice included
    code, stdout, stderr = run("infer", digits_bundle, *images, "--top-k", 3, "--ray",
                               "--output", out, "--resume")
    assert code == 0, stderr
    assert "0 file(s) classified" in stdout and "20 done before" in stdout
    assert out.read_bytes() == before
    # an input changed since its record was made is classified again
    changed = tmp_path / images[3].name
    changed.write_bytes(images[3].read_bytes())
    code, _, stderr = run("infer", digits_bundle, *images[:3], changed, "--top-k", 3,
                          "--ray", "--output", tmp_path / "two.jsonl")
    assert code == 0, stderr
    changed.write_bytes(images[7].read_bytes())  # another digit, same name
    code, stdout, stderr = run("infer", digits_bundle, *images[:3], changed, "--top-k", 3,
                               "--ray", "--output", tmp_path / "two.jsonl", "--resume")
    assert code == 0, stderr
    assert "1 file(s) classified" in stdout and "3 done before" in stdout
    assert records(tmp_path / "two.jsonl") == single_process(digits_bundle,
                                                             [*images[:3], changed])


def test_a_second_run_on_the_same_output_is_refused(digits_bundle, digit_images, tmp_path):
    """Two runs at once on one output both said they wrote 100 records, and the file was
    empty: the second is refused while the first holds the lock."""
    from vit_export.deploy.ray.data import lock_path, output_lock

    out = tmp_path / "race.jsonl"
    with output_lock(out):
        code, stdout, stderr = run("infer", digits_bundle, *digit_images[:2], "--ray",
                                   "--output", out)
        assert (code, stdout) == (1, "")
        assert one_line(stderr) == (f"Error: another run is writing {out} (it holds "
                                    f"{lock_path(out)}); wait for it to finish")
    assert sorted(tmp_path.iterdir()) == []  # the lock goes with the run


@pytest.mark.slow  # a Ray cluster: seconds to start on 2 cores
def test_ray_embed_to_parquet_equals_infer_embed_and_resumes(embedding_bundle, digit_images,
                                                             tmp_path):
    """infer --ray --embed --output F.parquet: record for record what infer --embed writes;
    a finished Parquet output resumes with more inputs; --resume of another kind of run is
    refused."""
    from vit_export.embeddings import read

    reference = tmp_path / "single.parquet"
    code, _, err = run("infer", embedding_bundle, *digit_images[:200], "--embed", "--output",
                       reference)
    assert code == 0, err
    names, expected = read(reference)
    out = tmp_path / "ray.parquet"
    code, stdout, err = run("infer", embedding_bundle, *digit_images[:120], "--embed", "--ray",
                            "--workers", 2, "--output", out)
    assert code == 0, err
    assert "120 file(s) embedded on Ray Data with 2 worker(s)" in stdout
    got_names, got = read(out)
    assert got_names == names[:120] and np.array_equal(got, expected[:120])
    code, stdout, err = run("infer", embedding_bundle, *digit_images[:200], "--embed", "--ray",
                            "--output", out, "--resume", "--top-k", 3)  # no top-k to keep
    assert code == 0, err
    assert "80 file(s) embedded" in stdout and "120 done before" in stdout
    got_names, got = read(out)
    assert got_names == names and np.array_equal(got, expected)
    assert sorted(p.name for p in tmp_path.iterdir()) == [".ray.parquet.run.json",
                                                          "ray.parquet", "single.parquet"]
    jsonl = tmp_path / "classes.jsonl"  # a run of the other kind cannot be resumed as this
    (tmp_path / ".classes.jsonl.run.json").write_text(json.dumps(
        {**json.loads((tmp_path / ".ray.parquet.run.json").read_text()), "embed": False}))
    jsonl.write_text("")
    code, _, err = run("infer", embedding_bundle, *digit_images[:200], "--embed", "--ray",
                       "--output", jsonl, "--resume")
    assert code == 1 and err.splitlines()[-1] == (
        f"Error: --resume with --embed, but the records of {jsonl} were made with no "
        f"--embed; --force starts over")
    code, _, err = run("infer", embedding_bundle, *digit_images[:2], "--embed", "--ray",
                       "--output", tmp_path / "e.npy")
    assert code == 2 and one_line(err) == (f"Error: --output {tmp_path / 'e.npy'}: --ray "
                                           f"--embed writes FILE.parquet (or JSON lines to "
                                           f"FILE.jsonl)")


@pytest.mark.slow  # a Ray cluster: seconds to start on 2 cores
def test_ray_embed_of_dinov2_is_dinov2s_own_embedding(photo_files, tmp_path):
    """DINOv2 from a Hugging Face folder with its processor: infer --ray --embed to Parquet
    on photos (grayscale and RGBA ones too) is transformers' pooler_output of the
    processor's pixels at cosine >= 0.99999, and infer --embed's file, value for value."""
    from families import cosines, hf_embedder

    from vit_export.embeddings import read

    folder, theirs = hf_embedder("Dinov2Model", tmp_path / "hf", photo_files)
    bundle = tmp_path / "dinov2"
    code, _, err = run("export", bundle, "--checkpoint", folder, "--provider", "cpu", "--quiet")
    assert code == 0, err
    code, _, err = run("infer", bundle, *photo_files, "--embed", "--ray", "--workers", 2,
                       "--batch-size", 2, "--output", tmp_path / "ray.parquet")
    assert code == 0, err
    names, ours = read(tmp_path / "ray.parquet")
    assert names == [str(f) for f in photo_files]
    assert cosines(theirs, ours).min() >= 0.99999
    code, _, err = run("infer", bundle, *photo_files, "--embed", "--batch-size", 2,
                       "--output", tmp_path / "single.parquet")
    assert code == 0, err
    assert np.array_equal(read(tmp_path / "single.parquet")[1], ours)


@pytest.mark.slow  # a Ray cluster, killed
def test_a_driver_killed_with_sigkill_leaves_no_ray_process_and_resumes(digits_bundle,
                                                                         digit_images,
                                                                         tmp_path):
    """kill -9 of `infer --ray` mid-run: no handler runs, yet the cluster it started goes
    with it (Ray's fate sharing: raylet and GCS die with their parent, their agents with
    them), and --resume completes the run (ray::DashboardAgent and
    ray::RuntimeEnvAgent outlive the driver)."""
    import uuid

    mark = uuid.uuid4().hex
    out = tmp_path / "results.jsonl"
    partial = tmp_path / ".results.jsonl.partial"
    folder = digit_images[0].parent
    process = subprocess.Popen(
        [sys.executable, str(ROOT / "cli.py"), "infer", str(digits_bundle), str(folder),
         "--top-k", "3", "--batch-size", "4", "--ray", "--output", str(out)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        env={**os.environ, "VX_TEST_RUN": mark})
    try:
        _midway(process, partial)
        assert len(marked(mark)) > 1  # the driver and the cluster it started
        process.kill()
        process.wait()
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    deadline = time.monotonic() + 30
    while marked(mark) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert marked(mark) == []
    assert not out.exists()
    code, _, stderr = run("infer", digits_bundle, folder, "--top-k", 3, "--ray", "--output",
                          out, "--resume")
    assert code == 0, stderr
    assert records(out) == single_process(digits_bundle, [folder])


def test_a_worker_s_error_keeps_the_flag_for_the_command_line():
    from vit_export.deploy.ray.session import cause_line
    from vit_export.errors import InputError, VitExportError, param, raw

    inner = InputError(f"x.npy is not an image (use another {param('runtime')})")

    class RayTaskError(Exception):  # Ray's wrapper: the actor's own exception as .cause
        cause = inner

    outer = VitExportError(f"a Ray Data worker failed: {cause_line(RayTaskError())}")
    assert outer.cli_message() == ("a Ray Data worker failed: x.npy is not an image (use "
                                   "another --runtime)")
    assert str(outer).endswith("(use another runtime)")
    assert InputError(raw(inner)).cli_message() == inner.cli_message()  # the error column


def test_a_copy_of_the_bundle_that_is_not_the_checked_one_is_refused_naming_the_file(
        digits_bundle, tmp_path):
    """What each Ray worker does with its node's copy of the bundle: `read_model` held to
    the driver's `checked_files`. The same bytes pass; another config.json, a file listed by
    another sha256 or one listed or not, is one line naming the file; a file that does not
    match a config.json of the same bytes is refused as it is loaded."""
    import shutil

    from conftest import rewrite_hash

    from vit_export.bundle import checked_files, read_model, sha256_file
    from vit_export.deploy.classify import Classifier
    from vit_export.errors import BundleError

    checked = checked_files(read_model(digits_bundle))
    config = json.loads((digits_bundle / "config.json").read_text())
    assert checked == {"config.json": sha256_file(digits_bundle / "config.json"),
                       **config["files"]}
    copy = tmp_path / "copy"
    shutil.copytree(digits_bundle, copy)
    assert read_model(copy, checked).hashes == config["files"]

    def refused(message: str) -> None:
        with pytest.raises(BundleError) as caught:
            Classifier(read_model(copy, checked))
        assert str(caught.value) == message

    def differs(name: str) -> str:
        return (f"{copy / name} differs from the driver's copy (sha256 "
                f"{sha256_file(copy / name)[:12]}... here, {checked[name][:12]}... on the "
                f"driver)")

    (copy / "config.json").write_text(json.dumps({**config, "labels": list("abcdefghij")}))
    refused(differs("config.json"))
    shutil.copyfile(digits_bundle / "config.json", copy / "config.json")
    onnx = copy / "model.onnx"
    onnx.write_bytes(onnx.read_bytes() + b"\0")  # config.json the driver's: caught on load
    refused(f"{onnx} does not match its sha256 in config.json (truncated or modified)")
    rewrite_hash(copy, "model.onnx")  # a config.json that agrees with it names the file
    refused(differs("model.onnx"))
    shutil.copyfile(digits_bundle / "config.json", copy / "config.json")
    shutil.copyfile(digits_bundle / "model.onnx", onnx)
    (copy / "extra.bin").write_bytes(b"x")
    rewrite_hash(copy, "extra.bin")
    refused(f"{copy / 'config.json'} lists extra.bin; the driver's copy does not")


def test_a_model_file_that_is_not_the_checked_one_is_refused_as_it_is_loaded(
        digits_bundle, tmp_path):
    """A model file given alone: the bytes each worker loads must hash to the driver's."""
    import onnx

    from vit_export.bundle import checked_files, read_model, sha256_file
    from vit_export.deploy.classify import Classifier
    from vit_export.errors import BundleError

    original = digits_bundle / "model.onnx"
    checked = checked_files(read_model(original))
    assert checked == {"model.onnx": sha256_file(original)}
    copy = tmp_path / "model.onnx"
    copy.write_bytes(original.read_bytes())
    for data in digits_bundle.glob("*.safetensors"):  # external data it may name
        (tmp_path / data.name).write_bytes(data.read_bytes())
    assert Classifier(read_model(copy, checked)).runner.name == "onnxruntime"
    proto = onnx.load(str(original))
    proto.doc_string = "another export"  # the same graph and description, other bytes
    onnx.save(proto, str(copy))
    with pytest.raises(BundleError) as caught:
        Classifier(read_model(copy, checked))
    assert str(caught.value) == (f"{copy} differs from the driver's copy (sha256 "
                                 f"{sha256_file(copy)[:12]}... here, "
                                 f"{checked['model.onnx'][:12]}... on the driver)")
    (tmp_path / "other.onnx").write_bytes(original.read_bytes())
    with pytest.raises(BundleError) as caught:
        read_model(tmp_path / "other.onnx", checked)
    assert str(caught.value) == (f"{tmp_path / 'other.onnx'} is not the model file that was "
                                 f"checked (model.onnx)")
