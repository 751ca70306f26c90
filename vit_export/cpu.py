"""What this CPU can do: its vector ISA, and the GEMM peak of each precision, measured now.

The ISA decides which reduced precisions have a hardware path: bf16 needs AVX-512 BF16 or
AMX; int8 GEMMs run everywhere ONNX Runtime runs, fastest with a dot-product instruction
(AVX-512 VNNI, AVX-VNNI or AMX). A precision without a hardware path is reported as such,
never timed as if it had one.
"""
from __future__ import annotations

import platform
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Optional

from .timing import seconds

# /proc/cpuinfo flag -> the name people use for it
ISA_FLAGS = {"avx2": "AVX2", "avx512f": "AVX-512", "avx512_vnni": "AVX512-VNNI",
             "avx_vnni": "AVX-VNNI", "avx512_bf16": "AVX512-BF16", "amx_bf16": "AMX-BF16",
             "amx_int8": "AMX-INT8"}


@dataclass(frozen=True)
class Isa:
    """The vector extensions of the CPU that runs this process (Linux: /proc/cpuinfo)."""
    model: str  # "AMD EPYC 7B13", or platform.processor() elsewhere
    flags: frozenset[str]  # the ISA_FLAGS keys present

    @property
    def int8_dot(self) -> bool:
        """A u8 x s8 dot product that accumulates in int32 (no int16 saturation)."""
        return bool(self.flags & {"avx512_vnni", "avx_vnni", "amx_int8"})

    @property
    def bf16(self) -> bool:
        """bf16 arithmetic in hardware (dot products or tiles), not emulated in fp32."""
        return bool(self.flags & {"avx512_bf16", "amx_bf16"})

    @property
    def summary(self) -> str:
        """"AVX2 (no AVX-512, VNNI, AMX, BF16)" or "AVX2, AVX-512, AVX512-VNNI, AMX-BF16"."""
        have = [ISA_FLAGS[f] for f in ISA_FLAGS if f in self.flags]
        missing = [name for name, present in (
            ("AVX-512", "avx512f" in self.flags),
            ("VNNI", bool(self.flags & {"avx512_vnni", "avx_vnni"})),
            ("AMX", bool(self.flags & {"amx_bf16", "amx_int8"})), ("BF16", self.bf16))
            if not present]
        text = ", ".join(have) or "no AVX2"
        return f"{text} (no {', '.join(missing)})" if missing else text


def parse_cpuinfo(text: str) -> Isa:
    """The Isa described by the text of /proc/cpuinfo (its first processor)."""
    model, flags = "", set()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip()
        if key == "model name" and not model:
            model = value.strip()
        elif key == "flags" and not flags:
            flags = set(value.split())
    return Isa(model or platform.processor() or "unknown CPU",
               frozenset(flags & set(ISA_FLAGS)))


def isa(cpuinfo: str = "/proc/cpuinfo") -> Isa:
    """This CPU's Isa; an empty flag set where /proc/cpuinfo cannot be read (not Linux)."""
    try:
        with open(cpuinfo, encoding="utf-8", errors="replace") as f:
            return parse_cpuinfo(f.read())
    except OSError:
        return Isa(platform.processor() or "unknown CPU", frozenset())


# ---------------------------------------------------------------- GEMM peaks


@dataclass
class Peak:
    """The rate of one precision's GEMM, measured now."""
    precision: str  # fp32 | bf16 | int8
    gflops: float  # GFLOP/s (int8: GOP/s), 2 per multiply-add
    kernel: str  # what was timed
    hardware: bool  # a hardware path exists for it on this CPU
    note: str = ""
    statistic: str = "best"  # of a few calls; "median" of calls timed in turns (bench)


@dataclass
class Gemm:
    """One precision's peak GEMM, ready to time: `call` does `ops` operations, and `peak`
    describes it (its gflops is 0 until timed)."""
    call: Callable[[], object]
    ops: float
    peak: Peak

    def timed(self, seconds_per_call: float, statistic: str = "best") -> Peak:
        return replace(self.peak, gflops=self.ops / seconds_per_call / 1e9,
                       statistic=statistic)


def _best_seconds(fn: Callable[[], object], repeats: int) -> float:
    return min(seconds(fn, warmup=1, min_runs=repeats))


def fp32_gemm(n: int = 2048) -> Gemm:
    """torch.mm on n x n fp32 matrices, with torch's current thread count."""
    import torch

    a, b = torch.randn(n, n), torch.randn(n, n)
    return Gemm(lambda: torch.mm(a, b), 2 * n ** 3,
                Peak("fp32", 0.0, f"torch.mm fp32 {n}x{n}", True))


