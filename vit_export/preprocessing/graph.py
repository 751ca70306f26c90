"""The preprocessing as an ONNX graph in front of the model: model.e2e.onnx takes uint8
images of any size and does in the graph what pipeline.preprocess does with Pillow."""
from __future__ import annotations

from pathlib import Path

import onnx

from ..bundle import names as B
from ..errors import ExportError, param
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
        raise ExportError(f"{param('embed_preprocessing', True)}: resize_backend {prep.resize_backend} (resize "
                          f"rescaled float pixels, as DINOv3's processor) is not built into the "
                          f"graph; it builds Pillow's uint8 resize")
    if prep.interpolation not in E2E_INTERPOLATIONS:
        raise ExportError(f"{param('embed_preprocessing', True)}: ONNX Resize has no {prep.interpolation} "
                          f"filter; it does {', '.join(E2E_INTERPOLATIONS)}")
    if prep.crop_mode not in E2E_CROP_MODES:
        raise ExportError(f"{param('embed_preprocessing', True)}: crop_mode {prep.crop_mode} (pad with the "
                          f"mean colour) is not done in the graph; it does "
                          f"{', '.join(E2E_CROP_MODES)}")
    if opset < E2E_MIN_OPSET:
        raise ExportError(f"{param('embed_preprocessing', True)} needs opset {E2E_MIN_OPSET} or newer "
                          f"(Resize's antialias), got {opset}")


class _Builder:
    """The nodes and initializers of the preprocessing graph, each named under its prefix;
    a constant is made once, however often it is asked for."""

    def __init__(self):
        self.nodes: list = []
        self.inits: list = []

    def const(self, name: str, value, dtype=None) -> str:
        import numpy as np
        from onnx import numpy_helper

        if not any(t.name == _P + name for t in self.inits):
            array = np.asarray(value, dtype=np.int64 if dtype is None else dtype)
            self.inits.append(numpy_helper.from_array(array, _P + name))
        return _P + name

    def node(self, op: str, inputs: list[str], name: str, **attrs) -> str:
        from onnx import helper as h

        self.nodes.append(h.make_node(op, inputs, [_P + name], name=_P + name, **attrs))
        return _P + name


def _resized_sides(g: _Builder, prep: Preprocessing, height: str, width: str):
    """The resized height and width: both resize_size (squash), or the short side
    resize_size and the long side (resize_size * long) // short (torchvision's Resize(int))."""
    target = g.const("resize_size", [prep.resize_size])
    if prep.crop_mode == "squash":
        return target, target
    portrait = g.node("LessOrEqual", [width, height], "portrait")
    long_h = g.node("Div", [g.node("Mul", [target, height], "t_h"), width], "long_h")
    long_w = g.node("Div", [g.node("Mul", [target, width], "t_w"), height], "long_w")
    return (g.node("Where", [portrait, long_h, target], "new_h"),
            g.node("Where", [portrait, target, long_w], "new_w"))


def _nearest(g: _Builder, x: str, side: str, axis: int, old: str, new: str) -> str:
    """Pillow's nearest resize of one axis: source pixel floor((i + 0.5) * old / new),
    exactly, picked by Gather (any dtype)."""
    count = g.node("Squeeze", [new], f"count_{side}")
    i = g.node("Range", [g.const("s0", 0), count, g.const("s1", 1)], f"range_{side}")
    twice = g.node("Add", [g.node("Mul", [i, g.const("s2", 2)], f"2i_{side}"),
                           g.const("s1", 1)], f"2i1_{side}")
    num = g.node("Sub", [g.node("Mul", [twice, old], f"num_{side}"), g.const("s1", 1)],
                 f"num1_{side}")  # at an exact tie Pillow takes the lower pixel
    source = g.node("Div", [num, g.node("Mul", [new, g.const("two", [2])], f"den_{side}")],
                    f"source_{side}")
    return g.node("Gather", [x, source], f"nearest_{side}", axis=axis)


