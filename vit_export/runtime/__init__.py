"""Runners: everything that turns an input batch into logits, behind one protocol.

A runner has a `name` ("eager", "torchscript", "pt2", "aoti", "onnxruntime",
"onnxruntime[model.int8.onnx]", "openvino", "openvino-bf16",
"openvino-bf16[model.int8-static.onnx]"), the `device` it really runs on
("cuda" or "cpu") and `__call__`: a numpy array in gives a numpy array out; a torch tensor in
gives a torch tensor out on the runner's device, without a host copy when the tensor is
already there (ONNX Runtime through IO binding).

`open_runners(bundle, provider)` builds every runner of a bundle on one device: the device
the ONNX Runtime sessions really run on, so eager PyTorch runs there too. onnxruntime-gpu
lists CUDAExecutionProvider even on a machine without a GPU, and a session asked for CUDA
there silently runs on CPU: only `session.get_providers()` tells the truth, so that is what
we check. The runners know nothing of the model; a bundle hands them its eager module.

One module per job, every public name re-exported here:
  base.py      the Runner protocol, InputSpec, providers and devices, process-wide state
               (TF32, threads), whether CUDA loads, memory released, RunnerSet
  staging.py   host input through reused buffers: pinned on CUDA, IO binding, the next
               batch's copy overlapped with the current run (stream)
  ort.py       ONNX Runtime sessions with verified providers; the CUDA-graph runner
  pytorch.py   eager, TorchScript, torch.export program and AOTInductor package runners
  ov.py        OpenVINO's CPU runners (an extra)
  registry.py  the runtimes, one registration each (each module declares its `Runtime`):
               runner names parsed, a bundle's or a file's runners listed, extras checked
  choice.py    which runners a command opens: open_runners, open_runner (--runtime
               auto's policy reads parity.json and performance.json: vit_export/choosing.py)
"""
from .base import (
    DEFAULT_PROVIDER,
    DEVICES,
    MAX_THREADS,
    PROVIDER_CHOICES,
    PROVIDERS,
    RELEASE_ABOVE,
    Deferred,
    InputSpec,
    Runner,
    RunnerSet,
    Runtime,
    Source,
    Target,
    check_real,
    cuda_problem,
    release_memory,
    tf32,
    torch_cuda,
    torch_device,
    torch_threads,
)
from .choice import (
    AUTO,
    DEFAULT_RUNNER,
    bundle_source,
    file_runner,
    open_runner,
    open_runners,
    runner_names,
)
from .ort import (
    HEAVY_OPS,
    OrtCudaGraphRunner,
    OrtRunner,
    check_fits,
    heavy_ops_on_cpu,
    node_placement,
    ort_log_level,
    ort_runner,
)
from .ov import OPENVINO_EXTRA, OPENVINO_PRECISIONS, OpenVinoRunner, openvino_runners
from .pytorch import COMPILE_SHAPES, TorchRunner, load_torch_file, load_torchscript
from .registry import (
    CODE_RUNNERS,
    FILE_RUNNERS,
    RUNNER_NAME,
    RUNTIMES,
    bundle_runners,
    check_runtimes,
    file_runners,
)
from .staging import Staged, Staging, stream

__all__ = [
    "AUTO", "CODE_RUNNERS", "COMPILE_SHAPES", "DEFAULT_PROVIDER", "DEFAULT_RUNNER", "DEVICES",
    "FILE_RUNNERS", "HEAVY_OPS", "MAX_THREADS", "OPENVINO_EXTRA", "OPENVINO_PRECISIONS",
    "PROVIDERS", "PROVIDER_CHOICES", "RELEASE_ABOVE", "RUNNER_NAME", "RUNTIMES", "Deferred", "InputSpec",
    "OpenVinoRunner", "OrtCudaGraphRunner", "OrtRunner", "Runner", "RunnerSet", "Runtime",
    "Source", "Staged", "Staging", "Target", "TorchRunner", "bundle_runners", "bundle_source",
    "check_fits", "check_real", "check_runtimes", "cuda_problem", "file_runner", "file_runners",
    "heavy_ops_on_cpu", "load_torch_file", "load_torchscript", "node_placement", "open_runner",
    "open_runners", "openvino_runners", "ort_log_level", "ort_runner", "release_memory",
    "runner_names", "stream", "tf32", "torch_cuda", "torch_device", "torch_threads",
]
