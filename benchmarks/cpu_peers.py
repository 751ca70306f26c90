"""Which model and runtime is fastest on this CPU? Every peer in one run, as a Markdown table.

    python benchmarks/cpu_peers.py [--quick] [--bundle DIR] [--threads N]
        [--calibrate PATH] [--real-data models/digits/held_out.npz] [--out table.md]

Peers, all on the same weights (ViT-B/16, random init, 10 classes, unless --bundle): timm
eager fp32 (the 1.00x baseline), torch autocast bf16, ONNX Runtime fp32 / dynamic int8 /
static int8 (the bundle's model.onnx, model.int8.onnx, model.int8-static.onnx), OpenVINO
f32 and bf16-hint on model.onnx, OpenVINO on the static int8 QDQ model, and AOTInductor
packages with weight freezing: fp32 (the bundle's model.aoti.pt2, or compiled here when it
has none) and bf16 weights and compute (compiled here; where the CPU has bf16
instructions), each with its compile time and package size (no C++ compiler: skipped). For each, the
ratio to timm eager fp32 at batch 1 and 8 (median latency), the lowest per-image cosine of
its logits to eager's, and top-1 agreement with eager on the real set (with labels: each
one's accuracy too).

Installs nothing: a peer whose package is absent (timm, openvino) is skipped and the table
says why, as is bf16 on a CPU without bf16 hardware (emulated there, thousands of times
slower; --emulated times it anyway). Without --bundle the script exports one with
`vit_export` first, static int8 calibrated on --calibrate (default: the training part of
scikit-learn's digits, which needs scikit-learn). The lead's final figures come from a
quiet machine: `python benchmarks/cpu_peers.py --out perf.md`. --quick runs fewer
repeats and 64 real images, for a check that it works, not for figures.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # run from a checkout, whatever is installed

from vit_export import bundle as B
from vit_export import cpu, runtime, timing
from vit_export.errors import VitExportError

BATCHES = (1, 8)


class Skip(Exception):
    """A peer that cannot run here; the message says why."""


def _torch_runner(module, autocast: bool) -> Callable[[np.ndarray], np.ndarray]:
    def run(x: np.ndarray) -> np.ndarray:
        with torch.inference_mode(), torch.autocast("cpu", torch.bfloat16, enabled=autocast):
            return module(torch.from_numpy(x)).float().numpy()
    return run


def timm_model(bundle: B.Bundle):
    """timm's VisionTransformer with the bundle's weights (our names are timm's)."""
    try:
        import timm
    except ImportError:
        raise Skip("timm is not installed") from None
    c = bundle.config
    model = timm.create_model(
        "vit_base_patch16_224", pretrained=False, img_size=c.img_size, patch_size=c.patch_size,
        in_chans=c.in_chans, num_classes=c.num_classes, embed_dim=c.embed_dim, depth=c.depth,
        num_heads=c.num_heads, mlp_ratio=c.mlp_ratio, qkv_bias=c.qkv_bias)
    model.load_state_dict(bundle.load_eager().state_dict())
    return model.eval()


def ort_peer(bundle: B.Bundle, file: str, threads: int):
    if not bundle.file(file).is_file():
        raise Skip(f"the bundle has no {file}")
    return runtime.ort_runner(bundle.file(file), "cpu", threads=threads)


def openvino_peer(bundle: B.Bundle, file: str, threads: int, hint: str):
    """OpenVINO's CPU plugin on one of the bundle's ONNX models (`runtime.OpenVinoRunner`:
    compiled per batch size, static shapes, as one deploys it). Returns (run, what the plugin
    really computes in): a bf16 hint the CPU cannot follow runs f32, as it would for a user."""
    try:
        import openvino  # noqa: F401
    except ImportError:
        raise Skip("openvino is not installed") from None
    if not bundle.file(file).is_file():
        raise Skip(f"the bundle has no {file}")
    spec = runtime.InputSpec.from_description(bundle.description.to_dict())
    try:
        runner = runtime.OpenVinoRunner(bundle.file(file), "openvino", hint, threads, spec)
    except runtime.ProviderError:
        if hint == "f32":
            raise
        runner = runtime.OpenVinoRunner(bundle.file(file), "openvino", "f32", threads, spec)
    return runner, runner.precision


def aoti_peer(bundle: B.Bundle, folder: Path, bf16: bool, notes: dict, name: str):
    """An AOTInductor package (weight freezing) of the bundle's model: the bundle's own
    model.aoti.pt2 for fp32 when it has one, else compiled here, into `folder`; bf16 is the
    model with bf16 weights and compute (input and logits fp32), compiled the same way. The
    compile time and the package's size go in the note."""

    if bf16 and not cpu.isa().bf16:
        raise Skip(f"no bf16 hardware ({cpu.isa().summary})")
    try:
        return _aoti_runner(bundle, folder, bf16, notes, name)
    except VitExportError as why:  # no C++ compiler, a package for another machine, ...
        raise Skip(str(why)) from None


def _aoti_runner(bundle: B.Bundle, folder: Path, bf16: bool, notes: dict, name: str):
    from vit_export import pt2

    path = bundle.file(B.AOTI_FILE)
    if bf16 or not path.is_file():
        model = bundle.load_eager()
        if bf16:
            model = _Bf16(model)
        c = bundle.config
        x = torch.zeros(2, c.in_chans, c.img_size, c.img_size)
        program = pt2.export_program(model, x)
        path = folder / f"{'bf16' if bf16 else 'fp32'}.aoti.pt2"
        made = pt2.compile_package(program, path, bundle.description.to_json(), "cpu")
    else:
        made = bundle.description.export["aoti"]
    notes[name] = (f"compiled in {made['compile_seconds']:.0f} s, package "
                   f"{made['bytes'] / 2**20:.0f} MiB")
    compiled, _ = pt2.load_package(path, "cpu")
    return lambda x: compiled(x)


class _Bf16(torch.nn.Module):
    """The model in bf16, fp32 in and out (as ONNX Runtime's fp16 model keeps its IO)."""

    def __init__(self, model):
        super().__init__()
        self.config = model.config
        self.model = model.to(torch.bfloat16)

    def forward(self, x):
        return self.model(x.to(torch.bfloat16)).float()


def median_ms(fn, x, repeats: int) -> float:
    # one warm-up call first (OpenVINO compiles there)
    return statistics.median(timing.seconds(lambda: fn(x), min_runs=repeats)) * 1e3


def run_all(fn, x: np.ndarray, chunk: int = 32) -> np.ndarray:
    return np.concatenate([fn(x[i:i + chunk]) for i in range(0, len(x), chunk)])


def cosine_min(a: np.ndarray, b: np.ndarray) -> float:
    a, b = a.astype(np.float64), b.astype(np.float64)
    return float(((a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1)))
                 .min())


