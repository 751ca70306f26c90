"""The preprocessing as an ONNX graph in front of the model: model.e2e.onnx takes uint8
images of any size and does in the graph what pipeline.preprocess does with Pillow."""
from __future__ import annotations

from pathlib import Path

import onnx

from ..bundle import names as B
from ..errors import ExportError, option
from ..onnxio import DEFAULT_OPSET, MAX_IR_VERSION, save_onnx
from .recipe import Preprocessing

# Pillow's filters that ONNX's Resize (opset 18) reproduces: mode, and whether Pillow widens
# the filter when it shrinks (antialias). Pillow's bicubic is Keys' a = -0.5.
E2E_INTERPOLATIONS = {"bicubic": "cubic", "bilinear": "linear", "nearest": "nearest"}
E2E_CROP_MODES = ("center", "squash")
E2E_MIN_OPSET = 18  # Resize's antialias attribute
_P = "preprocess/"  # prefix of every name the preprocessing adds to the graph


def check_e2e(prep: Preprocessing, opset: int) -> None:
    """What the preprocessing graph cannot do, refused before any work."""
    if prep.resize_backend != "pillow":
        raise ExportError(f"{option('--embed-preprocessing')}: resize_backend {prep.resize_backend} (resize "
                          f"rescaled float pixels, as DINOv3's processor) is not built into the "
                          f"graph; it builds Pillow's uint8 resize")
    if prep.interpolation not in E2E_INTERPOLATIONS:
        raise ExportError(f"{option('--embed-preprocessing')}: ONNX Resize has no {prep.interpolation} "
                          f"filter; it does {', '.join(E2E_INTERPOLATIONS)}")
    if prep.crop_mode not in E2E_CROP_MODES:
        raise ExportError(f"{option('--embed-preprocessing')}: crop_mode {prep.crop_mode} (pad with the "
                          f"mean colour) is not done in the graph; it does "
                          f"{', '.join(E2E_CROP_MODES)}")
    if opset < E2E_MIN_OPSET:
        raise ExportError(f"{option('--embed-preprocessing')} needs opset {E2E_MIN_OPSET} or newer "
                          f"(Resize's antialias), got {opset}")


