"""Ray, started (or joined) one way for `serve` and `infer --ray`.

Ray is the `serve` extra, not a core dependency: it is imported here, on first use. Started
from our CLI it keeps to our rules: its INFO and WARNING lines, and its C++ core's, stay off
stderr unless `--verbose`, and SIGTERM and SIGINT still reach our handlers (Ray installs its
own), so a stopped run says so in one line and cleans up.
"""
from __future__ import annotations

import logging
import signal
import threading
from typing import Optional

from .errors import VitExportError, first_line

SERVE_EXTRA = "pip install 'vit-export[serve]'"
log = logging.getLogger(__name__)
_saved_printer: list = []  # Ray's error printer while ours stands in for it
RAY_LOGGERS = ("ray", "ray.data", "ray.serve")
_saved_levels: dict[str, int] = {}  # their levels before start_ray and quiet() set them


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
    try:
        ray.init(address=address, include_dashboard=False, log_to_driver=verbose,
                 logging_level=logging.INFO if verbose else logging.ERROR,
                 ignore_reinit_error=True)
    except Exception as exc:  # ConnectionError, ValueError, RuntimeError: Ray's own words
        _restore_levels()
        where = f"join the Ray cluster at {address}" if address else "start Ray"
        raise VitExportError(f"cannot {where}: {cause_line(exc)}") from None
    for signum, handler in handlers.items():
        if handler is not None:
            signal.signal(signum, handler)
    quiet()
    if not verbose:
        _errors_to_debug()
    return ray


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


def cause_line(exc: BaseException) -> str:
    """One line for an error Ray reports: the innermost cause (a RayTaskError carries the
    actor's own exception as `.cause`), its first line."""
    seen = set()
    while id(exc) not in seen:
        seen.add(id(exc))
        inner = getattr(exc, "cause", None) or exc.__cause__
        if not isinstance(inner, BaseException):
            break
        exc = inner
    return first_line(exc)


def stop_ray(ray) -> None:
    """ray.shutdown, and what start_ray and quiet changed given back: Ray's error printer
    and its loggers' levels (a library leaves the process's logging as it found it)."""
    try:
        ray.shutdown()
    finally:
        if _saved_printer:
            from ray._private import worker

            worker.print_to_stdstream = _saved_printer.pop()
        _restore_levels()


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
        logger.setLevel(logging.ERROR)
