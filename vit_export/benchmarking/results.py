"""What bench measures, as data: a row per runner, batch size and input placement
(BenchRow), the run's result (BenchResult), and what the figures are measured against: a
model's FLOPs per image and the GEMM precision each tolerance profile is held to."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from .. import cpu

# A model's tolerance profile -> the precision its GEMMs run in, whose peak it is held to.
# CPUs have no fp16 GEMM that ONNX Runtime uses: fp16 rows are held to the fp32 peak there;
# on CUDA to the fp16 peak (int8 has no CUDA peak measured: held to fp16's).
PRECISION_OF_PROFILE = {"fp32": "fp32", "tf32": "fp32", "fp16": "fp32", "int8": "int8",
                        "int8-static": "int8", "bf16": "bf16"}
CUDA_PRECISION_OF_PROFILE = {"fp32": "fp32", "tf32": "fp32", "fp16": "fp16", "int8": "fp16",
                             "int8-static": "fp16"}


@dataclass
class BenchRow:
    backend: str  # eager, torchscript, onnxruntime, onnxruntime[model.int8.onnx], ...
    device: str  # where it ran: cpu | cuda
    io: str  # host: numpy in and out, a batch at a time; stream (CUDA, runners that stage
    # host input): STREAM_BATCHES host batches through runtime.stream, the next one's copy
    # overlapping the current run, per batch; device: a tensor already on the device
    batch: int
    runs: int
    p50_ms: float
    p90_ms: float
    p99_ms: float
    images_per_s: float
    gflops: float  # effective: model FLOPs / median latency
    peak_fraction: float  # gflops / measured GEMM peak of this row's precision
    speedup: float  # eager p50 / this p50, same batch size and input placement
    peak_rss_mb: float  # resident memory high-water mark while it first ran
    precision: str = "fp32"  # whose GEMM peak peak_fraction is against: fp32 | bf16 | int8
    # (CPU), fp32 | fp16 (CUDA)
    validated: bool = False  # its parity at export passed (eager, the reference, always);
    # for a peer (`bench --peers`): its output matched eager's at this batch in this run
    peer: bool = False  # not a file of the bundle: timed for comparison, never recommended


@dataclass
class BenchResult:
    model: str
    threads: int
    device: str  # where every backend ran: the device ONNX Runtime really got
    matmul_peak_gflops: float  # fp32, measured in this run
    gflop_per_image: float
    batch_sizes: list[int]
    rows: list[BenchRow]
    settings: dict[str, Any] = field(default_factory=dict)  # threads of each runtime, spinning
    versions: dict[str, str] = field(default_factory=dict)
    cpu_model: str = ""
    isa: str = ""  # "AVX2 (no AVX-512, VNNI, AMX, BF16)"
    peaks: dict[str, dict[str, Any]] = field(default_factory=dict)  # precision -> cpu.Peak
    recommendation: dict[int, dict[str, Any]] = field(default_factory=dict)  # see recommend
    gpu: str = ""  # on CUDA: the device, CUDA version and driver
    # peers left out, and why; runners whose answers depend on the batch (BATCH_DEPENDENT)
    notes: list[str] = field(default_factory=list)
    files: dict[str, str] = field(default_factory=dict)  # the sha256s of the files timed
    # backend -> its top-1 accuracy on the labelled images its parity.json measured, beside
    # eager's (`parity.labelled_accuracy`): a quantized model's speed next to what it costs
    accuracy: dict[str, dict[str, Any]] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def model_flops(config) -> float:
    """Forward FLOPs of one image (2 per multiply-add; softmax, norms, GELU not counted)."""
    D, T = config.embed_dim, config.num_patches + config.num_prefix_tokens
    hidden = int(D * config.mlp_ratio)
    glu = config.mlp_layer == "swiglu_packed"  # fc2 takes half of fc1's width
    patch = config.num_patches * D * config.in_chans * config.patch_size ** 2
    block = T * D * 3 * D + 2 * T * T * D + T * D * D + (1.5 if glu else 2) * T * D * hidden
    # the classifier (or CLIP's projection) runs unless the output is the features before it
    names = config.output_names  # the head runs for logits, or for a projection's embedding
    skipped = "logits" not in names and not ("embedding" in names and config.projection_head)
    head = 0 if skipped else config.num_features * max(config.num_classes, 0)
    if config.representation_size:
        head += D * config.representation_size
    if config.global_pool == "map":  # one latent query over the patch tokens, then an MLP
        head += 2 * D * D + 2 * config.num_patches * D * D + 2 * config.num_patches * D \
            + 2 * D * hidden
    return 2.0 * (patch + config.depth * block + head)


def matmul_peak_gflops(n: int = 2048, repeats: int = 5) -> float:
    """Best fp32 GEMM rate of this machine now, by torch.mm on n x n matrices (CPU, with
    torch's current thread count)."""
    return cpu.fp32_peak(n, repeats).gflops
