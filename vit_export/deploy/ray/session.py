"""Ray, started (or joined) one way for `serve` and `infer --ray`.

Ray is the `serve` extra, not a core dependency: it is imported here, on first use. Started
from our CLI it keeps to our rules: its INFO and WARNING lines, and its C++ core's, stay off
stderr unless `--verbose`, and SIGTERM and SIGINT still reach our handlers (Ray installs its
own), so a stopped run says so in one line and cleans up.
"""
from __future__ import annotations

import logging
import os
import signal
import threading
import time
from collections.abc import Collection, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Optional

from ...errors import Signalled, VitExportError, first_line, raw, signal_exception

SERVE_EXTRA = "pip install 'vit-export[serve]'"
log = logging.getLogger(__name__)
_saved_printer: list = []  # Ray's error printer while ours stands in for it
RAY_LOGGERS = ("ray", "ray.data", "ray.serve")
_saved_levels: dict[str, int] = {}  # their levels before start_ray and quiet() set them
_driver: list = []  # not empty once ray.init was called here: a C++ core worker may exist


def import_ray():
    """Ray, or one line saying how to get it."""
    try:
        import ray
    except ImportError:
        raise VitExportError(f"Ray is not installed; it comes with the serve extra: "
                             f"{SERVE_EXTRA}") from None
    return ray


def start_ray(address: Optional[str] = None):
    """ray.init: a local cluster of this machine's cores, or the cluster at `address`."""
    ray = import_ray()
    if address:
        _probe(address)
    verbose = logging.getLogger().isEnabledFor(logging.INFO)
    main = threading.current_thread() is threading.main_thread()
    handlers = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)} if main else {}
    for name in RAY_LOGGERS:  # ray.init sets "ray"'s level itself: saved before it
        _saved_levels.setdefault(name, logging.getLogger(name).level)
    def our_handlers() -> None:
        for signum, handler in handlers.items():
            if handler is not None:
                signal.signal(signum, handler)

    if main:  # the driver's signals are ours: no C++ handler for Ray's core worker here
        _no_failure_signal_handler()
    if address is None:
        _subreaper()
        _start_guard()  # before ray.init: a SIGKILL while Ray starts leaves nothing either
    _driver.append(True)
    try:
        with _signals_held(main):  # a signal held meanwhile is raised as the block ends
            # "local": a cluster of its own, never one `ray start` left on this machine
            ray.init(address=address or "local", include_dashboard=False,
                     log_to_driver=verbose,
                     logging_level=logging.INFO if verbose else logging.ERROR,
                     ignore_reinit_error=True)
    except Exception as exc:  # ConnectionError, ValueError, RuntimeError: Ray's own words
        our_handlers()
        _restore_levels()
        _stop_guard()  # which ends what Ray started under us, if anything
        where = f"join the Ray cluster at {address}" if address else "start Ray"
        raise VitExportError(f"cannot {where}: {cause_line(exc)}") from None
    except BaseException as exc:  # a signal while Ray starts: what it started goes too
        our_handlers()
        try:
            _shutdown(ray)
        finally:
            _restore_levels()
        if isinstance(exc, SystemExit) and exc.code == signal.SIGTERM:  # Ray's handler, where
            raise Signalled(signal.SIGTERM) from None  # _signals_held could not keep it out
        raise
    our_handlers()
    quiet()
    if not verbose:
        _errors_to_debug()
    return ray


@contextmanager
def ray_session(address: Optional[str] = None) -> Iterator[Any]:
    """Ray for the block (`start_ray`), shut down after it however it ends, and the
    process's logging, signal handlers and Ray's printer given back as they were
    (`stop_ray`)."""
    ray = start_ray(address)
    try:
        yield ray
    finally:
        stop_ray(ray)


def stop_within(seconds: float, what: str, cause: Optional[BaseException]) -> threading.Timer:
    """The last resort of a stop: if `what` has not shut down `seconds` from now (call
    `cancel()` once it has), Ray's processes under this one are killed, one line says so
    ("stopped by SIGINT; ..." after a signal), and the process exits (128 + the signal, else
    1). Ray's shutdown waits on its own processes; after a Ctrl-C to the whole process group
    they may be gone or going, and a wait on them was seen to outlast minutes."""
    import sys

    signum = signal.SIGINT if isinstance(cause, KeyboardInterrupt) else \
        getattr(cause, "signum", None)

    def give_up() -> None:
        for pid in _ray_descendants():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        head = f"stopped by {signal.Signals(signum).name}; " if signum else "Error: "
        try:
            sys.stderr.write(f"{head}{what} did not shut down within {seconds:g} s: its "
                             f"processes were killed\n")
            sys.stderr.flush()
        finally:
            os._exit(128 + signum if signum else 1)

    timer = threading.Timer(seconds, give_up)
    timer.daemon = True
    timer.start()
    return timer


