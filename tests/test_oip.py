"""The Open Inference Protocol (deploy/oip.py): routes, requests and answers as data, and a
serve replica's own code (deploy/serve.Replica) answering Triton's HTTP client, tritonclient,
served by uvicorn (the HTTP server under Ray Serve) without a Ray cluster: seconds, not the
minutes of a cluster. tests/test_serve.py asks `vit-export serve` itself the same way."""
import base64
import contextlib
import json
import socket
import struct
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from conftest import DIGITS, run, same_as_infer

from vit_export.deploy import oip
from vit_export.model import ViTConfig

SAMPLES = sorted((DIGITS / "samples").glob("*.png"))
MODEL = oip.Model.of("digits", "onnxruntime", ViTConfig(img_size=8, patch_size=4, in_chans=1,
                                                        num_classes=10), False, "logits")


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
    e2e = oip.Model.of("e2e", "onnxruntime[model.e2e.onnx]", ViTConfig(
        img_size=32, patch_size=8, in_chans=3, embed_dim=64, depth=2, num_heads=4,
        num_classes=0, dynamic_img_size=True), True, "embedding")
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
    e2e = oip.Model.of("e2e", "onnxruntime[model.e2e.onnx]", ViTConfig(
        img_size=8, patch_size=4, in_chans=3, num_classes=10), True, "logits")
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
]


@pytest.mark.parametrize("request_body, header, message", BAD_REQUESTS,
                         ids=[message[:48] for _, _, message in BAD_REQUESTS])
def test_what_a_request_gets_wrong_is_400_in_one_line(request_body, header, message):
    with pytest.raises(oip.ProtocolError) as caught:
        oip.parse_infer(MODEL, request_body, header)
    assert caught.value.status == 400 and str(caught.value) == message


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

    from vit_export.deploy.serve import Replica

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
    from vit_export.deploy.serve import ServeOptions

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


@pytest.mark.slow  # several seconds: the whole suite runs it
def test_a_replica_of_model_e2e_onnx_takes_uint8_pixels_and_images_as_infer_does(tmp_path):
    """Served with model.e2e.onnx (preprocessing in the graph), the tensor input is uint8
    pixels of any size: the samples as they are, and their files as BYTES, answer what
    infer --runtime onnxruntime[model.e2e.onnx] --json says of the same files."""
    httpclient = pytest.importorskip("tritonclient.http")
    from PIL import Image

    from vit_export.deploy.serve import ServeOptions

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
    with replica_served(bundle, ServeOptions(provider="cpu", runtime_name=runtime)) as url:
        client = httpclient.InferenceServerClient(url=url)
        assert client.get_model_metadata("vit_digits_8x8")["inputs"][0] == {
            "name": "images", "datatype": "UINT8", "shape": [-1, -1, -1, 1]}
        tensor = httpclient.InferInput("images", list(pixels.shape), "UINT8")
        tensor.set_data_from_numpy(pixels)
        assert same_as_infer(client.infer("vit_digits_8x8", [tensor]).as_numpy("logits"), want)
        files = httpclient.InferInput("image", [3], "BYTES")
        files.set_data_from_numpy(np.array([p.read_bytes() for p in SAMPLES[:3]], np.object_))
        assert same_as_infer(client.infer("vit_digits_8x8", [files]).as_numpy("logits"), want)
