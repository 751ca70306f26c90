"""The Open Inference Protocol (deploy/oip.py): routes, requests and answers as data, and a
serve replica's own code (deploy/ray/serve.Replica) answering Triton's HTTP client, tritonclient,
served by uvicorn (the HTTP server under Ray Serve) without a Ray cluster: seconds, not the
minutes of a cluster. tests/test_serve.py asks `vit-export serve` itself the same way."""
import base64
import contextlib
import dataclasses
import json
import socket
import struct
import threading
import time
import tracemalloc
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Optional

import numpy as np
import pytest
from conftest import DIGITS, run, same_as_infer

from vit_export.deploy import oip
from vit_export.model import ViTConfig
from vit_export.preprocessing import Preprocessing

SAMPLES = sorted((DIGITS / "samples").glob("*.png"))


def model_of(config: ViTConfig, images: bool, output: str = "logits", max_batch: int = 16,
             name: str = "digits", **prep) -> oip.Model:
    """The protocol's view of a model of `config`, its preprocessing timm's defaults (or
    `prep`'s fields), served with a max batch of `max_batch`."""
    preprocessing = dataclasses.replace(Preprocessing.default_for(config), **prep)
    runner = "onnxruntime[model.e2e.onnx]" if images else "onnxruntime"
    return oip.Model.of(name, runner, config, images, output, preprocessing, max_batch)


DIGITS_CONFIG = ViTConfig(img_size=8, patch_size=4, in_chans=1, num_classes=10)
MODEL = model_of(DIGITS_CONFIG, False)


def body(*inputs, **extra) -> bytes:
    return json.dumps({"inputs": list(inputs), **extra}).encode()


def pixels(shape=(2, 1, 8, 8), **extra) -> dict:
    return {"name": "pixel_values", "datatype": "FP32", "shape": list(shape),
            "data": np.arange(np.prod(shape), dtype=float).tolist(), **extra}


def test_metadata_names_each_input_and_output_with_minus_one_for_any_size():
    assert MODEL.metadata() == {
        "name": "digits", "versions": ["1"], "platform": "onnxruntime",
        "inputs": [{"name": "pixel_values", "datatype": "FP32", "shape": [-1, 1, 8, 8]},
                   {"name": "image", "datatype": "BYTES", "shape": [-1]}],
        "outputs": [{"name": "logits", "datatype": "FP32", "shape": [-1, 10]}]}
    e2e = model_of(ViTConfig(img_size=32, patch_size=8, in_chans=3, embed_dim=64, depth=2,
                             num_heads=4, num_classes=0, dynamic_img_size=True), True,
                   "embedding", name="e2e")
    assert [t.to_dict() for t in e2e.inputs + e2e.outputs] == [
        {"name": "images", "datatype": "UINT8", "shape": [-1, -1, -1, 3]},
        {"name": "image", "datatype": "BYTES", "shape": [-1]},
        {"name": "embedding", "datatype": "FP32", "shape": [-1, 64]}]


@pytest.mark.parametrize("method, path, what", [
    ("GET", "/v2", "server"), ("GET", "/v2/health/live", "live"),
    ("GET", "/v2/health/ready/", "ready"), ("GET", "/v2/models/digits", "model"),
    ("GET", "/v2/models/digits/versions/1", "model"),
    ("GET", "/v2/models/digits/ready", "model_ready"),
    ("POST", "/v2/models/digits/infer", "infer"),
    ("POST", "/v2/models/digits/versions/1/infer", "infer")])
def test_every_route_of_the_protocol(method, path, what):
    assert oip.route(MODEL, method, path) == what


@pytest.mark.parametrize("method, path, status, message", [
    ("GET", "/v2/models/other", 404, "no model 'other': this server holds 'digits'"),
    ("GET", "/v2/models/digits/versions/2/ready", 404,
     "no version 2 of 'digits': it has version 1"),
    ("GET", "/v2/models", 404, ("no route /v2/models in the Open Inference Protocol: GET /v2, "
                               "/v2/health/ready, /v2/models/digits; POST "
                               "/v2/models/digits/infer")),
    ("GET", "/v2/models/digits/infer", 405, "use POST /v2/models/digits/infer"),
    ("POST", "/v2/health/ready", 405, "use GET /v2/health/ready")])
