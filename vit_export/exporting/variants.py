"""The ONNX models derived from model.onnx: fp16, ONNX Runtime's optimized graph (in fp32,
and in fp16), dynamic int8 and static int8 calibrated on real images. Each is made with ONNX
Runtime's own tools and saved beside model.onnx, carrying the same description."""
from __future__ import annotations

import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Optional

import onnx

from .. import bundle as B
from .. import cpu, fusion
from ..errors import ExportError, first_line, param
from ..onnxio import captured, node_scopes, save_onnx

# Modules the fp16 variant computes in fp32: the rotary tables (angles of far patches lose
# their phase in fp16; docs: guides/families.md, "Rotary ViTs")
FP32_SCOPES = ("rope",)
PRECISIONS = ("fp32", "fp16")  # fp16 adds the "fp16" variant beside the fp32 model.onnx
# --quantize: "int8" dynamic (activation scales computed at run time), "static" int8
# calibrated on real images (--calibrate), activation scales fixed in the graph.
QUANTIZATIONS = ("int8", "static")

# kind -> (file name, tolerance profile it is validated with)
VARIANTS = {
    "fp16": ("model.fp16.onnx", "fp16"),
    "optimized": ("model.opt.onnx", "fp32"),
    "optimized-fp16": ("model.opt.fp16.onnx", "fp16"),
    "int8": ("model.int8.onnx", "int8"),
    "static": ("model.int8-static.onnx", "int8-static"),
}
# Files whose answer for one image depends on the images batched with it, and why: said
# wherever one is chosen for batched traffic (bench, bench --record, serve, triton).
BATCH_DEPENDENT = {
    "model.int8.onnx": "dynamic int8 quantizes each activation with one range taken over the "
                       "whole batch, so an image's answer depends on the images batched with "
                       "it (model.int8-static.onnx fixes its ranges at calibration and does "
                       "not)",
}
CALIBRATION_METHOD = "minmax"  # onnxruntime's MinMax: fast, and ViT's weight GEMM inputs
# are LayerNorm / GELU outputs without the long tails that need percentile or entropy.


def batch_dependence(name: str) -> Optional[str]:
    """Why the answers of `name` (a file of BATCH_DEPENDENT, or a runner of one, e.g.
    "onnxruntime[model.int8.onnx]") depend on the batch, for people; None for the others."""
    file = name[name.index("[") + 1:name.rindex("]")] if "[" in name and "]" in name else name
    return f"{name}: {BATCH_DEPENDENT[file]}" if file in BATCH_DEPENDENT else None


def _unshare_initializers(proto: onnx.ModelProto) -> None:
    """Give every use of a shared initializer its own copy.

    The dynamo exporter shares identical initializers (LayerNorm ones and zeros) between
    nodes; ONNX Runtime's fp16 converter then writes duplicate Cast names. Only small
    constant vectors are shared, so the copies cost little.
    """
    inits = {t.name: t for t in proto.graph.initializer}
    uses: dict[str, int] = {}
    for node in proto.graph.node:
        for i, name in enumerate(node.input):
            if name in inits:
                uses[name] = uses.get(name, 0) + 1
                if uses[name] > 1:
                    copy = onnx.TensorProto()
                    copy.CopyFrom(inits[name])
                    copy.name = f"{name}__use{uses[name]}"
                    proto.graph.initializer.append(copy)
                    node.input[i] = copy.name


def _converter_input(source: Path) -> onnx.ModelProto:
    """model.onnx as ONNX Runtime's converters want it: no initializer shared between nodes,
    no value_info (they rewrite the graph, and stale shapes then contradict inference)."""
    proto = onnx.load(str(source))
    _unshare_initializers(proto)
    del proto.graph.value_info[:]
    return proto


def fp32_nodes(proto: onnx.ModelProto, scopes: Sequence[str] = FP32_SCOPES) -> list[str]:
    """Names of the nodes inside the modules `scopes` names (by the exporter's scope
    metadata or node names): what the fp16 conversion leaves in fp32."""
    return [n.name for n in proto.graph.node
            if n.name and any(s in node_scopes(n) for s in scopes)]


