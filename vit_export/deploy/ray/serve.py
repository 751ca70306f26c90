"""HTTP serving on Ray Serve: `vit-export serve BUNDLE`.

Each replica opens the bundle as `infer` does (`classify.Classifier`, or `Embedder` for a
bundle whose output is an embedding: sha256s checked, the provider verified, so a replica
that asked for CUDA and got CPU fails to start) and serves

    POST /predict   an image: the raw bytes as the body, or a multipart file upload;
                    ?top_k=K. -> {"input", "top": [{"class", "label", "prob"}, ...]}
    POST /embed     (a bundle that gives an embedding, instead of /predict) an image as
                    for /predict -> {"input", "embedding": [...]}, as `infer --embed --json`
    GET  /healthz   -> {"status": "ok", "model", "runtime", "provider", "pid", "node"}:
                    the replica that answered; on a cluster, also "retried", "unanswered":
                    the front's counts of requests asked again and of 503s for none answering
    /v2/...         the Open Inference Protocol (KServe v2 REST, as Triton's and KServe's
                    clients speak it; `oip`): health, server and model metadata, and
                    POST /v2/models/NAME/infer with a tensor or encoded images (BYTES)

On a cluster (`serve --address`), where a replica's node can be lost while the others live,
each request comes in through the front (`front.Front`: one replica of no CPU, on the
driver's node), which reads it, its body held to --max-request-bytes, and hands it to a
replica; where that replica is lost with the request (its process or its node gone), the
front asks another, and answers 503 with Retry-After only where none could answer. On one
machine (no --address) there is no front: it is one more hop and a process sharing the
replicas' cores (measured on 2 cores: about 3 ms more a request at the median, and about
29% fewer requests/s under 32 clients), so the replicas take the HTTP requests themselves,
and a request in flight on a replica that crashes gets Ray Serve's own 500.

Requests are batched by `serve.batch` (max batch and wait configurable). A request the
model cannot take is a 4xx with {"error": "<one line>"}, as `infer` would say it: 400 for an
image that does not decode, 413 for a body over the size limit, 404/405 for other routes.
No request can take a replica down: whatever goes wrong inside one request is answered.

Every request costs a bounded amount, known before any of it is decoded or run: its body at
most --max-request-bytes; at most --max-batch-size inputs (a /v2 infer request over it is a
413, as Triton answers one over max_batch_size); each image's size read from its header and
held to the resize budget an image file is held to, and a request's images together to max
batch size images at that budget (`oip.Model.check_images`, for /predict as for /v2).

Stopping (SIGTERM, Ctrl-C) drains before Ray Serve is shut down, which kills its proxy at
once with whatever is in flight: the driver tells the replicas (through a `Stop` actor), each
answers what arrives after that with 503 {"error": "server is stopping"}, lets the requests
it holds finish for up to GRACE_S, answers those still unfinished with the same 503, and says
it has drained; then Ray Serve is shut down. A second signal stops at once. Should Ray's
shutdown hang (its own processes gone or going after a Ctrl-C to the process group), after
STOP_LIMIT_S its processes are killed and the server exits all the same, with one line.
"""
from __future__ import annotations

import asyncio
import email.message
import email.parser
import email.policy
import os
from dataclasses import dataclass
from typing import Any, Optional

from ...errors import VitExportError, first_line, received
from .. import DEFAULT_MAX_BATCH_SIZE, oip
from .front import Asked, HttpError, bind_front, read

DEFAULT_MAX_REQUEST_BYTES = 16 * 2 ** 20
MAX_PARTS = 16  # a multipart upload of more is refused before Python's parser walks it
APP = "vit-export"  # the Ray Serve application and deployment name
GRACE_S = 15.0  # after SIGTERM or Ctrl-C: how long requests in flight may take to finish
STOP_LIMIT_S = GRACE_S + 60  # then the most Ray Serve and Ray may take to shut down
STOPPING = "server is stopping"  # the 503's error, from the signal on
FLUSH_S = 0.5  # after the replicas drained: for the proxy to send their last answers


@dataclass(frozen=True)
class ServeOptions:
    host: str = "127.0.0.1"
    port: int = 8000
    replicas: int = 1
    autoscale: Optional[tuple[int, int]] = None  # (min, max) replicas instead of `replicas`
    max_batch_size: int = DEFAULT_MAX_BATCH_SIZE
    batch_wait_ms: float = 5.0
    max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES
    top_k: int = 5
    provider: str = "auto"
    runtime: Optional[str] = None  # a runner name (runtime.open_runner): None, onnxruntime
    threads: Optional[int] = None  # ONNX Runtime threads per replica
    # (file, sha256) of what the driver read: each replica holds its node's copy to them
    checked: Optional[tuple[tuple[str, str], ...]] = None