def test_a_route_model_version_or_method_not_here_is_4xx_in_one_line(method, path, status,
                                                                      message):
    with pytest.raises(oip.ProtocolError) as caught:
        oip.route(MODEL, method, path)
    assert (caught.value.status, str(caught.value)) == (status, message)


def test_a_tensor_in_json_or_binary_and_images_in_base64_or_binary_read_alike():
    x = np.random.default_rng(0).standard_normal((2, 1, 8, 8)).astype(np.float32)
    as_json = oip.parse_infer(MODEL, body(pixels(data=x.tolist()), id="a"))
    header = body({"name": "pixel_values", "datatype": "FP32", "shape": [2, 1, 8, 8],
                   "parameters": {"binary_data_size": x.nbytes}},
                  parameters={"binary_data_output": True})
    as_binary = oip.parse_infer(MODEL, header + x.tobytes(), str(len(header)))
    assert np.array_equal(as_json.values, x) and np.array_equal(as_binary.values, x)
    assert as_json.values.dtype == np.float32 and as_json.id == "a"
    assert as_json.outputs == (("logits", False),) and as_binary.outputs == (("logits", True),)
    images = [p.read_bytes() for p in SAMPLES[:2]]
    coded = oip.parse_infer(MODEL, body({"name": "image", "datatype": "BYTES", "shape": [2],
                                         "data": [base64.b64encode(i).decode() for i in images]}))
    packed = b"".join(struct.pack("<I", len(i)) + i for i in images)
    header = body({"name": "image", "datatype": "BYTES", "shape": [2],
                   "parameters": {"binary_data_size": len(packed)}})
    assert coded.values == images
    assert oip.parse_infer(MODEL, header + packed, str(len(header))).values == images


def test_a_model_that_takes_images_reads_uint8_pixels_of_any_size():
    """model.e2e.onnx's runner: uint8 [batch, height, width, channels], whole numbers 0-255."""
    e2e = model_of(ViTConfig(img_size=8, patch_size=4, in_chans=3, num_classes=10), True,
                   name="e2e")
    x = np.arange(2 * 5 * 7 * 3).reshape(2, 5, 7, 3) % 256
    asked = oip.parse_infer(e2e, body({"name": "images", "datatype": "UINT8",
                                       "shape": [2, 5, 7, 3], "data": x.tolist()}))
    assert asked.values.dtype == np.uint8 and np.array_equal(asked.values, x)
    for bad in ([256] * 210, [1.5] * 210, [-1] * 210):
        with pytest.raises(oip.ProtocolError, match=r"^input images's data must be whole "
                                                    r"numbers 0-255$"):
            oip.parse_infer(e2e, body({"name": "images", "datatype": "UINT8",
                                       "shape": [2, 5, 7, 3], "data": bad}))


def test_the_answer_holds_each_output_asked_for_in_json_or_after_the_header():
    logits = np.arange(20, dtype=np.float32).reshape(2, 10) / 7
    asked = oip.parse_infer(MODEL, body(pixels(), id="7", outputs=[{"name": "logits"}]))
    content, headers = oip.infer_answer(MODEL, asked, {"logits": logits})
    assert headers == {"content-type": "application/json"}
    assert json.loads(content) == {"model_name": "digits", "model_version": "1", "id": "7",
                                   "outputs": [{"name": "logits", "datatype": "FP32",
                                                "shape": [2, 10],
                                                "data": logits.ravel().tolist()}]}
    asked = oip.parse_infer(MODEL, body(pixels(), outputs=[
        {"name": "logits", "parameters": {"binary_data": True}}]))
    content, headers = oip.infer_answer(MODEL, asked, {"logits": logits})
    length = int(headers[oip.HEADER_LENGTH])
    assert json.loads(content[:length])["outputs"][0]["parameters"] == {"binary_data_size": 80}
    assert np.array_equal(np.frombuffer(content[length:], "<f4").reshape(2, 10), logits)


