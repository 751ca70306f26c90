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

from .errors import VitExportError

SERVE_EXTRA = "pip install 'vit-export[serve]'"


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
    verbose = logging.getLogger().isEnabledFor(logging.INFO)
    main = threading.current_thread() is threading.main_thread()
    handlers = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)} if main else {}
    ray.init(address=address, include_dashboard=False, log_to_driver=verbose,
             logging_level=logging.INFO if verbose else logging.ERROR,
             ignore_reinit_error=True)
    for signum, handler in handlers.items():
        if handler is not None:
            signal.signal(signum, handler)
    quiet()
    return ray


def quiet() -> None:
    """Ray's loggers to ERROR unless --verbose; again after Ray Serve starts, which sets its
    own up."""
    if logging.getLogger().isEnabledFor(logging.INFO):
        return
    import ray.data  # noqa: F401  (it sets up its loggers on import: quiet them after)

    for name in ("ray", "ray.data", "ray.serve"):
        logging.getLogger(name).setLevel(logging.ERROR)
