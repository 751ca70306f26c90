import re
import struct
import zlib

import numpy as np
import pytest
from PIL import Image

from vit_export.bundle import Preprocessing
from vit_export.errors import InputError
from vit_export.images import expand_inputs, iter_inputs, load_image, load_labelled_npz
from vit_export.preprocessing import preprocess

PREP = Preprocessing(img_size=4, resize_size=4, mean=(0.5, 0.5, 0.5), std=(0.25, 0.25, 0.25),
                     interpolation="nearest")


def test_rgb_values_are_normalized_per_channel():
    pixels = np.zeros((4, 4, 3), np.uint8)
    pixels[..., 0], pixels[..., 1], pixels[..., 2] = 255, 0, 128
    out = preprocess(Image.fromarray(pixels), PREP)
    assert out.shape == (3, 4, 4) and out.dtype == np.float32
    np.testing.assert_allclose(out[:, 0, 0], [2.0, -2.0, (128 / 255 - 0.5) / 0.25], atol=1e-6)


def test_resize_short_side_then_center_crop():
    prep = Preprocessing(img_size=4, resize_size=4, mean=(0.0,), std=(1.0,),
                         interpolation="nearest")
    pixels = np.zeros((8, 16), np.uint8)  # 16 wide, 8 high -> resized to 8x4, crop the middle
    pixels[:, 4:12] = 255
    out = preprocess(Image.fromarray(pixels, "L"), prep)
    assert out.shape == (1, 4, 4)
    np.testing.assert_array_equal(out[0], np.ones((4, 4)))


@pytest.mark.parametrize("mode,shape", [("L", (6, 6)), ("RGBA", (6, 6, 4)), ("LA", (6, 6, 2)),
                                        ("P", (6, 6)), ("I;16", (6, 6))])
def test_grayscale_and_alpha_images_are_converted_not_rejected(tmp_path, mode, shape):
    path = tmp_path / "x.png"
    if mode == "I;16":  # 16-bit grayscale
        Image.fromarray(np.full(shape, 100, np.uint16)).save(path)
    else:
        Image.fromarray(np.full(shape, 100, np.uint8)).convert(mode).save(path)
    out = load_image(path, PREP)
    assert out.shape == (3, 4, 4) and np.isfinite(out).all()


def test_non_image_and_truncated_image_are_input_errors(tmp_path):
    text = tmp_path / "notes.png"
    text.write_text("not an image")
    with pytest.raises(InputError, match="not an image Pillow can read"):
        load_image(text, PREP)
    good = tmp_path / "good.jpg"
    Image.fromarray(np.zeros((64, 64, 3), np.uint8)).save(good)
    cut = tmp_path / "cut.jpg"
    cut.write_bytes(good.read_bytes()[:200])
    with pytest.raises(InputError, match="cut.jpg"):
        load_image(cut, PREP)


def test_npy_inputs_by_shape(tmp_path):
    one = tmp_path / "one.npy"
    np.save(one, np.zeros((3, 4, 4), np.float64))
    many = tmp_path / "many.npy"
    np.save(many, np.ones((2, 3, 4, 4), np.float32))
    items = list(iter_inputs([one, many], PREP))
    assert [name for name, _ in items] == [str(one), f"{many}[0]", f"{many}[1]"]
    assert all(a.dtype == np.float32 and a.shape == (3, 4, 4) for _, a in items)
    wrong = tmp_path / "wrong.npy"
    np.save(wrong, np.zeros((1, 4, 4)))
    with pytest.raises(InputError, match=r"shape \(1, 4, 4\) does not fit .*\[N, 3, 4, 4\]"):
        list(iter_inputs([wrong], PREP))


@pytest.mark.parametrize("dtype", ["m8[s]", "M8[s]", "bool", "complex64"])
def test_npy_inputs_that_are_not_real_numbers_are_refused(tmp_path, dtype):
    """timedelta64 is an integer to numpy: it was cast to float32 and run."""
    path = tmp_path / "in.npy"
    np.save(path, np.zeros((1, 3, 4, 4), dtype))
    expected = f"in.npy: array of dtype {np.dtype(dtype)} is not real numbers"
    with pytest.raises(InputError, match=re.escape(expected)):
        list(iter_inputs([path], PREP))


def test_folder_expands_to_sorted_images_only(tmp_path):
    for name in ("b.png", "a.jpg"):
        Image.fromarray(np.zeros((4, 4, 3), np.uint8)).save(tmp_path / name)
    (tmp_path / "README.txt").write_text("skip me")
    assert [p.name for p in expand_inputs([tmp_path])] == ["a.jpg", "b.png"]
    with pytest.raises(InputError, match="does not exist"):
        expand_inputs([tmp_path / "missing.png"])
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(InputError, match="holds no image"):
        expand_inputs([empty])


