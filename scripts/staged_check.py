"""Host input through the staging buffers (what validate, infer, serve and Ray Data run)
against ONNX Runtime's own run of the same session on the same inputs, for each ONNX model of
a bundle, on one provider. A runner is opened as infer opens it (runtime.open_runner), then:

  alone    each batch size staged (`run_all` on numpy) against `run_unstaged`
  threads  two threads share the runner, each submitting its own batches of other sizes
           in turn (the slots are refitted under them), each answer against the own run

fp32 graphs (model.onnx, model.opt.onnx, model.e2e.onnx) must be bit-equal: it is the same
session running the same kernels, only where the input and output live differs. Reduced
precisions are held to their tolerance profile's max abs error, and whether they were
bit-equal is printed. One line per model and check; exit 1 on any difference, or where a
runner asked for cuda did not run there.

    python scripts/staged_check.py BUNDLE [--provider cpu|cuda] [--files model.onnx,...]
        [--batch-sizes 1,3,7,64] [--rounds 12]
"""
import argparse
import sys
import threading
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from vit_export import bundle as B
from vit_export import runtime
from vit_export.errors import VitExportError
from vit_export.parity.tolerance import profile_tolerance

EXACT = ("fp32", "e2e")  # profiles whose graph computes in fp32: the staged run is bit-equal


def inputs(bundle, file: str, batch: int, seed: int) -> np.ndarray:
    """A batch the model takes: uint8 images for model.e2e.onnx, else normal pixels."""
    config = bundle.description.config
    rng = np.random.default_rng(seed)
    if file == bundle.e2e_model:
        return rng.integers(0, 256, (batch, config.img_size, config.img_size, config.in_chans),
                            dtype=np.uint8)
    return rng.standard_normal((batch, config.in_chans, config.img_size,
                                config.img_size)).astype(np.float32)


def worst(got: dict, want: dict) -> float:
    """The largest abs difference over every output (inf where the names or shapes differ)."""
    if got.keys() != want.keys() or any(got[k].shape != want[k].shape for k in want):
        return float("inf")
    return max(float(np.abs(got[k].astype(np.float64) - want[k]).max(initial=0.0))
               for k in want)


def check(bundle, file: str, profile: str, provider: str, batches: list[int],
          rounds: int) -> bool:
    runner = runtime.open_runner(bundle, bundle.runner_name(file), provider)
    if provider != "auto" and runner.device != provider:
        print(f"{file}: asked for {provider}, ran on {runner.device}")
        return False
    allowed = 0.0 if profile in EXACT else profile_tolerance(profile).atol
    bound = "bit-equal" if allowed == 0.0 else f"max abs <= {allowed:g}"
    xs = {b: inputs(bundle, file, b, seed=b) for b in batches}
    own = {b: runner.run_unstaged(runner.cast_input(x)) for b, x in xs.items()}
    diffs = {b: worst(runner.run_all(x), own[b]) for b, x in xs.items()}
    ok = all(d <= allowed for d in diffs.values())
    print(f"{file} on {runner.device}, staged against the own run, {bound}: "
          + ", ".join(f"batch {b} {d:.1e}" for b, d in diffs.items())
          + ("" if ok else "  DIFFERS"))
    # two threads, each its own half of the sizes, every answer checked against the own run
    halves = [batches[0::2], batches[1::2] or batches[0::2]]
    found: list[list[float]] = [[], []]
    errors: list[str] = []

    def work(t: int) -> None:
        try:
            for i in range(rounds):
                b = halves[t][i % len(halves[t])]
                found[t].append(worst(runner.run_all(xs[b]), own[b]))
        except Exception as exc:  # reported below, as a failed check
            errors.append(f"thread {t}: {type(exc).__name__}: {exc}")

    threads = [threading.Thread(target=work, args=(t,)) for t in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    every = found[0] + found[1]
    exact = sum(d == 0.0 for d in every)
    shared = not errors and len(every) == 2 * rounds and all(d <= allowed for d in every)
    print(f"{file} on {runner.device}, two threads sharing the runner, {rounds} batches each "
          f"(sizes {halves[0]} and {halves[1]}): {exact} of {len(every)} bit-equal, worst "
          f"{max(every, default=float('nan')):.1e}" + ("" if shared else "  DIFFERS")
          + "".join(f"; {e}" for e in errors))
    return ok and shared


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("bundle", type=Path)
    parser.add_argument("--provider", choices=runtime.PROVIDER_CHOICES, default="auto")
    parser.add_argument("--files", help="ONNX files of the bundle, comma-separated [default: "
                        "every one, model.e2e.onnx included]")
    parser.add_argument("--batch-sizes", default="1,3,7,64")
    parser.add_argument("--rounds", type=int, default=12, help="batches per thread")
    args = parser.parse_args(argv)
    try:
        bundle = B.read_bundle(args.bundle)
        models = dict(bundle.onnx_models)
        if bundle.e2e_model:
            models[bundle.e2e_model] = "e2e"
        files = args.files.split(",") if args.files else list(models)
        missing = [f for f in files if f not in models]
        if missing:
            print(f"error: {args.bundle} has no {', '.join(missing)} (it has "
                  f"{', '.join(models)})", file=sys.stderr)
            return 1
        batches = [int(b) for b in args.batch_sizes.split(",")]
        results = [check(bundle, f, models[f], args.provider, batches, args.rounds)
                   for f in files]
    except VitExportError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0 if all(results) else 1


if __name__ == "__main__":
    sys.exit(main())
