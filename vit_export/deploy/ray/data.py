"""Batch inference on Ray Data: `vit-export infer MODEL INPUTS --ray --output FILE.jsonl`,
or with `--embed`, embeddings into FILE.parquet (or FILE.jsonl).

Ray Data hands the input files, in order, to an actor pool of `classify.Classifier`s (or
`Embedder`s) (`map_batches`); each actor reads, preprocesses and classifies (or embeds) its
batch exactly as `infer` does in one process, so the answers are the same to the last digit.
Records are JSON lines while the run goes ({"input", "top"} or {"input", "embedding"}: a
float32 survives JSON exactly); a Parquet output is written from them at the end. The driver appends each
finished batch to a hidden progress file beside the output (`.FILE.partial`), flushed and
fsynced, and renames it onto FILE, in input order, once every input is done: FILE is
complete or absent, never half-written. `--resume` reads the progress file (and FILE, when
it is there), drops a torn last line and the records of any input file not wholly done, and
runs only the rest, so a crash or Ctrl-C loses at most the batches in flight.

What the records came from is kept beside them (`.FILE.run.json`: the model's sha256, the
options that shape a record, each input's size and modification time, and, once the pool
has run, the Ray node ids that made the records with how many each made), so a resume
with another model, other options or inputs the run did not name is refused, and an input
changed since its record was made is classified again. One run at a time writes FILE: it
holds a lock beside it (`.FILE.lock`, flock) from start to finish.

Every worker reads the model on its own node, at the path the driver was given: the driver
hands them the sha256s of what it read (`bundle.checked_files`), and a worker whose copy
differs refuses, in one line naming its node and the file.
"""
from __future__ import annotations

import contextlib
import fcntl
import json
import os
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

import numpy as np

from ...errors import InputError, VitExportError, param, raw
from ...jsonio import dumps, read_json

if TYPE_CHECKING:
    from ..classify import InferOptions


def progress_path(output: Path) -> Path:
    """Where a run keeps its finished records until every input is done."""
    return output.with_name(f".{output.name}.partial")


def run_path(output: Path) -> Path:
    """Where a run records what its records came from."""
    return output.with_name(f".{output.name}.run.json")


def lock_path(output: Path) -> Path:
    return output.with_name(f".{output.name}.lock")


