"""Per-stage divergence (validate --layers): each stage's tensor (patch embedding, every
block's attention, MLP and output, final norm) from eager PyTorch, from an ONNX model and
from a torch.export program, compared, so the first stage that diverges can be named."""
from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Optional

import numpy as np

from .. import bundle as B
from .. import runtime
from ..errors import ParityError, first_line
from ..onnxio import node_scopes
from ..pt2 import read_program
from ..verified import Loaded
from .compare import cosines
from .report import StageResult
from .tolerance import Tolerance


def stage_names(config) -> list[tuple[str, str]]:
    """(module path, label) of each stage, in forward order; only modules the config has."""
    stages = [("patch_embed", "patch embedding"), ("pos_embed", "position embedding")]
    if config.rope_type:  # where the graph computes it: a dynamic size, or kept fp32 in fp16
        stages.append(("rope", "rotary table"))
    if config.pre_norm:
        stages.append(("norm_pre", "pre-norm"))
    attention = "rotary attention" if config.rope_type else "attention"
    mlp = "SwiGLU MLP" if config.mlp_layer.startswith("swiglu") else "MLP"
    for i in range(config.depth):
        stages.append((f"blocks.{i}.attn", f"block {i} {attention}"))
        if config.init_values:
            stages.append((f"blocks.{i}.ls1", f"block {i} attention LayerScale"))
        stages.append((f"blocks.{i}.mlp", f"block {i} {mlp}"))
        if config.init_values:
            stages.append((f"blocks.{i}.ls2", f"block {i} MLP LayerScale"))
        stages.append((f"blocks.{i}", f"block {i} output"))
    if config.final_norm and not config.use_fc_norm:
        stages.append(("norm", "final norm"))
    if config.global_pool == "map":
        stages.append(("attn_pool", "attention pool"))
    if config.final_norm and config.use_fc_norm:
        stages.append(("fc_norm", "norm after pooling"))
    return stages


def _entry(config) -> str:
    """The module that takes the tokens with their position embedding: the "pos_embed"
    stage is what it receives."""
    return "norm_pre" if config.pre_norm else "blocks.0"


def eager_stages(model, x) -> dict[str, np.ndarray]:
    """Intermediate tensors of the eager model, by forward hooks."""
    import torch

    captured: dict[str, np.ndarray] = {}
    handles = []

    def keep(name):
        return lambda module, args, out: captured.__setitem__(name, out.float().cpu().numpy())

    modules = dict(model.named_modules())
    for name, _ in stage_names(model.config):
        if name == "pos_embed":  # what the entry receives: tokens + position embedding
            handles.append(modules[_entry(model.config)].register_forward_pre_hook(
                lambda module, args: captured.__setitem__(
                    "pos_embed", args[0].float().cpu().numpy())))
        else:
            handles.append(modules[name].register_forward_hook(keep(name)))
    try:
        device = next(model.parameters()).device
        with torch.inference_mode():
            model(torch.from_numpy(x).to(device))
    finally:
        for h in handles:
            h.remove()
    return captured


def onnx_stage_values(proto, config) -> dict[str, str]:
    """Module path -> the ONNX value that is that module's output.

    A module's output is the last value produced inside its scope and consumed outside it,
    unless a fused ONNX Runtime node consumes it.
    "pos_embed" is what the entry module (the first block, or norm_pre) consumes from
    outside itself.
    """
    nodes = list(proto.graph.node)
    scopes = [set(node_scopes(n)) for n in nodes]
    graph_outputs = {o.name for o in proto.graph.output}
    consumers: dict[str, list[int]] = {}
    for i, n in enumerate(nodes):
        for name in n.input:
            consumers.setdefault(name, []).append(i)
    found = {}
    for stage, _ in stage_names(config):
        if stage == "pos_embed":
            inside = [i for i, s in enumerate(scopes) if _entry(config) in s]
            produced = {o for i in inside for o in nodes[i].output}
            entering = [v for i in inside for v in nodes[i].input
                        if v and v not in produced and not _is_constant(proto, v)]
            if entering:
                found[stage] = entering[0]
            continue
        inside = {i for i, s in enumerate(scopes) if stage in s}
        for i in sorted(inside, reverse=True):
            out = nodes[i].output[0]
            outside = [c for c in consumers.get(out, []) if c not in inside]
            if out in graph_outputs or outside:
                # An ONNX Runtime fusion (com.microsoft, no scope) that takes it may hold the
                # rest of the module: SkipLayerNormalization holds the projection's bias and
                # the residual Add. Then the module has no output of its own to compare.
                if not any(nodes[c].domain == "com.microsoft" for c in outside):
                    found[stage] = out
                break
    return found


def _is_constant(proto, name: str) -> bool:
    return any(t.name == name for t in proto.graph.initializer) or any(
        n.op_type == "Constant" and name in n.output for n in proto.graph.node)