def driver_ran() -> bool:
    """Whether this process called ray.init (and may hold Ray's C++ core worker)."""
    return bool(_driver)


def exit_process(code) -> None:
    """End a process in which Ray's driver ran: Python's exit handlers (ray.shutdown's
    among them), the streams flushed, then os._exit, skipping the C library's exit handlers.
    Ray's (CoreWorkerProcess::HandleAtExit) destroys the core worker while its io thread
    may still run a periodic RecordMetrics: a segfault after our last line, exit -11
    instead of 143, in 3 of 12 SIGTERMs during a Ray Data run here (the core dump shows
    both threads). Ray's own workers leave by os._exit for the same reason."""
    import atexit
    import sys

    if code is None:
        code = 0
    elif not isinstance(code, int):  # sys.exit("message"): Python prints it, exits 1
        print(code, file=sys.stderr)
        code = 1
    try:
        atexit._run_exitfuncs()
        logging.shutdown()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):  # a closed pipe: nothing more to say there
                pass
        os._exit(code)


@contextmanager
def _signals_held(main: bool) -> Iterator[None]:
    """SIGTERM and SIGINT held while the block (ray.init) runs, then handled as the handlers
    in place before it would have: the first one that came, once, as the block ends, whether
    it ended well or in an error (a SIGTERM sent to our process group reaches Ray's processes
    too, and ray.init then fails: the signal is the answer, not Ray's error). Raised where
    they land, a handler's exception can be lost: ray.init starts Ray's processes with a
    preexec_fn, so Python runs its fork hooks, and an exception raised in one (logging's
    _releaseLock, say) is printed as "Exception ignored" and dropped. CI saw Ray's handler's
    SystemExit dropped there: logging's lock stayed taken, and the run hung until it was
    killed 120 s later. A second signal is handled at once (ray.init may wait long on a
    cluster); if that is lost too, the first is still held. A signal ignored before is
    still ignored. ray.init's own SIGTERM handlers (sys.exit in the driver, and the head
    node's, which ends its processes and exits 1) are kept out meanwhile: our clean-up ends
    what Ray started. Off the main thread nothing is held: no handler runs there."""
    if not main:
        yield
        return
    from ray._private import utils

    saved = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    held: list[int] = []

    def handle(signum: int) -> None:  # as the handler we replaced would have
        handler = saved[signum]
        if callable(handler):
            handler(signum, None)
        elif handler != signal.SIG_IGN:  # the default ends the process: we clean up first
            raise signal_exception(signum)

    def hold(signum, frame):
        if held:
            handle(signum)
        held.append(signum)

    set_sigterm_handler = getattr(utils, "set_sigterm_handler", None)
    for signum, handler in saved.items():
        if handler != signal.SIG_IGN:
            signal.signal(signum, hold)
    if set_sigterm_handler is not None:
        utils.set_sigterm_handler = lambda handler: None
    try:
        yield
    finally:
        if set_sigterm_handler is not None:
            utils.set_sigterm_handler = set_sigterm_handler
        for signum, handler in saved.items():
            signal.signal(signum, handler if handler is not None else signal.SIG_DFL)
        if held:
            handle(held[0])


def _no_failure_signal_handler() -> None:
    """Ray's core worker, built inside ray.init, installs Abseil's failure signal handler for
    SIGTERM too: a SIGTERM after that, before ray.init returned, printed a C++ stack dump and
    its 3-second alarm aborted our clean-up (exit 134, not 143; CI saw it). Ray's own switch
    (RAY_DISABLE_FAILURE_SIGNAL_HANDLER, read from ray_constants when the core worker is
    built), set for this process only: the raylet and its workers keep their handler. A
    native crash in the driver loses Abseil's C++ stack; Python's faulthandler still works."""
    from ray._private import ray_constants

    ray_constants.RAY_DISABLE_FAILURE_SIGNAL_HANDLER = True


def _probe(address: str, seconds: float = 5.0) -> None:
    """A host:port (or ray://host:port) address answers a TCP connection, or one line says
    it does not: ray.init would retry an unreachable address for minutes."""
    import socket

    host, _, port = address.removeprefix("ray://").rpartition(":")
    if not host or not port.isdigit():
        return  # "auto", or a form Ray parses itself
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=seconds):
            pass
    except OSError as exc:
        why = "no answer" if isinstance(exc, TimeoutError) else exc.strerror or str(exc)
        raise VitExportError(f"cannot join the Ray cluster at {address}: {why}") from None