BAD_REQUESTS = [
    (b"{", None, ("infer request is not JSON: Expecting property name enclosed in double "
                 "quotes: line 1 column 2 (char 1)")),
    (b"[]", None, "infer request is not a JSON object"),
    (body(), None, "send one input: pixel_values (FP32 [-1, 1, 8, 8]) or image (BYTES [-1])"),
    (body(pixels(), pixels()), None, ("send one input: pixel_values (FP32 [-1, 1, 8, 8]) or "
                                     "image (BYTES [-1])")),
    (body(pixels(name="x")), None, ("no input 'x': send pixel_values (FP32 [-1, 1, 8, 8]) or "
                                   "image (BYTES [-1])")),
    (body(pixels(datatype="FP16")), None, "input pixel_values is FP32, not 'FP16'"),
    (body(pixels(shape=(2, 1, 4, 4))), None, ("input pixel_values of shape [2, 1, 4, 4]: "
                                             "expected [-1, 1, 8, 8] (-1: any size)")),
    (body(pixels(shape=(0, 1, 8, 8))), None, ("input pixel_values of shape [0, 1, 8, 8]: an "
                                             "empty batch")),
    (body({**pixels(), "shape": "2"}), None, ("input pixel_values's shape must be a list of sizes, "
                                    "not '2'")),
    (body(pixels(data=[1.0, 2.0])), None, ("input pixel_values of shape [2, 1, 8, 8] needs 128 "
                                          "values, got 2")),
    (body(pixels(data=["1"] * 128)), None, ("input pixel_values's data must be a list of "
                                           "numbers")),
    (body({"name": "pixel_values", "datatype": "FP32", "shape": [1, 1, 8, 8]}), None,
     "input pixel_values has neither data nor binary_data_size"),
    (b"{}", "x", ("Inference-Header-Content-Length 'x' is not a length within the body's 2 "
                 "bytes")),
    (body({"name": "image", "datatype": "BYTES", "shape": [1], "data": ["not base64!"]}),
     None, "input image's data is not base64: Only base64 data is allowed"),
    (body({"name": "image", "datatype": "BYTES", "shape": [2], "data": ["AAAA"]}), None,
     "input image of shape [2] holds 1 elements"),
    (body(pixels(), outputs=[{"name": "probs"}]), None, ("no output 'probs': this model gives "
                                                        "logits")),
    (body(pixels(), outputs=[{"name": "logits", "parameters": {"class_count": 3}}]), None,
     ("class_count (classification) is not served here: ask for the output, or POST "
     "/predict?top_k=K")),
    (body(pixels(), id=3), None, "id must be a string"),
    (b"[" * 100_000 + b"]" * 100_000, None, "infer request is not JSON we read: nested too deep"),
    (body(pixels(data=[10 ** 400] * 128)), None, ("input pixel_values's data holds a number "
                                                "beyond float64")),
    (body({"name": "images", "datatype": "UINT8", "shape": [1]}), None,
     "no input 'images': send pixel_values (FP32 [-1, 1, 8, 8]) or image (BYTES [-1])"),
    (b"{}", "9" * 5000, ("Inference-Header-Content-Length '99999999999999999999...(5000 "
                         "characters)' is not a length within the body's 2 bytes")),
    (body({"name": "image", "datatype": "BYTES", "shape": [1], "data": [""]}), None,
     "image[0] is empty (0 bytes), not an image"),
    (body({"name": "image", "datatype": "BYTES", "shape": [0], "data": []}), None,
     "input image of shape [0]: an empty batch"),
]


@pytest.mark.parametrize("request_body, header, message", BAD_REQUESTS,
                         ids=[message[:48] for _, _, message in BAD_REQUESTS])
def test_what_a_request_gets_wrong_is_400_in_one_line(request_body, header, message):
    with pytest.raises(oip.ProtocolError) as caught:
        oip.parse_infer(MODEL, request_body, header)
    assert caught.value.status == 400 and str(caught.value) == message


E2E = model_of(DIGITS_CONFIG, True, name="e2e")  # model.e2e.onnx: uint8 images of any size


@pytest.mark.parametrize("shape", [[1, 0, 0, 1], [1, 1, 0, 1], [2, 5, 0, 1]])
def test_an_image_of_no_pixels_is_400_in_one_line(shape):
    """numpy's min() of an empty array was a 500."""
    with pytest.raises(oip.ProtocolError) as caught:
        oip.parse_infer(E2E, body({"name": "images", "datatype": "UINT8", "shape": shape,
                                   "data": []}))
    assert (caught.value.status, str(caught.value)) == (
        400, f"input images of shape {shape}: images of no pixels")