def _mend_blocked_casts(proto: onnx.ModelProto) -> None:
    """What ONNX Runtime's converter (1.31) does to a chain of node_block_list nodes, undone:
    it casts each value between two of them to fp16 and back (rounding the fp32 chain at
    every step), and casts a value once per blocked reader, every Cast under the same name.
    Each fp32 -> fp16 -> fp32 round trip is bypassed, repeated Casts and unread ones go."""
    nodes = list(proto.graph.node)
    producer = {o: n for n in nodes for o in n.output}

    def cast_to(node) -> int:
        return next((a.i for a in node.attribute if a.name == "to"), -1)

    outputs = {o.name for o in proto.graph.output}  # a Cast making one stays
    renamed: dict[str, str] = {}
    for node in nodes:
        source = producer.get(node.input[0]) if node.op_type == "Cast" and node.input else None
        if cast_to(node) == onnx.TensorProto.FLOAT and source is not None \
                and node.output[0] not in outputs \
                and source.op_type == "Cast" and cast_to(source) == onnx.TensorProto.FLOAT16:
            renamed[node.output[0]] = source.input[0]  # the fp32 value before the trip
    seen, kept = set(), []
    for node in nodes:
        key = (node.op_type, tuple(node.input), tuple(node.output))
        if node.output[0] in renamed or (node.op_type == "Cast" and key in seen):
            continue
        seen.add(key)
        for i, name in enumerate(node.input):
            node.input[i] = renamed.get(name, name)
        kept.append(node)
    read = {i for n in kept for i in n.input} | {o.name for o in proto.graph.output}
    kept = [n for n in kept if n.op_type != "Cast" or n.output[0] in read]
    del proto.graph.node[:]
    proto.graph.node.extend(kept)


def to_fp16(proto: onnx.ModelProto, fp16_io: bool = False,
            keep: Optional[Sequence[str]] = None) -> onnx.ModelProto:
    """fp16 weights and compute; LayerNorm and Softmax stay fp32 (Casts around them), and so
    do the nodes named in `keep` (default: those computing the rotary tables, fp32_nodes)."""
    from onnxruntime.transformers.float16 import convert_float_to_float16
    from onnxruntime.transformers.onnx_model import OnnxModel

    keep = fp32_nodes(proto) if keep is None else list(keep)
    with captured("fp16 conversion"):
        half = convert_float_to_float16(proto, keep_io_types=not fp16_io,
                                        op_block_list=["LayerNormalization", "Softmax"],
                                        node_block_list=keep or None)
        if keep:
            _mend_blocked_casts(half)
        OnnxModel(half).topological_sort()  # the converter appends its input Casts last
    del half.graph.value_info[:]  # it leaves the fp32 types of converted values behind
    return half


def to_optimized(path: Path, config) -> onnx.ModelProto:
    """ONNX Runtime's transformer optimizer (model type vit): one fused Attention op per
    block (com.microsoft, with CPU and CUDA kernels), SkipLayerNormalization, BiasGelu.

    The optimizer fuses attention only in Hugging Face's layout, so each block's attention is
    first rewritten into it (fusion.split_qkv), and a model without one fused node per block
    is an error, not a quietly slower model. use_gpu stays False, so a bundle made on a CPU
    machine is the one made on a GPU machine: at opt_level 1 it only picks the provider of
    the session that runs ONNX Runtime's basic optimizations (the same for every provider),
    and where no CUDA provider is installed the optimizer then skips them altogether. The
    Python fusions do not read it.
    """
    from onnxruntime.transformers import optimizer

    if config.rope_type:
        raise ExportError(f"{param('optimize', True)}: ONNX Runtime's "
                          f"transformer optimizer fuses plain "
                          f"attention; this model's rotates queries and keys (rope_type "
                          f"{config.rope_type})")
    proto = _converter_input(path)
    if config.init_values:  # LayerScale hides attention from the optimizer: folded first
        fusion.fold_layer_scale(proto)
    feeds = fusion.after_projection(proto, config.embed_dim)
    rewritten = fusion.split_qkv(proto, config.embed_dim, config.num_heads)
    if rewritten != config.depth:
        raise ExportError(f"found the attention of {rewritten} of {config.depth} blocks to "
                          f"lay out for the transformer optimizer")
    with tempfile.TemporaryDirectory(dir=path.parent, prefix=".optimize-") as tmp:
        source = Path(tmp) / "split_qkv.onnx"
        save_onnx(proto, source)
        with captured("transformer optimizer"):
            optimized = optimizer.optimize_model(str(source), model_type="vit",
                                                 num_heads=config.num_heads,
                                                 hidden_size=config.embed_dim, opt_level=1)
    fused = fusion.fused_attention_count(optimized.model)
    if fused != config.depth:
        blocked = sorted({op for op in feeds if op != "Add"})
        why = (f": a block's attention projection feeds {' and '.join(blocked)}, where the "
               f"optimizer looks for the residual Add" if blocked else "")
        raise ExportError(f"the transformer optimizer fused the attention of {fused} of "
                          f"{config.depth} blocks{why}")
    return optimized.model