def preprocessing_graph(prep: Preprocessing, channels: int) -> onnx.GraphProto:
    """uint8 images [batch, height, width, C] -> float pixel_values [batch, C, S, S], as
    pipeline.preprocess does it with Pillow: resize (center: the short side to resize_size, the
    long side (resize_size * long) // short; squash: both sides), each side in its own pass,
    width first, rounded to uint8 after each as Pillow does; center crop at Pillow's offsets;
    then (x * rescale_factor - mean) / std. Sizes come from Shape ops, so any input size runs.
    """
    import numpy as np
    from onnx import TensorProto as T
    from onnx import helper as h
    from onnx import numpy_helper

    check_e2e(prep, DEFAULT_OPSET)
    nodes, inits = [], []

    def const(name: str, value, dtype=np.int64) -> str:
        if not any(t.name == _P + name for t in inits):
            inits.append(numpy_helper.from_array(np.asarray(value, dtype=dtype), _P + name))
        return _P + name

    def node(op: str, inputs: list[str], name: str, **attrs) -> str:
        nodes.append(h.make_node(op, inputs, [_P + name], name=_P + name, **attrs))
        return _P + name

    S, T_ = prep.img_size, prep.resize_size
    shape = node("Shape", [B.E2E_INPUT_NAME], "shape")  # [B, H, W, C]
    batch = node("Slice", [shape, const("i0", [0]), const("i1", [1])], "batch")
    height = node("Slice", [shape, const("i1", [1]), const("i2", [2])], "height")
    width = node("Slice", [shape, const("i2", [2]), const("i3", [3])], "width")
    target = const("resize_size", [T_])
    if prep.crop_mode == "squash":
        new_h = new_w = target
    else:  # torchvision's Resize(int): int(T * long / short) == (T * long) // short
        portrait = node("LessOrEqual", [width, height], "portrait")
        long_h = node("Div", [node("Mul", [target, height], "t_h"), width], "long_h")
        long_w = node("Div", [node("Mul", [target, width], "t_w"), height], "long_w")
        new_h = node("Where", [portrait, long_h, target], "new_h")
        new_w = node("Where", [portrait, target, long_w], "new_w")
    # [B, C, H, W], still uint8: a full-size float copy is four times the input, and the
    # images are often photos of millions of pixels. Cast where a Resize needs float.
    x = node("Transpose", [B.E2E_INPUT_NAME], "nchw", perm=[0, 3, 1, 2])
    floated = False
    chans = const("channels", [channels])
    mode = E2E_INTERPOLATIONS[prep.interpolation]
    resize = dict(mode=mode, coordinate_transformation_mode="half_pixel", antialias=1,
                  exclude_outside=1, cubic_coeff_a=-0.5)  # Pillow widens its filter to shrink
    low, high = const("0f", 0.0, np.float32), const("255f", 255.0, np.float32)
    # Width first, then height, each rounded to uint8 as Pillow's two passes are.
    for side, axis, old, new in (("w", 3, width, new_w), ("h", 2, height, new_h)):
        if mode == "nearest":  # Pillow's source pixel floor((i + 0.5) * old / new), exactly
            count = node("Squeeze", [new], f"count_{side}")
            i = node("Range", [const("s0", 0), count, const("s1", 1)], f"range_{side}")
            twice = node("Add", [node("Mul", [i, const("s2", 2)], f"2i_{side}"),
                                 const("s1", 1)], f"2i1_{side}")
            num = node("Sub", [node("Mul", [twice, old], f"num_{side}"), const("s1", 1)],
                       f"num1_{side}")  # at an exact tie Pillow takes the lower pixel
            source = node("Div", [num,
                                  node("Mul", [new, const("two", [2])], f"den_{side}")],
                          f"source_{side}")
            x = node("Gather", [x, source], f"nearest_{side}", axis=axis)  # picks: any dtype
            continue
        if not floated:
            x, floated = node("Cast", [x], "float", to=T.FLOAT), True
        sizes = [batch, chans, height, new_w] if side == "w" else [batch, chans, new_h, new_w]
        size = node("Concat", sizes, f"size_{side}", axis=0)
        x = node("Resize", [x, "", "", size], f"resize_{side}", **resize)
        x = node("Clip", [node("Round", [x], f"round_{side}"), low, high], f"uint8_{side}")
    offsets = []
    for side, new in (("h", new_h), ("w", new_w)):
        extra = node("Sub", [new, const("crop_side", [S])], f"extra_{side}")
        half = node("Div", [extra, const("two", [2])], f"half_{side}")
        if prep.crop_offset == "round":  # round((new - S) / 2) half to even: + 1 when .5, odd
            odd = node("Mod", [half, const("two", [2])], f"odd_{side}")
            tie = node("Mod", [extra, const("two", [2])], f"tie_{side}")
            half = node("Add", [half, node("Mul", [odd, tie], f"up_{side}")], f"offset_{side}")
        offsets.append(half)
    starts = node("Concat", offsets, "starts", axis=0)
    ends = node("Add", [starts, const("crop2", [S, S])], "ends")
    x = node("Slice", [x, starts, ends, const("axes", [2, 3])], "cropped")
    if not floated:  # nearest: only picked pixels, cropped
        x = node("Cast", [x], "float", to=T.FLOAT)
    if abs(prep.rescale_factor - 1 / 255) < 1e-15:  # torchvision's float32 x / 255
        x = node("Div", [x, const("255", 255.0, np.float32)], "rescaled")
    else:
        x = node("Mul", [x, const("rescale", prep.rescale_factor, np.float32)], "rescaled")
    mean = const("mean", np.reshape(prep.mean, (1, -1, 1, 1)), np.float32)
    std = const("std", np.reshape(prep.std, (1, -1, 1, 1)), np.float32)
    x = node("Sub", [x, mean], "centred")
    nodes.append(h.make_node("Div", [x, std], [B.INPUT_NAME], name=_P + "normalized"))
    images = h.make_tensor_value_info(B.E2E_INPUT_NAME, T.UINT8,
                                      [B.BATCH_DIM, B.HEIGHT_DIM, B.WIDTH_DIM, channels])
    pixels = h.make_tensor_value_info(B.INPUT_NAME, T.FLOAT, [B.BATCH_DIM, channels, S, S])
    return h.make_graph(nodes, "preprocess", [images], [pixels], inits)


def preprocessing_model(prep: Preprocessing, channels: int,
                        opset: int = DEFAULT_OPSET) -> onnx.ModelProto:
    """The preprocessing graph alone, as an ONNX model (to measure it against Pillow)."""
    proto = onnx.helper.make_model(preprocessing_graph(prep, channels),
                                   opset_imports=[onnx.helper.make_opsetid("", opset)])
    proto.ir_version = min(proto.ir_version, MAX_IR_VERSION)
    return proto


def make_e2e(source: Path, folder: Path, prep: Preprocessing, channels: int,
             description_json: str) -> str:
    """model.e2e.onnx: the preprocessing graph in front of the model at `source`."""
    proto = onnx.load(str(source), load_external_data=True)
    check_e2e(prep, max(o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")))
    pre = preprocessing_graph(prep, channels)
    graph = proto.graph
    body = list(graph.node)
    del graph.node[:]
    graph.node.extend(list(pre.node) + body)
    graph.initializer.extend(pre.initializer)
    del graph.input[:]
    graph.input.extend(pre.input)
    graph.name = "vit_e2e"
    del proto.metadata_props[:]
    onnx.helper.set_model_props(proto, {B.METADATA_KEY: description_json})
    save_onnx(proto, folder / B.E2E_FILE)
    return B.E2E_FILE