def binary(entry: dict, payload: bytes) -> tuple[bytes, str]:
    """A request of one input whose data is `payload`, after the JSON header (Triton's
    binary tensor extension): (the body, its Inference-Header-Content-Length)."""
    header = body({**entry, "parameters": {"binary_data_size": len(payload)}})
    return header + payload, str(len(header))


def packed(items: list[bytes]) -> bytes:
    """BYTES elements as binary data: each length-prefixed."""
    return b"".join(struct.pack("<I", len(item)) + item for item in items)


def png_file(width: int, height: int) -> bytes:
    import io

    from PIL import Image

    buffer = io.BytesIO()
    Image.new("L", (width, height)).save(buffer, format="PNG")
    return buffer.getvalue()


def png_header(width: int, height: int) -> bytes:
    """A PNG's signature, header and end, with no image data: what a client can send, in
    45 bytes, for an image of any size Pillow opens."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(
            ">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)  # 8-bit gray
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IEND", b"")


def refused(model: oip.Model, request: bytes, header: Optional[str] = None
            ) -> tuple[int, str, int]:
    """(status, line, bytes allocated at the peak) of a request parse_infer refuses."""
    tracemalloc.start()
    try:
        with pytest.raises(oip.ProtocolError) as caught:
            oip.parse_infer(model, request, header)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    return caught.value.status, str(caught.value), peak


OVER_THE_BATCH = [  # (model, input, data after the header): each would run all at once
    (MODEL, {"name": "pixel_values", "datatype": "FP32", "shape": [60_000, 1, 8, 8]},
     bytes(60_000 * 64 * 4)),  # 15 MB of rows: 5.8 GB on a replica of a larger model
    (MODEL, {"name": "image", "datatype": "BYTES", "shape": [1000]},
     packed([png_file(1, 1)] * 1000)),  # 71 KB of 1x1 images, each resized to the model's
    (E2E, {"name": "images", "datatype": "UINT8", "shape": [100_000, 1, 1, 1]},
     bytes(100_000)),  # 100 KB of 1x1 images that model.e2e.onnx would resize at once
]


@pytest.mark.parametrize("model, entry, payload", OVER_THE_BATCH,
                         ids=["fp32-rows", "encoded-images", "uint8-images"])
def test_a_request_over_the_max_batch_is_413_before_its_data_is_read(model, entry, payload):
    """As Triton refuses a request over a model's max_batch_size: in one line, with nothing
    of its data converted or decoded (the parse allocates no more than its JSON header)."""
    status, line, peak = refused(model, *binary(entry, payload))
    count = entry["shape"][0]
    assert (status, line) == (413, (f"input {entry['name']} of shape {entry['shape']} holds "
                                    f"{count} inputs, over the 16 one request may hold (the "
                                    f"server's max batch size): send at most 16 per request"))
    assert peak < 256 << 10, peak  # not the payload's size, let alone the run's
    within = {**entry, "shape": [16, *entry["shape"][1:]]}
    size = len(payload) // count * 16 if entry["datatype"] != "BYTES" else None
    data = payload[:size] if size else packed([png_file(1, 1)] * 16)
    assert len(oip.parse_infer(model, *binary(within, data)).values) == 16


def test_images_are_budgeted_by_their_headers_before_any_is_decoded():
    """16 images of 9000x9000, declared in 45 bytes each: 1.3 G pixels to decode, refused
    from their headers with nothing decoded; 16 images of the budget go through."""
    entry = {"name": "image", "datatype": "BYTES", "shape": [16]}
    started = time.perf_counter()
    status, line, peak = refused(MODEL, *binary(entry, packed([png_header(9000, 9000)] * 16)))
    assert (status, line) == (413, ("16 image(s) would take 1296 M pixels to decode and resize, "
                                    "over the 268 M one request may take (16 images of 17 M): "
                                    "send fewer or smaller images per request"))
    assert peak < 256 << 10 and time.perf_counter() - started < 1.0
    within = oip.parse_infer(MODEL, *binary(entry, packed([png_header(4096, 4096)] * 16)))
    assert within.sizes == ((4096, 4096),) * 16


def test_an_image_tensor_is_held_to_the_resize_budget_of_an_image_file():
    """A 2000000x1 strip as uint8 pixels (2 MB) would be resized to 16000000x8 in the model's
    graph: refused with the line the same image as a file gets, before a byte is converted;
    as an encoded image too."""
    from vit_export.errors import InputError
    from vit_export.images import load_image_bytes

    strip = png_file(2_000_000, 1)
    with pytest.raises(InputError) as as_file:
        load_image_bytes(strip, "images[0]", E2E.prep, raw=True)
    status, line, peak = refused(E2E, *binary(
        {"name": "images", "datatype": "UINT8", "shape": [1, 1, 2_000_000, 1]},
        bytes(2_000_000)))
    assert (status, line) == (400, str(as_file.value))
    assert line.startswith("images[0]: image is 2000000x1: resizing it as the model's "
                           "preprocessing does (short side to 8) would make it 16000000x8")
    assert peak < 256 << 10
    status, line, _ = refused(E2E, *binary({"name": "image", "datatype": "BYTES", "shape": [1]},
                                           packed([strip])))
    assert (status, line) == (400, str(as_file.value).replace("images[0]", "image[0]"))


def test_pixel_values_of_a_dynamic_size_model_are_held_to_a_batch_at_its_size():
    """A dynamic-size model runs at the size it is sent: a request may hold as many pixels
    as a full batch at the model's own size."""
    dynamic = model_of(dataclasses.replace(DIGITS_CONFIG, dynamic_img_size=True), False)
    entry = {"name": "pixel_values", "datatype": "FP32", "shape": [1, 1, 64, 64]}
    status, line, _ = refused(dynamic, *binary(entry, bytes(64 * 64 * 4)))
    assert (status, line) == (413, ("input pixel_values of shape [1, 1, 64, 64] holds 4096 "
                                    "pixels, over the 1024 one request may hold (16 inputs of "
                                    "8x8): send fewer or smaller inputs per request"))
    within = {**entry, "shape": [1, 1, 32, 32]}
    assert oip.parse_infer(dynamic, *binary(within, bytes(32 * 32 * 4))).values.shape == \
        (1, 1, 32, 32)