@contextmanager
def output_lock(output: Path) -> Iterator[None]:
    """Hold `output`'s lock for the run, or InputError when another run holds it. flock: a
    run that dies, even by SIGKILL, lets go of it."""
    path = lock_path(output)
    for _ in range(3):  # another run may remove the file between our open and our flock
        fd = os.open(path, os.O_CREAT | os.O_RDWR, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise InputError(f"another run is writing {output} (it holds {path}); wait for "
                             f"it to finish") from None
        try:
            same = os.fstat(fd).st_ino == os.stat(path).st_ino
        except FileNotFoundError:
            same = False
        if same:
            break
        os.close(fd)
    else:
        raise InputError(f"cannot lock {path}: other runs keep replacing it")
    try:
        yield
    finally:
        path.unlink(missing_ok=True)
        os.close(fd)


def model_sha256(checked: dict[str, str], model: Path) -> str:
    """What answers, from `bundle.checked_files`: a bundle's config.json (it holds the
    sha256 of every file it runs), or the model file itself."""
    from ...bundle import CONFIG_FILE

    return checked[CONFIG_FILE if model.is_dir() else model.name]


def _stamp(path: Path) -> list[int]:
    st = path.stat()
    return [st.st_size, st.st_mtime_ns]


# A run record lists each input's size and time (about 100 bytes an image): 2.5 M images
MAX_RUN_RECORD = 256 << 20


def _read_run(path: Path) -> Optional[dict[str, Any]]:
    if not path.is_file():
        return None
    try:
        run = read_json(path, MAX_RUN_RECORD, error=InputError)
        ok = isinstance(run, dict) and isinstance(run.get("inputs"), dict)
    except InputError:
        ok = False
    if not ok:
        raise InputError(f"{path}: not a run record this command wrote; cannot resume from it")
    return run


def _check_resume(run: Optional[dict[str, Any]], identity: dict[str, Any], output: Path,
                  records: Sequence[dict], current: set[str]) -> None:
    """A resume continues the same run: the same model and options, no records of inputs
    it does not name."""
    if records and run is None:
        raise InputError(f"{output}: nothing records what made its records "
                         f"({run_path(output).name} is missing); cannot resume from it")
    def said(key: str, value) -> str:
        if key == "embed":
            return param("embed", True) if value else "no " + param("embed")
        if key == "top_k":
            return param("top_k", value)
        return {"model": "model (sha256 {})", "runtime": "runtime {}"}[key].format(value)

    keys = ("model", "runtime", "embed") if identity["embed"] else \
        ("model", "top_k", "runtime", "embed")  # an embedding has no top-k
    for key in keys:
        if run is not None and run.get(key, False) != identity[key]:
            raise InputError(f"{param('resume')} with {said(key, identity[key])}, but the "
                             f"records of {output} were made with "
                             f"{said(key, run.get(key, False))}; {param('force')} starts over")
    strangers = [r["input"] for r in records if not _is_from(r["input"], current)]
    if strangers:
        raise InputError(f"{output} holds records of {len(strangers)} input(s) this run does "
                         f"not name (the first: {strangers[0]}); resume with the same inputs")


def input_names(path: Path) -> list[str]:
    """The names `infer` gives the inputs one file holds (an .npy of N arrays holds N), read
    from the .npy header, not the data."""
    from ...images import ARRAY_SUFFIX

    if path.suffix.lower() != ARRAY_SUFFIX:
        return [str(path)]
    try:
        shape = np.load(path, mmap_mode="r", allow_pickle=False).shape
    except Exception:  # unreadable: not done, and the run will say why
        return [f"{path}[?]"]
    count = shape[0] if len(shape) == 4 else 1
    return [f"{path}[{i}]" for i in range(count)] if len(shape) == 4 and count > 1 \
        else [str(path)]


def read_records(files: Iterable[Path]) -> list[dict[str, Any]]:
    """The whole records in earlier outputs, in order; a line cut short by a crash (the last
    one of a progress file) is dropped, any other bad line is an error."""
    records: list[dict[str, Any]] = []
    for path in files:
        if not path.is_file():
            continue
        if path.suffix.lower() == ".parquet":  # a finished --embed run's output
            records += _parquet_records(path)
            continue
        lines = path.read_bytes().split(b"\n")
        lines.pop()  # after the last newline: nothing, or a line a crash cut short
        for number, line in enumerate(lines, 1):
            try:
                record = json.loads(line)
                ok = isinstance(record, dict) and isinstance(record.get("input"), str) \
                    and isinstance(record.get("top", record.get("embedding")), list)
            except ValueError:
                ok = False
            if not ok:
                raise InputError(f"{path}:{number}: not a record this command wrote; "
                                 f"cannot resume from it")
            records.append(record)
    return records


def _parquet_records(path: Path) -> list[dict[str, Any]]:
    from ...embeddings import read

    try:
        names, embeddings = read(path)
    except (OSError, ValueError, KeyError) as exc:  # pyarrow's errors are ValueErrors
        raise InputError(f"{path}: not embeddings this command wrote ({exc}); cannot resume "
                         f"from it") from None
    return [{"input": name, "embedding": row.tolist()} for name, row in zip(names, embeddings)]


def open_on_node(model: str, checked: Optional[dict[str, str]], embed: bool, provider: str,
                 runtime: Optional[str], threads: Optional[int]):
    """The Classifier (or Embedder) of a worker: the model read from this node's copy, held
    to what the driver checked (`bundle.read_model`). What stops it is one line that names
    the node (`session.on_this_node`)."""
    from ...bundle import read_model
    from ..classify import Classifier, Embedder
    from .session import on_this_node

    with on_this_node():
        opened = read_model(model, checked)
        return (Embedder if embed else Classifier)(opened, provider, runtime, threads)


class _ClassifyFiles:
    """A Ray Data actor: a Classifier (an Embedder, with `embed`) opened once, then batches
    of file names -> records, each row naming the node that made it."""

    def __init__(self, model: str, provider: str, runtime: str, top_k: int,
                 threads: Optional[int], batch_size: int, embed: bool = False,
                 checked: Optional[dict[str, str]] = None):
        from .session import node_id

        self.classify = open_on_node(model, checked, embed, provider, runtime, threads)
        self.node = node_id()
        self.top_k = top_k
        self.batch_size = batch_size  # inputs per model call (an .npy file may hold many)

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, list]:
        rows = self._rows(batch)
        rows["node"] = [self.node] * len(rows["file"])
        return rows

    def _rows(self, batch: dict[str, np.ndarray]) -> dict[str, list]:
        from ..classify import batched

        rows: dict[str, list] = {"file": [], "record": [], "error": []}
        items = []
        for file in batch["file"]:
            try:
                named = list(self.classify.inputs([Path(file)]))
            except VitExportError as exc:  # this file fails; the others in the batch still run
                for column, value in (("file", file), ("record", ""), ("error", raw(exc))):
                    rows[column].append(value)
                continue
            items += [(file, name, array) for name, array in named]
        for chunk in batched(items, self.batch_size):
            files, names, arrays = zip(*chunk)
            try:
                results = self.classify.records(names, arrays, self.top_k)
                errors = [""] * len(results)
            except VitExportError as exc:  # non-finite values: the message names the input
                results, errors = [None] * len(names), [raw(exc)] * len(names)
            rows["file"] += files
            rows["record"] += [dumps(r, line=True) if r else "" for r in results]
            rows["error"] += errors
        return rows


