"""The peers: ways to run the bundle's model that are not files of the bundle (PyTorch's own
fast paths, ONNX Runtime's CUDA graphs, timm's model), built beside the bundle's runners
into what bench times (runners_to_time)."""
from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Optional

from .. import bundle as B
from .. import runtime
from ..checkpoints import timm_model
from ..errors import ConfigError, ProviderError, param

# Peers: ways to run the bundle's model that are not files of the bundle, timed beside it by
# `bench --peers` -> the tolerance profile they are checked against eager with. The timm peers
# are timm's own VisionTransformer holding the bundle's weights (checkpoints.timm_model: fused
# SDPA attention), as users run it: eager, .half() and torch.compile'd (mode default, and
# reduce-overhead: CUDA graphs).
PEERS = {"eager-amp": "fp16", "torch-compile": "fp32", "torch-compile-amp": "fp16",
         "cuda-graph": None,  # cuda-graph: every ONNX runner again, by its file's profile
         "timm": "fp32", "timm-compile": "fp32", "timm-fp16": "fp16",
         "timm-compile-fp16": "fp16", "timm-compile-ro-fp16": "fp16"}
CUDA_PEERS = ("eager-amp", "torch-compile-amp", "cuda-graph", "timm-fp16", "timm-compile-fp16",
              "timm-compile-ro-fp16")
COMPILE_MODE = "max-autotune"
# torch.compile's mode for the timm peers: what a user writes (default), or reduce-overhead
TIMM_COMPILE_MODES = {"timm-compile": "default", "timm-compile-fp16": "default",
                      "timm-compile-ro-fp16": "reduce-overhead"}
CUDA_GRAPH_SUFFIX = "+cuda-graph"


def check_peers(peers: Sequence[str]) -> None:
    """Every name one of PEERS, or ConfigError naming the first that is not."""
    unknown = [p for p in peers if p not in PEERS]
    if unknown:
        raise ConfigError(f"unknown peer {unknown[0]!r}; choose from {', '.join(PEERS)}")


def peer_runners(peers: Sequence[str], eager: runtime.TorchRunner, onnx_files: dict[str, str],
                 bundle: B.Bundle) -> list[runtime.Runner]:
    """The runners of `peers` (PEERS keys) beside `eager`: autocast fp16 eager, the module
    torch.compile'd (mode max-autotune, one graph per input shape; compiled at its first
    call), each ONNX runner in `onnx_files` again with CUDA graphs, and timm's own model
    with the bundle's weights (`checkpoints.timm_model`; one line where timm's
    VisionTransformer does not build this model)."""
    import torch

    check_peers(peers)
    cuda_only = [p for p in peers if p in CUDA_PEERS]
    if cuda_only and eager.device != "cuda":
        raise ProviderError(f"peer {cuda_only[0]} needs CUDA, and this run is on "
                            f"{eager.device}")
    runners: list[runtime.Runner] = []
    timm_built = None
    for peer in peers:
        if peer == "eager-amp":
            runners.append(runtime.TorchRunner(eager.module, peer, eager.device, eager.spec,
                                               "float16"))
        elif peer.startswith("torch-compile"):
            module = torch.compile(eager.module, mode=COMPILE_MODE, dynamic=False)
            runners.append(runtime.TorchRunner(module, peer, eager.device, eager.spec,
                                               "float16" if peer.endswith("-amp") else None,
                                               True))
        elif peer.startswith("timm"):
            half = peer.endswith("-fp16")
            if half:  # a copy of its own in fp16 (.half() converts in place)
                module = _timm_peer_model(bundle, eager).half()
            else:
                timm_built = timm_built or _timm_peer_model(bundle, eager)
                module = timm_built
            mode = TIMM_COMPILE_MODES.get(peer)
            if mode:
                module = torch.compile(module, mode=mode, dynamic=False)
            runners.append(runtime.TorchRunner(module, peer, eager.device, eager.spec,
                                               compiled=mode is not None, half=half))
        elif not onnx_files:
            raise ConfigError(f"peer cuda-graph runs the ONNX models, and "
                              f"{param('runners')} chose none")
        else:
            runners += [runtime.OrtCudaGraphRunner(bundle.onnx_model(file),
                                                   name + CUDA_GRAPH_SUFFIX, eager.spec)
                        for name, file in onnx_files.items()]
    return runners


def _timm_peer_model(bundle: B.Bundle, eager: runtime.TorchRunner):
    """timm's VisionTransformer with the bundle's weights, on eager's device."""
    try:
        return timm_model(bundle.config, eager.module.state_dict()).to(eager.device)
    except ModuleNotFoundError as exc:  # timm is not a dependency of the package
        if exc.name != "timm":
            raise
        raise ConfigError("the timm peers need timm: pip install timm") from None


def runners_to_time(bundle: B.Bundle, provider: str, threads: Optional[int],
                    runners: Optional[Sequence[str]], runtimes: Sequence[str],
                    peers: Sequence[str], trust_code: bool
                    ) -> tuple[runtime.RunnerSet, list[str]]:
    """What `bench` times: every runner of the bundle on each runtime the registry lists
    (the opt-in ones where `runtimes` names them), eager first, then the `peers` that can
    run here. Returns the set and the peers left out because they need CUDA and this run
    is elsewhere (each said in a note, as any peer that cannot run here)."""
    opened = runtime.open_runners(bundle, provider, threads=threads, runners=runners,
                                  runtimes=runtimes, trust_code=trust_code)
    ort_files = {r.name: opened.onnx_files[r.name] for r in opened.candidates
                 if isinstance(r, runtime.OrtRunner)}
    unrunnable = [p for p in peers if p in CUDA_PEERS and opened.device != "cuda"]
    added = peer_runners([p for p in peers if p not in unrunnable], opened.reference,
                         ort_files, bundle)
    return dataclasses.replace(opened, runners=opened.runners + added,
                               peers=[r.name for r in added]), unrunnable