def test_labelled_npz(tmp_path):
    path = tmp_path / "d.npz"
    np.savez(path, images=np.full((5, 4, 4), 255, np.uint8), labels=np.arange(5))
    x, labels = load_labelled_npz(path, PREP)
    assert x.shape == (5, 3, 4, 4) and labels.tolist() == [0, 1, 2, 3, 4]
    np.testing.assert_allclose(x, 2.0)
    np.savez(path, images=np.zeros((5, 4, 4), np.float32))
    with pytest.raises(InputError, match="must be uint8"):
        load_labelled_npz(path, PREP)


def _digits_prep():
    from vit_export.bundle import read_bundle

    return read_bundle("models/digits").description.preprocessing


@pytest.mark.parametrize("mode", ["I;16", "I", "F"])
def test_high_bit_depth_images_are_scaled_not_clipped(tmp_path, mode):
    """A 16-bit, 32-bit or float copy of each held-out digit preprocesses exactly like the
    8-bit original (Pillow's own convert would clip it to white)."""
    prep = _digits_prep()
    with np.load("models/digits/held_out.npz") as data:
        images = data["images"][:12]
    for i, pixels in enumerate(images):
        eight = tmp_path / f"{i}.png"
        Image.fromarray(pixels).save(eight)
        if mode == "F":
            deep, copy = tmp_path / f"{i}.tif", Image.fromarray(pixels.astype(np.float32) / 255)
        else:
            wide = pixels.astype(np.uint16 if mode == "I;16" else np.int32) * 257
            deep, copy = tmp_path / f"{i}.{'png' if mode == 'I;16' else 'tif'}", \
                Image.fromarray(wide)
        copy.save(deep)
        with Image.open(deep) as check:
            assert check.mode == mode
        np.testing.assert_array_equal(load_image(deep, prep), load_image(eight, prep))


@pytest.mark.parametrize("values, message", [
    (np.full((6, 6), 2.0, np.float32), r"F image has values in \[2, 2\], outside \[0, 1\]"),
    (np.full((6, 6), np.nan, np.float32), "F image holds NaN or infinite pixels"),
    (np.full((6, 6), -5, np.int32), r"I image has values in \[-5, -5\], outside \[0, 65535\]"),
])
def test_high_bit_depth_values_outside_the_scale_are_refused(tmp_path, values, message):
    path = tmp_path / "odd.tif"
    Image.fromarray(values).save(path)
    with pytest.raises(InputError, match=f"^{path}: {message}"):
        load_image(path, PREP)


def _png(path, pixels: np.ndarray, interlace: bool = False, rows: int | None = None):
    """A gray 8-bit PNG written by hand: the rows as filter-0 scanlines (Adam7 passes when
    interlaced), of which the zlib stream holds the first `rows` scanlines' bytes, complete
    and valid: what Pillow decodes without a word, zeros where the data stops."""
    height, width = pixels.shape
    passes = ((0, 0, 8, 8), (4, 0, 8, 8), (0, 4, 4, 8), (2, 0, 4, 4), (0, 2, 2, 4),
              (1, 0, 2, 2), (0, 1, 1, 2)) if interlace else ((0, 0, 1, 1),)
    lines = [b"\0" + pixels[y, x0::dx].tobytes()
             for x0, y0, dx, dy in passes if x0 < width for y in range(y0, height, dy)]
    data = b"".join(lines if rows is None else lines[:rows])

    def chunk(kind: bytes, body: bytes) -> bytes:
        return (struct.pack(">I", len(body)) + kind + body
                + struct.pack(">I", zlib.crc32(kind + body) & 0xFFFFFFFF))

    header = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, int(interlace))
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header)
                     + chunk(b"IDAT", zlib.compress(data)) + chunk(b"IEND", b""))
    return path


@pytest.mark.parametrize("interlace", [False, True])
def test_a_png_whose_data_stops_early_is_refused_not_filled_with_zeros(tmp_path, interlace,
                                                                      monkeypatch):
    """A PNG holding 24 of its 64 rows in a valid zlib stream: Pillow decodes it, the missing
    rows black, and infer answered about an image that is not there. The data is
    counted a kilobyte at a time here, so the whole image is read across many steps."""
    from vit_export import images

    monkeypatch.setattr(images, "PNG_STEP", 1000)
    pixels = np.random.default_rng(0).integers(0, 256, (64, 64), np.uint8)
    prep = Preprocessing(img_size=64, resize_size=64, mean=(0.5,), std=(0.5,))
    whole = load_image(_png(tmp_path / "whole.png", pixels, interlace), prep)
    assert np.abs(whole[0] - (pixels / 255.0 - 0.5) / 0.5).max() < 1e-6
    short = _png(tmp_path / "short.png", pixels, interlace, rows=24)
    with pytest.raises(InputError, match=r"short.png: PNG image data holds \d+ of the \d+ bytes "
                                         r"its size needs \(truncated\)$"):
        load_image(short, prep)
    assert Image.open(short).convert("L").size == (64, 64)  # what Pillow alone does