def test_binary_data_must_be_exactly_what_the_input_says():
    x = np.zeros((1, 1, 8, 8), np.float32)
    header = body(pixels(shape=x.shape, parameters={"binary_data_size": 100}))
    with pytest.raises(oip.ProtocolError, match=r"needs 256 bytes of float32, got 100$"):
        oip.parse_infer(MODEL, header + bytes(100), str(len(header)))
    header = body(pixels(shape=x.shape, parameters={"binary_data_size": 256}))
    with pytest.raises(oip.ProtocolError, match=r"^4 bytes of binary data after the input's$"):
        oip.parse_infer(MODEL, header + x.tobytes() + bytes(4), str(len(header)))
    header = body({"name": "image", "datatype": "BYTES", "shape": [1],
                   "parameters": {"binary_data_size": 6}})
    with pytest.raises(oip.ProtocolError, match=r"element 0 is cut short$"):
        oip.parse_infer(MODEL, header + struct.pack("<I", 9) + b"ab", str(len(header)))


# --- a replica's own code, asked by tritonclient

def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def replica_served(bundle, options) -> Iterator[str]:
    """serve.Replica on `bundle`, its __call__ served by uvicorn on localhost: host:port."""
    pytest.importorskip("ray.serve")
    uvicorn = pytest.importorskip("uvicorn")
    from starlette.applications import Starlette
    from starlette.routing import Route

    from vit_export.deploy.ray.serve import Replica

    replica = Replica(str(bundle), options)

    async def endpoint(request):
        return await replica(request)

    app = Starlette(routes=[Route("/{path:path}", endpoint, methods=["GET", "POST", "PUT"])])
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="error"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.05)
    assert server.started
    try:
        yield f"127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(10)


@pytest.fixture(scope="module")
def replica_url(digits_bundle):
    from vit_export.deploy.ray.serve import ServeOptions

    with replica_served(digits_bundle, ServeOptions(provider="cpu")) as url:
        yield url


@pytest.fixture(scope="module")
def expected(digits_bundle) -> dict[str, dict]:
    """infer --json on the shipped samples, by file name."""
    code, stdout, stderr = run("infer", digits_bundle, *SAMPLES, "--top-k", 3, "--json",
                               "--provider", "cpu")
    assert code == 0, stderr
    return {Path(r["input"]).name: r for r in json.loads(stdout)["results"]}


