"""export --model NAME[@REVISION]: the real huggingface_hub client against a Hub on 127.0.0.1
(tests/hub_server.py) that serves repos written here with save_pretrained and timm's own
saving. The CLI runs in a subprocess, as a user runs it: huggingface_hub reads HF_ENDPOINT,
HF_HOME and HF_HUB_OFFLINE when it is imported."""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from families import hf_output, perturb, processor, save_hf, tiny_hf
from hub_server import GRANTED, NOT_GRANTED, Hub, HubServer

ROOT = Path(__file__).resolve().parent.parent
TIMM_NAME = "test_vit.r160_in1k"  # timm's own tiny ViT, kept on the Hub as timm/test_vit.r160_in1k


@pytest.fixture(scope="module")
def hub():
    served = Hub()
    with HubServer(served):
        yield served


def cli(hub: Hub, home: Path, *args, **env) -> subprocess.CompletedProcess:
    """`vit-export ARGS` with huggingface_hub pointed at `hub` and its cache in `home`."""
    environ = {k: v for k, v in os.environ.items()
               if not k.startswith("HF_") and k != "TRANSFORMERS_OFFLINE"}
    environ.update({"HF_ENDPOINT": hub.url, "HF_HOME": str(home),
                    "HF_HUB_DISABLE_TELEMETRY": "1", **env})
    return subprocess.run([sys.executable, "cli.py", *map(str, args)], cwd=ROOT, env=environ,
                          capture_output=True, text=True, timeout=600, check=False)


def one_line(out: subprocess.CompletedProcess) -> str:
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    assert out.returncode == 1 and len(lines) == 1, (out.returncode, out.stderr)
    return lines[0]


def downloaded(hub: Hub, name: str) -> bool:
    return any(method == "GET" and path.endswith("/" + name) for method, path, _ in hub.requests)


@pytest.fixture(scope="module")
def pickle_repo(hub, tmp_path_factory) -> str:
    """A transformers ViT whose repo offers only pytorch_model.bin, as older repos do."""
    folder = tmp_path_factory.mktemp("pickled")
    model = tiny_hf("ViTModel")
    model.config.save_pretrained(folder)
    torch.save(model.state_dict(), folder / "pytorch_model.bin")
    hub.add("local/vit-pickled", folder)
    return "local/vit-pickled"


def test_pickle_only_repo_is_refused_and_nothing_is_unpickled(hub, pickle_repo, tmp_path):
    out = cli(hub, tmp_path / "hf", "export", tmp_path / "out", "--model", pickle_repo, "--quiet")
    assert one_line(out) == ("Error: local/vit-pickled offers only pickled weights "
                             "(pytorch_model.bin), no model.safetensors; vit-export reads "
                             "safetensors only and never unpickles a download")
    assert not (tmp_path / "out").exists()
    assert downloaded(hub, "config.json") and not downloaded(hub, "pytorch_model.bin")


def _snapshot(hub: Hub, home: Path, repo: str) -> Path:
    """Fill the cache at `home` as export --model does (huggingface_hub's own download of the
    configs and model.safetensors, the listing kept): its snapshot folder."""
    code = ("from huggingface_hub import snapshot_download; print(snapshot_download("
            f"{repo!r}, allow_patterns=['config.json', 'preprocessor_config.json', "
            "'model.safetensors']))")
    environ = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    environ.update({"HF_ENDPOINT": hub.url, "HF_HOME": str(home)})
    done = subprocess.run([sys.executable, "-c", code], env=environ, capture_output=True,
                          text=True, timeout=300, check=True)
    return Path(done.stdout.strip().splitlines()[-1])


def _cached_repo(hub: Hub, tmp_path: Path, repo: str):
    """A tiny transformers ViT on the Hub as `repo`, fetched into a cache of its own: (the
    model, the cache's home, its snapshot folder)."""
    model = tiny_hf("ViTModel")
    model.save_pretrained(tmp_path / "repo")
    hub.add(repo, tmp_path / "repo")
    home = tmp_path / "hf"
    return model, home, _snapshot(hub, home, repo)


