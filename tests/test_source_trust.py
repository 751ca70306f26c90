"""Source parity as a hostile bundle would use it: a bundle names no path outside itself,
and the source framework's model is built from the bytes that were hashed, never from a
path again, with no code from a checkpoint.

Each case is a bundle exported for real from a tiny DINOv2 folder, its import record then
rewritten as an attacker would (config.json is data a bundle's author writes)."""
import hashlib
import json
import os
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner
from conftest import one_line, run
from families import perturb, save_hf, tiny_hf

from vit_export import bundle as B
from vit_export.checkpoints import read_recorded
from vit_export.cli import cli
from vit_export.parity.source import open_source

transformers = pytest.importorskip("transformers")

NOT_NAMED = "source: not compared, skipped: the checkpoint it was imported from"


@pytest.fixture(scope="module")
def imported(tmp_path_factory):
    """A tiny DINOv2 folder and the bundle exported from it (its source rows passed)."""
    root = tmp_path_factory.mktemp("imported")
    peer = tiny_hf("Dinov2Model")
    folder = save_hf(peer, root / "dinov2")
    out = root / "bundle"
    code, _, err = run("export", out, "--checkpoint", folder)
    assert code == 0, err
    return peer, folder, out


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def with_record(bundle, tmp_path, **record):
    """A copy of `bundle` whose import record holds `record`'s fields."""
    copy = tmp_path / "hostile"
    shutil.copytree(bundle, copy)
    config = json.loads((copy / B.CONFIG_FILE).read_text())
    config["extra"]["import"].update(record)
    (copy / B.CONFIG_FILE).write_text(json.dumps(config))
    return copy


def code_folder(tmp_path, marker):
    """A checkpoint folder whose config.json asks transformers for its own code (auto_map, a
    model type transformers does not know), and the code, which would leave `marker`."""
    folder = tmp_path / "evil"
    folder.mkdir()
    code = f"open({str(marker)!r}, 'w').write('ran')\n"
    for name in ("configuration_evil.py", "modeling_evil.py"):
        (folder / name).write_text(code)
    (folder / "config.json").write_text(json.dumps({
        "model_type": "evil_vit", "architectures": ["EvilModel"],
        "auto_map": {"AutoConfig": "configuration_evil.EvilConfig",
                     "AutoModel": "modeling_evil.EvilModel"}}))
    (folder / "model.safetensors").write_bytes(b"not weights")
    return folder


def test_a_folder_the_bundle_names_is_never_opened_and_its_code_never_runs(imported,
                                                                           tmp_path):
    """The record points at a folder whose config.json would have transformers ask "run the
    custom code? [y/N]" and, answered y, import its .py: a default validate and an export
    --from the bundle answer y on stdin and still run nothing, open nothing, and say the
    source was not compared. Named with --source, the folder is read as data: its model
    type is not transformers' own, so the source is skipped, still running nothing."""
    _, _, bundle = imported
    marker = tmp_path / "ran"
    folder = code_folder(tmp_path, marker)
    files = {n: sha256((folder / n).read_bytes()) for n in ("config.json", "model.safetensors")}
    hostile = with_record(bundle, tmp_path, checkpoint=str(folder), files=files)
    runner = CliRunner()
    result = runner.invoke(cli, ["validate", str(hostile)], input="y\ny\n")
    assert result.exit_code == 0, result.stderr
    assert NOT_NAMED in result.stdout and "custom code" not in result.output
    result = runner.invoke(cli, ["export", str(tmp_path / "again"), "--from", str(hostile)],
                           input="y\ny\n")
    assert result.exit_code == 0, result.stderr
    assert NOT_NAMED in result.stdout and "custom code" not in result.output
    result = runner.invoke(cli, ["validate", str(hostile), "--source", str(folder)],
                           input="y\ny\n")
    assert result.exit_code == 0, result.stderr
    assert "source: not compared, skipped: config.json's model_type 'evil_vit' is not one " \
        "transformers" in result.stdout and "custom code" not in result.output
    assert not marker.exists()


def test_a_record_naming_paths_outside_any_folder_is_refused_unread(imported, tmp_path):
    """File names that are paths (/etc/passwd, ../x) are never opened: validate without
    --source says only that the source was not named (the same line whatever those files
    hold: no oracle), and with --source the name is refused as not a file name."""
    _, folder, bundle = imported
    passwd = sha256(Path("/etc/passwd").read_bytes())
    for name in ("/etc/passwd", "../dinov2/config.json"):
        hostile = with_record(bundle, tmp_path / name.replace("/", "_"),
                              files={name: passwd})
        report = tmp_path / "report.json"
        code, text, err = run("validate", hostile, "--report", report)
        assert code == 0, err
        assert f"{NOT_NAMED} ({name}) was not named (validate --source PATH)" in text
        assert set(json.loads(report.read_text())["source"]) == {"status", "reason"}
        code, _, err = run("validate", hostile, "--source", folder)
        assert code == 1 and one_line(err) == \
            f"Error: the bundle's import record names {name!r}, not a file name"


