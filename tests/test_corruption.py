"""Generated corruption: many broken variants of a good bundle, its config.json, a labelled
.npz, a checkpoint and a Hugging Face folder. For every one the command that reads it must
exit 1 or 2 with one line on stderr, raise no traceback, and leave every file as it was.

The variants come from hypothesis strategies (derandomized, so CI runs the same cases every
time): a value of another JSON type or out of range for each field, a required field
deleted, files truncated, emptied, filled with noise or swapped for another bundle file with
their sha256 rewritten to match. CASES below is how many each test runs.
"""
import functools
import json
import math
import shutil
import tempfile
import zlib
from pathlib import Path

import conftest
import numpy as np
import pytest
import torch
from click.testing import CliRunner

from vit_export import bundle as B
from vit_export.cli import cli
from vit_export.model import create_model

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

# Generated cases per kind: a quarter in the quick run, the other three quarters in the
# slow part (--run-slow, CI's second pass): each case belongs to one part, by its hash, so
# the two passes never run the same case.
CASES = {"config": 160, "files": 48, "npz": 40, "checkpoint": 48, "hf": 32}
QUICK_SHARE = 4


def cases(kind: str):
    quick = CASES[kind] // QUICK_SHARE
    return settings(max_examples=CASES[kind] - quick if conftest.FULL else quick,
                    deadline=None, derandomize=True, database=None,
                    suppress_health_check=list(HealthCheck))


def this_part(check):
    """`check` run only on the cases of the part this item runs (`cases`), the others
    passed over before any work."""
    @functools.wraps(check)
    def part(*args, **kwargs):
        case = repr((args, sorted(kwargs.items())))
        assume((zlib.crc32(case.encode()) % QUICK_SHARE != 0) == conftest.FULL)
        return check(*args, **kwargs)
    return part


def run(*args):
    result = CliRunner().invoke(cli, [str(a) for a in args])
    return result


def tree(path: Path) -> dict[str, bytes]:
    return {str(p.relative_to(path)): p.read_bytes() for p in sorted(path.rglob("*"))
            if p.is_file()}


def assert_refused(result, before: dict, folder: Path) -> None:
    """Exit 1 or 2, one `Error:` line, no exception escaped, nothing on disk changed."""
    assert result.exception is None or isinstance(result.exception, SystemExit), \
        f"traceback: {result.exception!r}"
    assert result.exit_code in (1, 2), (result.exit_code, result.stdout, result.stderr)
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("Error: "), result.stderr
    assert tree(folder) == before


# ---------------------------------------------------------------- config.json


def _leaves(value, path=()):
    """Every JSON path of a document, containers and leaves, with its value."""
    yield path, value
    if isinstance(value, dict):
        for key, item in value.items():
            yield from _leaves(item, path + (key,))
    elif isinstance(value, list):
        for i, item in enumerate(value):
            yield from _leaves(item, path + (i,))


def _kind(value) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, (int, float)):
        return "number"
    return type(value).__name__


DEEP = "__deep__"  # written as 100,000 nested lists: deeper than Python's parser recurses
OTHER_TYPES = [None, True, "x", "", [], {}, [1, 2], {"a": 1}, 7, 2.5, DEEP, "../../etc/passwd"]
OUT_OF_RANGE = [float("nan"), float("inf"), -float("inf"), -1, 10 ** 12, 1e308]
# Free-form fields: any value of the right type is legal there.
FREE = {("name",), ("versions",), ("extra",), ("export", "exporter"), ("export", "opset"),
        ("export", "parity"), ("export", "ir_version"), ("export", "external_data"),
        ("export", "weights_bytes"), ("export", "fp16_io")}
NULLABLE = {("labels",)}  # null is a legal value there: a bundle without class names
# Strings whose value is checked: any other string there is corruption too.
CHECKED_STRINGS = {("format",), ("io",), ("files",), ("preprocessing", "interpolation"),
                   ("preprocessing", "crop_mode"), ("preprocessing", "crop_offset"),
                   ("preprocessing", "alpha"), ("export", "onnx_models")}


def _config_paths(document) -> list[tuple]:
    return [p for p, _ in _leaves(document) if p and not any(p[:len(f)] == f for f in FREE)]


