"""How much does cutting each image's tokens into whole row blocks (runtime/ov_rows.py) gain
for a static int8 model on OpenVINO? The same file, compiled with its int8 GEMMs' rows cut
and as it is, timed in turns at each batch size.

    python benchmarks/ov_row_cut.py BUNDLE [--file model.int8-static.onnx]
                                    [--batches 1,2,4,8] [--threads 2] [--precision bf16]
                                    [--seconds 6]

BUNDLE: an export with `--quantize static` (`vit-export export DIR --preset
vit_base_patch16_224 --quantize static --calibrate calib.npz`). Prints, per batch size,
milliseconds (median) for each graph, how many MatMuls were cut, and the cut graph's
speed against the whole one, measured in the same run; and the cosine between the two
graphs' outputs. Random input: speed does not depend on it.
"""
import argparse
from pathlib import Path

import numpy as np

from vit_export import bundle as B
from vit_export import cpu, timing
from vit_export.runtime.base import InputSpec
from vit_export.runtime.ov import OpenVinoRunner


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("bundle", type=Path)
    parser.add_argument("--file", default="model.int8-static.onnx")
    parser.add_argument("--batches", default="1,2,4,8")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--precision", default="bf16" if cpu.isa().bf16 else "f32",
                        help="what OpenVINO computes the float ops in [bf16 where the CPU has it]")
    parser.add_argument("--seconds", type=float, default=6.0, help="per graph and batch size")
    args = parser.parse_args()
    found = B.read_bundle(args.bundle)
    spec = InputSpec.from_description(found.description.to_dict())
    model = found.onnx_model(args.file)  # read once and checked against config.json
    runners = {cut: OpenVinoRunner(model, args.file, args.precision, args.threads, spec,
                                   cut_rows=cut) for cut in (True, False)}
    print(f"{cpu.isa().model}; {cpu.isa().summary}; {args.threads} threads; {args.file} on "
          f"OpenVINO, {args.precision} where not int8")
    print(f"{'batch':>5} {'whole ms':>9} {'cut ms':>8} {'MatMuls cut':>11} {'speed':>6} "
          f"{'cosine':>8}")
    rng = np.random.default_rng(0)
    for batch in (int(b) for b in args.batches.split(",")):
        x = rng.standard_normal((batch, *spec.example_shape()[1:])).astype(np.float32)
        outs = {cut: runner(x) for cut, runner in runners.items()}  # compiles the shape
        series = {cut: timing.Series(lambda r=runner, x=x: r(x)) for cut, runner in runners.items()}
        for runner in runners.values():
            for _ in range(3):
                runner(x)
        timing.in_turns(list(series.values()), min_runs=10, min_seconds=args.seconds)
        whole, cut = (float(np.median(series[c].times)) for c in (False, True))
        a, b = outs[True].ravel(), outs[False].ravel()
        cosine = float(a @ b / np.linalg.norm(a) / np.linalg.norm(b))
        count = runners[True].rows_split.get(x.shape, 0)
        print(f"{batch:>5} {whole * 1e3:>9.1f} {cut * 1e3:>8.1f} {count:>11} "
              f"{whole / cut:>5.2f}x {cosine:>8.5f}")


if __name__ == "__main__":
    main()