def _resized(g: _Builder, prep: Preprocessing, x: str, channels: int, sizes: tuple
             ) -> tuple[str, bool]:
    """`x` resized width first, then height, each rounded to uint8 as Pillow's two passes
    are; and whether it is float yet (a Resize needs float; nearest picks uint8 pixels)."""
    import numpy as np
    from onnx import TensorProto as T

    batch, height, width, new_h, new_w = sizes
    floated = False
    chans = g.const("channels", [channels])
    mode = E2E_INTERPOLATIONS[prep.interpolation]
    resize = dict(mode=mode, coordinate_transformation_mode="half_pixel", antialias=1,
                  exclude_outside=1, cubic_coeff_a=-0.5)  # Pillow widens its filter to shrink
    low, high = g.const("0f", 0.0, np.float32), g.const("255f", 255.0, np.float32)
    for side, axis, old, new in (("w", 3, width, new_w), ("h", 2, height, new_h)):
        if mode == "nearest":
            x = _nearest(g, x, side, axis, old, new)
            continue
        if not floated:
            x, floated = g.node("Cast", [x], "float", to=T.FLOAT), True
        shape = [batch, chans, height, new_w] if side == "w" else [batch, chans, new_h, new_w]
        size = g.node("Concat", shape, f"size_{side}", axis=0)
        x = g.node("Resize", [x, "", "", size], f"resize_{side}", **resize)
        x = g.node("Clip", [g.node("Round", [x], f"round_{side}"), low, high], f"uint8_{side}")
    return x, floated


def _cropped(g: _Builder, prep: Preprocessing, x: str, new_h: str, new_w: str) -> str:
    """The center crop of side img_size at Pillow's offsets (floor, or round half to even)."""
    S = prep.img_size
    offsets = []
    for side, new in (("h", new_h), ("w", new_w)):
        extra = g.node("Sub", [new, g.const("crop_side", [S])], f"extra_{side}")
        half = g.node("Div", [extra, g.const("two", [2])], f"half_{side}")
        if prep.crop_offset == "round":  # round((new - S) / 2) half to even: + 1 when .5, odd
            odd = g.node("Mod", [half, g.const("two", [2])], f"odd_{side}")
            tie = g.node("Mod", [extra, g.const("two", [2])], f"tie_{side}")
            half = g.node("Add", [half, g.node("Mul", [odd, tie], f"up_{side}")],
                          f"offset_{side}")
        offsets.append(half)
    starts = g.node("Concat", offsets, "starts", axis=0)
    ends = g.node("Add", [starts, g.const("crop2", [S, S])], "ends")
    return g.node("Slice", [x, starts, ends, g.const("axes", [2, 3])], "cropped")


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

    check_e2e(prep, DEFAULT_OPSET)
    g = _Builder()
    S = prep.img_size
    shape = g.node("Shape", [B.E2E_INPUT_NAME], "shape")  # [B, H, W, C]
    batch = g.node("Slice", [shape, g.const("i0", [0]), g.const("i1", [1])], "batch")
    height = g.node("Slice", [shape, g.const("i1", [1]), g.const("i2", [2])], "height")
    width = g.node("Slice", [shape, g.const("i2", [2]), g.const("i3", [3])], "width")
    new_h, new_w = _resized_sides(g, prep, height, width)
    # [B, C, H, W], still uint8: a full-size float copy is four times the input, and the
    # images are often photos of millions of pixels. Cast where a Resize needs float.
    x = g.node("Transpose", [B.E2E_INPUT_NAME], "nchw", perm=[0, 3, 1, 2])
    x, floated = _resized(g, prep, x, channels, (batch, height, width, new_h, new_w))
    x = _cropped(g, prep, x, new_h, new_w)
    if not floated:  # nearest: only picked pixels, cropped
        x = g.node("Cast", [x], "float", to=T.FLOAT)
    if abs(prep.rescale_factor - 1 / 255) < 1e-15:  # torchvision's float32 x / 255
        x = g.node("Div", [x, g.const("255", 255.0, np.float32)], "rescaled")
    else:
        x = g.node("Mul", [x, g.const("rescale", prep.rescale_factor, np.float32)], "rescaled")
    mean = g.const("mean", np.reshape(prep.mean, (1, -1, 1, 1)), np.float32)
    std = g.const("std", np.reshape(prep.std, (1, -1, 1, 1)), np.float32)
    x = g.node("Sub", [x, mean], "centred")
    g.nodes.append(h.make_node("Div", [x, std], [B.INPUT_NAME], name=_P + "normalized"))
    images = h.make_tensor_value_info(B.E2E_INPUT_NAME, T.UINT8,
                                      [B.BATCH_DIM, B.HEIGHT_DIM, B.WIDTH_DIM, channels])
    pixels = h.make_tensor_value_info(B.INPUT_NAME, T.FLOAT, [B.BATCH_DIM, channels, S, S])
    return h.make_graph(g.nodes, "preprocess", [images], [pixels], g.inits)


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