def test_a_source_file_that_reads_for_ever_or_is_huge_is_refused_before_it_is_read(
        imported, tmp_path):
    """config.json as a link to /proc/self/pagemap (0 bytes declared, read for ever: it hung
    validate) and a 300 MB config.json (read whole, 1.6 GB at peak) are one line each."""
    _, folder, bundle = imported
    linked = tmp_path / "linked"
    shutil.copytree(folder, linked)
    (linked / "config.json").unlink()
    os.symlink("/proc/self/pagemap", linked / "config.json")
    code, _, err = run("validate", bundle, "--source", linked)
    assert code == 1 and one_line(err).startswith(
        f"Error: {linked / 'config.json'} is not a file of fixed size"), err
    huge = tmp_path / "huge"
    shutil.copytree(folder, huge)
    os.truncate(huge / "config.json", 300 << 20)  # sparse: no disk, 300 MB declared
    code, _, err = run("validate", bundle, "--source", huge)
    assert code == 1 and one_line(err) == (
        f"Error: {huge / 'config.json'} holds {300 << 20} bytes, more than the {16 << 20} "
        f"such a file holds")


def test_a_weights_file_the_config_names_is_never_what_the_source_is_built_from(tmp_path):
    """A config.json's transformers_weights names another file in the folder, which
    transformers' from_pretrained(folder) loads instead of model.safetensors: the source
    was built from weights nobody hashed. Built from the bytes the import read, it is the
    checkpoint's own model, and export passes."""
    peer = tiny_hf("Dinov2Model")
    folder = save_hf(peer, tmp_path / "dinov2")
    perturb(tiny_hf("Dinov2Model"), seed=7).save_pretrained(tmp_path / "other")
    shutil.copy(tmp_path / "other" / "model.safetensors", folder / "other.safetensors")
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config,
                                                    "transformers_weights": "other.safetensors"}))
    out = tmp_path / "bundle"
    code, text, err = run("export", out, "--checkpoint", folder)
    assert code == 0, text + err
    source = json.loads((out / "parity.json").read_text())["source"]
    assert source["status"] == "passed" and "other.safetensors" not in source["files"]


def test_the_source_is_the_bytes_that_were_checked_whatever_is_swapped_in_after(imported,
                                                                               tmp_path):
    """Files read and checked, then other weights renamed over them before the framework
    builds its model: the model is built from the bytes checked (the peer's answers), not
    from what the folder holds now."""
    import torch

    peer, folder, bundle = imported
    copy = tmp_path / "copy"
    shutil.copytree(folder, copy)
    description = B.read_bundle(bundle).description
    files = read_recorded(copy, description.extra["import"]["files"])
    other = perturb(tiny_hf("Dinov2Model"), seed=9)
    other.save_pretrained(tmp_path / "other")
    os.replace(tmp_path / "other" / "model.safetensors", copy / "model.safetensors")
    source = open_source(description, files)
    x = torch.randn(2, 3, 42, 42, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        expected = peer(pixel_values=x).pooler_output.numpy()
    got = source.run(x.numpy())["embedding"]
    assert abs(got - expected).max() <= 1e-5 * abs(expected).max()
    assert source.files == description.extra["import"]["files"]


def test_an_attention_implementation_a_config_names_is_never_loaded(tmp_path):
    """config.json's attn_implementation may name a Hub kernel (fetched, and loaded as native
    code) or a library that is not here: the source is built with transformers' own eager
    attention whatever it says (here flash_attention_2, which needs a package not installed:
    transformers refused to build the source)."""
    peer = tiny_hf("Dinov2Model")
    folder = save_hf(peer, tmp_path / "dinov2")
    config = json.loads((folder / "config.json").read_text())
    config["attn_implementation"] = "flash_attention_2"
    config["_attn_implementation_internal"] = "kernels-community/flash-attn"
    (folder / "config.json").write_text(json.dumps(config))
    out = tmp_path / "b"
    code, _, err = run("export", out, "--checkpoint", folder)
    assert code == 0, err
    source = json.loads((out / "parity.json").read_text())["source"]
    assert source["status"] == "passed", source
