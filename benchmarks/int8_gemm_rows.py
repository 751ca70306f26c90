"""How fast is one int8 GEMM of a ViT on each runtime, by its number of rows? A ViT at batch 1
gives its GEMMs one image's tokens as rows (197 for a 224 px /16 model); a runtime that
works in blocks of rows pays for the last block whole.

    python benchmarks/int8_gemm_rows.py [--rows 192,197,200,208,224,256] [--k 768]
                                        [--n 2304] [--threads 2] [--rounds 10]
                                        [--seconds 2]

Builds the GEMM as static int8 writes it (QDQ: uint8 activations per tensor, int8 weights
per output channel, a MatMul between the DequantizeLinear nodes), then times it on ONNX
Runtime and, when installed, on OpenVINO's CPU plugin (int8, the rest bf16 where the CPU
has bf16). Each runtime's row counts are timed in turns (timing.in_turns), so a busy moment
falls on all alike; one runtime after the other, so neither's threads wait on the other's. Prints milliseconds (median), GOP/s, and the time against the first row
count's on the same runtime.
"""
import argparse

import numpy as np
from onnx import TensorProto, helper, numpy_helper

from vit_export import cpu, timing


def qdq_gemm(rows: int, k: int, n: int) -> bytes:
    """x[rows, k] (float) -> Q/DQ uint8 -> MatMul with DQ(int8 weight, per column)."""
    rng = np.random.default_rng(0)
    nodes = [helper.make_node("QuantizeLinear", ["x", "xs", "xz"], ["xq"]),
             helper.make_node("DequantizeLinear", ["xq", "xs", "xz"], ["xd"]),
             helper.make_node("DequantizeLinear", ["w", "ws", "wz"], ["wd"], axis=1),
             helper.make_node("MatMul", ["xd", "wd"], ["y"])]
    weights = [numpy_helper.from_array(np.float32(0.02), "xs"),
               numpy_helper.from_array(np.uint8(128), "xz"),
               numpy_helper.from_array(rng.integers(-127, 128, (k, n), dtype=np.int8), "w"),
               numpy_helper.from_array(np.full(n, 0.01, np.float32), "ws"),
               numpy_helper.from_array(np.zeros(n, np.int8), "wz")]
    graph = helper.make_graph(nodes, "int8_gemm",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [rows, k])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [rows, n])],
                              weights)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)
    return model.SerializeToString()


def ort_call(model: bytes, x: np.ndarray, threads: int):
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads, options.inter_op_num_threads = threads, 1
    options.log_severity_level = 3
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    session = ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])
    return lambda: session.run(None, {"x": x})


def openvino_call(model: bytes, x: np.ndarray, threads: int):
    import openvino

    core = openvino.Core()
    hint = "bf16" if cpu.isa().bf16 else "f32"
    compiled = core.compile_model(core.read_model(model, b""), "CPU", {
        "PERFORMANCE_HINT": "LATENCY", "INFERENCE_PRECISION_HINT": hint,
        "INFERENCE_NUM_THREADS": threads})
    request = compiled.create_infer_request()
    return lambda: request.infer({0: x})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", default="192,197,200,208,224,256")
    parser.add_argument("--k", type=int, default=768)
    parser.add_argument("--n", type=int, default=2304)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--seconds", type=float, default=2.0, help="per row count, in all")
    args = parser.parse_args()
    rows = [int(r) for r in args.rows.split(",")]
    runtimes = {"onnxruntime": ort_call}
    try:
        import openvino  # noqa: F401

        runtimes["openvino"] = openvino_call
    except ImportError:
        print("OpenVINO is not installed: ONNX Runtime only")
    rng = np.random.default_rng(1)
    series = {}
    for name, make in runtimes.items():
        for m in rows:
            call = make(qdq_gemm(m, args.k, args.n),
                        rng.standard_normal((m, args.k)).astype(np.float32), args.threads)
            for _ in range(5):
                call()
            series[name, m] = timing.Series(call)
    for name in runtimes:  # one runtime at a time: its threads never wait on the other's
        timing.in_turns([series[name, m] for m in rows], min_runs=args.rounds,
                        min_seconds=args.seconds, turns=args.rounds)
    print(f"{cpu.isa().model}; {cpu.isa().summary}; {args.threads} threads; "
          f"int8 GEMM [rows x {args.k}] x [{args.k} x {args.n}]")
    print(f"{'runtime':<12} {'rows':>5} {'ms':>8} {'GOP/s':>7} {'time vs first':>13}")
    for name in runtimes:
        first = float(np.median(series[name, rows[0]].times))
        for m in rows:
            ms = float(np.median(series[name, m].times))
            rate = 2 * m * args.k * args.n / ms / 1e9
            print(f"{name:<12} {m:>5} {ms * 1e3:>8.3f} {rate:>7.0f} {ms / first:>12.2f}x")


if __name__ == "__main__":
    main()