def export_default(folder: Path, calibrate: Path | None, progress) -> Path:
    """ViT-B/16, random init (seed 0), 10 classes, with every CPU variant."""
    from vit_export.exporting import ExportOptions, export_bundle
    from vit_export.images import load_calibration
    from vit_export.model import create_model

    torch.manual_seed(0)
    model = create_model("vit_base_patch16_224", num_classes=10).eval()
    description = B.Description(model.config, B.Preprocessing.default_for(model.config),
                                name="vit_base_patch16_224")
    if calibrate is None:
        calibrate = folder / "train_digits.npz"
        np.savez(calibrate, images=train_digits())
    calibration = load_calibration(calibrate, description.preprocessing)
    out = folder / "vit_base"
    start = time.perf_counter()
    export_bundle(model, out, description, ExportOptions(
        quantize=("int8", "static"), calibrate=calibration, validation=dict(provider="cpu")),
        progress=progress)
    progress(f"export, calibration and validation took {time.perf_counter() - start:.0f} s")
    return out


def train_digits() -> np.ndarray:
    """The training part of load_digits, as scripts/train_digits.py splits it."""
    try:
        from sklearn.datasets import load_digits
        from sklearn.model_selection import train_test_split
    except ImportError:
        sys.exit("scikit-learn is not installed: give --calibrate PATH or --bundle DIR")
    digits = load_digits()
    images = np.round(digits.images * (255 / 16)).astype(np.uint8)
    return train_test_split(images, digits.target, test_size=0.2, random_state=0,
                            stratify=digits.target)[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bundle", type=Path, help="A bundle with model.onnx, model.int8.onnx "
                        "and model.int8-static.onnx [default: export ViT-B/16 first]")
    parser.add_argument("--calibrate", type=Path, help="Calibration images for the export")
    parser.add_argument("--real-data", type=Path, default=ROOT / "models/digits/held_out.npz")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--quick", action="store_true", help="3 repeats, 64 real images")
    parser.add_argument("--emulated", action="store_true",
                        help="Time bf16 even without bf16 hardware (very slow)")
    parser.add_argument("--out", type=Path, help="Also write the Markdown table here")
    args = parser.parse_args()
    repeats = 3 if args.quick else args.repeats
    start = time.perf_counter()

    def progress(step: str) -> None:
        print(f"[{time.perf_counter() - start:6.1f}s] {step}", file=sys.stderr, flush=True)

    torch.set_num_threads(args.threads)
    this = cpu.isa()
    progress("measuring GEMM peaks")
    peaks = cpu.gemm_peaks(args.threads, this)
    with tempfile.TemporaryDirectory(prefix="cpu-peers-") as tmp:
        path = args.bundle or export_default(Path(tmp), args.calibrate, progress)
        bundle = B.read_bundle(path)
        c = bundle.config
        inputs = {b: np.random.default_rng(b).standard_normal(
            (b, c.in_chans, c.img_size, c.img_size)).astype(np.float32) for b in BATCHES}
        real, labels = None, None
        if args.real_data and args.real_data.is_file():
            from vit_export.images import load_labelled_npz

            real, labels = load_labelled_npz(args.real_data, bundle.description.preprocessing)
            if args.quick:
                real, labels = real[:64], None if labels is None else labels[:64]

        peers: list[tuple[str, Callable[[], Callable]]] = []
        eager_model = {}

        def timm_fp32():
            eager_model["m"] = timm_model(bundle)
            return _torch_runner(eager_model["m"], autocast=False)

        def timm_bf16():
            if not this.bf16 and not args.emulated:
                raise Skip(f"no bf16 hardware ({this.summary}): emulated bf16 matmul runs at "
                           f"{peaks['bf16'].gflops:.2g} GFLOP/s; --emulated to time it")
            return _torch_runner(eager_model.get("m") or timm_model(bundle), autocast=True)

        notes: dict[str, str] = {}

        def ov(file, hint, name):
            def make():
                fn, ran = openvino_peer(bundle, file, args.threads, hint)
                if ran != hint:
                    notes[name] = f"asked {hint}, the plugin ran {ran} (no bf16 hardware)"
                return fn
            return make

        peers = [
            ("timm eager fp32", timm_fp32),
            ("torch autocast bf16 (timm)", timm_bf16),
            ("ONNX Runtime fp32", lambda: ort_peer(bundle, B.ONNX_FILE, args.threads)),
            ("ONNX Runtime dynamic int8", lambda: ort_peer(bundle, "model.int8.onnx",
                                                           args.threads)),
            ("ONNX Runtime static int8", lambda: ort_peer(bundle, "model.int8-static.onnx",
                                                          args.threads)),
            ("OpenVINO f32", ov(B.ONNX_FILE, "f32", "OpenVINO f32")),
            ("OpenVINO bf16-hint", ov(B.ONNX_FILE, "bf16", "OpenVINO bf16-hint")),
            ("OpenVINO static int8 (QDQ)", ov("model.int8-static.onnx", "f32", "")),
            ("AOTInductor fp32 (freezing)",
             lambda: aoti_peer(bundle, Path(tmp), False, notes, "AOTInductor fp32 (freezing)")),
            ("AOTInductor bf16 (freezing)",
             lambda: aoti_peer(bundle, Path(tmp), True, notes, "AOTInductor bf16 (freezing)")),
        ]
        rows, reference, base = [], {}, {}
        for name, make in peers:
            try:
                progress(f"preparing {name}")
                fn = make()
            except Skip as why:
                rows.append((name, None, str(why)))
                continue
            ms = {}
            for b in BATCHES:
                progress(f"timing {name} at batch {b}")
                ms[b] = median_ms(fn, inputs[b], repeats)
            out_random = fn(inputs[8])
            out_real = run_all(fn, real) if real is not None else None
            if not reference:  # timm eager fp32 is the reference and the 1.00x
                if name != "timm eager fp32":
                    sys.exit("timm eager fp32 could not run; it is every ratio's baseline")
                reference = {"random": out_random, "real": out_real}
                base = ms
            cos = cosine_min(reference["random"], out_random)
            agree = acc = None
            if out_real is not None:
                cos = min(cos, cosine_min(reference["real"], out_real))
                agree = float((out_real.argmax(1) == reference["real"].argmax(1)).mean())
                if labels is not None:
                    acc = float((out_real.argmax(1) == labels).mean())
            rows.append((name, (ms, cos, agree, acc), notes.get(name, "")))

    table = render(rows, base, this, peaks, args, len(real) if real is not None else 0)
    print(table)
    if args.out:
        args.out.write_text(table)
    progress("done")