def to_optimized_fp16(optimized: onnx.ModelProto, fp16_io: bool = False) -> onnx.ModelProto:
    """The optimized graph (to_optimized) in fp16, converted as ONNX Runtime's optimizer
    converts it (`--float16`: OnnxModel.convert_float_to_float16, whose symbolic shape
    inference types the fused com.microsoft ops): Attention, SkipLayerNormalization and
    BiasGelu take fp16 and run their own fp16 kernels on CUDA, with no Cast between them.
    model.fp16.onnx is converted from the plain graph instead, where LayerNorm and Softmax
    stay fp32 ops with a Cast on each side and GELU is four kernels. On CPU, ONNX Runtime
    computes most of this graph in fp32 behind Casts it inserts, so a CPU validation proves
    the conversion, not the GPU's rounding."""
    from onnxruntime.transformers.onnx_model import OnnxModel

    model = OnnxModel(optimized)
    with captured("fp16 conversion"):
        model.convert_float_to_float16(keep_io_types=not fp16_io)
        model.topological_sort()
    half = model.model
    del half.graph.value_info[:]
    # where symbolic shape inference failed, ORT only warns and converts blind
    left = [t.name for t in half.graph.initializer
            if t.data_type == onnx.TensorProto.FLOAT and len(t.dims) == 2]
    inner = [n.name for n in half.graph.node if n.op_type == "Cast"
             and not ({*n.input, *n.output} & {v.name for v in [*half.graph.input,
                                                                *half.graph.output]})]
    if left or inner:
        raise ExportError(f"the fp16 conversion of the optimized graph left "
                          f"{len(left)} fp32 weight matrices and {len(inner)} Casts inside "
                          f"it (first: {(left + inner)[0]})")
    return half


def to_int8(proto: onnx.ModelProto, folder: Path) -> onnx.ModelProto:
    """Dynamic int8 quantization of the MatMul/Gemm weights (their inputs quantized at run)."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    with tempfile.TemporaryDirectory(dir=folder, prefix=".int8-") as tmp:
        source, out = Path(tmp) / "fp32.onnx", Path(tmp) / "int8.onnx"
        save_onnx(proto, source)
        with captured("int8 quantization"):
            # Weights only: attention's activation x activation MatMuls stay fp32 (measured:
            # as fast, and no second dynamic quantization inside softmax attention).
            quantize_dynamic(str(source), str(out), weight_type=QuantType.QInt8,
                             op_types_to_quantize=["MatMul", "Gemm"],
                             extra_options={"MatMulConstBOnly": True})
        return onnx.load(str(out))


def _weight_gemms(proto: onnx.ModelProto) -> list[onnx.NodeProto]:
    """MatMul / Gemm nodes whose second input is a weight (an initializer), in graph order."""
    weights = {t.name for t in proto.graph.initializer}
    return [n for n in proto.graph.node
            if n.op_type in ("MatMul", "Gemm") and len(n.input) > 1 and n.input[1] in weights]


def weight_gemms(source: Path) -> dict[str, list[str]]:
    """The weight GEMMs static int8 quantizes in the model at `source`, by block: "blocks.N"
    -> node names (as to_int8_static names them), from the exporter's scopes."""
    proto = onnx.load(str(source), load_external_data=False)
    for i, node in enumerate(proto.graph.node):
        node.name = node.name or f"{node.op_type}_{i}"
    found: dict[str, list[str]] = {}
    for node in _weight_gemms(proto)[:-1]:  # the head stays fp32 anyway
        block = next((s for s in node_scopes(node) if s.count(".") == 1
                      and s.startswith("blocks.")), None)
        if block is not None:
            found.setdefault(block, []).append(node.name)
    return found


def _calibration_reader(x, batch: int = 8):
    """onnxruntime's CalibrationDataReader over our preprocessed images, in batches."""
    from onnxruntime.quantization import CalibrationDataReader

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self.rewind()

        def get_next(self):
            return next(self._batches, None)

        def rewind(self) -> None:
            self._batches = iter([{B.INPUT_NAME: x[i:i + batch]}
                                  for i in range(0, len(x), batch)])

    return Reader()


def static_int8_options(isa: "cpu.Isa") -> dict[str, Any]:
    """The static int8 recipe for a ViT on a CPU with `isa`; recorded in the bundle.

    Only the weight GEMMs are quantized (qkv, attention projection, fc1, fc2): QDQ around
    them, weights int8 symmetric per output channel, activations uint8 asymmetric (ONNX
    Runtime's u8s8 kernels). Residual Adds, LayerNorm, Softmax, GELU, attention's
    activation x activation MatMuls, the patch embedding and the classifier head stay fp32:
    quantizing the residual stream collapses a ViT's accuracy, and the head decides the
    answer. Without VNNI (AVX2's vpmaddubsw adds two u8 x s8 products in int16) full-range
    weights can saturate, so weights get 7 bits there (`reduce_range`), as ONNX Runtime
    advises; with VNNI or AMX they get all 8.
    """
    return {"format": "QDQ", "activations": "uint8 asymmetric, per tensor",
            "weights": "int8 symmetric, per channel", "reduce_range": not isa.int8_dot,
            "quantized": "weight MatMuls (qkv, proj, fc1, fc2)",
            "kept_fp32": "residual Add, LayerNorm, Softmax, GELU, attention MatMuls, "
                         "patch embedding, head",
            "method": CALIBRATION_METHOD, "made_for_isa": isa.summary}