def _pool_size(workers: int, cluster_cpus: float, node_cpus: float) -> tuple[float, int]:
    """CPUs each actor asks Ray for, and ONNX Runtime threads for each: the cluster's cores
    shared out, so two workers on two cores do not fight over them; never more than the
    largest node has (an actor lives on one node), and a fraction of a core when there are
    more workers than cores (they still all start)."""
    per = min(cluster_cpus / workers, node_cpus or cluster_cpus)
    per = float(int(per)) if per >= 1 else per
    return per, max(1, int(per))


def refuse_existing(output: Path, resume: bool, force: bool = False) -> None:
    """Without --resume (continue) or --force (start over, the old output kept until the
    new one replaces it), neither the output nor an earlier run's progress file may
    exist."""
    partial = progress_path(output)
    if not (resume or force) and (output.exists() or partial.exists()):
        there = output if output.exists() else partial
        raise InputError(f"{there} exists; pass {param('resume')} to continue that run, or "
                         f"{param('force')} to start over")


def infer_on_ray(model: Path, files: Sequence[Path], options: InferOptions,
                 progress: Callable[[int, int], None] = lambda done, total: None
                 ) -> dict[str, Any]:
    """Classify (or embed, `options.embed`) `files` through Ray Data into `options.output`
    (JSON lines, one record per input as `infer --json` gives it; for embeddings, a .parquet
    output holds columns input and embedding), with `options.workers` runners on the
    cluster at `options.address` (None: one started here). Runtime auto is chosen here once,
    for every worker (the runner and why are in the counts returned). `options.resume`
    continues an earlier run, `options.force` starts over where one left files. Returns
    counts: inputs done before, now, and in all, and the Ray nodes that ran this run's
    work (node id -> records)."""
    from ...bundle import read_model
    from ...choosing import resolve_runner

    output, address = Path(options.output), options.address
    # read once here, on a cluster we join too: what this reads is what every worker must
    # hold (its sha256s go to them, `bundle.checked_files`)
    opened = read_model(model)
    runtime, why = resolve_runner(opened, options.runtime, options.provider,
                                  options.batch_size)
    with output_lock(output):
        return {"runtime": runtime, "chosen_by": why} | _infer_locked(
            model, files, output, top_k=options.top_k, batch_size=options.batch_size,
            workers=options.workers, provider=options.provider, runtime=runtime,
            resume=options.resume, force=options.force, address=address,
            embed=options.embed, progress=progress, opened=opened)


