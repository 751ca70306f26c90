"""BenchOptions: what bench times and how long, every rule checked when made."""
from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Optional

from .. import runtime
from ..errors import ConfigError, OptionError, raw
from .peers import check_peers


class BenchOptionError(OptionError, ConfigError):
    """Bench options that cannot be honoured (a ConfigError, as before bench's options had
    their own type; the command line exits 2 for it)."""


@dataclass(frozen=True)
class BenchOptions:
    """What `bench` times and how long; the defaults are those of `vit-export bench`.
    Checked when made (BenchOptionError): the one home of bench's rules."""
    batch_sizes: Sequence[int] = (1, 8, 32)
    threads: Optional[int] = None  # intra-op threads [default: every core]
    provider: str = runtime.DEFAULT_PROVIDER  # "auto", "cuda" or "cpu"
    warmup: int = 2  # untimed calls before each timed series
    min_runs: int = 5  # timed calls at least, ...
    min_seconds: float = 2.0  # ... and for at least this long
    seed: int = 0  # of the timed inputs
    runners: Optional[Sequence[str]] = None  # runner names to time (None: every one)
    runtimes: Sequence[str] = ()  # opt-in runtimes to time too ("openvino")
    peers: Sequence[str] = ()  # PEERS: PyTorch's own fast paths, CUDA graphs, timm
    trust_code: bool = False  # also time the files that can carry code

    def __post_init__(self) -> None:
        try:
            self._check()
        except BenchOptionError:
            raise
        except ConfigError as exc:  # an unknown runtime or peer
            raise BenchOptionError(raw(exc)) from None

    def _check(self) -> None:
        from ..runtime.registry import by_name

        for name in ("batch_sizes", "runtimes", "peers"):  # each once, in the order given
            object.__setattr__(self, name, tuple(dict.fromkeys(getattr(self, name))))
        if not self.batch_sizes or min(self.batch_sizes) < 1:
            raise BenchOptionError(f"batch sizes must be >= 1, got {list(self.batch_sizes)}")
        if self.warmup < 0 or self.min_runs < 1 or self.min_seconds < 0:
            raise BenchOptionError("warmup must be >= 0, min_runs >= 1 and min_seconds >= 0")
        if self.threads is not None and self.threads < 1:
            raise BenchOptionError(f"threads must be >= 1, got {self.threads}")
        for name in self.runtimes:
            by_name(name)
        check_peers(self.peers)


def bench_options(options: Optional[BenchOptions], keywords: dict[str, Any]) -> BenchOptions:
    """`options`, or its fields as keyword arguments; the two together: `options` with
    them replaced."""
    if options is None:
        return BenchOptions(**keywords)
    return dataclasses.replace(options, **keywords) if keywords else options