def node_id() -> str:
    """The Ray node this process runs on, by its id (as `ray status` and Ray's state API
    name it)."""
    import ray

    return ray.get_runtime_context().get_node_id()


@contextmanager
def on_this_node() -> Iterator[None]:
    """Our error raised in the block, in a Ray worker or replica, names the node it ran on:
    on a cluster, which machine holds a copy of the bundle that differs, or lacks the
    provider asked for."""
    try:
        yield
    except VitExportError as exc:
        raise VitExportError(f"on Ray node {node_id()}: {raw(exc)}") from None


def innermost(exc: BaseException) -> BaseException:
    """The innermost cause of an error Ray reports (a RayTaskError carries the actor's own
    exception as `.cause`)."""
    seen = set()
    while id(exc) not in seen:
        seen.add(id(exc))
        inner = getattr(exc, "cause", None) or exc.__cause__
        if not isinstance(inner, BaseException):
            break
        exc = inner
    return exc


def cause_line(exc: BaseException) -> str:
    """One line for an error Ray reports: the innermost cause (a RayTaskError carries the
    actor's own exception as `.cause`), its first line."""
    exc = innermost(exc)
    # ours keeps its option marks, so the command line shows the flag (errors.option)
    return first_line(exc) if not isinstance(exc, VitExportError) else \
        (raw(exc).strip().splitlines() or [type(exc).__name__])[0]


def our_error(report: str) -> Optional[str]:
    """The message of our own error (`errors.VitExportError` and its kinds) in a report Ray
    made of it, which wraps the exception and its traceback in its own text (an actor that
    failed to start, a replica's failure), or None where it holds none."""
    from ... import errors

    names = tuple(name for name in dir(errors) if name.endswith("Error"))
    for line in reversed(report.splitlines()):
        text = line.strip()
        for name in names:
            if text.startswith(f"{name}: ") or f"errors.{name}: " in text:
                return text.split(f"{name}: ", 1)[1]
    return None


def stop_ray(ray) -> None:
    """ray.shutdown, and what start_ray and quiet changed given back: Ray's error printer
    and its loggers' levels (a library leaves the process's logging as it found it)."""
    try:
        _shutdown(ray)
    finally:
        if _saved_printer:
            from ray._private import worker

            worker.print_to_stdstream = _saved_printer.pop()
        _restore_levels()


def _shutdown(ray) -> None:
    """ray.shutdown, then the end of what the local cluster left behind: its raylet's agents
    (ray::DashboardAgent, ray::RuntimeEnvAgent) outlived it by a minute or more (measured,
    after a SIGTERM during start-up). Only processes under this one, by PID."""
    left = _ray_descendants()
    ray.shutdown()
    for sig in (signal.SIGTERM, signal.SIGKILL):
        # agents still starting when we stopped, orphaned by their raylet: ours again now
        left = [pid for pid in {*left, *_ray_descendants()} if alive(pid)]
        for pid in left:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + 2
        while any(alive(pid) for pid in left) and time.monotonic() < deadline:
            time.sleep(0.05)
    for pid in left:  # those that became our children: reaped, not left as zombies
        try:
            os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            pass
    _stop_guard()


def _subreaper() -> None:
    """Make this process the one Ray's orphans are given to (Linux's child subreaper): an
    agent still starting when a SIGTERM stopped ray.init outlived its raylet, reparented to
    init where no process tree of ours led to it (CI saw two left after 30 s). As our
    children again, `_shutdown` finds and ends them. Elsewhere: nothing."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
    except (OSError, AttributeError):
        pass


# The guard: a small process started beside a local cluster. Every half second it learns
# Ray's processes under us (PID and start time, so a reused PID is never touched), until our
# end of a pipe closes: at our exit, or at our death by SIGKILL, when no handler of ours runs.
# Ray's fate sharing takes the raylet and GCS down with us, but their agents
# (ray::DashboardAgent, ray::RuntimeEnvAgent) outlived a SIGKILLed driver by over 30 s
# (3 runs of 3, tests/test_ray_data.py): the guard ends them. Signals to our process group (Ctrl-C) leave it be;
# our own clean-up runs first.
GUARD = r"""
import os, select, signal, sys, time
signal.signal(signal.SIGINT, signal.SIG_IGN)
signal.signal(signal.SIGTERM, signal.SIG_IGN)
driver = int(sys.argv[1])
def started(pid):
    try:
        return int(open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[19])
    except (OSError, ValueError, IndexError):
        return None
