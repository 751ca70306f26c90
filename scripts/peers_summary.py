"""What a `bench --peers` result says (the peers.json that scripts/cuda_proof.sh's `peers`
stage writes): the bundle's fastest validated backend against the strongest timm peer at each
batch size and input placement (bench.against_peer), its share of the measured GEMM peak at
the largest batch, and its images/s with host input (a batch at a time, or a stream of
batches whose copies overlap the runs: the faster) against input already on the device. Each
goal is printed as met or not met with its numbers, never asserted: it exits 0 whatever they
are, and 1 only where the result has no row of the peer (left out: its note says why) or the
file is not a bench result. Then each lever's gain (LEVERS), measured in the same run: fp16,
the fused graph, ONNX Runtime's CUDA graph, and torch.compile's CUDA graphs on timm.

    python scripts/peers_summary.py out/cuda/peers.json [--peer timm-compile-ro-fp16]
"""
import argparse
import sys
from pathlib import Path
from typing import Optional

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from vit_export import benchmarking as bench
from vit_export.errors import BundleError, VitExportError
from vit_export.jsonio import read_json

# the strongest timm peer on each device: torch.compile with CUDA graphs in fp16 on CUDA
STRONGEST = {"cuda": "timm-compile-ro-fp16", "cpu": "timm-compile"}
RATIO_GOAL = 1.0  # at least as fast as the peer, at every batch size measured (1 and 64)
PEAK_GOAL = 0.55  # share of the measured GEMM peak of its precision, at the largest batch
HOST_GOAL = 0.85  # img/s with host input over with the input on the device


def _x(value) -> str:
    return "-" if value is None else f"{value:.2f}x"


def _goal(name: str, parts: list[tuple[str, Optional[bool]]]) -> str:
    """One goal line, each part with its numbers: met where every part met it, not met where
    one did not, else not measured (a part is None where a figure is missing)."""
    oks = [ok for _, ok in parts]
    if False in oks:
        verdict = "not met"
    elif oks and all(oks):
        verdict = "met"
    else:
        verdict = "not measured"
    return f"goal {name}: {verdict}" + (f" ({', '.join(t for t, _ in parts)})" if parts else "")


def _at_least(value: Optional[float], goal: float) -> Optional[bool]:
    return None if value is None else value >= goal


# each lever: its name, the backend with it, the backend without it (same bench run)
LEVERS = [
    ("fp16", "onnxruntime[model.fp16.onnx]", "onnxruntime"),
    ("fused graph", "onnxruntime[model.opt.fp16.onnx]", "onnxruntime[model.fp16.onnx]"),
    ("CUDA graph", "onnxruntime[model.opt.fp16.onnx]" + bench.CUDA_GRAPH_SUFFIX,
     "onnxruntime[model.opt.fp16.onnx]"),
    ("torch.compile reduce-overhead on timm", "timm-compile-ro-fp16", "timm-fp16"),
]


def levers(result: dict, io: str) -> list[str]:
    """One line per lever: img/s with it over img/s without it, at each batch size, where
    the input was `io`; not measured where the run has no rows of either."""
    rows = {(r.get("backend"), r.get("io"), r.get("batch")): r for r in result["rows"]}
    lines = []
    for name, with_it, without in LEVERS:
        parts = []
        for batch in result.get("batch_sizes", []):
            a, b = rows.get((with_it, io, batch)), rows.get((without, io, batch))
            if a and b and b["images_per_s"]:
                unchecked = "" if a["validated"] and b["validated"] else " (did NOT match eager)"
                parts.append(f"batch {batch} {_x(a['images_per_s'] / b['images_per_s'])}"
                             + unchecked)
        lines.append(f"lever {name} ({with_it} over {without}, {io} input): "
                     + (", ".join(parts) or "not measured"))
    return lines


def summary(result: dict, peer: str) -> list[str]:
    """The lines to print: one per batch size and input placement, then the goals."""
    found = bench.against_peer(result, peer)
    lines = [f"against {peer} on {result.get('device')}"
             + (f" ({result['gpu']})" if result.get("gpu") else "")
             + f"; {result.get('model')}"]
    for a in found:
        line = (f"batch {a.batch}, {a.io} input: {a.backend} {a.images_per_s:.1f} img/s "
                f"({a.peak_fraction:.2f} of the {a.precision} GEMM peak); ")
        if a.peer_images_per_s is None:
            line += f"{peer} not measured"
        else:
            line += (f"{peer} {a.peer_images_per_s:.1f} img/s"
                     + ("" if a.peer_validated else " (did NOT match eager)")
                     + f": {_x(a.ratio)}")
        if a.graph_images_per_s is not None and a.peer_images_per_s:
            line += (f"; with a CUDA graph (peer cuda-graph, not what infer runs) "
                     f"{a.graph_images_per_s:.1f} img/s, "
                     f"{_x(a.graph_images_per_s / a.peer_images_per_s)}")
        lines.append(line)
    lines += [f"note: {note}" for note in result.get("notes", [])
              if note.split(" left out:")[0] == peer]
    # the figures are with the input on the GPU; a CPU run has host input only
    io = "device" if any(a.io == "device" for a in found) else "host"
    placed = [a for a in found if a.io == io]
    lines.append(_goal(f">= {RATIO_GOAL:g}x {peer} at each batch ({io} input)", [
        (f"batch {a.batch} {a.backend} {_x(a.ratio)}", _at_least(a.ratio, RATIO_GOAL))
        for a in placed]))
    lines.append(_goal(f"peak share >= {PEAK_GOAL:g} at the largest batch ({io} input)", [
        (f"batch {a.batch} {a.backend} {a.peak_fraction:.2f} of the {a.precision} GEMM peak",
         a.peak_fraction >= PEAK_GOAL) for a in placed[-1:]]))
    if io == "host":
        lines.append(f"goal host input >= {HOST_GOAL:g}x device input: not measured "
                     f"(host input only on {result.get('device')})")
    else:
        lines.append(_goal(f"host input (a batch at a time or streamed, the faster) >= "
                           f"{HOST_GOAL:g}x device input", [
            (f"batch {a.batch} {a.backend} {_x(a.host_vs_device)}",
             _at_least(a.host_vs_device, HOST_GOAL)) for a in placed]))
    return lines + levers(result, io)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("result", type=Path, help="bench --json or --report output")
    parser.add_argument("--peer", help="the peer to compare with [default: the strongest on "
                        "the result's device: " + ", ".join(
                            f"{p} on {d}" for d, p in STRONGEST.items()) + "]")
    args = parser.parse_args(argv)
    try:
        result = read_json(args.result, 16 << 20)
        if not isinstance(result, dict):
            raise BundleError("not a bench result (bench --json or --report)")
        peer = args.peer or STRONGEST.get(result.get("device"), "timm-compile")
        lines = summary(result, peer)
    except VitExportError as exc:
        print(f"error: {args.result}: {exc}", file=sys.stderr)
        return 1
    print("\n".join(lines))
    if not any(r.get("backend") == peer for r in result["rows"]):
        print(f"error: {args.result} has no row of {peer}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