def test_tritonclient_reads_health_and_metadata_of_a_replica(replica_url):
    httpclient = pytest.importorskip("tritonclient.http")
    client = httpclient.InferenceServerClient(url=replica_url)
    assert client.is_server_live() and client.is_server_ready()
    assert client.get_server_metadata() == {"name": "vit-export", "version": "0.1.0",
                                             "extensions": ["binary_tensor_data"]}
    assert client.is_model_ready("vit_digits_8x8")
    assert client.get_model_metadata("vit_digits_8x8") == {
        "name": "vit_digits_8x8", "versions": ["1"], "platform": "onnxruntime",
        "inputs": [{"name": "pixel_values", "datatype": "FP32", "shape": [-1, 1, 8, 8]},
                   {"name": "image", "datatype": "BYTES", "shape": [-1]}],
        "outputs": [{"name": "logits", "datatype": "FP32", "shape": [-1, 10]}]}
    from tritonclient.utils import InferenceServerException

    with pytest.raises(InferenceServerException) as caught:
        client.get_model_metadata("other")
    assert caught.value.status() == "404"
    assert caught.value.message() == "no model 'other': this server holds 'vit_digits_8x8'"


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
def test_tritonclient_infer_on_a_tensor_equals_infer(replica_url, digits_bundle, expected,
                                                     binary):
    """The samples preprocessed as infer reads them, sent as one FP32 tensor (in binary,
    tritonclient's default, or as JSON data): the same top-3 as infer --json."""
    httpclient = pytest.importorskip("tritonclient.http")
    from vit_export.deploy.classify import open_model

    _names, arrays = zip(*open_model(digits_bundle, "cpu").inputs(SAMPLES))
    x = np.stack(arrays).astype(np.float32)
    tensor = httpclient.InferInput("pixel_values", list(x.shape), "FP32")
    tensor.set_data_from_numpy(x, binary_data=binary)
    outputs = [httpclient.InferRequestedOutput("logits", binary_data=binary)]
    client = httpclient.InferenceServerClient(url=replica_url)
    result = client.infer("vit_digits_8x8", [tensor], outputs=outputs, request_id="r1")
    logits = result.as_numpy("logits")
    assert logits.shape == (len(SAMPLES), 10) and logits.dtype == np.float32
    assert result.get_response()["id"] == "r1"
    assert same_as_infer(logits, [expected[p.name] for p in SAMPLES])


def test_tritonclient_infer_on_encoded_images_equals_infer(replica_url, expected):
    """The sample files' bytes as one BYTES tensor, decoded as /predict decodes a body."""
    httpclient = pytest.importorskip("tritonclient.http")
    files = np.array([p.read_bytes() for p in SAMPLES], dtype=np.object_)
    tensor = httpclient.InferInput("image", [len(files)], "BYTES")
    tensor.set_data_from_numpy(files)
    client = httpclient.InferenceServerClient(url=replica_url)
    logits = client.infer("vit_digits_8x8", [tensor]).as_numpy("logits")
    assert same_as_infer(logits, [expected[p.name] for p in SAMPLES])


def test_a_bad_infer_is_4xx_in_one_line_and_the_replica_answers_after(replica_url):
    httpclient = pytest.importorskip("tritonclient.http")
    requests = pytest.importorskip("requests")
    from tritonclient.utils import InferenceServerException

    client = httpclient.InferenceServerClient(url=replica_url)
    tensor = httpclient.InferInput("pixel_values", [1, 1, 4, 4], "FP32")
    tensor.set_data_from_numpy(np.zeros((1, 1, 4, 4), np.float32))
    with pytest.raises(InferenceServerException) as caught:
        client.infer("vit_digits_8x8", [tensor])
    assert caught.value.status() == "400"
    assert caught.value.message() == ("input pixel_values of shape [1, 1, 4, 4]: expected "
                                      "[-1, 1, 8, 8] (-1: any size)")
    url = f"http://{replica_url}/v2/models/vit_digits_8x8/infer"
    for sent, status, message in [
            (pixels(shape=(1, 1, 8, 8), data=[1e39] * 64), 400,
             "pixel_values[0]: non-finite values in the model's input"),
            ({"name": "image", "datatype": "BYTES", "shape": [1],
              "data": [base64.b64encode(b"not an image").decode()]}, 400,
             "image[0] is not an image Pillow can read")]:
        answer = requests.post(url, data=body(sent), timeout=30)
        assert (answer.status_code, answer.json()) == (status, {"error": message})
    assert requests.get(url, timeout=30).status_code == 405
    too_big = requests.post(url, data=b"x" * (17 << 20), timeout=30)
    assert too_big.status_code == 413 and too_big.json()["error"].startswith("request body")
    assert client.is_server_ready()