def test_a_huge_png_header_over_a_few_rows_is_refused_in_bounded_memory(tmp_path):
    big = _png(tmp_path / "big.png", np.zeros((9500, 9500), np.uint8), rows=10)
    with pytest.raises(InputError, match="big.png: PNG image data holds 95010 of the "
                                         "90259500 bytes"):
        load_image(big, Preprocessing(img_size=64, resize_size=64, mean=(0.5,), std=(0.5,)))


def test_empty_images_and_a_fifo_in_place_of_an_npz_are_one_line(tmp_path):
    """Zero-height images divided by zero in the resize; a FIFO given as --real-data or
    --calibrate blocked np.load forever."""
    import os
    import threading

    path = tmp_path / "d.npz"
    np.savez(path, images=np.zeros((3, 0, 8), np.uint8), labels=np.arange(3))
    with pytest.raises(InputError, match=r"d.npz: `images` of shape \(3, 0, 8\) are empty"):
        load_labelled_npz(path, PREP)
    fifo = tmp_path / "pipe.npz"
    os.mkfifo(fifo)
    raised = []

    def read():
        with pytest.raises(InputError, match="pipe.npz is not a regular file") as caught:
            load_labelled_npz(fifo, PREP)
        raised.append(caught.value)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    reader.join(timeout=30)
    assert raised, "load_labelled_npz blocked on a FIFO"


@pytest.mark.slow  # several seconds: the whole suite runs it
def test_a_thin_strip_is_refused_in_one_line_under_a_memory_limit(tmp_path):
    """A 60 KB 20000x1 PNG whose short side the preprocessing makes 256 asked Pillow for
    3.9 GB (and model.e2e.onnx for more): refused before any work, in one line, where under
    a 2 GB data limit infer died in a MemoryError traceback. The same check reads a
    server's request body for model.e2e.onnx (raw pixels, resized in the graph)."""
    import dataclasses
    import resource
    import subprocess
    import sys
    from pathlib import Path

    import torch
    from conftest import one_line

    from vit_export import bundle as B
    from vit_export.exporting import export_bundle
    from vit_export.images import load_image_bytes
    from vit_export.model import create_model

    torch.manual_seed(0)
    model = create_model("vit_seed_tiny").eval()
    prep = dataclasses.replace(B.Preprocessing.default_for(model.config), resize_size=256)
    export_bundle(model, tmp_path / "b", B.Description(model.config, prep))
    thin = tmp_path / "thin.png"
    Image.new("L", (20000, 1)).save(thin)

    def limit():
        resource.setrlimit(resource.RLIMIT_DATA, (2 << 30, 2 << 30))

    cli = Path(__file__).resolve().parent.parent / "cli.py"
    done = subprocess.run([sys.executable, str(cli), "infer", str(tmp_path / "b"), str(thin)],
                          preexec_fn=limit, capture_output=True, text=True, timeout=300,
                          check=False)
    assert done.returncode == 1, done.stderr
    line = one_line(done.stderr)
    assert "image is 20000x1" in line and "5120000x256" in line, line
    with pytest.raises(InputError, match="body: image is 20000x1"):
        load_image_bytes(thin.read_bytes(), "body", prep, raw=True)
    square = tmp_path / "square.png"
    Image.new("RGB", (3000, 47)).save(square)  # 64:1 and under goes through
    assert load_image(square, prep).shape == (3, 32, 32)


@pytest.mark.parametrize("content, what", [
    (b"\x80\x04K\x01.", "pickled data"), (b"\x93NUMPY", "an .npy array"),
    (b"hello", "not an .npz archive")])
def test_a_labelled_set_that_is_not_an_npz_says_what_it_is(tmp_path, content, what):
    """numpy's own line for a pickle told the user to load it unsafely."""
    path = tmp_path / "held.npz"
    path.write_bytes(content)
    with pytest.raises(InputError) as raised:
        load_labelled_npz(path, PREP)
    assert str(raised.value) == (f"{path} is not an .npz of `images` and `labels`: it is "
                                 f"{what} (an .npz is read without unpickling)")
    assert "unsafely" not in str(raised.value)