def _infer_locked(model: Path, files: Sequence[Path], output: Path, *, top_k: int,
                  batch_size: int, workers: int, provider: str, runtime: str,
                  resume: bool, force: bool, address: Optional[str], embed: bool,
                  progress: Callable[[int, int], None], opened: Any) -> dict[str, Any]:
    from ...bundle import checked_files
    from .session import ray_session

    refuse_existing(output, resume, force)
    partial = progress_path(output)
    checked = checked_files(opened)
    run = {"model": model_sha256(checked, model), "top_k": top_k, "runtime": runtime,
           "embed": embed, "inputs": {str(f): _stamp(f) for f in files}}
    done, kept, earlier_run = _done_before(run, files, output, resume)
    todo = [f for f in files if str(f) not in done]
    if not todo and output.is_file() and not partial.exists():  # a no-op: left as it is
        return {"before": len(done), "now": 0, "records": len(read_records([output])),
                "nodes": {}}
    if address is None and todo:  # the workers run here: prove the model and provider first
        from ..classify import Classifier, Embedder

        (Embedder if embed else Classifier)(opened, provider, runtime)
    ran: Counter[str] = Counter()  # node id -> records its workers made in this run
    made = _nodes_of(earlier_run) if kept else Counter()  # ... and in the run resumed
    # a cluster not there leaves nothing
    with ray_session(address) if todo else contextlib.nullcontext() as ray:
        _write_atomically(run_path(output), [dumps(run | {"nodes": dict(made)}, line=True)])
        _write_atomically(partial, (dumps(r, line=True) for r in kept))
        try:
            new = _run_pool(ray, model, todo, partial, top_k=top_k, batch_size=batch_size,
                            workers=workers, provider=provider, runtime=runtime,
                            embed=embed, progress=progress, checked=checked,
                            nodes=ran) if todo else 0
        finally:  # which nodes made the records kept, for a resume or a finished run alike
            if ran:
                _write_atomically(run_path(output),
                                  [dumps(run | {"nodes": dict(made + ran)}, line=True)])
    _finish(partial, output, [str(f) for f in files], parquet=embed
            and output.suffix.lower() == ".parquet")
    return {"before": len(done), "now": len(todo), "records": len(kept) + new,
            "nodes": dict(ran)}


def _done_before(run: dict[str, Any], files: Sequence[Path], output: Path, resume: bool
                 ) -> tuple[set[str], list[dict], Optional[dict[str, Any]]]:
    """With --resume, what an earlier run of the same model and options did: the input
    files wholly done, the records kept of them (the first of each input), and that run's
    record; else nothing."""
    current = {str(f) for f in files}
    partial = progress_path(output)
    records = read_records([output, partial]) if resume else []
    earlier_run = _read_run(run_path(output)) if resume else None
    _check_resume(earlier_run, run, output, records, current)
    # an input changed since its record was made is classified again
    fresh = {name for name, stamp in run["inputs"].items()
             if earlier_run is not None and earlier_run["inputs"].get(name) == stamp}
    earlier: dict[str, dict] = {}  # the first record of each input
    for record in records:
        if _base(record["input"], current) in fresh:
            earlier.setdefault(record["input"], record)
    done = {str(f) for f in files if all(n in earlier for n in input_names(f))}
    expected = {n for f in files if str(f) in done for n in input_names(f)}
    # an input file only partly done runs again whole
    return done, [r for name, r in earlier.items() if name in expected], earlier_run


def _nodes_of(run: Optional[dict[str, Any]]) -> Counter[str]:
    """The nodes an earlier run's record says made its records (node id -> records)."""
    nodes = (run or {}).get("nodes")
    if not isinstance(nodes, dict):
        return Counter()
    return Counter({node: count for node, count in nodes.items()
                    if isinstance(node, str) and isinstance(count, int) and count > 0})


def _base(name: str, files: set[str]) -> str:
    """The input file a record's input name comes from ("x.npy[3]" -> "x.npy")."""
    return name if name in files else name.rsplit("[", 1)[0]


def _is_from(name: str, files: set[str]) -> bool:
    return _base(name, files) in files


