"""Ray across several nodes: `infer --ray --address` and `serve --address` against a real
multi-node cluster, a head and worker nodes each started as Ray starts a node (raylet,
object store, agents; `ray.cluster_utils.Cluster`, or `ray start` for a node that must see
its own files), the commands run as the CLI in processes of their own.

The head has no CPUs, so every worker and replica runs on a worker node; the nodes share
this machine's cores, so the figures printed are counts, not speeds. Each test's cluster
is torn down however the test ends, and then no process it started may be left: each
carries a mark in its environment (conftest.marked)."""
import json
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import NamedTuple, Optional

import numpy as np
import pytest
from conftest import end_marked, run, same_as_infer

pytest.importorskip("ray.data")
pytest.importorskip("ray.serve")
requests = pytest.importorskip("requests")

pytestmark = pytest.mark.slow  # Ray clusters of three nodes on 2 cores: minutes in all

ROOT = Path(__file__).resolve().parent.parent
START_S = 300  # Ray on 2 cores, busy: generous


class RayCluster:
    """A head node of no CPUs and worker nodes, each a node of its own (raylet, object
    store, agents), and the CLI processes a test runs against them; `close` ends them all."""

    def __init__(self, worker_cpus: float, workers: int):
        from ray.cluster_utils import Cluster

        self.commands: list[subprocess.Popen] = []  # the CLI runs and `ray start` nodes
        self.cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0})
        self.workers = [self.cluster.add_node(num_cpus=worker_cpus) for _ in range(workers)]
        self.cluster.wait_for_nodes(timeout=START_S)

    @property
    def address(self) -> str:
        return self.cluster.address

    def worker_ids(self) -> set[str]:
        return {node.node_id for node in self.workers}

    def live_nodes(self) -> set[str]:
        return {n["NodeID"] for n in self.cluster.global_state.node_table() if n["Alive"]}

    def actor_nodes(self, class_part: str) -> list[str]:
        """The node of each live actor whose class name holds `class_part`."""
        return sorted(a["Address"]["NodeID"]
                      for a in self.cluster.global_state.actor_table(None).values()
                      if class_part in a["ActorClassName"] and a["State"] == "ALIVE")

    def remove(self, node) -> None:
        self.cluster.remove_node(node)
        self.workers.remove(node)

    def cli(self, *args) -> subprocess.Popen:
        process = subprocess.Popen([sys.executable, str(ROOT / "cli.py"), *map(str, args)],
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.commands.append(process)
        return process

    def run(self, *args, timeout: float = START_S) -> tuple[int, str, str]:
        return finish(self.cli(*args), timeout)

    def close(self) -> None:
        """SIGTERM to each command still running (as a user stops one), then the nodes."""
        for process in self.commands:
            finish(process, 120, signal.SIGTERM)
        self.cluster.shutdown()
        self.cluster.global_state.disconnect()


def finish(process: subprocess.Popen, timeout: float, sig=None) -> tuple[int, str, str]:
    """(exit code, stdout, stderr) of a command, sent `sig` first where it still runs;
    killed if it outlives `timeout`."""
    if sig is not None and process.poll() is None:
        process.send_signal(sig)
    try:
        stdout, stderr = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        stdout, stderr = process.communicate()
    return process.returncode, stdout or "", stderr or ""


@pytest.fixture
def ray_cluster(monkeypatch):
    """start(worker_cpus, workers, **env) -> a RayCluster, its processes marked; after the
    test, every command and node ended, and none of their processes left."""
    mark = uuid.uuid4().hex
    monkeypatch.setenv("VX_TEST_RUN", mark)  # inherited by every process the test starts
    clusters: list[RayCluster] = []

    def start(worker_cpus: float = 1, workers: int = 2, **env: str) -> RayCluster:
        for name, value in env.items():
            monkeypatch.setenv(name, value)
        clusters.append(RayCluster(worker_cpus, workers))
        return clusters[-1]

    try:
        yield start
    finally:
        for cluster in clusters:
            cluster.close()
        left = end_marked(mark)
    assert left == [], f"processes the test started were left running: {left}"


def short(nodes) -> str:
    """Node ids as their first 8 digits (as Ray's own logs shorten them)."""
    if isinstance(nodes, dict):
        return "{" + ", ".join(f"{n[:8]}: {c}" for n, c in sorted(nodes.items())) + "}"
    return "[" + ", ".join(n[:8] for n in nodes) + "]"


def jsonl(records: list[dict]) -> str:
    from vit_export.jsonio import dumps

    return "".join(dumps(r, line=True) + "\n" for r in records)


def single_process(bundle, inputs) -> list[dict]:
    code, stdout, stderr = run("infer", bundle, *inputs, "--top-k", 3, "--json")
    assert code == 0, stderr
    return json.loads(stdout)["results"]


def run_record(output: Path) -> dict:
    from vit_export.deploy.ray.data import run_path

    return json.loads(run_path(output).read_text())


def test_infer_across_nodes_writes_what_infer_writes_and_names_the_nodes(
        ray_cluster, digits_bundle, embedding_bundle, digit_images, tmp_path):
    """Two workers on two nodes: the records file is single-process infer's byte for byte,
    the embeddings Parquet file infer --embed's, and the run record names both nodes."""
    from vit_export.embeddings import read

    cluster = ray_cluster()
    folder = digit_images[0].parent
    out = tmp_path / "classes.jsonl"
    code, stdout, stderr = cluster.run("infer", digits_bundle, folder, "--top-k", 3,
                                       "--ray", "--address", cluster.address,
                                       "--workers", 2, "--output", out)
    assert code == 0, stderr
    assert "360 file(s) classified on Ray Data with 2 worker(s) on 2 node(s)" in stdout
    assert out.read_text() == jsonl(single_process(digits_bundle, [folder]))
    nodes = run_record(out)["nodes"]
    assert set(nodes) == cluster.worker_ids() and sum(nodes.values()) == 360
    print(f"\ninfer --ray across nodes: 360 records equal to infer's, by node {short(nodes)}")

    reference, embedded = tmp_path / "single.parquet", tmp_path / "ray.parquet"
    code, _, stderr = run("infer", embedding_bundle, folder, "--embed", "--output", reference)
    assert code == 0, stderr
    code, stdout, stderr = cluster.run("infer", embedding_bundle, folder, "--embed", "--ray",
                                       "--address", cluster.address, "--workers", 2,
                                       "--output", embedded)
    assert code == 0, stderr
    (names, expected), (got_names, got) = read(reference), read(embedded)
    assert got_names == names and got.dtype == expected.dtype
    assert np.array_equal(got, expected)  # to the bit: float32 equality, no tolerance
    nodes = run_record(embedded)["nodes"]
    assert set(nodes) == cluster.worker_ids() and sum(nodes.values()) == 360
    print(f"infer --ray --embed across nodes: 360 embeddings equal to infer --embed's, by "
          f"node {short(nodes)}")


IMAGES = 7200  # the 360 digits 20 times: a run of seconds at --batch-size 4


def _many_images(digit_images, folder: Path) -> Path:
    folder.mkdir()
    for copy in range(IMAGES // len(digit_images)):
        for path in digit_images:
            shutil.copyfile(path, folder / f"{copy:02d}_{path.name}")
    return folder


def _working_on_both(cluster: RayCluster, process: subprocess.Popen, partial: Path) -> int:
    """Wait until a run's two workers are up on two nodes and a fifth of the records are
    written (both workers busy by then); the records written so far."""
    deadline = time.monotonic() + START_S
    while time.monotonic() < deadline and process.poll() is None:
        written = partial.read_bytes().count(b"\n") if partial.exists() else 0
        if written >= IMAGES // 5 and len(set(cluster.actor_nodes("_ClassifyFiles"))) == 2:
            return written
        time.sleep(0.05)
    raise AssertionError(f"the run ended or did not run on two nodes: {finish(process, 1)}")


def test_a_node_lost_mid_run_answers_every_input_once(ray_cluster, digits_bundle,
                                                      digit_images, tmp_path):
    """A worker node removed while both workers run: the command stops in one line naming
    the node and keeps every finished record, and --resume answers the rest, none twice
    (or, where the node held no work in flight, the run finishes on the other); either way
    the output is single-process infer's, each input answered once."""
    cluster = ray_cluster()
    folder = _many_images(digit_images, tmp_path / "images")
    out = tmp_path / "results.jsonl"
    args = ("infer", digits_bundle, folder, "--top-k", 3, "--batch-size", 4, "--ray",
            "--address", cluster.address, "--workers", 2, "--output", out)
    process = cluster.cli(*args)
    written = _working_on_both(cluster, process, tmp_path / ".results.jsonl.partial")
    lost = cluster.workers[1]
    cluster.remove(lost)
    code, stdout, stderr = finish(process, START_S)
    if code == 0:  # Ray Data finished on the other worker: nothing of the lost one's lost
        kept, told = 0, "the run finished on the other node"
    else:
        kept = _stopped_and_kept(stdout, stderr, out, lost.node_id)
        code, stdout, stderr = cluster.run(*args, "--resume")
        assert code == 0, stderr
        told = (f"the run stopped in one line, {kept} records kept; --resume answered "
                f"{IMAGES - kept}")
    assert f"{IMAGES - kept} file(s) classified" in stdout
    assert f"{kept} done before; {IMAGES} record(s)" in stdout
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert len({r["input"] for r in records}) == len(records) == IMAGES  # each once
    assert out.read_text() == jsonl(single_process(digits_bundle, [folder]))
    nodes = run_record(out)["nodes"]
    assert sum(nodes.values()) == IMAGES and set(nodes) <= {lost.node_id} | cluster.worker_ids()
    print(f"\nnode {lost.node_id[:8]} removed mid-run ({written} of {IMAGES} records "
          f"written): {told}, 0 twice; records by node {short(nodes)}")


def _stopped_and_kept(stdout: str, stderr: str, out: Path, lost: str) -> int:
    """A run stopped by a lost node: one line naming it, no output, the finished records
    kept (each input once) and recorded as made by the nodes that made them; how many."""
    assert stdout == "", stderr
    assert stderr.splitlines()[-1] == (
        f"Error: a Ray Data worker was lost with its node {lost}; the records finished are "
        f"kept: --resume runs the rest"), stderr
    assert not out.exists()
    partial = out.with_name(f".{out.name}.partial")
    kept = [json.loads(line)["input"] for line in partial.read_text().splitlines()]
    assert 0 < len(kept) < IMAGES and len(set(kept)) == len(kept)
    made = run_record(out)["nodes"]
    assert sum(made.values()) == len(kept) and lost in made
    return len(kept)


def _can_unshare() -> bool:
    """Whether this process may give a command a mount namespace of its own (root, or a
    kernel that lets users have one)."""
    try:
        return subprocess.run(["unshare", "-m", "--propagation", "private", "true"],
                              capture_output=True, timeout=30, check=False).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def _node_seeing(cluster: RayCluster, bundle: Path, copy: Path) -> tuple[subprocess.Popen, str]:
    """A worker node started by `ray start`, as on a machine of its own, that finds `copy`
    at `bundle`'s path (a mount namespace of its own, `copy` bound over the path); its id
    once it has joined."""
    before = cluster.live_nodes()
    script = ('mount --bind "$1" "$2" && exec "$3" -m ray.scripts.scripts start --address '
              '"$4" --num-cpus 1 --block')
    node = subprocess.Popen(
        ["unshare", "-m", "--propagation", "private", "sh", "-c", script, "sh", str(copy),
         str(bundle), sys.executable, cluster.address],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    cluster.commands.append(node)
    deadline = time.monotonic() + START_S
    while not (joined := cluster.live_nodes() - before) and time.monotonic() < deadline:
        assert node.poll() is None, "ray start exited"
        time.sleep(0.5)
    assert joined, "the node did not join"
    return node, joined.pop()


@pytest.mark.skipif(not _can_unshare(), reason="needs a mount namespace (unshare -m) to give "
                    "a node its own copy of the bundle")
def test_a_node_whose_copy_of_the_bundle_differs_refuses_in_one_line(
        ray_cluster, digits_bundle, digit_images, tmp_path):
    """Its own copy of the bundle at the same path, as on a machine of its own: another
    export of the same weights (other labels). infer --ray and serve refuse in one line
    naming the node and the file; nothing is answered from the other copy."""
    from conftest import rewrite_hash

    cluster = ray_cluster(workers=0)
    bundle = tmp_path / "digits"
    shutil.copytree(digits_bundle, bundle)
    other = tmp_path / "other"
    shutil.copytree(digits_bundle, other)
    config = json.loads((other / "config.json").read_text())
    config["labels"] = [f"digit {i}" for i in range(10)]
    (other / "config.json").write_text(json.dumps(config))
    _, node = _node_seeing(cluster, bundle, other)
    from vit_export.bundle import sha256_file

    here, there = (sha256_file(b / "config.json")[:12] for b in (other, bundle))
    why = (f"on Ray node {node}: {bundle / 'config.json'} differs from the driver's copy "
           f"(sha256 {here}... here, {there}... on the driver)")
    out = tmp_path / "r.jsonl"
    code, stdout, stderr = cluster.run("infer", bundle, *digit_images[:8], "--ray",
                                       "--address", cluster.address, "--output", out)
    assert (code, stdout) == (1, ""), stderr
    assert stderr.splitlines()[-1] == f"Error: a Ray Data worker failed: {why}", stderr
    assert not out.exists()
    code, stdout, stderr = cluster.run("serve", bundle, "--address", cluster.address,
                                       "--port", free_port())
    assert code == 1, stderr
    assert stderr.splitlines()[-1] == f"Error: the replicas did not start: {why}", stderr

    (other / "config.json").write_bytes((bundle / "config.json").read_bytes())
    model = other / "model.onnx"  # its config.json the driver's, its model.onnx another
    model.write_bytes(model.read_bytes() + b"\0")
    code, _, stderr = cluster.run("infer", bundle, *digit_images[:8], "--ray", "--address",
                                  cluster.address, "--output", out, "--force")
    assert code == 1 and stderr.splitlines()[-1] == (
        f"Error: a Ray Data worker failed: on Ray node {node}: {bundle / 'model.onnx'} does "
        f"not match its sha256 in config.json (truncated or modified)"), stderr
    rewrite_hash(other, "model.onnx")  # a config.json that agrees with it: names model.onnx
    code, _, stderr = cluster.run("infer", bundle, *digit_images[:8], "--ray", "--address",
                                  cluster.address, "--output", out, "--force")
    here, there = (sha256_file(b / "model.onnx")[:12] for b in (other, bundle))
    assert code == 1 and stderr.splitlines()[-1] == (
        f"Error: a Ray Data worker failed: on Ray node {node}: {bundle / 'model.onnx'} "
        f"differs from the driver's copy (sha256 {here}... here, {there}... on the "
        f"driver)"), stderr
    print(f"\na node with its own copy of the bundle refused: {stderr.splitlines()[-1]}")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


CLIENTS = 16  # threads, each sending one request after another
MOST_REQUESTS, MOST_LOAD_S = 40_000, 240  # the load's bounds
ANSWER_S = 10  # stated: a request started this long after the node went is answered
IN_FLIGHT_S = 2  # a request that fails started before the node was gone, or about then
REQUEST_S = 60  # each client's timeout
RECOVERY_S = 120  # stated: both replicas run again within this long
REPLICA = "ServeReplica:vit-export:vit-export"  # the class of the model's replicas' actors
FRONT = "ServeReplica:vit-export:front"  # and of the front's


class Outcome(NamedTuple):
    """What one request got, and when it was sent."""
    kind: str  # predict, v2 or ready
    name: str  # the image's
    start: float
    took: float  # seconds until the answer, or the client's exception
    status: object  # the HTTP status, or the name of the exception the client raised
    text: str
    retry_after: Optional[str] = None


def retriable(outcome: Outcome) -> bool:
    """A request the server could not answer: our 503, JSON in one line, with Retry-After
    (what the front answers where no replica answered a request whose replica was lost)."""
    from vit_export.deploy.ray.front import RETRY_AFTER_S, UNANSWERED

    if (outcome.status, outcome.retry_after) != (503, str(RETRY_AFTER_S)):
        return False
    try:
        return json.loads(outcome.text) == {"error": UNANSWERED}
    except ValueError:  # Ray Serve's own text
        return False


class Load:
    """Concurrent clients sending /predict, /v2 infer and /v2/health/ready in turn until
    `stop` is set (or the bounds are met); each outcome kept with when it started."""

    def __init__(self, url: str, name: str, bodies: list[tuple[str, bytes]]):
        from test_oip import binary, packed

        self.url, self.bodies, self.name = url, bodies, name
        self.v2 = [binary({"name": "image", "datatype": "BYTES", "shape": [1]},
                          packed([body])) for _, body in bodies]
        self.results: list[Outcome] = []
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.count = 0

    def client(self) -> None:
        session = requests.Session()
        deadline = time.monotonic() + MOST_LOAD_S
        while not self.stop.is_set() and time.monotonic() < deadline:
            with self.lock:
                i, self.count = self.count, self.count + 1
            if i >= MOST_REQUESTS:
                return
            kind = ("predict", "v2", "ready")[i % 3]
            image = i // 3 % len(self.bodies)
            start = time.monotonic()
            name = self.bodies[image][0]
            try:
                answer = self._send(session, kind, image)
                outcome = Outcome(kind, name, start, time.monotonic() - start,
                                  answer.status_code, answer.text,
                                  answer.headers.get("Retry-After"))
            except requests.RequestException as exc:
                outcome = Outcome(kind, name, start, time.monotonic() - start,
                                  type(exc).__name__, str(exc))
            with self.lock:
                self.results.append(outcome)

    def _send(self, session, kind: str, image: int):
        if kind == "predict":
            return session.post(f"{self.url}/predict?top_k=3", data=self.bodies[image][1],
                                timeout=REQUEST_S)
        if kind == "ready":
            return session.get(f"{self.url}/v2/health/ready", timeout=REQUEST_S)
        body, header = self.v2[image]
        return session.post(f"{self.url}/v2/models/{self.name}/infer", data=body,
                            headers={"Inference-Header-Content-Length": header},
                            timeout=REQUEST_S)

    def answered(self, since: float) -> int:
        with self.lock:
            return sum(1 for r in self.results if r.start >= since and r.status == 200)


def _wrong(results, expected: dict[str, dict]) -> list:
    """The answers that are not infer's: other classes, or probabilities off by more than
    float32 rounding between batches (a server batches requests as they come)."""
    wrong = []
    for kind, name, _, _, status, text, _ in results:
        if status != 200:
            continue
        if kind == "ready":
            good = json.loads(text) == {"ready": True}
        elif kind == "predict":
            top, want = json.loads(text)["top"], expected[name]["top"]
            good = [t["class"] for t in top] == [t["class"] for t in want] and \
                max(abs(t["prob"] - w["prob"]) for t, w in zip(top, want)) <= 1e-5
        else:
            logits = np.array([json.loads(text)["outputs"][0]["data"]], np.float32)
            good = same_as_infer(logits, [expected[name]])
        if not good:
            wrong.append((kind, name, text[:200]))
    return wrong


def _serving(cluster: RayCluster, bundle: Path, url: str, port: int) -> dict:
    """`serve --address --replicas 2` started on the cluster: its /healthz once it answers
    and both replicas run."""
    server = cluster.cli("serve", bundle, "--address", cluster.address, "--replicas", 2,
                         "--port", port, "--max-batch-size", 16)
    deadline = time.monotonic() + START_S
    while time.monotonic() < deadline:
        assert server.poll() is None, finish(server, 1)
        try:
            answer = requests.get(url + "/healthz", timeout=5)
            if answer.status_code == 200 and len(cluster.actor_nodes(REPLICA)) == 2:
                # /healthz answers a moment before `serve` is done starting: its line says so
                line = server.stderr.readline()
                assert line.startswith(f"serving {bundle} on {url} "), line
                return answer.json()
        except requests.RequestException:
            pass  # not listening yet
        time.sleep(0.5)
    raise AssertionError("serve did not start two replicas")


def _lose_a_replica_node(cluster: RayCluster, load: Load) -> tuple[float, float, str]:
    """Once the load is answered, remove the node of one replica; wait until two replicas
    run again. Returns (when the node was gone, when two ran again, its id)."""
    deadline = time.monotonic() + START_S
    while load.answered(0) < 300 and time.monotonic() < deadline:
        time.sleep(0.1)
    node = next(n for n in cluster.workers if n.node_id in cluster.actor_nodes(REPLICA))
    cluster.remove(node)
    gone = time.monotonic()
    while len(cluster.actor_nodes(REPLICA)) < 2 and \
            time.monotonic() < gone + RECOVERY_S:
        time.sleep(0.5)
    return gone, time.monotonic(), node.node_id


def test_serving_across_nodes_under_load_loses_a_node_and_recovers(
        ray_cluster, digits_bundle, digit_images):
    """serve --address --replicas 2: one replica on each worker node, the front on the
    driver's; 16 clients send /predict, /v2 infer and /v2/health/ready while one replica's
    node is removed. No answer is wrong, and every request is answered: the front asks the
    other replica what the lost one held, and one that none answered would be our 503 with
    Retry-After (`retriable`), as many as the front counts; never Ray Serve's plain-text 500,
    never no answer. The other replica answers throughout, /v2/health/ready says so, and a
    second replica runs again in time."""
    # each node's proxy binds its own port on a machine of its own; here they share one
    # machine, so the worker nodes' proxies listen elsewhere and the clients reach the
    # head's, as clients of a cluster reach the node they were pointed at
    cluster = ray_cluster(worker_cpus=2, RAY_SERVE_WORKER_PROXY_HTTP_PORT=str(free_port()))
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    records = single_process(digits_bundle, digit_images)
    expected = {r["input"]: r for r in records}
    health = _serving(cluster, digits_bundle, url, port)
    placed = cluster.actor_nodes(REPLICA)
    assert len(set(placed)) == 2 and set(placed) <= cluster.worker_ids(), placed
    assert health["node"] in placed
    head = cluster.cluster.head_node.node_id  # the driver's node: Ray joins it to the head
    assert cluster.actor_nodes(FRONT) == [head] == cluster.actor_nodes("Stop")
    load = Load(url, health["model"], [(str(p), p.read_bytes()) for p in digit_images])
    with ThreadPoolExecutor(CLIENTS) as pool:
        clients = [pool.submit(load.client) for _ in range(CLIENTS)]
        try:
            gone, again, lost = _lose_a_replica_node(cluster, load)
            time.sleep(5)  # the load goes on a while on both replicas
        finally:
            load.stop.set()
        for client in clients:
            client.result()
    server = cluster.commands[-1]
    assert server.poll() is None, finish(server, 1)[2]  # serving still
    results, counts = load.results, requests.get(url + "/healthz", timeout=10).json()
    assert _wrong(results, expected) == []
    failed = [r for r in results if r.status != 200]
    assert all(retriable(r) and r.start - gone <= IN_FLIGHT_S for r in failed), failed
    assert counts["unanswered"] == len(failed)
    after = _recovered(results, gone, again)
    held = [r.took for r in results if r.start < gone < r.start + r.took]  # in flight then
    now = cluster.actor_nodes(REPLICA)
    assert len(now) == 2 and lost not in now, now
    kinds = Counter(r.kind for r in results)
    print(f"\nserve across nodes: {len(results)} requests ({kinds['predict']} /predict, "
          f"{kinds['v2']} /v2 infer, {kinds['ready']} /v2/health/ready) from {CLIENTS} "
          f"clients; replicas on {short(placed)}, the front on {short([head])}; node "
          f"{lost[:8]} removed: answered {len(results) - len(failed)}, of which the front "
          f"asked again {counts['retried'] - counts['unanswered']}; 503 {len(failed)}; "
          f"other failures 0, wrong 0; the slowest of the {len(held)} requests in flight "
          f"as it went took {max(held, default=0):.2f} s; answered again {after:.2f} s after; "
          f"/v2/health/ready true throughout; two replicas again after {again - gone:.1f} s, "
          f"on {short(now)}")
    code, _, stderr = finish(cluster.commands[-1], 120, signal.SIGTERM)
    assert code == 128 + signal.SIGTERM, stderr
    assert stderr.splitlines()[-1] == "stopped by SIGTERM; Ray Serve shut down", stderr


def _recovered(results: list[Outcome], gone: float, again: float) -> float:
    """The server answered while it recovered (/predict and /v2/health/ready between the
    loss and two replicas running again), and within ANSWER_S of the loss: how soon."""
    after = sorted(r.start - gone for r in results
                   if r.status == 200 and r.kind == "predict" and r.start >= gone)
    assert after and after[0] <= ANSWER_S  # answered at once by the other replica
    recovering = [r for r in results if gone <= r.start <= again and r.status == 200]
    assert {"ready", "predict"} <= {r.kind for r in recovering}
    assert again - gone <= RECOVERY_S
    return after[0]