@pytest.fixture(scope="module")
def bundle_and_config(tiny_bundle):
    return tiny_bundle, json.loads((tiny_bundle / B.CONFIG_FILE).read_text())




_DELETE = conftest.DELETE


@st.composite
def config_mutation(draw, document):
    paths = _config_paths(document)
    path = draw(st.sampled_from(paths))
    original = dict(_leaves(document))[path]
    choices = [v for v in OTHER_TYPES if _kind(v) != _kind(original)
               and not (v is None and path in NULLABLE)]
    if _kind(original) == "number":
        choices += [v for v in OUT_OF_RANGE if not (isinstance(original, float)
                                                   and math.isinf(original))]
    if _kind(original) == "str" and any(path[:len(c)] == c for c in CHECKED_STRINGS):
        choices += ["no-such-" + original]
    if path in REQUIRED or (isinstance(path[-1], int)):  # a list item: deleting shifts them
        choices.append(_DELETE)
    return path, draw(st.sampled_from(choices))


# Deleting these leaves a bundle that cannot be what was validated; other fields default.
REQUIRED = {("format",), ("model",), ("files",), ("files", "weights.safetensors"),
            ("files", "model.onnx"), ("files", "model.ts"), ("model", "embed_dim"),
            ("model", "depth"), ("model", "num_heads"), ("model", "num_classes"),
            ("model", "img_size"), ("model", "patch_size")}


def test_generated_config_corruption_is_refused(bundle_and_config, tmp_path_factory):
    source, document = bundle_and_config

    @cases("config")
    @given(config_mutation(document))
    @this_part
    def check(mutation):
        path, value = mutation
        with tempfile.TemporaryDirectory(dir=tmp_path_factory.getbasetemp()) as tmp:
            bundle = Path(tmp) / "b"
            shutil.copytree(source, bundle)
            broken = json.loads(json.dumps(document))
            conftest.set_at(broken, path, value)
            text = json.dumps(broken, allow_nan=True)
            (bundle / B.CONFIG_FILE).write_text(
                text.replace(f'"{DEEP}"', "[" * 100_000 + "]" * 100_000))
            before = tree(bundle)
            for command in (["info", bundle], ["validate", bundle, "--batch-sizes", "1"]):
                result = run(*command)
                if command[0] == "validate" or result.exit_code != 0:
                    assert_refused(result, before, bundle)

    check()


# ---------------------------------------------------------------- the bundle's files


DAMAGE = ["truncate", "empty", "noise", "swap"]


@st.composite
def file_damage(draw):
    name = draw(st.sampled_from([B.ONNX_FILE, B.TS_FILE, B.WEIGHTS_FILE, B.CONFIG_FILE]))
    how = draw(st.sampled_from(DAMAGE))
    fraction = draw(st.floats(0.01, 0.99))
    other = draw(st.sampled_from([B.ONNX_FILE, B.TS_FILE, B.WEIGHTS_FILE]))
    rehash = draw(st.booleans())
    return name, how, fraction, other, rehash


def test_generated_file_damage_is_refused(tiny_bundle, tmp_path_factory):
    @cases("files")
    @given(file_damage())
    @this_part
    def check(damage):
        name, how, fraction, other, rehash = damage
        if how == "swap" and other == name:
            return
        with tempfile.TemporaryDirectory(dir=tmp_path_factory.getbasetemp()) as tmp:
            bundle = Path(tmp) / "b"
            shutil.copytree(tiny_bundle, bundle)
            data = (bundle / name).read_bytes()
            seed = int(fraction * 1e6)
            new = {"truncate": data[:int(len(data) * fraction)], "empty": b"",
                   "noise": np.random.default_rng(seed).bytes(len(data)),
                   "swap": (bundle / other).read_bytes()}[how]
            (bundle / name).write_bytes(new)
            if rehash and name != B.CONFIG_FILE:
                config = json.loads((bundle / B.CONFIG_FILE).read_text())
                config["files"][name] = B.sha256_file(bundle / name)
                (bundle / B.CONFIG_FILE).write_text(json.dumps(config))
            image = Path(tmp) / "x.npy"
            np.save(image, np.zeros((3, 32, 32), np.float32))
            before = tree(Path(tmp))
            # trusted, validate runs model.ts too (without --trust-code it is not read)
            assert_refused(run("validate", bundle, "--batch-sizes", "1", "--trust-code"),
                           before, Path(tmp))
            result = run("infer", bundle, image)
            if result.exit_code != 0:  # infer reads only what it runs: config and ONNX
                assert_refused(result, before, Path(tmp))
            else:  # each file is hashed as it is read: what infer never opens is not read
                assert name in (B.TS_FILE, B.WEIGHTS_FILE)

    check()