def _run_pool(ray, model: Path, todo: Sequence[Path], partial: Path, *, top_k: int,
              batch_size: int, workers: int, provider: str, runtime: str,
              embed: bool, progress: Callable[[int, int], None], checked: dict[str, str],
              nodes: Counter[str]) -> int:
    """The actor pool over `todo`: each finished batch appended to `partial` (fsynced), the
    node that made each record counted in `nodes`. Returns the records written."""
    context = ray.data.DataContext.get_current()
    context.execution_options.preserve_order = True  # records land in input order
    context.enable_progress_bars = False
    context.print_on_execution_start = False
    resources = ray.cluster_resources()
    largest = max((n.get("Resources", {}).get("CPU", 0) for n in ray.nodes()
                   if n.get("Alive")), default=0)
    cpus, threads = _pool_size(workers, resources.get("CPU", 1), largest)
    # an actor sees a GPU only if it asks for one (Ray hides the others): `auto` asks too
    gpus = min(1.0, resources.get("GPU", 0) / workers) if provider in ("cuda", "auto") else 0
    dataset = ray.data.from_items([{"file": str(f)} for f in todo]).map_batches(
        _ClassifyFiles, batch_size=batch_size, num_cpus=cpus, num_gpus=gpus,
        compute=ray.data.ActorPoolStrategy(size=workers),
        max_restarts=0,  # a runner that dies fails the run, which --resume continues
        fn_constructor_kwargs=dict(model=str(model.resolve()), provider=provider,
                                   runtime=runtime, top_k=top_k, threads=threads,
                                   batch_size=batch_size, embed=embed, checked=checked))
    written, files_done = 0, set()
    with open(partial, "ab") as out, contextlib.closing(_batches(dataset)) as batches:
        for batch in batches:
            good = [r for r, e in zip(batch["record"], batch["error"]) if not e]
            nodes.update(n for n, e in zip(batch["node"], batch["error"]) if not e)
            if good:
                out.write(b"".join(r.encode() + b"\n" for r in good))
                out.flush()
                os.fsync(out.fileno())
                written += len(good)
            errors = [e for e in batch["error"] if e]
            if errors:  # what was done stays in the progress file for --resume
                raise InputError(errors[0])
            files_done.update(batch["file"])
            progress(len(files_done), len(todo))
    return written


def _batches(dataset):
    """The dataset's finished batches; what fails inside Ray (an actor that cannot open the
    model, a worker that died) is one line naming the cause, not Ray's traceback."""
    iterator = iter(dataset.iter_batches(batch_size=None, batch_format="numpy"))
    try:
        while True:
            try:
                batch = next(iterator)
            except StopIteration:
                return
            except Exception as exc:
                raise VitExportError(worker_failure(exc)) from None
            yield batch
    finally:
        # Ray Data's executor stops here, when the run ends or is stopped (a signal, an
        # error), not when the garbage collector gets to it: that can be after
        # ray.shutdown, and an executor thread that then touches the shut-down core worker
        # makes Ray end the process with exit 1 ("The core worker has already been
        # shutdown"), in place of the signal's exit code
        close = getattr(iterator, "close", None)
        if close is not None:
            close()


def worker_failure(exc: BaseException) -> str:
    """One line for a worker that failed inside Ray: a worker lost with its node (a machine
    gone, a node removed) says which node, and that --resume runs what it had not
    answered; a worker that could not start (Ray Data reports it in a traceback's text),
    our own error's line (`open_on_node`'s, naming the node); else the cause's first line."""
    import re

    from .session import cause_line, innermost, our_error

    lost = re.search(r"its node has died\. Node Id: ([0-9a-f]+)", str(exc))
    if lost:
        return (f"a Ray Data worker was lost with its node {lost.group(1)}; the records "
                f"finished are kept: {param('resume')} runs the rest")
    ours = None if isinstance(innermost(exc), VitExportError) else our_error(str(exc))
    return f"a Ray Data worker failed: {ours or cause_line(exc)}"


def _write_atomically(path: Path, lines: Iterable[str]) -> None:
    """JSON lines, through the package's one atomic write (bundle.atomic_write_chunks)."""
    from ...bundle import atomic_write_chunks

    atomic_write_chunks(path, (line.encode() + b"\n" for line in lines))


def _finish(partial: Path, output: Path, order: Sequence[str], parquet: bool = False) -> None:
    """The progress file, in input order (records of inputs not in this run after them),
    renamed onto the output."""
    records = read_records([partial])
    rank = {name: i for i, name in enumerate(order)}

    def key(record):
        name = record["input"]
        base = name.rsplit("[", 1)[0] if name not in rank else name
        return rank.get(base, len(order))

    records.sort(key=key)  # stable: arrays of one .npy keep their order
    if parquet:  # embeddings: the table, then the records go
        from ...embeddings import write

        write(output, [r["input"] for r in records],
              np.array([r["embedding"] for r in records], np.float32))
        partial.unlink()
        return
    _write_atomically(partial, (dumps(r, line=True) for r in records))
    os.replace(partial, output)