def ray_under_driver():
    children = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                fields = open(f"/proc/{name}/stat").read().rsplit(")", 1)[1].split()
                children.setdefault(int(fields[1]), []).append(int(name))
            except (OSError, ValueError, IndexError):
                pass
    found, todo = [], list(children.get(driver, []))
    while todo:
        pid = todo.pop()
        todo += children.get(pid, [])
        try:
            if pid != os.getpid() and b"ray" in open(f"/proc/{pid}/cmdline", "rb").read():
                found.append(pid)
        except OSError:
            pass
    return found
procs = {}
while True:  # learn Ray's processes as they start, until the driver's pipe closes
    for pid in ray_under_driver():
        if pid not in procs and (start := started(pid)) is not None:
            procs[pid] = start
    if select.select([sys.stdin], [], [], 0.5)[0] and not os.read(sys.stdin.fileno(), 4096):
        break
for sig in (signal.SIGTERM, signal.SIGKILL):
    for pid, start in procs.items():
        if started(pid) == start:
            try:
                os.kill(pid, sig)
            except OSError:
                pass
    deadline = time.monotonic() + 2
    while any(started(p) == s for p, s in procs.items()) and time.monotonic() < deadline:
        time.sleep(0.05)
"""
_guard: list = []  # the guard's Popen, while a local cluster runs


def _start_guard() -> None:
    import subprocess
    import sys

    if _guard:
        return
    _guard.append(subprocess.Popen([sys.executable, "-c", GUARD, str(os.getpid())],
                                   stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                                   stderr=subprocess.DEVNULL, close_fds=True))


def _stop_guard() -> None:
    """Close the pipe (the guard finds Ray's processes gone already, and exits); reap it."""
    while _guard:
        guard = _guard.pop()
        try:
            guard.stdin.close()
            guard.wait(timeout=10)
        except Exception:  # it is ours: it does not outlive us either way
            guard.kill()
            guard.wait()


def _ray_descendants() -> list[int]:
    """The PIDs of Ray's processes under this one (a local cluster: raylet, GCS, agents,
    workers), from /proc; none where there is no /proc. Not the guard: taken for one of
    them, it ignored the SIGTERM and every shutdown waited 2 s for it before a SIGKILL."""
    found = []
    for pid in descendants(os.getpid(), skip={guard.pid for guard in _guard}):
        try:  # the guard's script says "ray" too: it ends itself
            if b"ray" in Path(f"/proc/{pid}/cmdline").read_bytes():
                found.append(pid)
        except OSError:
            continue
    return found


def descendants(root: int, skip: Collection[int] = ()) -> list[int]:
    """The PIDs of every process under `root` now (its children, theirs, ...), from /proc,
    but those in `skip` and what is under them; none where there is no /proc."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
        except (OSError, IndexError, ValueError):  # ended while read
            continue
    found, todo = [], [pid for pid in children.get(root, []) if pid not in skip]
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo += [child for child in children.get(pid, []) if child not in skip]
    return found


def alive(pid: int) -> bool:
    """Whether `pid` is a running process (a zombie waiting for its reaper is not)."""
    try:
        return "\nState:\tZ" not in Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False


def _restore_levels() -> None:
    for name, level in _saved_levels.items():
        logging.getLogger(name).setLevel(level)
    _saved_levels.clear()


def _errors_to_debug() -> None:
    """The driver's thread that listens for the cluster's error messages prints them to
    *stdout* (e.g. "(raylet) Task ServeController.graceful_shutdown failed ..." as Serve shuts
    down), where our results go: send them to the debug log instead, as Ray's own logs are.
    The printer is a module global of ray._private.worker, looked up on every message."""
    from ray._private import worker

    printer = getattr(worker, "print_to_stdstream", None)
    if printer is None or _saved_printer:
        return
    _saved_printer.append(printer)

    def to_debug(data, ignore_prefix: bool = False) -> None:
        for line in data.get("lines", []):
            log.debug("ray (%s): %s", data.get("pid"), line)

    worker.print_to_stdstream = to_debug


def quiet() -> None:
    """Ray's loggers to ERROR unless --verbose; again after Ray Serve starts, which sets its
    own up."""
    if logging.getLogger().isEnabledFor(logging.INFO):
        return
    import ray.data  # noqa: F401  (it sets up its loggers on import: quiet them after)

    for name in RAY_LOGGERS:
        logger = logging.getLogger(name)
        _saved_levels.setdefault(name, logger.level)  # the level before our first quiet()
        # Ray Data logs a task that failed (a worker lost with its node) at ERROR, with its
        # traceback, before the driver is told: the driver says it in one line itself
        logger.setLevel(logging.CRITICAL if name == "ray.data" else logging.ERROR)