# ---------------------------------------------------------------- labelled .npz


GOOD_IMAGES = np.zeros((20, 32, 32, 3), np.uint8)


@st.composite
def npz_variant(draw):
    labels = np.arange(20) % 10
    kind = draw(st.sampled_from([
        "float images", "int16 images", "rank 2", "rank 5", "no images", "zero images",
        "short labels", "float labels", "negative label", "label too big", "object array",
        "five channels", "not a zip", "truncated", "labels 2-d", "nan labels"]))
    arrays = {"images": GOOD_IMAGES, "labels": labels}
    if kind == "float images":
        arrays["images"] = GOOD_IMAGES.astype(np.float32) + draw(st.floats(-1e9, 1e9))
    elif kind == "int16 images":
        arrays["images"] = GOOD_IMAGES.astype(np.int16)
    elif kind == "rank 2":
        arrays["images"] = GOOD_IMAGES.reshape(20, -1)
    elif kind == "rank 5":
        arrays["images"] = GOOD_IMAGES[..., None]
    elif kind == "no images":
        del arrays["images"]
    elif kind == "zero images":
        arrays = {"images": GOOD_IMAGES[:0], "labels": labels[:0]}
    elif kind == "short labels":
        arrays["labels"] = labels[:draw(st.integers(0, 19))]
    elif kind == "float labels":
        arrays["labels"] = labels + 0.5
    elif kind == "nan labels":
        arrays["labels"] = np.full(20, np.nan)
    elif kind == "negative label":
        arrays["labels"] = labels - draw(st.integers(1, 10 ** 6))
    elif kind == "label too big":
        arrays["labels"] = labels + draw(st.integers(10, 10 ** 6))
    elif kind == "object array":
        arrays["labels"] = np.array([{"x": 1}] * 20, dtype=object)
    elif kind == "five channels":  # two (gray and alpha) or four (RGBA) are images
        arrays["images"] = np.concatenate([GOOD_IMAGES, GOOD_IMAGES[..., :2]], axis=-1)
    elif kind == "labels 2-d":
        arrays["labels"] = labels.reshape(20, 1)
    return kind, arrays, draw(st.floats(0.05, 0.95))


def test_generated_npz_corruption_is_refused(tiny_bundle, tmp_path_factory):
    @cases("npz")
    @given(npz_variant())
    @this_part
    def check(variant):
        kind, arrays, fraction = variant
        with tempfile.TemporaryDirectory(dir=tmp_path_factory.getbasetemp()) as tmp:
            path = Path(tmp) / "data.npz"
            if kind == "not a zip":
                path.write_bytes(b"PK\x03\x04 not really")
            else:
                np.savez(path, allow_pickle=True, **arrays) if kind == "object array" else \
                    np.savez(path, **arrays)
                if kind == "truncated":
                    path.write_bytes(path.read_bytes()[:int(path.stat().st_size * fraction)])
            before = tree(Path(tmp))
            assert_refused(run("validate", tiny_bundle, "--real-data", path, "--batch-sizes",
                               "1"), before, Path(tmp))

    check()


# ---------------------------------------------------------------- checkpoints


@pytest.fixture(scope="module")
def tiny_state():
    torch.manual_seed(0)
    return create_model("vit_seed_tiny").state_dict()


@st.composite
def checkpoint_variant(draw, keys):
    key = draw(st.sampled_from(keys))
    kind = draw(st.sampled_from(["delete", "rank", "shape", "not a tensor", "nan", "extra key",
                                 "empty tensor", "wrong format", "truncated", "int tensor"]))
    return key, kind, draw(st.floats(0.05, 0.95))