@pytest.mark.slow  # several seconds: the whole suite runs it
def test_cached_weights_must_be_the_bytes_the_hub_listed(hub, tmp_path):
    """The cached model.safetensors must hash to the sha256 the Hub listed for it (its LFS
    oid): one altered weight was exported as it was."""
    _, home, snapshot = _cached_repo(hub, tmp_path, "local/vit-altered")
    blob = (snapshot / "model.safetensors").resolve()
    data = bytearray(blob.read_bytes())
    data[-1] ^= 0x40  # one weight altered: still a valid safetensors file
    blob.chmod(0o644)
    blob.write_bytes(bytes(data))
    out = cli(hub, home, "export", tmp_path / "out", "--model", "local/vit-altered", "--quiet",
              HF_HUB_OFFLINE="1")
    assert one_line(out).startswith("Error: the cached model.safetensors of local/vit-altered@"), \
        out.stderr
    assert "does not match the sha256 the Hub lists for it" in one_line(out)
    assert not (tmp_path / "out").exists()


@pytest.mark.slow  # several seconds: the whole suite runs it
def test_a_cached_config_must_be_the_blob_the_hub_listed(hub, tmp_path):
    """config.json decides the architecture the weights are read into: its cached bytes must
    be the git blob the Hub's listing names."""
    _, home, snapshot = _cached_repo(hub, tmp_path, "local/vit-config")
    blob = (snapshot / "config.json").resolve()
    config = json.loads(blob.read_text())
    config["layer_norm_eps"] = 0.5
    blob.chmod(0o644)
    blob.write_text(json.dumps(config))
    out = cli(hub, home, "export", tmp_path / "out", "--model", "local/vit-config", "--quiet",
              HF_HUB_OFFLINE="1")
    assert one_line(out).startswith("Error: the cached config.json of local/vit-config@"), \
        out.stderr
    assert "is not the file the Hub lists (git blob " in one_line(out)
    assert not (tmp_path / "out").exists()


@pytest.mark.slow  # several seconds: the whole suite runs it
def test_cached_weights_that_are_no_file_never_fall_back_to_a_pickle(hub, tmp_path):
    """Where the cached model.safetensors was not a regular file, the import took the
    pytorch_model.bin beside it and torch.loaded it."""
    model, home, snapshot = _cached_repo(hub, tmp_path, "local/vit-folder")
    weights = snapshot / "model.safetensors"
    weights.unlink()
    weights.mkdir()
    torch.save({k: v * 2 for k, v in model.state_dict().items()}, snapshot / "pytorch_model.bin")
    out = cli(hub, home, "export", tmp_path / "out", "--model", "local/vit-folder", "--quiet",
              HF_HUB_OFFLINE="1")
    assert "model.safetensors of local/vit-folder@" in one_line(out), out.stderr
    assert "is not a regular file (a folder): vit-export reads no other weights" in one_line(out)
    assert not (tmp_path / "out").exists()


@pytest.mark.slow  # several seconds: the whole suite runs it
def test_a_timm_repos_model_args_pass_only_sizes_and_switches(hub, tmp_path):
    """timm.create_model(checkpoint_path=...) loads that file into the model it builds; a
    repo's model_args went to it as they were."""
    folder = tmp_path / "repo"
    folder.mkdir()
    planted = tmp_path / "planted.pth"
    torch.save({"anything": torch.zeros(1)}, planted)
    (folder / "config.json").write_text(json.dumps({
        "architecture": "test_vit", "num_classes": 1000,
        "pretrained_cfg": {"tag": "r160_in1k"},
        "model_args": {"img_size": 160, "checkpoint_path": str(planted)}}))
    (folder / "model.safetensors").write_bytes(b"never read")
    hub.add("local/timm-args", folder)
    out = cli(hub, tmp_path / "hf", "export", tmp_path / "out", "--model",
              "hf-hub:local/timm-args", "--quiet")
    assert one_line(out).startswith(
        "Error: local/timm-args's config.json: model_args 'checkpoint_path' is not one "
        "vit-export passes to timm (it passes sizes and switches only: "), out.stderr
    assert not (tmp_path / "out").exists()


def hub_module():
    from vit_export import hub as module

    return module