def render(rows, base, this, peaks, args, n_real: int) -> str:
    lines = [f"CPU: {this.model}, {args.threads} threads; ISA {this.summary}. GEMM peaks "
             f"measured in this run: " + ", ".join(
                 f"{p.precision} {p.gflops:.4g} {'GOP/s' if p.precision == 'int8' else 'GFLOP/s'}"
                 + ("" if p.hardware else " (no hardware path: emulated)")
                 for p in peaks.values()) + ".", "",
             (f"| peer | batch 1 | batch 8 | cosine to eager (min) | top-1 agreement "
             f"({n_real} real) | accuracy | note |"),
             "| --- | --- | --- | ---: | ---: | ---: | --- |"]
    for name, figures, note in rows:
        if figures is None:
            lines.append(f"| {name} | skipped | skipped | | | | {note} |")
            continue
        ms, cos, agree, acc = figures
        cells = [f"{ms[b]:.0f} ms ({base[b] / ms[b]:.2f}x)" for b in BATCHES]
        lines.append(f"| {name} | {cells[0]} | {cells[1]} | {cos:.5f} | "
                     f"{'' if agree is None else f'{agree:.1%}'} | "
                     f"{'' if acc is None else f'{acc:.1%}'} | {note} |")
    lines += ["", ("Top-1 agreement is raw (no tie excused): on a model with random weights "
              "the logits of the 10 classes lie close together, so int8 flips near-ties that a "
              "trained model would not have.")]
    lines += ["", f"Median of {3 if args.quick else args.repeats} runs after a warm-up; "
              f"ratios are to timm eager fp32 in this same run."
              + (" --quick: not figures to publish." if args.quick else "")]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