class Replica:
    """The deployment's class (wrapped by `serve.deployment` in `application`)."""

    def __init__(self, bundle: str, options: ServeOptions, stop=None):
        from ray import serve

        from ...bundle import read_model
        from ..classify import open_model
        from .session import node_id, on_this_node

        self._drain_on(stop)
        with on_this_node():  # this node's copy of the bundle, held to the driver's
            model = read_model(bundle, dict(options.checked) if options.checked else None)
            self.classify = open_model(model, options.provider, options.runtime,
                                       threads=options.threads)
        self.node = node_id()
        self.route = route(self.classify.description.config)
        self.options = options
        self.name = self.classify.description.name
        self.oip = oip.Model.of(self.name, self.classify.runner.name,
                                self.classify.description.config, self.classify.takes_images,
                                self.classify.kind, self.classify.description.preprocessing,
                                options.max_batch_size)
        self._batched = serve.batch(max_batch_size=options.max_batch_size,
                                    batch_wait_timeout_s=options.batch_wait_ms / 1000)(
            self._run_batch)

    async def _run_batch(self, requests: list[tuple[str, Any, int]]) -> list[Any]:
        names, arrays, ks = zip(*requests)
        loop = asyncio.get_running_loop()
        try:
            results = await loop.run_in_executor(None, self._ask, names, arrays, max(ks))
        except VitExportError:  # non-finite outputs for some input: answer each on its own,
            return [await self._run_one(request) for request in requests]  # not another's
        if self.route == "/embed":
            return results
        return [{**r, "top": r["top"][:k]} for r, k in zip(results, ks)]

    def _ask(self, names, arrays, k: int) -> list[dict[str, Any]]:
        if self.route == "/embed":
            return [{"input": name, "embedding": row.tolist()}
                    for name, row in zip(names, self.classify(names, arrays))]
        return self.classify(names, arrays, k)

    async def _run_one(self, request: tuple[str, Any, int]) -> Any:
        name, array, k = request
        loop = asyncio.get_running_loop()
        try:
            [result] = await loop.run_in_executor(None, self._ask, [name], [array], k)
        except VitExportError as exc:  # the model's fault, not the request's
            return HttpError(500, str(exc))
        return result

    def _drain_on(self, stop) -> None:
        self._stop = stop  # the driver's `Stop` actor: it says when to drain
        self._stopping = False  # from then on, a request that comes is answered 503
        self._in_flight = 0  # requests taken before that, not yet answered
        self._late = asyncio.Event()  # the grace period is over: those are answered 503
        self._late_wait: Optional[asyncio.Future] = None
        self._watching: Optional[asyncio.Task] = None
        self._start_watching()

    def _start_watching(self) -> None:
        """The task that waits for the driver's word to stop (Serve builds the replica on
        its event loop; elsewhere, the first request starts it)."""
        if self._stop is None or self._watching is not None:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        self._watching = loop.create_task(self._watch())

    async def _watch(self) -> None:
        try:
            grace = await self._stop.wait.remote()
        except Exception:  # the driver, and Ray, going away: nothing to drain for
            return
        self._stopping = True
        loop = asyncio.get_running_loop()
        deadline = loop.time() + grace
        while self._in_flight and loop.time() < deadline:
            await asyncio.sleep(0.05)
        self._late.set()  # what is still in flight is answered 503 now
        while self._in_flight:
            await asyncio.sleep(0.01)
        try:
            await self._stop.drained.remote()
        except Exception:  # the driver gone already: no one to tell
            return

    async def __call__(self, asked: Any) -> Any:
        """The answer (a Starlette response) to a request the front read (`Asked`,
        on a cluster), or to a Starlette request, read here (on one machine: no front)."""
        from starlette.responses import JSONResponse

        self._start_watching()
        if self._stopping:
            return JSONResponse({"error": STOPPING}, status_code=503)
        self._in_flight += 1
        try:
            work = asyncio.ensure_future(self._respond(asked))
            if self._late_wait is None:
                self._late_wait = asyncio.ensure_future(self._late.wait())
            try:
                await asyncio.wait((work, self._late_wait),
                                   return_when=asyncio.FIRST_COMPLETED)
            except asyncio.CancelledError:  # Serve or the front gave up on it (client gone)
                work.cancel()
                raise
            if work.done():
                return work.result()
            # past the grace period: answered now; the work's own answer goes nowhere
            return JSONResponse({"error": STOPPING}, status_code=503)
        finally:
            self._in_flight -= 1

    async def _respond(self, asked: Any) -> Any:
        from starlette.responses import JSONResponse, Response

        try:
            if not isinstance(asked, Asked):  # a Starlette request
                asked = await read(asked, self.options.max_request_bytes)
            answer = await self._answer(asked)
            return answer if isinstance(answer, Response) else JSONResponse(answer)
        except HttpError as exc:  # oip's ProtocolError too: the same class
            return JSONResponse({"error": str(exc)}, status_code=exc.status)
        except Exception as exc:  # never a traceback to the client, never a dead replica
            line = first_line(exc)
            return JSONResponse({"error": f"internal error: {line}"}, status_code=500)

    async def _answer(self, asked: Asked) -> dict[str, Any]:
        from ...errors import InputError

        route = asked.route
        if route == "/v2" or route.startswith("/v2/"):
            return await self._oip(asked, route)
        if route == "/healthz":
            if asked.method != "GET":
                raise HttpError(405, "use GET /healthz")
            return {"status": "ok", "model": self.name, "runtime": self.classify.runner.name,
                    "provider": self.classify.runner.device, "pid": os.getpid(),
                    "node": self.node}
        if route != self.route:
            what = {"/predict": "classes", "/embed": "embeddings"}
            why = f" (this model gives {what[self.route]})" if route in what else ""
            raise HttpError(404, f"no route {route}{why}: POST an image to {self.route}, "
                                 f"GET /healthz")
        if asked.method != "POST":
            raise HttpError(405, f"use POST {self.route} with an image as the body")
        top_k = _top_k(asked.top_k, self.options.top_k) if self.route == "/predict" else 0
        data, name = _image_part(_body(asked), asked.content_type)
        loop = asyncio.get_running_loop()  # decoding is CPU work: off the event loop
        try:
            array = await loop.run_in_executor(None, self._decode, data, name)
        except InputError as exc:
            raise HttpError(400, str(exc)) from None
        answer = await self._batched((name, array, top_k))
        if isinstance(answer, HttpError):
            raise answer
        return answer

    def _decode(self, data: bytes, name: str):
        """The image of a /predict or /embed request, as a /v2 request's one: its size read
        from its header and held to what a request may cost before it is decoded."""
        from ...images import image_size

        self.oip.check_images([name], [image_size(data, name)])
        return self.classify.decode(data, name)

    async def _oip(self, asked: Asked, path: str) -> Any:
        """A request of the Open Inference Protocol: a GET's JSON, or infer's answer."""
        from starlette.responses import Response

        what = oip.route(self.oip, asked.method, path)
        if what != "infer":
            return oip.answer(self.oip, what)
        loop = asyncio.get_running_loop()  # off the event loop: headers, decoding, the model
        infer = await loop.run_in_executor(None, oip.parse_infer, self.oip, _body(asked),
                                           asked.header_length)
        values = await loop.run_in_executor(None, self._infer, infer)
        content, headers = oip.infer_answer(self.oip, infer, {self.classify.kind: values})
        return Response(content, headers=headers)

    def _infer(self, asked: "oip.Request"):
        """The model's output for an infer request's input (within what a request may cost,
        `oip.parse_infer`): a tensor's rows, or each encoded image decoded as /predict
        decodes one. A bad input is a 400; the model's own failure (non-finite output) a
        500."""
        from ...errors import InputError

        names = [f"{asked.input.name}[{i}]" for i in range(len(asked.values))]
        try:
            if asked.input.datatype == "BYTES":
                return self.classify.run_encoded(names, asked.values, asked.sizes)
            # the runner checks the size, as for infer
            return self.classify.run(names, list(asked.values))
        except InputError as exc:
            raise HttpError(400, str(exc)) from None
        except VitExportError as exc:
            raise HttpError(500, str(exc)) from None