@pytest.mark.slow  # several seconds: the whole suite runs it
def test_a_cached_ref_that_names_no_commit_is_refused(hub, tmp_path):
    """Offline, huggingface_hub takes the text of the cache's refs/main as the commit and
    its snapshot folder from it: a ref reading ../../x made another folder the model's."""
    _, home, snapshot = _cached_repo(hub, tmp_path, "local/vit-ref")
    elsewhere = tmp_path / "elsewhere"
    shutil.copytree(snapshot, elsewhere)
    ref = snapshot.parent.parent / "refs" / "main"
    ref.write_text(os.path.relpath(elsewhere, snapshot.parent))
    out = cli(hub, home, "export", tmp_path / "out", "--model", "local/vit-ref", "--quiet",
              HF_HUB_OFFLINE="1")
    assert one_line(out).startswith("Error: local/vit-ref@main resolved to '"), out.stderr
    assert one_line(out).endswith("in the Hugging Face cache, which is not a commit hash")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("revision", ["../../etc", "..", "main/../../x", "/abs", "a//b",
                                      ".hidden", "refs/.x", "main.lock", "a b", "x\\y"])
def test_a_revision_is_a_commit_or_a_ref_name_never_a_path(revision):
    """Offline, huggingface_hub reads a revision as a file under the cache's refs/ folder:
    `@../../x` read another file as the commit."""
    from vit_export.errors import HubError

    with pytest.raises(HubError, match="is not a commit hash or a ref name"):
        hub_module().parse_name(f"local/vit@{revision}")
    for good in ("main", "v1.0", "refs/pr/1", "feature/x-y_z", "a" * 40):
        assert hub_module().parse_name(f"local/vit@{good}") == ("local/vit", good)


# --- the rest exports or starts the CLI many times: the whole suite (--run-slow) ---------


@pytest.fixture(scope="module")
def repos(hub, tmp_path_factory) -> dict[str, Path]:
    """The repos the slow tests fetch, written by transformers' and timm's own saving."""
    import timm
    import transformers
    from timm.models import save_for_hf

    base = tmp_path_factory.mktemp("repos")
    dinov2 = save_hf(tiny_hf("Dinov2Model"), base / "dinov2", processor("Dinov2Model"))
    hub.add("local/dinov2-tiny", dinov2)
    hub.add("local/dinov2-gated", dinov2, gated=True)
    hub.add("local/dinov2-private", dinov2, private=True)
    big = save_hf(transformers.Dinov2Model(transformers.Dinov2Config(  # 19 MB of weights
        hidden_size=96, num_hidden_layers=4, num_attention_heads=4, mlp_ratio=64, image_size=42,
        patch_size=14)), base / "big", processor("Dinov2Model"))
    hub.add("local/dinov2-broken", big, breaks=True)
    siglip = save_hf(tiny_hf("SiglipVisionModel"), base / "siglip",
                     processor("SiglipVisionModel"))
    hub.add("local/siglip-gated", siglip, gated=True)
    torch.manual_seed(0)
    save_for_hf(timm.create_model("test_vit", pretrained=False), base / "timm",
                safe_serialization="both")  # as timm's own repos: both files
    hub.add(f"timm/{TIMM_NAME}", base / "timm")
    remote = base / "remote"
    shutil.copytree(dinov2, remote)
    config = json.loads((remote / "config.json").read_text())
    config["auto_map"] = {"AutoModel": "modeling_tiny.TinyModel"}
    (remote / "config.json").write_text(json.dumps(config))
    (remote / "modeling_tiny.py").write_text("raise SystemExit('remote code ran')\n")
    hub.add("local/remote-code", remote)
    beit = base / "beit"
    perturb(transformers.BeitModel(transformers.BeitConfig(  # LayerScale 0.1 made blind
        hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64,
        image_size=28, patch_size=14))).save_pretrained(beit)
    hub.add("local/beit-tiny", beit)
    resnet = base / "resnet"
    transformers.ResNetModel(transformers.ResNetConfig(
        embedding_size=8, hidden_sizes=[8, 16], depths=[1, 1])).save_pretrained(resnet)
    hub.add("local/resnet-tiny", resnet)
    nested = base / "nested"
    shutil.copytree(dinov2, nested)
    (nested / "config.json").write_text('{"a": ' + "[" * 100000 + "]" * 100000 + "}")
    hub.add("local/nested", nested)
    return {"dinov2": dinov2, "siglip": siglip, "timm": base / "timm"}


