"""The server's front on a cluster: the Ray Serve deployment that takes each HTTP request
first when `serve --address` joins a cluster, where a replica's node can be lost while the
others live. On one machine there is none (`serve.application`): the replicas take the HTTP
requests themselves, and a replica that crashes fails what it held with Ray Serve's own 500;
the front's hop, and its process on the replicas' cores, cost more there than it saves.

One replica of it, of no CPU, runs on the driver's node (the node `serve` runs on: the
server stops with it in any case). It reads a request, its body held to
--max-request-bytes (413 over it), and hands what the routes need (`Asked`) to a `Replica`
through Serve's handle. When the replica that holds a request is lost (its process killed,
its node gone), the front asks another: an answer changes nothing on the server, so asking
again is safe. A request is asked again at most RETRIES times, within RETRY_S of its first
loss; one that no replica answered by then is a 503 {"error": UNANSWERED} with a
Retry-After header, and only then. GET /healthz adds how many requests were asked again
("retried") and how many were answered that 503 ("unanswered") since the server started.
(`Front` takes other limits than RETRIES and RETRY_S as `retries` and `retry_s`.)
"""
from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import Any, Optional

from ...errors import first_line
from .. import oip

FRONT = "front"  # the front's deployment name, in the application `serve.APP`
RETRIES = 2  # a request whose replica was lost is asked again at most this many times: a
# request that itself took its replica down (a crash in native code) takes few others along
RETRY_S = 15.0  # and only within this long of its first loss: time for a replica to start
RETRY_AFTER_S = 5  # a 503's Retry-After: in the tests, replicas took 2-5 s to start anew
UNANSWERED = ("no replica could answer: the replica that held the request was lost, and no "
              "other answered it in time; ask again")


HttpError = oip.ProtocolError  # a request answered with its status and {"error": message}


@dataclass(frozen=True)
class Asked:
    """A request as the front read it, what a replica needs of it: the path, method,
    ?top_k, the two headers the routes read, and the body (read within the size limit)."""
    path: str
    method: str
    top_k: Optional[str]
    content_type: str
    header_length: Optional[str]  # Inference-Header-Content-Length, for /v2 infer
    body: bytes

    @property
    def route(self) -> str:
        return self.path.rstrip("/") or "/"


async def read(request, limit: int) -> Asked:
    """The `Asked` of a Starlette request; HttpError 413 for a body over `limit` bytes."""
    headers = request.headers
    return Asked(request.url.path, request.method, request.query_params.get("top_k"),
                 headers.get("content-type", ""), headers.get(oip.HEADER_LENGTH),
                 await read_body(request, limit))


async def read_body(request, limit: int) -> bytes:
    """The body, read no further than `limit` bytes: one declared over it is refused
    before any of it is read."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isascii() and declared.isdigit() and \
            oip.length_within(declared, limit) is None:  # over the limit, however many digits
        digits = declared.lstrip("0")
        shown = digits if len(digits) <= 20 else f"a {len(digits)}-digit number of"
        raise HttpError(413, f"request body of {shown} bytes is over the limit of {limit} "
                             f"bytes")
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > limit:
            raise HttpError(413, f"request body is over the limit of {limit} bytes")
    return bytes(body)


def lost_replica_errors() -> tuple[type, ...]:
    """What awaiting a replica's answer raises when the replica was lost with the request:
    its actor died or cannot be reached (Ray), its worker or node died, or Serve found it
    gone."""
    from ray.exceptions import NodeDiedError, RayActorError, WorkerCrashedError
    from ray.serve.exceptions import ReplicaUnavailableError

    return RayActorError, WorkerCrashedError, NodeDiedError, ReplicaUnavailableError


def bind_front(replicas, limit: int, ongoing: int, node: Optional[str] = None, **asking):
    """The front as a Ray Serve deployment, bound to `replicas` (a bound deployment) and the
    body's size limit `limit`: one replica, of no CPU, on Ray node `node` where given,
    holding at most `ongoing` requests at a time; `asking`: `Front`'s retries, retry_s."""
    from ray import serve

    here = {"label_selector": {"ray.io/node-id": node}} if node else {}
    return serve.deployment(
        Front, name=FRONT, num_replicas=1, max_ongoing_requests=ongoing,
        ray_actor_options={"num_cpus": 0, **here},
        health_check_period_s=2).bind(replicas, limit, **asking)


class Front:
    """The front's deployment class (`bind_front`), given the replicas' handle, the body's
    size limit, and how many times and for how long a lost request is asked again."""

    def __init__(self, replicas, limit: int, retries: int = RETRIES,
                 retry_s: float = RETRY_S):
        self.replicas = replicas
        self.limit = limit
        self.retries, self.retry_s = retries, retry_s
        self.retried = 0  # requests asked again after their replica was lost
        self.unanswered = 0  # of those, the ones no replica answered: 503s
        self._lost = lost_replica_errors()

    async def __call__(self, request) -> Any:
        from starlette.responses import JSONResponse

        try:
            asked = await read(request, self.limit)
        except HttpError as exc:
            return JSONResponse({"error": str(exc)}, status_code=exc.status)
        except Exception as exc:  # the client gone mid-body: never a traceback, as replicas
            return JSONResponse({"error": f"internal error: {first_line(exc)}"},
                                status_code=500)
        answer = await self._ask(asked)
        if asked.route == "/healthz" and answer.status_code == 200:
            return JSONResponse({**json.loads(answer.body), **self.counts()})
        return answer

    def counts(self) -> dict[str, int]:
        """What GET /healthz adds: the requests asked again, and the 503s among them."""
        return {"retried": self.retried, "unanswered": self.unanswered}

    async def _ask(self, asked: Asked) -> Any:
        """A replica's answer; another replica's where the one asked was lost; a 503 where
        none answered within `retries` more asks and `retry_s`."""
        from starlette.responses import JSONResponse

        loop = asyncio.get_running_loop()
        deadline = None  # retry_s after the first loss
        for attempt in range(self.retries + 1):
            left = None if deadline is None else deadline - loop.time()
            if left is not None and left <= 0:
                break
            try:
                return await self._once(asked, left)
            except self._lost:
                if deadline is None:
                    deadline, self.retried = loop.time() + self.retry_s, self.retried + 1
            except asyncio.TimeoutError:
                break
            except Exception as exc:  # never a traceback to the client
                return JSONResponse({"error": f"internal error: {first_line(exc)}"},
                                    status_code=500)
            await asyncio.sleep(0.05 * (attempt + 1))  # for Serve to note the lost replica
        self.unanswered += 1
        return JSONResponse({"error": UNANSWERED}, status_code=503,
                            headers={"Retry-After": str(RETRY_AFTER_S)})

    async def _once(self, asked: Asked, within: Optional[float]) -> Any:
        """One replica's answer, waited for at most `within` seconds (None: as long as it
        takes); a request given up on (the client gone, or out of time) is cancelled."""
        response = self.replicas.remote(asked)
        try:
            return await asyncio.wait_for(_answer(response), within)
        except (asyncio.TimeoutError, asyncio.CancelledError):
            response.cancel()
            raise


async def _answer(response) -> Any:
    return await response