def route(config) -> str:
    """Where a bundle's answers are asked for: /predict (classes) where it gives logits,
    else /embed."""
    return "/predict" if "logits" in config.output_names else "/embed"


def _top_k(value: Optional[str], default: int) -> int:
    if value is None:
        return default
    if not (value.isascii() and value.isdigit()) or not value.strip("0"):
        raise HttpError(400, f"top_k must be a whole number >= 1, got {value!r}")
    # as `infer --top-k`, more than there are classes gives them all; int() of a number of
    # thousands of digits is refused by Python, and never needed
    return int(value) if len(value) <= 18 else 10 ** 18


def _body(asked: Asked) -> bytes:
    """The request's body, which the front read (held to the size limit there)."""
    if not asked.body:
        raise HttpError(400, "empty request body: send an image's bytes, or upload it as "
                             "multipart/form-data")
    return asked.body


def _image_part(body: bytes, content_type: str) -> tuple[bytes, str]:
    """The image in a request: the body itself, or the first file of a multipart upload."""
    if not content_type.lower().startswith("multipart/form-data"):
        return body, "request body"
    boundary = email.message.Message()
    boundary["content-type"] = content_type
    marker = boundary.get_boundary()  # as the parser reads it: RFC 2231's boundary*= too
    if marker and body.count(b"--" + marker.encode("utf-8", "surrogateescape")) > MAX_PARTS + 1:
        raise HttpError(400, f"multipart upload of more than {MAX_PARTS} parts")
    message = email.parser.BytesParser(policy=email.policy.HTTP).parsebytes(
        f"Content-Type: {content_type}\r\n\r\n".encode("latin-1") + body)
    if not message.is_multipart():
        raise HttpError(400, "multipart/form-data body without parts or boundary")
    parts = [p for p in message.iter_parts() if p.get_payload(decode=True)]
    # the first file; a form without files: its first named field (curl -F image=<file)
    for part in [p for p in parts if p.get_filename() is not None] + [
            p for p in parts if p.get_param("name", header="content-disposition")]:
        return part.get_payload(decode=True), f"upload {part.get_filename() or 'file'!r}"
    raise HttpError(400, "multipart upload holds no file")