def test_generated_checkpoint_corruption_is_refused(tiny_state, tmp_path_factory):
    keys = sorted(tiny_state)

    @cases("checkpoint")
    @given(checkpoint_variant(keys))
    @this_part
    def check(variant):
        key, kind, fraction = variant
        state = dict(tiny_state)
        value = state[key]
        extra = []
        if kind == "delete":
            del state[key]
        elif kind == "rank":
            state[key] = value.reshape(-1)[None, None] if value.dim() < 3 else value.flatten()
        elif kind == "shape":
            state[key] = torch.zeros(*[d + 1 for d in value.shape]) if value.dim() else \
                torch.zeros(2)
        elif kind == "not a tensor":
            state[key] = 3
        elif kind == "nan":
            state[key] = torch.full_like(value, float("nan"))
        elif kind == "extra key":
            state["blocks.0.attn.surprise"] = torch.zeros(3)
        elif kind == "empty tensor":
            state[key] = torch.zeros(0)
        elif kind == "int tensor":
            state[key] = value.to(torch.int64)
        elif kind == "wrong format":
            extra = ["--format", "torchvision"]
        with tempfile.TemporaryDirectory(dir=tmp_path_factory.getbasetemp()) as tmp:
            path = Path(tmp) / "ckpt.pth"
            torch.save({"model": state}, path)
            if kind == "truncated":
                path.write_bytes(path.read_bytes()[:int(path.stat().st_size * fraction)])
            before = tree(Path(tmp))
            result = run("export", Path(tmp) / "out", "--checkpoint", path, "--preset",
                         "vit_seed_tiny", *extra)
            if kind == "int tensor" and result.exit_code == 0:
                # an integer copy of a float tensor is still its values: load_state_dict
                # casts it back; the export validated it like any other
                return
            assert_refused(result, before, Path(tmp))

    check()


# ---------------------------------------------------------------- Hugging Face folders


@pytest.fixture(scope="module")
def hf_folder(tmp_path_factory):
    transformers = pytest.importorskip("transformers")
    config = transformers.ViTConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                    intermediate_size=128, image_size=32, patch_size=8,
                                    num_labels=5)
    torch.manual_seed(0)
    folder = tmp_path_factory.mktemp("hf") / "vit"
    transformers.ViTForImageClassification(config).eval().save_pretrained(folder)
    transformers.ViTImageProcessorPil(size={"height": 32, "width": 32}).save_pretrained(folder)
    return folder


HF_FIELDS = {
    "config.json": ["num_attention_heads", "layer_norm_eps", "image_size", "qkv_bias",
                    "hidden_act", "id2label"],
    "preprocessor_config.json": ["size", "resample", "do_resize", "do_center_crop",
                                 "image_mean", "image_std", "rescale_factor",
                                 "do_rescale", "do_normalize"],
}


@st.composite
def hf_variant(draw):
    name = draw(st.sampled_from(sorted(HF_FIELDS)))
    field = draw(st.sampled_from(HF_FIELDS[name]))
    values = ["x", None, [1, 2], {"a": 1}, -1, float("nan"), 10 ** 9, True, [],
              {"height": 7, "width": 9}]
    value = draw(st.sampled_from([v for v in values if (field, json.dumps(v)) not in
                                  HF_HARMLESS]))
    return name, field, value


def test_generated_hf_config_corruption_is_refused(hf_folder, tmp_path_factory):
    @cases("hf")
    @given(hf_variant())
    @this_part
    def check(variant):
        name, field, value = variant
        with tempfile.TemporaryDirectory(dir=tmp_path_factory.getbasetemp()) as tmp:
            folder = Path(tmp) / "vit"
            shutil.copytree(hf_folder, folder)
            document = json.loads((folder / name).read_text())
            document[field] = value
            (folder / name).write_text(json.dumps(document, allow_nan=True))
            before = tree(Path(tmp))
            assert_refused(run("export", Path(tmp) / "out", "--checkpoint", folder), before,
                           Path(tmp))

    check()


# Values a field may really hold (null is "not given": the processor's default applies), so
# they are not corruption and are not generated.
HF_HARMLESS = {(f, "null") for f in HF_FIELDS["preprocessor_config.json"]} | {
    ("qkv_bias", "true"), ("id2label", "null"), ("do_center_crop", "true"),
    ("do_resize", "true"), ("do_rescale", "true"), ("do_normalize", "true")}