def bundle_files(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def check_parity(bundle: Path, reference: torch.Tensor, x: torch.Tensor) -> None:
    """The bundle's eager model and model.onnx against the framework's own forward."""
    import onnxruntime as ort

    from vit_export import bundle as B

    found = B.read_bundle(bundle)
    with torch.no_grad():
        eager = B.load_eager(found)(x)
    session = ort.InferenceSession(str(bundle / "model.onnx"), providers=["CPUExecutionProvider"])
    (onnx,) = session.run(None, {"pixel_values": x.numpy()})
    scale = reference.abs().max().item()
    assert (eager - reference).abs().max().item() / scale <= 1e-5
    assert np.abs(onnx - reference.numpy()).max() / scale <= 1e-4


@pytest.mark.slow
def test_export_by_repo_id_pins_the_commit_and_reproduces(hub, repos, tmp_path):
    import transformers

    repo = hub.repos["local/dinov2-tiny"]
    out = tmp_path / "out"
    first = cli(hub, tmp_path / "hf1", "export", out, "--model", "local/dinov2-tiny",
                "--progress")
    assert first.returncode == 0, first.stderr
    assert "Fetching 1 files: 100%" in first.stderr  # huggingface_hub's bars: the weights
    config = json.loads((out / "config.json").read_text())
    files = {name: sha256(repo.files[name]) for name in
             ("config.json", "preprocessor_config.json", "model.safetensors")}
    assert config["extra"]["hub"] == {"repo": "local/dinov2-tiny", "revision": "main",
                                      "commit": repo.commit, "files": files}
    assert config["extra"]["import"]["checkpoint"] == f"local/dinov2-tiny@{repo.commit}"
    assert config["preprocessing"]["sources"]["mean"] == "hf preprocessor_config.json"
    snapshot = tmp_path / "hf1" / "hub" / "models--local--dinov2-tiny" / "snapshots" / repo.commit
    peer = transformers.Dinov2Model.from_pretrained(snapshot).eval()  # the same files
    x = torch.randn(3, 3, 42, 42, generator=torch.Generator().manual_seed(1))
    check_parity(out, hf_output("Dinov2Model", peer, x), x)
    source = json.loads((out / "parity.json").read_text())["source"]  # the files fetched
    assert (source["framework"], source["status"]) == ("transformers", "passed"), source
    assert source["files"] == files
    info = cli(hub, tmp_path / "hf1", "info", out)
    assert f"hub: local/dinov2-tiny, revision main, commit {repo.commit}" in info.stdout
    made = bundle_files(out)

    pinned = cli(hub, tmp_path / "hf2", "export", out, "--model",
                 f"local/dinov2-tiny@{repo.commit}", "--force", "--quiet")
    assert pinned.returncode == 0 and pinned.stderr == "", pinned.stderr
    again = bundle_files(out)
    offline = cli(hub, tmp_path / "hf2", "export", out, "--model",
                  f"local/dinov2-tiny@{repo.commit}", "--force", "--quiet", HF_HUB_OFFLINE="1")
    assert offline.returncode == 0, offline.stderr
    assert bundle_files(out) == again  # byte for byte, from a fresh cache and offline
    assert again["weights.safetensors"] == made["weights.safetensors"]
    first_doc, pinned_doc = json.loads(made["config.json"]), json.loads(again["config.json"])
    assert pinned_doc["extra"]["hub"].pop("revision") == repo.commit
    assert first_doc["extra"]["hub"].pop("revision") == "main"
    for doc in (first_doc, pinned_doc):  # the description is in model.onnx and model.ts too
        doc.pop("files")
    assert first_doc == pinned_doc


@pytest.mark.slow
def test_export_by_timm_name(hub, repos, tmp_path):
    import timm

    repo = hub.repos[f"timm/{TIMM_NAME}"]
    out = tmp_path / "out"
    done = cli(hub, tmp_path / "hf", "export", out, "--model", TIMM_NAME, "--quiet")
    assert done.returncode == 0, done.stderr
    config = json.loads((out / "config.json").read_text())
    assert config["extra"]["hub"]["repo"] == f"timm/{TIMM_NAME}"
    assert config["extra"]["hub"]["commit"] == repo.commit
    assert config["extra"]["hub"]["timm_name"] == TIMM_NAME
    assert config["preprocessing"]["sources"]["mean"] == f"timm pretrained_cfg {TIMM_NAME}"
    assert not downloaded(hub, "pytorch_model.bin")  # the repo has both: the pickle is left
    weights = (tmp_path / "hf" / "hub" / f"models--timm--{TIMM_NAME}" / "snapshots" /
               repo.commit / "model.safetensors")
    peer = timm.create_model(TIMM_NAME, pretrained=True,
                             pretrained_cfg_overlay={"file": str(weights)}).eval()
    x = torch.randn(2, 3, 160, 160, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        check_parity(out, peer(x), x)
    source = json.loads((out / "parity.json").read_text())["source"]
    assert (source["framework"], source["model"], source["status"]) == \
        ("timm", TIMM_NAME, "passed"), source
    # hf-hub:timm/NAME is the same repo; offline, from the cache this run filled
    hub_named = cli(hub, tmp_path / "hf", "export", tmp_path / "again", "--model",
                    f"hf-hub:timm/{TIMM_NAME}", "--quiet", HF_HUB_OFFLINE="1")
    assert hub_named.returncode == 0, hub_named.stderr
    assert (tmp_path / "again" / "weights.safetensors").read_bytes() == \
        (out / "weights.safetensors").read_bytes()


@pytest.mark.slow
@pytest.mark.parametrize("name, env, expected", [
    ("local/remote-code", {}, ("Error: local/remote-code's config.json needs the repo's own code "
     "(modeling_tiny.TinyModel); vit-export never runs remote code")),
    ("local/resnet-tiny", {}, ("Error: local/resnet-tiny: config.json: model_type 'resnet' is "
     "not supported (one of vit, deit, vit_mae, dinov2, dinov2_with_registers, "
     "clip_vision_model, siglip_vision_model, clip, siglip, dinov3_vit, siglip2_vision_model, "
     "siglip2)")),
    ("local/no-such-model", {}, ("Error: local/no-such-model is not on {url}, or it is private "
     "and no token was given: set HF_TOKEN")),
    ("local/dinov2-tiny@v9", {}, ("Error: local/dinov2-tiny has no revision 'v9' (a branch, tag "
     "or commit)")),
    ("local/dinov2-gated", {}, ("Error: local/dinov2-gated is gated (no token was given, HTTP "
     "401): accept its terms at {url}/local/dinov2-gated and set HF_TOKEN to a token of that "
     "account")),
    ("local/dinov2-gated", {"HF_TOKEN": NOT_GRANTED}, ("Error: local/dinov2-gated is gated (the "
     "token in HF_TOKEN has not been granted access, HTTP 403): accept its terms at "
     "{url}/local/dinov2-gated and set HF_TOKEN to a token of that account")),
    ("local/dinov2-gated", {"HF_TOKEN": "hf_wrong"}, ("Error: the Hub at {url} refused the token "
     "in HF_TOKEN (invalid credentials, HTTP 401)")),
    ("local/dinov2-private", {}, ("Error: local/dinov2-private is not on {url}, or it is private "
     "and no token was given: set HF_TOKEN")),
    ("local/dinov2-tiny", {"HF_HUB_OFFLINE": "1"}, ("Error: local/dinov2-tiny@main is not in the "
     "Hugging Face cache ({cache}) and HF_HUB_OFFLINE=1 forbids downloading it; run once "
     "online, or unset HF_HUB_OFFLINE")),
    ("local/dinov2-tiny", {"HF_ENDPOINT": "http://127.0.0.1:9"}, ("Error: cannot reach the Hub "
     "at http://127.0.0.1:9 (ConnectError: [Errno 111] Connection refused) and "
     "local/dinov2-tiny@main is not in the Hugging Face cache ({cache})")),
    ("local/nested", {}, ("Error: local/nested: its config.json is nested too deeply to be a "
     "description")),
    ("not_a_timm_model.tag", {}, ("Error: 'not_a_timm_model.tag' is neither a Hub repo id "
     "(owner/name) nor a timm model with pretrained weights; a name can be a Hub repo id of a "
     "transformers image model (vit, deit, vit_mae, dinov2, dinov2_with_registers, "
     "clip_vision_model, siglip_vision_model, clip, siglip, dinov3_vit, siglip2_vision_model, "
     "siglip2; and, as transformers builds them, aimv2_vision_model, beit, cvt, "
     "data2vec-vision, donut-swin, dpt, hiera, ijepa, levit, mobilevit, mobilevitv2, pvt, "
     "pvt_v2, segformer, swiftformer, swin, swinv2, vit_msn, vitdet, yolos), or a timm vision "
     "transformer's name with its pretrained tag (or hf-hub:timm/NAME)")),
])
def test_each_refusal_is_one_line_and_writes_nothing(hub, repos, tmp_path, name, env, expected):
    home = tmp_path / "hf"
    out = cli(hub, home, "export", tmp_path / "out", "--model", name, **env)
    assert one_line(out) == expected.format(url=hub.url, cache=home / "hub")
    assert not (tmp_path / "out").exists()
    assert not downloaded(hub, "modeling_tiny.py")


@pytest.mark.slow
def test_a_hub_model_not_rebuilt_exports_as_transformers_builds_it(hub, repos, tmp_path):
    """BEiT on the Hub: its own transformers module, pinned and proved like any other."""
    done = cli(hub, tmp_path / "hf", "export", tmp_path / "out", "--model", "local/beit-tiny",
               "--quiet")
    assert done.returncode == 0, done.stderr
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert config["module"]["class"] == "BeitModel"
    assert config["extra"]["hub"]["repo"] == "local/beit-tiny"
    source = json.loads((tmp_path / "out" / "parity.json").read_text())["source"]
    assert (source["framework"], source["status"]) == ("transformers", "passed"), source


@pytest.mark.slow
def test_gated_repo_with_a_granted_token(hub, repos, tmp_path):
    import transformers

    done = cli(hub, tmp_path / "hf", "export", tmp_path / "out", "--model",
               "local/siglip-gated", "--quiet", HF_TOKEN=GRANTED)
    assert done.returncode == 0, done.stderr
    commit = hub.repos["local/siglip-gated"].commit
    snapshot = tmp_path / "hf" / "hub" / "models--local--siglip-gated" / "snapshots" / commit
    peer = transformers.SiglipVisionModel.from_pretrained(snapshot).eval()
    x = torch.randn(2, 3, 42, 42, generator=torch.Generator().manual_seed(3))
    check_parity(tmp_path / "out", hf_output("SiglipVisionModel", peer, x), x)


@pytest.mark.slow
def test_a_download_that_breaks_off(hub, repos, tmp_path):
    """huggingface_hub resumes a broken download within the run (Range, from the last whole
    10 MiB chunk it wrote); a run that still fails leaves no partial file to be used."""
    repo = hub.repos["local/dinov2-broken"]
    weights = repo.files["model.safetensors"]
    assert len(weights) * 3 // 4 > 10 * 2**20  # past one of the client's 10 MiB chunks
    url = f"/local/dinov2-broken/resolve/{repo.commit}/model.safetensors"
    home, out = tmp_path / "hf", tmp_path / "out"
    hub.down = True
    try:
        failed = cli(hub, home, "export", out, "--model", "local/dinov2-broken", "--quiet")
    finally:
        hub.down = False
    assert one_line(failed) == ("Error: downloading model.safetensors of local/dinov2-broken@"
                                f"{repo.commit} broke off (HTTP 500 from {hub.url}); no partial "
                                f"file is kept; run the same command again")
    assert (hub.requests[-1][:2], hub.requests[-1][2]) == (("GET", url), "bytes=10485760-")
    assert not out.exists()
    storage = home / "hub" / "models--local--dinov2-broken"
    assert not (storage / "snapshots" / repo.commit / "model.safetensors").exists()
    assert [p.name for p in (storage / "blobs").iterdir() if p.stat().st_size > 2**20] == []
    repo.broken.clear()
    done = cli(hub, home, "export", out, "--model", "local/dinov2-broken", "--quiet")
    assert done.returncode == 0, done.stderr
    gets = [rng for method, path, rng in hub.requests if (method, path) == ("GET", url)]
    assert gets[-2:] == [None, "bytes=10485760-"]  # broke off, then resumed in the run
    config = json.loads((out / "config.json").read_text())
    assert config["extra"]["hub"]["files"]["model.safetensors"] == sha256(weights)


@pytest.mark.parametrize("name, repo", [("a/b/c", "a/b/c"), ("../../x", "../../x"),
                                        ("a b/c", "a b/c"), ("hf-hub:", ""),
                                        ("hf-hub:timm/", "timm/")])
def test_a_repo_id_the_hub_client_refuses_is_one_line(name, repo, tmp_path, monkeypatch):
    """huggingface_hub's HFValidationError was a traceback."""
    from conftest import one_line, run

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    code, _, err = run("export", tmp_path / "out", "--model", name)
    assert code == 1 and one_line(err).startswith(
        f"Error: --model {name}: {repo} is not a Hub repo id (owner/name): Repo id must ")
    assert not (tmp_path / "out").exists()