class Stop:
    """The driver's word to the replicas that the server is stopping (a Ray actor of no CPU,
    made by `stop_actor`): each replica waits on `wait`, which returns the grace period once
    the driver calls `stop`, and calls `drained` when it holds no request any more."""

    def __init__(self):
        self._stopped = asyncio.Event()
        self._grace = GRACE_S
        self._drained = 0

    async def wait(self) -> float:
        await self._stopped.wait()
        return self._grace

    def stop(self, grace: float) -> None:
        self._grace = grace
        self._stopped.set()

    def drained(self) -> None:
        self._drained += 1

    def count(self) -> int:
        return self._drained


def stop_actor(ray):
    """The `Stop` actor, on the driver's own node: on a cluster it would otherwise go to any
    node, and the loss of that node (the driver's first call on it still waiting: seen
    under load) stopped a server whose other replica still answered."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    here = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)
    return ray.remote(num_cpus=0)(Stop).options(scheduling_strategy=here).remote()


def drain(serve, ray, stop, grace: float = GRACE_S) -> None:
    """Tell the replicas to stop, and wait (at most `grace` and a few seconds) until each
    running one has drained: answered or 503'd what it held; then a moment for the proxy to
    send those answers."""
    import time

    deadline = time.monotonic() + grace + 5
    ray.get(stop.stop.remote(grace), timeout=10)
    while time.monotonic() < deadline:
        try:
            states = serve.status().applications[APP].deployments[APP].replica_states
            running = states.get("RUNNING", 0)
        except Exception:  # Serve's controller gone: nothing left to wait for
            return
        if ray.get(stop.count.remote(), timeout=10) >= running:
            break
        time.sleep(0.1)
    time.sleep(FLUSH_S)


def application(bundle: str, options: ServeOptions, gpus: float = 0.0, cpus: float = 1.0,
                stop=None, front_on: Optional[str] = None):
    """The Ray Serve application: `Replica` as a deployment, bound to the bundle (and the
    `Stop` actor), each replica asking Ray for `cpus` and `gpus`. `front_on`, on a cluster:
    the Ray node (the driver's) of the `front.Front` that takes the HTTP requests before
    the replicas; None, on one machine: no front, the replicas take them themselves."""
    from ray import serve

    scaling: dict[str, Any] = {"num_replicas": options.replicas}
    if options.autoscale:
        low, high = options.autoscale
        scaling = {"autoscaling_config": {"min_replicas": low, "max_replicas": high,
                                          "target_ongoing_requests": options.max_batch_size}}
    ongoing = max(2 * options.max_batch_size, 8)  # requests one replica holds at a time
    replicas = serve.deployment(
        Replica, name=APP,
        max_ongoing_requests=ongoing,
        ray_actor_options={"num_cpus": cpus, "num_gpus": gpus},
        health_check_period_s=2,
        max_constructor_retry_count=3,  # a wrong provider or bundle does not mend by retrying
        **scaling).bind(bundle, options, stop)
    if front_on is None:
        return replicas
    most = options.autoscale[1] if options.autoscale else options.replicas
    # as many as the replicas hold: the rest wait in Serve's proxy, as they would for them
    return bind_front(replicas, options.max_request_bytes, most * ongoing, front_on)


def _replica_failure(serve) -> Optional[str]:
    """What Ray Serve recorded of the deployment's failure: the replica's traceback."""
    try:
        deployments = serve.status().applications[APP].deployments
        return "\n".join(d.message for d in deployments.values() if d.message) or None
    except Exception:  # Serve itself is gone: the caller's own message will do
        return None


def failure_line(report: str) -> str:
    """Our one line out of Ray's report of a replica that failed to start (it wraps the
    replica's exception and traceback in its own text)."""
    from .session import our_error

    return our_error(report) or (report.strip().splitlines() or ["no reason given"])[0]


@dataclass(frozen=True)
class Serving:
    """What a server will be, decided before Ray starts: its options, the route it answers
    (/predict or /embed), why `--runtime auto` chose its runner, and notes."""
    options: ServeOptions
    route: str
    chosen_by: Optional[str]
    notes: tuple[str, ...]


def serve_options(bundle, *, host: str, port: int, replicas: int,
                  autoscale: Optional[tuple[int, int]], max_batch_size: int,
                  batch_wait_ms: float, max_request_bytes: Optional[int], top_k: int,
                  runtime: str, provider: str, threads: Optional[int],
                  address: Optional[str]) -> Serving:
    """The server's options, checked before Ray starts: replicas or autoscale, the runner
    (auto resolved once, for every replica), and where the replicas run here, the bundle
    opened and its provider proved, and the address free."""
    from ... import bundle as B
    from ...choosing import resolve_runner
    from ...errors import Note, OptionError, param
    from ...exporting.variants import batch_dependence
    from ..classify import open_model

    _check_values(port=port, replicas=replicas, autoscale=autoscale,
                  max_batch_size=max_batch_size, batch_wait_ms=batch_wait_ms,
                  max_request_bytes=max_request_bytes, top_k=top_k, threads=threads)
    if autoscale and replicas != 1:
        raise OptionError(f"{param('replicas')} and {param('autoscale')} exclude each other")
    # read once here, on a cluster we join too: what this reads is what every replica must
    # hold (its sha256s go to them, `bundle.checked_files`)
    model = B.read_model(bundle)
    runtime, chosen_by = resolve_runner(model, runtime, provider, max_batch_size)
    note = batch_dependence(runtime)
    notes = (Note(f"{note}; {param('max_batch_size', 1)} answers each request alone"),) \
        if note and max_batch_size > 1 else ()  # requests from different clients share one
    where = "/predict or /embed"
    if address is None:  # the replicas run here: prove the bundle, runtime and provider
        opened = open_model(model, provider, runtime)
        where, runtime = route(opened.description.config), opened.runner.name
        check_port_free(host, port)
    most = autoscale[1] if autoscale else replicas
    options = ServeOptions(
        host=host, port=port, replicas=replicas, autoscale=autoscale,
        max_batch_size=max_batch_size, batch_wait_ms=batch_wait_ms,
        max_request_bytes=max_request_bytes or DEFAULT_MAX_REQUEST_BYTES, top_k=top_k,
        provider=provider, runtime=runtime,
        threads=threads or max(1, (os.cpu_count() or 1) // most),
        checked=tuple(sorted(B.checked_files(model).items())))
    return Serving(options, where, chosen_by, notes)


def _check_values(*, port, replicas, autoscale, max_batch_size, batch_wait_ms,
                  max_request_bytes, top_k, threads) -> None:
    """The ranges serve's flags hold their values to, for every caller."""
    import numbers

    from ...errors import OptionError, param, within
    from ...runtime import MAX_THREADS
    from .. import BATCH_WAIT_MS_RANGE, INT32_MAX, PORT_RANGE

    within("port", port, *PORT_RANGE, whole=True)
    within("max_batch_size", max_batch_size, 1, INT32_MAX, whole=True)
    within("batch_wait_ms", batch_wait_ms, *BATCH_WAIT_MS_RANGE)
    within("replicas", replicas, 1, whole=True)
    within("top_k", top_k, 1, whole=True)
    if threads is not None:
        within("threads", threads, 1, MAX_THREADS, whole=True)
    if max_request_bytes is not None:
        within("max_request_bytes", max_request_bytes, 1, whole=True)
    if autoscale is not None:
        try:
            low, high = autoscale
        except (TypeError, ValueError):
            low = high = None
        if not all(isinstance(v, numbers.Integral) and not isinstance(v, bool)
                   for v in (low, high)) \
                or not 1 <= low <= high:
            raise OptionError(f"{param('autoscale', autoscale)}: needs (MIN, MAX) replicas "
                              f"with 1 <= MIN <= MAX")


def check_port_free(host: str, port: int) -> None:
    """The address can be listened on (Ray Serve's proxy would fail later and less clearly)."""
    import socket

    from ...errors import OptionError

    try:
        with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as probe:
            probe.bind((host, port))
    except OSError as exc:
        raise OptionError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None


def serve_bundle(bundle: str, options: ServeOptions, address: Optional[str],
                 started=lambda url, replicas: None) -> None:
    """Start Ray (or join the cluster at `address`), run the application, call `started`,
    and block until interrupted; Ray Serve and the Ray this started are shut down after."""
    import sys

    from .session import quiet, ray_session, stop_within

    limit: list = []  # the shutdown's time limit, once it has begun
    try:
        with ray_session(address) as ray:
            from ray import serve

            quiet()  # importing ray.serve set its logger to INFO, on stderr
            serving: list = []  # the `Stop` actor, once the replicas serve
            try:
                _run(serve, ray, bundle, options, started, serving, cluster=bool(address))
            finally:
                limit.append(stop_within(STOP_LIMIT_S, "Ray Serve", sys.exc_info()[1]))
                try:
                    if serving:  # what was taken is answered before the proxy goes
                        drain(serve, ray, serving[0])
                finally:
                    # on a cluster we joined, other applications may be served: remove ours
                    if address:
                        serve.delete(APP)
                    else:
                        serve.shutdown()
    finally:
        for timer in limit:  # Ray shut down (or raised): no need for the last resort
            timer.cancel()


def _run(serve, ray, bundle: str, options: ServeOptions, started, serving: list,
         cluster: bool) -> None:
    """The application on the Ray session: started, announced, then served until a signal;
    `cluster`: on a cluster joined (--address), behind the front."""
    import time

    from ...errors import signal_exception
    from .session import quiet

    before = len(received)  # signals so far: one lost while Serve starts stops it too
    resources = ray.cluster_resources()
    # a replica sees a GPU only if it asks for one (Ray hides the others): `auto` asks
    # too, where the cluster has GPUs, or it would quietly run on the CPU
    gpus = 1.0 if options.provider in ("cuda", "auto") and resources.get("GPU") else 0.0
    most = options.autoscale[1] if options.autoscale else options.replicas
    cpus = min(1.0, resources.get("CPU", 1.0) / most)  # more replicas than cores still run
    serve.start(http_options={"host": options.host, "port": options.port},
                logging_config={"log_level": "ERROR"})
    quiet()
    stop = stop_actor(ray)
    # the front's node: the driver's, as the `Stop` actor's
    front_on = ray.get_runtime_context().get_node_id() if cluster else None
    try:
        serve.run(application(os.path.abspath(bundle), options, gpus, cpus, stop, front_on),
                  name=APP, route_prefix="/", logging_config={"log_level": "ERROR"})
    except Exception as exc:  # a replica that could not start: say why in one line
        raise VitExportError(f"the replicas did not start: "
                             f"{failure_line(_replica_failure(serve) or str(exc))}") from None
    ray.get(stop.count.remote())  # the driver's first call on it took 0.4 s: not at the stop
    serving.append(stop)
    replicas = options.autoscale[0] if options.autoscale else options.replicas
    started(f"http://{options.host}:{options.port}", replicas)
    while len(received) == before:  # until the handler raises here, or raised where it was lost
        time.sleep(1)
    raise signal_exception(received[before])  # Ctrl-C's can be lost as SIGTERM's can
