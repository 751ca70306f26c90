"""A hostile user's run: many bad or odd inputs across the commands, each judged for the
promise (one `Error:` line and exit 1/2 for a bad input, no traceback, no file lost or left
half-written, no silently wrong answer). Prints one line per case and the counts.

    python scripts/hostile_run.py [WORKDIR]

It writes only under WORKDIR (a fresh temporary folder by default) and runs `python cli.py`
from this checkout, one case at a time.
"""
from __future__ import annotations

import hashlib
import importlib.util
import io
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from PIL import Image

ROOT = Path(__file__).resolve().parent.parent
CLI = [sys.executable, str(ROOT / "cli.py")]
TIMEOUT = 300  # seconds a case may take before it counts as a hang


def snapshot(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


class Run:
    def __init__(self, work: Path):
        self.work = work
        self.counts = {"ok": 0, "traceback": 0, "lost": 0, "half-written": 0, "wrong": 0,
                       "hang": 0, "leaked": 0}
        self.bad: list[str] = []

    def case(self, name: str, args: list, expect: str = "error", check=None,
             input_bytes: bytes | None = None, keeps: tuple[str, ...] = ()) -> None:
        """expect "error": exit 1 or 2 with one Error line; "ok": exit 0 (check(stdout) may
        judge the answer); "either": a sane one of the two. `keeps`: files the command may
        leave on purpose (infer --ray's progress file, which --resume continues)."""
        before = snapshot(self.work)
        try:
            done = subprocess.run(CLI + [str(a) for a in args], capture_output=True, text=True,
                                  input=input_bytes, cwd=self.work, timeout=TIMEOUT,
                                  check=False)
        except subprocess.TimeoutExpired:
            self.tally("hang", name, f"{' '.join(map(str, args))}: no answer in {TIMEOUT} s")
            print(f"{'hang':12} {'':8} {name}")
            return
        after = snapshot(self.work)
        lines = [line for line in done.stderr.splitlines() if line.strip()]
        verdict = "ok"
        if "Traceback" in done.stderr or (done.returncode not in (0,) and (
                len(lines) != 1 or not lines[0].startswith("Error: "))):
            verdict = "traceback"
        elif done.returncode == 0 and expect == "error":  # noqa: SIM114  one verdict a cause
            verdict = "wrong"
        elif done.returncode != 0 and expect in ("ok", "writes"):  # noqa: SIM114
            verdict = "wrong"
        elif done.returncode == 0 and expect != "error" and check is not None and \
                not check(done.stdout):
            verdict = "wrong"
        changed = [k for k in before if before[k] != after.get(k)]
        leftovers = [k for k in after if k not in before and (
            ".vx-" in k or ".partial" in k or ".old-" in k or k.endswith(".tmp"))
            and k not in keeps]
        if changed and verdict == "ok" and expect != "writes":
            verdict = "lost"
        if leftovers and verdict == "ok":
            verdict = "half-written"
        self.tally(verdict, name, f"{' '.join(map(str, args))} -> exit {done.returncode}: "
                   f"{done.stderr.strip()[:300]} changed={changed} left={leftovers}")
        first = lines[0] if lines else (done.stdout.splitlines() or [""])[0]
        print(f"{verdict:12} exit {done.returncode:3}  {name}: {first[:110]}")

    def tally(self, verdict: str, name: str, detail: str) -> None:
        self.counts[verdict] += 1
        if verdict != "ok":
            self.bad.append(f"{name}: {detail}")


def main() -> None:
    work = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(tempfile.mkdtemp(prefix="hostile-"))
    work.mkdir(parents=True, exist_ok=True)
    os.chdir(work)
    r = Run(work)
    t0 = time.time()
    subprocess.run(CLI + ["export", "tiny", "--preset", "vit_seed_tiny", "--quiet"],
                   check=True, capture_output=True)
    subprocess.run(CLI + ["export", "digits", "--from", ROOT / "models" / "digits", "--quiet"],
                   check=True, capture_output=True)
    tiny, digits = Path("tiny"), Path("digits")
    config = json.loads((tiny / "config.json").read_text())

    def bundle_with(name: str, change) -> Path:
        out = Path(name)
        shutil.copytree(tiny, out)
        data = json.loads(json.dumps(config))
        change(data)
        (out / "config.json").write_text(json.dumps(data, allow_nan=True))
        return out

    def setter(*path_value):
        *path, value = path_value

        def change(d):
            for k in path[:-1]:
                d = d[k]
            if value is KeyError:
                del d[path[-1]]
            else:
                d[path[-1]] = value
        return change

    # ---- config.json, by field
    fields = [("model", "depth"), ("model", "embed_dim"), ("model", "num_heads"),
              ("model", "img_size"), ("model", "norm_eps"), ("model", "mlp_ratio"),
              ("model", "qkv_bias"), ("model", "drop_path_rate"), ("preprocessing", "mean"),
              ("preprocessing", "std"), ("preprocessing", "resize_size"),
              ("preprocessing", "interpolation"), ("export", "export_batch"),
              ("export", "onnx_models"), ("labels",), ("files",), ("io",)]
    values = [None, "12", -1, 1e12, float("nan"), [1], {"a": 1}, True]
    n = 0
    for field in fields:
        for value in values[:5] if len(field) > 1 else values:
            if field == ("labels",) and value is None:  # legal: a bundle without class names
                continue
            n += 1
            b = bundle_with(f"c{n}", setter(*field, value))
            r.case(f"config {'.'.join(field)}={value!r}", ["validate", b, "--batch-sizes", "1",
                                                           "--quiet"])
            shutil.rmtree(b)
    for field in [("model",), ("preprocessing",), ("format",), ("files", "weights.safetensors"),
                  ("files", "model.onnx")]:
        b = bundle_with("del", setter(*field, KeyError))
        r.case(f"config without {'.'.join(field)}", ["validate", b, "--quiet"])
        shutil.rmtree(b)
    b = bundle_with("traversal", setter("files", "../../etc/passwd", "0" * 64))
    r.case("files entry outside the bundle", ["validate", b, "--quiet"])
    shutil.rmtree(b)
    deep = Path("deep")
    shutil.copytree(tiny, deep)
    (deep / "config.json").write_text("[" * 200000 + "]" * 200000)
    r.case("config.json nested 200000 deep", ["info", deep])
    (deep / "config.json").unlink()
    (deep / "config.json").mkdir()
    r.case("config.json is a folder", ["info", deep])
    shutil.rmtree(deep)

    # ---- the bundle's files
    for name in ["model.onnx", "model.ts", "weights.safetensors"]:
        for how in ["truncate", "empty", "swap"]:
            b = Path(f"f_{name}_{how}")
            shutil.copytree(tiny, b)
            data = (b / name).read_bytes()
            other = "model.ts" if name != "model.ts" else "model.onnx"
            (b / name).write_bytes({"truncate": data[:len(data) // 2], "empty": b"",
                                    "swap": (b / other).read_bytes()}[how])
            for rehash in (False, True):
                if rehash:
                    c = json.loads((b / "config.json").read_text())
                    c["files"][name] = hashlib.sha256((b / name).read_bytes()).hexdigest()
                    (b / "config.json").write_text(json.dumps(c))
                r.case(f"{name} {how} rehash={rehash}", ["validate", b, "--quiet",
                                                         "--trust-code"])
            shutil.rmtree(b)
    other = Path("other")
    subprocess.run(CLI + ["export", other, "--preset", "vit_seed_tiny", "--set", "num_classes=7",
                          "--quiet"], check=True, capture_output=True)
    b = Path("foreign")
    shutil.copytree(tiny, b)
    shutil.copy(other / "model.onnx", b / "model.onnx")
    c = json.loads((b / "config.json").read_text())
    c["files"]["model.onnx"] = hashlib.sha256((b / "model.onnx").read_bytes()).hexdigest()
    (b / "config.json").write_text(json.dumps(c))
    r.case("model.onnx of a 7-class model, sha rewritten", ["validate", b, "--quiet"])
    np.save("x.npy", np.zeros((3, 32, 32), np.float32))
    r.case("infer on the foreign model.onnx", ["infer", b, "x.npy"])
    if importlib.util.find_spec("openvino") is not None:
        r.case("infer on the foreign model.onnx, OpenVINO", ["infer", b, "x.npy", "--runtime",
                                                            "openvino"])
    shutil.rmtree(b)
    b = Path("declared")
    shutil.copytree(tiny, b)
    c = json.loads((b / "config.json").read_text())
    c["export"]["onnx_models"] = {"model.onnx": "int8"}
    (b / "config.json").write_text(json.dumps(c))
    r.case("fp32 model.onnx declared int8", ["validate", b, "--quiet"])
    shutil.rmtree(b)

    # ---- labelled npz
    good = np.zeros((20, 32, 32, 3), np.uint8)
    labels = np.arange(20) % 10
    npz = {"float images": dict(images=good.astype(np.float32), labels=labels),
           "no images": dict(labels=labels), "0 images": dict(images=good[:0], labels=labels[:0]),
           "labels too big": dict(images=good, labels=labels + 10),
           "negative labels": dict(images=good, labels=labels - 1),
           "float labels": dict(images=good, labels=labels + 0.5),
           "short labels": dict(images=good, labels=labels[:5]),
           "5 channels": dict(images=np.zeros((20, 32, 32, 5), np.uint8), labels=labels),
           "rank 2": dict(images=good.reshape(20, -1), labels=labels)}
    for name, arrays in npz.items():
        np.savez("d.npz", **arrays)
        r.case(f"npz {name}", ["validate", tiny, "--real-data", "d.npz", "--quiet"])
    np.savez("d.npz", images=good, labels=np.array([{"a": 1}] * 20, dtype=object))
    r.case("npz with a pickled object array", ["validate", tiny, "--real-data", "d.npz"])
    Path("d.npz").write_bytes(b"PK\x03\x04garbage")
    r.case("npz that is not a zip", ["validate", tiny, "--real-data", "d.npz"])
    np.savez("d.npz", images=good, labels=labels)
    Path("d.npz").write_bytes(Path("d.npz").read_bytes()[:3000])
    r.case("truncated npz", ["validate", tiny, "--real-data", "d.npz"])
    Path("d.npz").unlink()

    # ---- npy inputs
    for name, array in {"nan": np.full((3, 32, 32), np.nan, np.float32),
                        "inf": np.full((1, 3, 32, 32), np.inf, np.float32),
                        "wrong shape": np.zeros((3, 16, 16), np.float32),
                        "0-d": np.float32(1), "strings": np.array(["a"] * 8),
                        "complex": np.zeros((3, 32, 32), np.complex64),
                        "zero samples": np.zeros((0, 3, 32, 32), np.float32)}.items():
        np.save("in.npy", array)
        r.case(f"npy {name}", ["infer", tiny, "in.npy"])
    np.save("in.npy", np.array([{"x": 1}], dtype=object), allow_pickle=True)
    r.case("npy with pickled objects", ["infer", tiny, "in.npy"])
    Path("in.npy").write_bytes(b"\x93NUMPY\x01\x00v\x00{'descr': '<f4', 'fortran_order': False, "
                               b"'shape': (100000000000, 3, 32, 32), }" + b" " * 40 + b"\n")
    r.case("npy header claiming 1e11 samples", ["infer", tiny, "in.npy"])
    Path("in.npy").unlink()

    # ---- images on the shipped model
    with np.load(ROOT / "models" / "digits" / "held_out.npz") as data:
        digit = data["images"][0]
    Image.fromarray(digit).save("d8.png")
    Image.fromarray(digit.astype(np.uint16) * 257).save("d16.png")
    Image.fromarray(digit.astype(np.float32) / 255).save("dF.tif")
    expected = subprocess.run(CLI + ["infer", digits, "d8.png", "--top-k", "1"],
                              capture_output=True, text=True, check=True).stdout.split()[1]
    for name in ["d16.png", "dF.tif"]:
        r.case(f"{name}: a deeper copy of a digit", ["infer", digits, name, "--top-k", "1"],
               expect="ok", check=lambda out: out.split()[1] == expected)
    Image.fromarray(np.full((8, 8), 2.0, np.float32)).save("over.tif")
    r.case("float image with values above 1", ["infer", digits, "over.tif"])
    Path("text.png").write_text("not an image")
    r.case("text named .png", ["infer", digits, "text.png"])
    Path("cut.png").write_bytes(Path("d8.png").read_bytes()[:40])
    r.case("truncated png", ["infer", digits, "cut.png"])
    Image.new("RGB", (1, 1)).save("one.png")
    r.case("1x1 image", ["infer", digits, "one.png"], expect="ok")
    Image.new("L", (1, 20000)).save("thin.png")
    r.case("1x20000 image", ["infer", digits, "thin.png"], expect="ok")
    Image.new("CMYK", (20, 20)).save("cmyk.jpg")
    r.case("CMYK jpeg", ["infer", digits, "cmyk.jpg"], expect="ok")
    Image.new("P", (20, 20)).save("pal.png", transparency=0)
    r.case("palette with transparency", ["infer", digits, "pal.png"], expect="ok")
    Image.new("1", (20000, 10000)).save("bomb.png")  # 200M pixels, tiny file
    r.case("decompression bomb (200M pixels)", ["infer", digits, "bomb.png"])
    Path("empty_dir").mkdir()
    r.case("a folder without images", ["infer", digits, "empty_dir"])
    r.case("a missing file", ["infer", digits, "nope.png"])
    weird = "new\nline.png"
    shutil.copy("d8.png", weird)
    r.case("a file name with a newline", ["infer", digits, weird], expect="ok")
    shutil.copy("d8.png", "-dash.png")
    r.case("a file name starting with a dash", ["infer", digits, "--", "-dash.png"],
           expect="either")

    # ---- checkpoints
    torch.manual_seed(0)
    from vit_export.model import create_model

    state = create_model("vit_seed_tiny").state_dict()

    def ckpt(name: str, change) -> Path:
        s = dict(state)
        change(s)
        torch.save(s, name)
        return Path(name)

    cases = {"missing block": lambda s: s.pop("blocks.1.mlp.fc1.weight"),
             "rank 1 cls_token": lambda s: s.__setitem__("cls_token", s["cls_token"].flatten()),
             "nan weights": lambda s: s.__setitem__("head.weight", s["head.weight"] * np.nan),
             "non-tensor value": lambda s: s.__setitem__("head.bias", 3),
             "pos_embed not a square grid": lambda s: s.__setitem__(
                 "pos_embed", torch.zeros(1, 7, 64)),
             "extra key": lambda s: s.__setitem__("blocks.9.x", torch.zeros(2))}
    for name, change in cases.items():
        path = ckpt("c.pth", change)
        r.case(f"checkpoint {name}", ["export", "ck", "--checkpoint", path, "--preset",
                                      "vit_seed_tiny"])
    path = ckpt("c.pth", lambda s: None)
    r.case("checkpoint without num_heads", ["export", "ck", "--checkpoint", path])
    r.case("checkpoint with a contradicting --format", ["export", "ck", "--checkpoint", path,
                                                         "--format", "hf", "--set", "num_heads=4"])

    class Evil:
        def __reduce__(self):
            return (os.system, ("touch pwned",))

    import pickle

    Path("evil.pth").write_bytes(pickle.dumps({"model": Evil()}))
    r.case("a pickle that runs code", ["export", "ck", "--checkpoint", "evil.pth"])
    if Path("pwned").exists():
        r.counts["wrong"] += 1
        r.bad.append("the evil pickle ran code")
    Path("junk.safetensors").write_bytes(os.urandom(2000))
    r.case("random bytes as safetensors", ["export", "ck", "--checkpoint", "junk.safetensors"])

    # ---- options
    opts = [["validate", tiny, "--atol", "nan"], ["validate", tiny, "--rtol", "-1"],
            ["validate", tiny, "--min-cosine", "2"], ["validate", tiny, "--seed", "-1"],
            ["validate", tiny, "--batch-sizes", "0"], ["validate", tiny, "--batch-sizes", "1,a"],
            ["validate", tiny, "--batch-sizes", "100000000"],
            ["validate", tiny, "--report", tiny / "config.json"],
            ["validate", tiny, "--junit", tiny / "model.onnx"],
            ["validate", tiny, "--report", "x.json", "--junit", "x.json"],
            ["bench", tiny, "--min-seconds", "inf"], ["bench", tiny, "--report", "no/such/b.json"],
            ["bench", tiny, "--variants", "int8"], ["bench", "vit_base_patch16_224",
                                                   "--batch-sizes", "1000000"],
            ["export", tiny, "--from", tiny, "--force"],
            ["export", tiny / "inner", "--from", tiny, "--force"],
            ["export", ".", "--from", tiny, "--force"],
            ["export", "new", "--preset", "no_such_preset"],
            ["export", "new", "--preset", "vit_seed_tiny", "--set", "depth=-1"],
            ["export", "new", "--preset", "vit_seed_tiny", "--set", "nonsense"],
            ["export", "new", "--preset", "vit_seed_tiny", "--export-batch-size", "1"],
            ["export", "new", "--preset", "vit_seed_tiny", "--export-batch-size", "1025"],
            ["export", "new", "--preset", "vit_seed_tiny", "--set", "dynamic_img_size=true",
             "--exporter", "torchscript"],
            ["export", "new", "--preset", "vit_seed_tiny", "--fp16-io"],
            ["export", "x" * 300, "--preset", "vit_seed_tiny"],
            ["infer", tiny / "model.onnx", "x.npy", "--runtime", "torchscript"],
            ["infer", tiny, "x.npy", "--top-k", "0"], ["infer", tiny, "x.npy", "--top-k", "-3"],
            ["quick-test", "--preset", "nope"], ["quick-test", "--batch-size", "0"],
            ["info", "nowhere"], ["info", "x.npy"],
            ["triton", tiny, tiny / "repo"], ["triton", tiny, tiny, "--force"],
            ["triton", tiny, "repo", "--max-batch-size", "0"],
            ["triton", tiny, "repo", "--tf32"], ["presets", "extra-arg"]]
    for args in opts:
        r.case("option " + " ".join(map(str, args))[:80], args)
    for i, args in enumerate(opts):
        if Path("new").exists() or Path("repo").exists():
            r.counts["half-written"] += 1
            r.bad.append(f"a refused command left output behind (after option case {i})")
            shutil.rmtree("new", ignore_errors=True)
            shutil.rmtree("repo", ignore_errors=True)
            break

    # ---- OpenVINO runtimes, when the openvino extra is installed
    if importlib.util.find_spec("openvino") is not None:
        r.case("infer on OpenVINO", ["infer", digits, "d8.png", "--top-k", "1", "--runtime",
                                     "openvino"], expect="ok",
               check=lambda out: out.split()[1] == expected)
        for args in (["infer", digits / "model.ts", "d8.png", "--runtime", "openvino"],
                     ["infer", digits, "d8.png", "--runtime", "openvino", "--provider", "cuda"],
                     ["infer", digits, "cut.png", "--runtime", "openvino"],
                     ["infer", digits, "over.tif", "--runtime", "openvino-bf16"],
                     ["validate", digits, "--openvino", "--provider", "cuda"],
                     ["validate", digits, "--openvino", "--atol", "nan"],
                     ["bench", digits, "--openvino", "--runners", "openvino-fp64"]):
            r.case(" ".join(map(str, args))[:80], args)

    embed_cases(r, digits)

    # ---- infer --ray (Ray Data) and serve (Ray Serve), when the serve extra is installed
    if importlib.util.find_spec("ray") is not None:
        ray_cases(r, digits, tiny)
        http_cases(r, digits)

    # ---- --force onto a symlink, and signals during an export
    Path("target").mkdir()
    (Path("target") / "keep.txt").write_text("mine")
    os.symlink("target", "link")
    r.case("--force onto a symlink", ["export", "link", "--from", tiny, "--force", "--quiet"],
           expect="writes")
    if (Path("target") / "keep.txt").read_text() != "mine":
        r.counts["lost"] += 1
        r.bad.append("--force onto a symlink changed the link's target")
    for sig in (signal.SIGTERM, signal.SIGINT):
        for step in ("exporting ONNX", "validating"):
            out = Path(f"sig_{sig}_{step[:4]}")
            shutil.copytree(tiny, out)
            before = snapshot(out)
            proc = subprocess.Popen(CLI + ["export", out, "--preset", "vit_seed_tiny", "--force",
                                           "--progress"], stderr=subprocess.PIPE, text=True)
            for line in proc.stderr:
                if step in line:
                    proc.send_signal(sig)
                    break
            rest = proc.stderr.read()
            code = proc.wait()
            left = [p.name for p in Path(".").iterdir() if p.name.startswith(".vx-")]
            ok = code == 128 + sig and snapshot(out) == before and not left and \
                "Traceback" not in rest
            r.counts["ok" if ok else "half-written"] += 1
            print(f"{'ok' if ok else 'half-written':12} exit {code:3}  {sig.name} at {step}")
            if not ok:
                r.bad.append(f"{sig.name} at {step}: exit {code}, left {left}, {rest[-200:]}")

    total = sum(r.counts.values())
    print(f"\n{total} cases in {time.time() - t0:.0f} s: " +
          ", ".join(f"{k} {v}" for k, v in r.counts.items()))
    for line in r.bad:
        print("NOT OK:", line)


def embed_cases(r: Run, digits: Path) -> None:
    """Embeddings: outputs a bundle cannot give, the wrong command for a bundle's
    output, files --embed cannot write; and on Ray Data when Ray is installed."""
    subprocess.run(CLI + ["export", "emb", "--from", digits, "--outputs", "embedding",
                          "--quiet"], check=True, capture_output=True)
    emb = Path("emb")
    for name, extra in [("--outputs tokens,tokens", ["--outputs", "tokens,tokens"]),
                        ("--outputs logits,", ["--outputs", "logits,"]),
                        ("--outputs ''", ["--outputs", ""]),
                        ("--outputs probs", ["--outputs", "probs"]),
                        ("--normalize on logits", ["--normalize"]),
                        ("--normalize on tokens", ["--outputs", "logits,tokens", "--normalize"]),
                        ("--outputs logits, headless", ["--set", "num_classes=0", "--outputs",
                                                        "logits"])]:
        r.case(f"export {name}", ["export", "out_emb", "--preset", "vit_seed_tiny", *extra])

    def three(out: str) -> bool:  # config.json names the three, in order
        config = json.loads(Path(r.work, "out_three", "config.json").read_text())
        return config["io"]["outputs"] == ["logits", "embedding", "tokens"]
    r.case("export --outputs logits,embedding,tokens", ["export", "out_three", "--preset",
                                                        "vit_seed_tiny", "--outputs",
                                                        "logits,embedding,tokens", "--quiet"],
           "ok", three)

    def records(out: str) -> bool:
        results = json.loads(out)["results"]
        return len(results) == 1 and len(results[0]["embedding"]) > 1
    for name, args, expect, check in [
            ("classify an embedding bundle", [emb, "d8.png"], "error", None),
            ("--embed on a logits bundle", [digits, "d8.png", "--embed"], "error", None),
            ("--embed --output .csv", [emb, "d8.png", "--embed", "--output", "e.csv"], "error",
             None),
            ("--embed --output in a missing folder", [emb, "d8.png", "--embed", "--output",
                                                      "no/such/e.npy"], "error", None),
            ("--embed --output is the input", [emb, "d8.png", "--embed", "--output", "d8.png"],
             "error", None),
            ("--embed --output inside the bundle", [emb, "d8.png", "--embed", "--output",
                                                    emb / "e.npy"], "error", None),
            ("--embed --json", [emb, "d8.png", "--embed", "--json"], "ok", records),
            ("--embed --output .npy", [emb, "d8.png", "--embed", "--output", "e.npy"], "ok",
             None),
            ("--embed --output .parquet", [emb, "d8.png", "--embed", "--output", "e.parquet"],
             "ok", None)]:
        r.case(f"infer {name}", ["infer", *args], expect=expect, check=check)
    if importlib.util.find_spec("ray") is None:
        return
    Path("emb_in").mkdir()
    for i in range(4):
        shutil.copy("d8.png", Path("emb_in") / f"{i}.png")
    for name, args, expect in [
            ("--ray --output .parquet without --embed", [digits, "emb_in", "--ray", "--output",
                                                         "c.parquet"], "error"),
            ("--ray --embed --output .npy", [emb, "emb_in", "--ray", "--embed", "--output",
                                             "r.npy"], "error"),
            ("--ray --embed --output .parquet", [emb, "emb_in", "--ray", "--embed", "--output",
                                                 "r.parquet"], "ok")]:
        r.case(f"infer {name}", ["infer", *args], expect=expect)


def ray_cases(r: Run, digits: Path, tiny: Path) -> None:
    """infer --ray: bad options before Ray starts, bad inputs and files while it runs; the
    progress file a failed run keeps holds whole records only (--resume continues it)."""
    folder = Path("ray_in")
    folder.mkdir()
    for i in range(12):
        shutil.copy("d8.png", folder / f"{i:02d}.png")
    Path("ray_bad").mkdir()
    for i in range(6):
        shutil.copy("d8.png", Path("ray_bad") / f"{i:02d}.png")
    Path("ray_bad", "99.png").write_text("not an image")
    np.save("nan.npy", np.full((1, 1, 8, 8), np.nan, np.float32))
    Path("garbage.jsonl").write_text("[1, 2, 3]\n")
    Path(".stale.jsonl.partial").write_text('{"input": "x", "top": []}\n{"inp')
    for name, args, expect, keeps in [
        ("--ray without --output", [folder, "--ray"], "error", ()),
        ("--output without --ray", [folder, "--output", "o.jsonl"], "error", ()),
        ("--ray --json", [folder, "--ray", "--json", "--output", "o.jsonl"], "error", ()),
        ("--workers 0", [folder, "--ray", "--workers", "0", "--output", "o.jsonl"], "error", ()),
        ("--top-k 0 on Ray", [folder, "--ray", "--top-k", "0", "--output", "o.jsonl"],
         "error", ()),
        ("--output inside the bundle", [folder, "--ray", "--output", digits / "r.jsonl"],
         "error", ()),
        ("--output is an input image", [folder, "--ray", "--output", folder / "00.png"],
         "error", ()),
        ("--output in a missing folder", [folder, "--ray", "--output", "no/such/o.jsonl"],
         "error", ()),
        ("--output is a folder", [folder, "--ray", "--output", "ray_in"], "error", ()),
        ("--output exists, no --resume", [folder, "--ray", "--output", "garbage.jsonl"],
         "error", ()),
        ("--resume from a file it did not write", [folder, "--ray", "--resume", "--output",
                                                  "garbage.jsonl"], "error", ()),
        ("--ray on a folder without images", ["empty_dir", "--ray", "--output", "o.jsonl"],
         "error", ()),
        ("--ray on a missing file", ["nope.png", "--ray", "--output", "o.jsonl"], "error", ()),
        ("--ray with a broken image among good ones", ["ray_bad", "--ray", "--batch-size", "2",
                                                       "--output", "bad.jsonl"],
         "error", (".bad.jsonl.partial",)),
        ("--ray on a NaN array", ["nan.npy", "--ray", "--output", "nan.jsonl"], "error",
         (".nan.jsonl.partial",)),
        ("--ray --address of no cluster", [folder, "--ray", "--address", "127.0.0.1:1",
                                           "--output", "o.jsonl"], "error", ()),
        ("--ray --runtime torchscript", [folder, "--ray", "--runtime", "torchscript",
                                         "--output", "ts.jsonl"], "ok", ()),
        ("--resume over another run's torn progress file", [folder, "--ray", "--resume",
                                                            "--output", "stale.jsonl"],
         "error", ()),
        ("--resume of a finished run, nothing to do", [folder, "--ray", "--runtime",
                                                       "torchscript", "--resume", "--output",
                                                       "ts.jsonl"], "ok", ()),
        ("--resume with another --top-k", [folder, "--ray", "--runtime", "torchscript",
                                           "--top-k", "1", "--resume", "--output",
                                           "ts.jsonl"], "error", ()),
        ("--resume with other inputs", ["ray_bad", "--ray", "--runtime", "torchscript",
                                        "--resume", "--output", "ts.jsonl"], "error", ()),
    ]:
        r.case(f"infer {name}", ["infer", digits, *args], expect=expect, keeps=keeps,
               check=lambda out: "12 file(s) classified" in out
               or "0 file(s) classified" in out and "12 done before" in out)
    killed_driver(r, digits, folder)
    r.case("infer --resume with another bundle", ["infer", tiny, folder, "--ray", "--runtime",
                                                  "torchscript", "--resume", "--output",
                                                  "ts.jsonl"])
    for name in ("bad", "nan"):  # what a failed run keeps must be whole records
        kept = Path(f".{name}.jsonl.partial")
        lines = kept.read_text().splitlines() if kept.exists() else []
        whole = all(json.loads(line).get("top") for line in lines)
        r.tally("ok" if whole else "half-written", f"progress file of the failed {name} run",
                f"{len(lines)} lines, whole={whole}")
        kept.unlink(missing_ok=True)
    for args in (["--port", "0"], ["--host", "256.1.1.1"], ["--host", "no.such.host."],
                 ["--autoscale", "3,1"], ["--autoscale", "x"], ["--autoscale", "1,2",
                                                                "--replicas", "2"],
                 ["--batch-wait-ms", "-1"], ["--max-request-bytes", "0"],
                 ["--max-batch-size", "0"], ["--provider", "cuda"], ["--threads", "0"]):
        r.case("serve " + " ".join(args), ["serve", digits, *args])
    broken = Path("serve_broken")
    shutil.copytree(digits, broken)
    config = broken / "config.json"
    config.write_text(config.read_text()[:-40])
    r.case("serve a bundle whose config.json is cut short", ["serve", broken])
    r.case("serve a missing bundle", ["serve", "nowhere"])
    r.case("serve --address of no cluster", ["serve", digits, "--address", "127.0.0.1:1"])


def killed_driver(r: Run, digits: Path, folder: Path) -> None:
    """kill -9 of an `infer --ray` driver mid-run: every Ray process it started (found by a
    mark in their environment) must be gone within 30 s."""
    import uuid

    mark = uuid.uuid4().hex

    def marked() -> list[str]:
        found = []
        for proc in Path("/proc").iterdir():
            try:
                if proc.name.isdigit() and f"VX_TEST_RUN={mark}".encode() in \
                        (proc / "environ").read_bytes().split(b"\0") and \
                        "\nState:\tZ" not in (proc / "status").read_text():
                    found.append((proc / "cmdline").read_bytes()[:40].decode(errors="replace"))
            except OSError:
                continue
        return found

    partial = Path(".killed.jsonl.partial")
    proc = subprocess.Popen(CLI + ["infer", str(digits), str(folder), "--ray", "--batch-size",
                                   "1", "--output", "killed.jsonl"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            env={**os.environ, "VX_TEST_RUN": mark})
    deadline = time.monotonic() + 120
    while proc.poll() is None and time.monotonic() < deadline and not (
            partial.exists() and partial.stat().st_size):
        time.sleep(0.05)
    proc.kill()
    proc.wait()
    deadline = time.monotonic() + 30
    while marked() and time.monotonic() < deadline:
        time.sleep(0.5)
    left = marked()
    r.tally("ok" if not left else "leaked", "kill -9 of the infer --ray driver",
            f"Ray processes left after 30 s: {left}")
    print(f"{'ok' if not left else 'leaked':12} {'':8} kill -9 of the infer --ray driver: "
          f"{len(left)} Ray process(es) left")
    partial.unlink(missing_ok=True)
    for name in (".killed.jsonl.run.json", ".killed.jsonl.lock"):
        Path(name).unlink(missing_ok=True)


def http_cases(r: Run, digits: Path) -> None:
    """A real `vit-export serve` on localhost and hostile requests: each gets a 4xx with one
    JSON line (or, for a good image, the answer `infer` gives), never a 500, and the replica
    that answered is the one still serving."""
    import http.client
    import socket
    import urllib.parse

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = subprocess.Popen(CLI + ["serve", digits, "--port", str(port), "--max-request-bytes",
                                     "200000"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)

    def ask(method: str, path: str, body: bytes = b"", headers=None):
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        try:
            connection.request(method, path, body=body, headers=headers or {})
            answer = connection.getresponse()
            return answer.status, answer.read()
        finally:
            connection.close()

    try:
        for _ in range(240):
            try:
                status, body = ask("GET", "/healthz")
                if status == 200:
                    break
            except OSError:
                pass
            time.sleep(0.5)
        pid = json.loads(body)["pid"]
        good = Path("d8.png").read_bytes()
        digit_answer = subprocess.run(CLI + ["infer", digits, "d8.png", "--json", "--top-k", "1"],
                                      capture_output=True, text=True, check=True).stdout
        expected = json.loads(digit_answer)["results"][0]["top"][0]["class"]
        sixteen = Path("d16.png").read_bytes()
        buffer = io.BytesIO()
        Image.new("1", (20000, 10000)).save(buffer, format="PNG")
        bomb = buffer.getvalue()
        buffer = io.BytesIO()
        Image.new("L", (8, 8)).save(buffer, format="GIF", save_all=True,
                                    append_images=[Image.new("L", (8, 8), 255)])
        gif = buffer.getvalue()
        boundary = "XyZ"

        def multipart(*parts: tuple[str, str | None, bytes]) -> bytes:
            out = b""
            for name, filename, data in parts:
                disposition = f'form-data; name="{name}"' + (
                    f'; filename="{filename}"' if filename else "")
                out += (f"--{boundary}\r\nContent-Disposition: {disposition}\r\n\r\n"
                        .encode() + data + b"\r\n")
            return out + f"--{boundary}--\r\n".encode()

        form = {"Content-Type": f"multipart/form-data; boundary={boundary}"}
        cases = [
            ("a good digit", "POST", "/predict", good, {}, 200),
            ("a 16-bit digit", "POST", "/predict", sixteen, {}, 200),
            ("a digit as a multipart upload", "POST", "/predict",
             multipart(("image", "d.png", good)), form, 200),
            ("an upload after a text field", "POST", "/predict",
             multipart(("note", None, b""), ("image", "d.png", good)), form, 200),
            ("text as an image", "POST", "/predict", b"hello", {}, 400),
            ("an empty body", "POST", "/predict", b"", {}, 400),
            ("a truncated png", "POST", "/predict", good[:40], {}, 400),
            ("a decompression bomb", "POST", "/predict", bomb, {}, 400),
            ("an animated gif", "POST", "/predict", gif, {}, 200),
            ("a body over the limit", "POST", "/predict", good + b"\0" * 200_000, {}, 413),
            ("content-length claims 10 GB", "POST", "/predict", good,
             {"Content-Length": str(10 ** 10)}, 413),
            ("multipart without a boundary", "POST", "/predict", good,
             {"Content-Type": "multipart/form-data"}, 400),
            ("multipart with a wrong boundary", "POST", "/predict",
             multipart(("image", "d.png", good)),
             {"Content-Type": "multipart/form-data; boundary=other"}, 400),
            ("multipart whose file is text", "POST", "/predict",
             multipart(("image", "d.png", b"text")), form, 400),
            ("40 parts under an RFC 2231 boundary*=", "POST", "/predict",
             multipart(*[("image", "d.png", good)] * 40),
             {"Content-Type": f"multipart/form-data; boundary*=utf-8''{boundary}"}, 400),
            ("top_k=0", "POST", "/predict?top_k=0", good, {}, 400),
            ("top_k=-1", "POST", "/predict?top_k=-1", good, {}, 400),
            ("top_k=1e9", "POST", "/predict?top_k=1000000000", good, {}, 200),
            ("top_k twice", "POST", "/predict?top_k=1&top_k=x", good, {}, 400),
            ("top_k unicode digits", "POST", "/predict?top_k=" + urllib.parse.quote("٣"),
             good, {}, 400),
            ("GET /predict", "GET", "/predict", b"", {}, 405),
            ("PUT /predict", "PUT", "/predict", good, {}, 405),
            ("POST /healthz", "POST", "/healthz", good, {}, 405),
            ("an unknown route", "GET", "/admin", b"", {}, 404),
            ("a path with ..", "GET", "/predict/../../etc/passwd", b"", {}, 404),
            ("a very long path", "GET", "/" + "a" * 5000, b"", {}, 404),
        ]
        for name, method, path, body, headers, status in cases:
            try:
                got, raw = ask(method, path, body, headers)
            except OSError as exc:
                got, raw = 0, str(exc).encode()
            try:
                answer = json.loads(raw)
            except ValueError:
                answer = None
            verdict = "ok"
            if got >= 500 or got == 0 or not isinstance(answer, dict):
                verdict = "traceback"
            elif got != status:  # noqa: SIM114  one verdict a cause
                verdict = "wrong"
            elif got == 200 and name.endswith("digit") and answer["top"][0]["class"] != expected:
                verdict = "wrong"
            elif got != 200 and (set(answer) != {"error"} or "\n" in answer["error"]):
                verdict = "traceback"
            health = json.loads(ask("GET", "/healthz")[1])
            if health.get("pid") != pid:
                verdict = "lost"  # the replica that served died and was replaced
            print(f"{verdict:12} http {got:3}  {name}: {raw[:100]!r}")
            r.tally(verdict, f"http {name}", f"{method} {path} -> {got} {raw[:300]!r}")
    finally:
        server.send_signal(signal.SIGTERM)
        stdout, stderr = server.communicate(timeout=120)
    lines = stderr.decode().strip().splitlines()
    ok = server.returncode == 128 + signal.SIGTERM and not stdout and len(lines) == 2 and \
        lines[-1] == "stopped by SIGTERM; Ray Serve shut down"
    print(f"{'ok' if ok else 'traceback':12} exit {server.returncode:3}  serve stopped by SIGTERM")
    r.tally("ok" if ok else "traceback", "serve stopped by SIGTERM",
            f"exit {server.returncode}, stdout {stdout[:200]!r}, stderr {stderr[-300:]!r}")


if __name__ == "__main__":
    main()