def bf16_gemm(cpu: Isa, n: int = 2048) -> Gemm:
    """torch.mm on bf16 matrices. Without bf16 hardware torch emulates it, thousands of
    times slower: a 256 probe is timed instead, so the run does not stall, and said so."""
    import torch

    size = n if cpu.bf16 else 256
    a, b = torch.randn(size, size).bfloat16(), torch.randn(size, size).bfloat16()
    note = "" if cpu.bf16 else "no bf16 hardware (needs AVX512-BF16 or AMX): emulated"
    return Gemm(lambda: torch.mm(a, b), 2 * size ** 3,
                Peak("bf16", 0.0, f"torch.mm bf16 {size}x{size}", cpu.bf16, note))


def _matmul_graph(n: int, int8: bool, chain: int = 1) -> bytes:
    """An ONNX model of n x n GEMMs against constant weights: `chain` fp32 MatMuls, each
    taking the last one's output (weights scaled by 1/sqrt(n), so the values stay near 1),
    or one int8 GEMM (`int8`: MatMulInteger u8 x s8 -> int32 for ONNX Runtime; OpenVINO
    runs its QDQ form, Quantize/DequantizeLinear around an fp32 MatMul, as int8)."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    if not int8:
        names = ["a"] + [f"y{i}" for i in range(1, chain)] + ["y"]
        nodes = [helper.make_node("MatMul", [names[i], f"w{i}"], [names[i + 1]])
                 for i in range(chain)]
        a, out = TensorProto.FLOAT, TensorProto.FLOAT
        weights = [numpy_helper.from_array(
            rng.standard_normal((n, n), dtype=np.float32) / np.float32(n ** 0.5), f"w{i}")
            for i in range(chain)]
    else:
        nodes, a, out = [helper.make_node("MatMulInteger", ["a", "w"], ["y"])], \
            TensorProto.UINT8, TensorProto.INT32
        weights = [numpy_helper.from_array(rng.integers(-128, 128, (n, n), dtype=np.int8),
                                           "w")]
    graph = helper.make_graph(nodes, "gemm", [helper.make_tensor_value_info("a", a, [n, n])],
                              [helper.make_tensor_value_info("y", out, [n, n])], weights)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)
    return model.SerializeToString()


def _qdq_graph(n: int) -> bytes:
    """The QDQ int8 GEMM (what a static int8 model holds), for OpenVINO."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    consts = [numpy_helper.from_array(np.array(v, dtype), name) for v, dtype, name in
              ((0.05, np.float32, "sa"), (128, np.uint8, "za"), (0.01, np.float32, "sw"),
               (0, np.int8, "zw"))]
    consts.append(numpy_helper.from_array(rng.integers(-127, 128, (n, n), dtype=np.int8), "w"))
    nodes = [helper.make_node("QuantizeLinear", ["a", "sa", "za"], ["qa"]),
             helper.make_node("DequantizeLinear", ["qa", "sa", "za"], ["da"]),
             helper.make_node("DequantizeLinear", ["w", "sw", "zw"], ["dw"]),
             helper.make_node("MatMul", ["da", "dw"], ["y"])]
    graph = helper.make_graph(
        nodes, "qdq_gemm", [helper.make_tensor_value_info("a", TensorProto.FLOAT, [n, n])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [n, n])], consts)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)
    return model.SerializeToString()