def test_a_replica_refuses_what_a_request_may_not_cost_in_one_line_and_answers_after(
        replica_url):
    """Over HTTP, as a client sends them: 60,000 rows (15 MB, within the body limit) are a
    413 before anything runs; an empty image and a 5,000-digit header length, 400s (they
    were 500s); the replica answers the next request."""
    requests = pytest.importorskip("requests")
    url = f"http://{replica_url}/v2/models/vit_digits_8x8/infer"
    rows, header = binary({"name": "pixel_values", "datatype": "FP32",
                           "shape": [60_000, 1, 8, 8]}, bytes(60_000 * 64 * 4))
    empty = body({"name": "image", "datatype": "BYTES", "shape": [1], "data": [""]})
    for sent, length, status, message in [
            (rows, header, 413, ("input pixel_values of shape [60000, 1, 8, 8] holds 60000 "
                                 "inputs, over the 16 one request may hold (the server's max "
                                 "batch size): send at most 16 per request")),
            (empty, None, 400, "image[0] is empty (0 bytes), not an image"),
            (b"{}", "9" * 5000, 400, ("Inference-Header-Content-Length '9999999999999999999"
                                      "9...(5000 characters)' is not a length within the "
                                      "body's 2 bytes"))]:
        headers = {oip.HEADER_LENGTH: length} if length else {}
        answer = requests.post(url, data=sent, headers=headers, timeout=60)
        assert (answer.status_code, answer.json()) == (status, {"error": message})
    answer = requests.post(url, data=body(pixels(shape=(16, 1, 8, 8))), timeout=60)
    assert answer.status_code == 200 and answer.json()["outputs"][0]["shape"] == [16, 10]


@pytest.mark.slow  # several seconds: the whole suite runs it
def test_a_replica_of_model_e2e_onnx_takes_uint8_pixels_and_images_as_infer_does(tmp_path):
    """Served with model.e2e.onnx (preprocessing in the graph), the tensor input is uint8
    pixels of any size: the samples as they are, and their files as BYTES, answer what
    infer --runtime onnxruntime[model.e2e.onnx] --json says of the same files."""
    httpclient = pytest.importorskip("tritonclient.http")
    from PIL import Image

    from vit_export.deploy.ray.serve import ServeOptions

    bundle = tmp_path / "digits-e2e"
    code, _, stderr = run("export", bundle, "--from", DIGITS, "--embed-preprocessing",
                          "--provider", "cpu", "--quiet")
    assert code == 0, stderr
    runtime = "onnxruntime[model.e2e.onnx]"
    code, stdout, stderr = run("infer", bundle, *SAMPLES[:3], "--top-k", 3, "--json",
                               "--provider", "cpu", "--runtime", runtime)
    assert code == 0, stderr
    want = json.loads(stdout)["results"]
    pixels = np.stack([np.asarray(Image.open(p).convert("L"))[..., None] for p in SAMPLES[:3]])
    with replica_served(bundle, ServeOptions(provider="cpu", runtime=runtime)) as url:
        client = httpclient.InferenceServerClient(url=url)
        assert client.get_model_metadata("vit_digits_8x8")["inputs"][0] == {
            "name": "images", "datatype": "UINT8", "shape": [-1, -1, -1, 1]}
        tensor = httpclient.InferInput("images", list(pixels.shape), "UINT8")
        tensor.set_data_from_numpy(pixels)
        assert same_as_infer(client.infer("vit_digits_8x8", [tensor]).as_numpy("logits"), want)
        files = httpclient.InferInput("image", [3], "BYTES")
        files.set_data_from_numpy(np.array([p.read_bytes() for p in SAMPLES[:3]], np.object_))
        assert same_as_infer(client.infer("vit_digits_8x8", [files]).as_numpy("logits"), want)