def to_int8_static(proto: onnx.ModelProto, folder: Path, calibration,
                   options: dict[str, Any], exclude: Sequence[str] = ()) -> onnx.ModelProto:
    """Static int8 (see static_int8_options), calibrated on `calibration.x`; the weight
    GEMMs named in `exclude` stay fp32 (an accuracy budget keeps them, budget.py)."""
    from onnxruntime.quantization import CalibrationMethod, QuantFormat, QuantType, quantize_static

    reader = _calibration_reader(calibration.x)
    for i, node in enumerate(proto.graph.node):  # quantize_static selects nodes by name
        node.name = node.name or f"{node.op_type}_{i}"
    # Named explicitly: in QDQ format onnxruntime ignores MatMulConstBOnly and would quantize
    # attention's activation x activation MatMuls too. The last weight GEMM, the head, stays.
    gemms = [n.name for n in _weight_gemms(proto)][:-1]
    gemms = [g for g in gemms if g not in set(exclude)]
    if not gemms:  # onnxruntime reads no nodes named as every node: all would be quantized
        raise ExportError("static int8 found no weight GEMM to quantize in the graph (its "
                          "MatMul weights must be initializers)")
    with tempfile.TemporaryDirectory(dir=folder, prefix=".int8-static-") as tmp:
        source, out = Path(tmp) / "fp32.onnx", Path(tmp) / "int8.onnx"
        save_onnx(proto, source)
        with captured("static int8 quantization"):
            quantize_static(
                str(source), str(out), reader, quant_format=QuantFormat.QDQ,
                op_types_to_quantize=["MatMul", "Gemm"], per_channel=True,
                reduce_range=options["reduce_range"], activation_type=QuantType.QUInt8,
                weight_type=QuantType.QInt8, nodes_to_quantize=gemms,
                calibrate_method=CalibrationMethod.MinMax,
                # Inputs only: a MatMul's fp32 output goes on to the residual Add, Softmax,
                # GELU; quantizing it would put Q/DQ in front of each of them.
                extra_options={"MatMulConstBOnly": True, "WeightSymmetric": True,
                               "ActivationSymmetric": False,
                               "OpTypesToExcludeOutputQuantization": ["MatMul", "Gemm"]})
        return onnx.load(str(out))


def make_variant(kind: str, source: Path, folder: Path, config, description_json: str,
                 fp16_io: bool = False, calibration=None,
                 static_options: Optional[dict[str, Any]] = None,
                 exclude: Sequence[str] = ()) -> str:
    """Derive one ONNX model from `source` into `folder`; returns its file name. `exclude`:
    the weight GEMMs (node names, `weight_gemms`) static int8 leaves in fp32."""
    if kind not in VARIANTS:
        raise ExportError(f"unknown model variant {kind!r}; choose from {', '.join(VARIANTS)}")
    name = VARIANTS[kind][0]
    try:
        if kind == "fp16":
            proto = to_fp16(_converter_input(source), fp16_io)
        elif kind == "optimized":
            proto = to_optimized(source, config)
        elif kind == "optimized-fp16":  # from model.opt.onnx where this export made one
            made = folder / VARIANTS["optimized"][0]
            proto = to_optimized_fp16(onnx.load(str(made)) if made.is_file() and made != source
                                      else to_optimized(source, config), fp16_io)
        elif kind == "int8":
            proto = to_int8(_converter_input(source), folder)
        else:
            if calibration is None:
                raise ExportError(f"static int8 needs calibration images "
                                  f"({param('calibrate')})")
            proto = to_int8_static(_converter_input(source), folder, calibration,
                                   static_options or static_int8_options(cpu.isa()),
                                   exclude)
    except ExportError:
        raise
    except Exception as exc:  # converters raise many error types
        first = first_line(exc)
        raise ExportError(f"making the {kind} model failed: {first}") from None
    del proto.metadata_props[:]
    onnx.helper.set_model_props(proto, {B.METADATA_KEY: description_json})
    save_onnx(proto, folder / name)
    return name