def onnx_stages(source: Path | B.OnnxModel, config, x: np.ndarray, device: str,
                tf32: bool = False) -> dict[str, np.ndarray]:
    """Run a copy of the model, in memory, with the stage values as extra graph outputs: made
    from the bytes read once (`Bundle.onnx_model`; a path is read here), its external tensors
    given from their checked bytes. The model file itself is never modified or read again.
    """
    import hashlib

    import onnx
    from onnx import shape_inference

    model = source if isinstance(source, B.OnnxModel) else B.read_onnx_file(source)
    values = onnx_stage_values(model.proto, config)
    if not values:
        return {}
    proto = onnx.ModelProto()  # the stage outputs go on a copy: the parsed graph is shared
    proto.CopyFrom(model.proto)
    typed = onnx.ModelProto()
    typed.CopyFrom(proto)
    del typed.graph.value_info[:]  # infer types afresh; converters may leave stale ones
    types = {v.name: v.type.tensor_type.elem_type
             for v in shape_inference.infer_shapes(typed).graph.value_info}
    for value in values.values():
        proto.graph.output.append(onnx.helper.make_tensor_value_info(
            value, types.get(value, onnx.TensorProto.FLOAT), None))
    data = proto.SerializeToString()
    staged = B.OnnxModel(Loaded(model.path, data, hashlib.sha256(data).hexdigest()),
                         model.external)
    runner = runtime.ort_runner(staged, device, tf32=tf32)
    names = [o.name for o in runner.session.get_outputs()]
    outputs = dict(zip(names, runner.session.run(
        None, {runner.input.name: runner.cast_input(x)})))
    return {stage: outputs[value].astype(np.float32) for stage, value in values.items()}


def program_stages(path: Path | Loaded, config, x: np.ndarray, device: str) -> dict[str, np.ndarray]:
    """The stage values of a torch.export program (model.pt2), by running its graph node by
    node: a module's output is the last node inside its scope (the nn_module_stack torch.export
    records), "pos_embed" what the first block takes from outside itself."""
    import torch

    program = read_program(path)  # refused in one line where it could run code
    try:
        if device != "cpu":
            from torch.export.passes import move_to_device_pass

            program = move_to_device_pass(program, device)
    except Exception as exc:  # deserialization raises many error types
        raise ParityError(f"cannot read the program in {path.name}: {first_line(exc)}") from None
    module = program.module()
    nodes = [n for n in module.graph.nodes if n.op == "call_function"]

    def scopes(node) -> set[str]:
        return {path for path, _ in (node.meta.get("nn_module_stack") or {}).values()}

    wanted = {}
    for stage, _ in stage_names(config):
        if stage == "pos_embed":
            entry = _entry(config)
            first = next((n for n in nodes if entry in scopes(n)), None)
            entering = [a for a in (first.all_input_nodes if first else ())
                        if a.op == "call_function" and entry not in scopes(a)]
            if entering:
                wanted[entering[0]] = stage
            continue
        inside = [n for n in nodes if stage in scopes(n)]
        if inside:
            wanted[inside[-1]] = stage
    captured: dict[str, np.ndarray] = {}

    class Keep(torch.fx.Interpreter):
        def run_node(self, node):
            out = super().run_node(node)
            if node in wanted and isinstance(out, torch.Tensor):
                captured[wanted[node]] = out.float().cpu().numpy()
            return out

    with torch.inference_mode():
        Keep(module).run(torch.from_numpy(x).to(device))
    return captured


def run_stages(model, source: Path | B.OnnxModel | Loaded, x: np.ndarray, device: str,
               tf32: bool = False) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """The stage values of eager `model` and of the ONNX model or torch.export program at
    `source` (a path, or the file as read once and checked), on the same input: (eager's,
    the file's), each stage -> values."""
    ours = eager_stages(model, x)
    path = source.path if isinstance(source, (B.OnnxModel, Loaded)) else Path(source)
    theirs = (program_stages(source, model.config, x, device) if path.name == B.PT2_FILE
              else onnx_stages(source, model.config, x, device, tf32))
    return ours, theirs


def compare_stages(name: str, config, ours: dict[str, np.ndarray],
                   theirs: dict[str, np.ndarray], batch: int, tol: Tolerance,
                   profile: str = "fp32") -> list[StageResult]:
    """Each stage of the file `name` against eager's, in forward order (pure: no running).
    A stage one side lacks, or holds in another shape, is left out."""
    results = []
    for stage, label in stage_names(config):
        if stage not in theirs or stage not in ours:
            continue
        rows = 1 if stage == "rope" else batch  # the rotary table has no batch axis
        a = ours[stage].astype(np.float64).reshape(rows, -1)
        b = theirs[stage].astype(np.float64).reshape(rows, -1)
        if a.shape != b.shape:
            continue
        norm = np.linalg.norm(a)
        rel_l2 = float(np.linalg.norm(a - b) / norm) if norm > 0 else float(np.linalg.norm(b))
        results.append(StageResult(
            name, stage, label, batch, float(np.abs(a - b).max()), rel_l2,
            float(cosines(a, b).min()), rel_l2 <= tol.stage_rel_l2, profile))
    return results


def first_divergence(results: Sequence[StageResult], tol: Tolerance) -> Optional[str]:
    """The first stage beyond `tol`, for people; None when every stage is within it."""
    bad = next((s for s in results if not s.passed), None)
    return (f"{bad.label} first exceeds rel L2 {tol.stage_rel_l2:g} ({bad.rel_l2:.3g})"
            if bad else None)