def onnxruntime_gemm(precision: str, cpu: Isa, threads: Optional[int],
                     n: int = 2048) -> Gemm:
    """ONNX Runtime's fp32 MatMul (MLAS sgemm), or its MatMulInteger u8 x s8 -> int32 (the
    MLAS kernel our int8 models run; torch._int_mm has no optimized CPU kernel)."""
    import numpy as np
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 3
    if threads:
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
    int8 = precision == "int8"
    session = ort.InferenceSession(_matmul_graph(n, int8), options,
                                   providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(1)
    a = rng.integers(0, 256, (n, n), dtype=np.uint8) if int8 else \
        rng.standard_normal((n, n), dtype=np.float32)
    note = "no VNNI: u8 x s8 pairs summed in int16 (vpmaddubsw)" \
        if int8 and not cpu.int8_dot else ""
    kernel = f"onnxruntime {'MatMulInteger u8s8' if int8 else 'MatMul fp32'} {n}x{n}"
    return Gemm(lambda: session.run(None, {"a": a}), 2 * n ** 3,
                Peak(precision, 0.0, kernel, True, note))


# GEMMs in a row in OpenVINO's fp32 and bf16 peak graphs (see openvino_gemm)
FLOAT_CHAIN = 4


def openvino_gemm(precision: str, cpu: Isa, threads: Optional[int],
                  n: int = 2048) -> Optional[Gemm]:
    """OpenVINO's CPU plugin on the same GEMM: fp32 (f32 asked), bf16 (the fp32 graph with
    bf16 asked) or int8 (the QDQ graph); None where OpenVINO is not installed or the CPU
    has no bf16 instructions. fp32 and bf16 time FLOAT_CHAIN GEMMs in a row: a call also
    converts its fp32 input to bf16 and its output back, which cost one GEMM's call a
    tenth of its rate (838 against 957 GFLOP/s on a Zen 5, measured), so a ViT whose
    activations stay bf16 from layer to layer outran the peak of one."""
    try:
        import openvino
    except ImportError:
        return None
    if precision == "bf16" and not cpu.bf16:
        return None
    import numpy as np

    core = openvino.Core()
    config = {"PERFORMANCE_HINT": "LATENCY",
              "INFERENCE_PRECISION_HINT": "bf16" if precision == "bf16" else "f32"}
    if threads:
        config["INFERENCE_NUM_THREADS"] = int(threads)
    chain = 1 if precision == "int8" else FLOAT_CHAIN
    graph = _qdq_graph(n) if precision == "int8" else _matmul_graph(n, False, chain)
    request = core.compile_model(core.read_model(graph), "CPU", config).create_infer_request()
    a = np.random.default_rng(1).standard_normal((n, n), dtype=np.float32)
    kernel = f"openvino MatMul {'QDQ int8' if precision == 'int8' else precision} {n}x{n}"
    kernel += f", {chain} in a row" if chain > 1 else ""
    return Gemm(lambda: request.infer({0: a}), chain * 2 * n ** 3,
                Peak(precision, 0.0, kernel, True))


def gemms(threads: Optional[int] = None, cpu: Optional[Isa] = None,
          openvino: bool = False) -> dict[str, Gemm]:
    """Each runtime's GEMM of each precision, to be timed (bench times them in turns with its
    runners): key "PRECISION KERNEL". A precision's peak is the fastest of its GEMMs
    (`fastest`), so no row can pass it: torch.mm and ONNX Runtime's MatMul (faster than
    torch.mm in fp32 on Zen 5) always, OpenVINO's where `openvino` (its runners are timed)
    and it is installed. (An OpenVINO CPU plugin loaded in a process that is then sent
    SIGTERM during torch.export crashed it, measured: it is loaded only where it runs.)"""
    cpu = cpu or isa()
    found = [fp32_gemm(), onnxruntime_gemm("fp32", cpu, threads), bf16_gemm(cpu),
             onnxruntime_gemm("int8", cpu, threads)]
    found += [openvino_gemm(p, cpu, threads) for p in ("fp32", "bf16", "int8") if openvino]
    return {f"{g.peak.precision} {g.peak.kernel}": g for g in found if g is not None}


def fastest(peaks: dict[str, Peak]) -> dict[str, Peak]:
    """Each precision's fastest timed GEMM, of `peaks` keyed as `gemms` keys them."""
    best: dict[str, Peak] = {}
    for peak in peaks.values():
        if peak.precision not in best or peak.gflops > best[peak.precision].gflops:
            best[peak.precision] = peak
    return best


def fp32_peak(n: int = 2048, repeats: int = 5) -> Peak:
    gemm = fp32_gemm(n)
    return gemm.timed(_best_seconds(gemm.call, repeats))


def bf16_peak(cpu: Isa, n: int = 2048, repeats: int = 3) -> Peak:
    gemm = bf16_gemm(cpu, n)
    return gemm.timed(_best_seconds(gemm.call, repeats))


def gemm_peaks(threads: Optional[int] = None, cpu: Optional[Isa] = None,
               openvino: bool = False) -> dict[str, Peak]:
    """fp32, bf16 and int8 GEMM peaks, each the fastest runtime's best of a few calls,
    measured now (CPU; OpenVINO's too where `openvino`)."""
    return fastest({key: gemm.timed(_best_seconds(gemm.call, 3 if key.startswith("bf16")
                                                  else 5))
                    for key, gemm in gemms(threads, cpu, openvino).items()})
