"""Read each file once, verify the bytes you load.

A file checked by its path and then opened again by its path is two files: one renamed over
it between the two reads is run unchecked. So a file that is to be loaded is read here once,
into memory, its sha256 compared where one is expected, and those bytes are what every check
reads and what the loader is given (ONNX Runtime and OpenVINO from bytes, torch from a
BytesIO). The path stays only to name the file in messages.
"""
from __future__ import annotations

import hashlib
import os
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Optional

from .errors import BundleError

CONFIG_FILE = "config.json"  # where a bundle's sha256s are listed (bundle.CONFIG_FILE)


@dataclass(frozen=True)
class Loaded:
    """A file's bytes as they were read once (and checked, where `sha256` was expected)."""
    path: Path  # where they were read from: named in messages, never opened again
    data: bytes
    sha256: str

    @property
    def name(self) -> str:
        return self.path.name

    @property
    def suffix(self) -> str:
        return self.path.suffix


def read_once(path: str | os.PathLike, expected: Optional[str] = None,
              limit: Optional[int] = None,
              inside: Optional[str | os.PathLike] = None) -> Loaded:
    """The bytes of the regular file at `path`, read once; with `expected`, they must hash to
    it (the sha256 config.json lists). BundleError in one line where the file is missing,
    not a regular file, or not the file that was hashed.

    Args:
        path: the file (a symlink is followed).
        expected: its sha256 as config.json lists it, or None for a file the user named.
        limit: the most bytes such a file holds (a JSON file's), refused before it is read.
        inside: a folder the file must really lie in (checked on the file opened): a link
            out of it is refused.

    Returns:
        The bytes and their sha256.

    Raises:
        BundleError: unreadable, not a regular file of a fixed size (at most `limit`),
            outside `inside`, or its bytes do not match `expected`.
    """
    path = Path(path)
    with _regular_file(path) as f:
        if inside is not None:
            _check_inside(f, path, Path(inside))
        size = os.fstat(f.fileno()).st_size
        if limit is not None and size > limit:
            raise BundleError(f"{path} holds {size} bytes, more than the {limit} such a file "
                              f"holds")
        data = f.read(size + 1)
    if len(data) != size:  # /proc's files say 0 bytes and read on (pagemap: for ever)
        raise BundleError(f"{path} is not a file of fixed size ({size} bytes declared, "
                          f"{len(data)}{'+' if len(data) > size else ''} read)")
    digest = hashlib.sha256(data).hexdigest()
    if expected is not None and digest != expected:
        raise BundleError(f"{path} does not match its sha256 in {CONFIG_FILE} (truncated or "
                          f"modified)")
    return Loaded(path, data, digest)


def held_to(loaded: Loaded, expected: Optional[str]) -> Loaded:
    """`loaded`, whose bytes must hash to `expected` where one is given: the sha256 of the
    copy a run was checked against elsewhere (on a Ray cluster, the driver's copy; each
    node reads its own).

    Raises:
        BundleError: the bytes differ, in one line naming the file and both sha256s.
    """
    if expected is not None and loaded.sha256 != expected:
        raise BundleError(differs(loaded.path, loaded.sha256, expected))
    return loaded


def differs(path: str | os.PathLike, here: str, there: str) -> str:
    """One line: the file at `path` is not the copy the driver checked."""
    return (f"{path} differs from the driver's copy (sha256 {here[:12]}... here, "
            f"{there[:12]}... on the driver)")


@contextmanager
def open_checked(path: str | os.PathLike, expected: Optional[str]) -> Iterator[str]:
    """A path to the regular file at `path` as it is open here, its bytes hashed to
    `expected` first: /proc/self/fd/N names this open file, whatever is renamed over `path`
    meanwhile. For a file too large to hold in memory and read by a loader that maps it
    (safetensors): hashed as read once, then mapped from the same open file.

    Raises:
        BundleError: not a regular file, unreadable, no `expected`, or bytes that differ.
    """
    path = Path(path)
    if expected is None:
        raise BundleError(f"{path} has no sha256 in {CONFIG_FILE}, so it may not be the file "
                          f"that was validated")
    with _regular_file(path) as f:
        if _hashed(f, path) != expected:
            raise BundleError(f"{path} does not match its sha256 in {CONFIG_FILE} (truncated "
                              f"or modified)")
        here = f"/proc/self/fd/{f.fileno()}"
        yield here if os.path.exists(here) else str(path)  # elsewhere: the path, as before


def open_hashed(path: str | os.PathLike) -> tuple[BinaryIO, str]:
    """The regular file at `path`, hashed as it is read through once and left open at its
    start, with its sha256: what is later read or mapped from this open file (`fd_path`) is
    what was hashed, whatever is renamed over `path` meanwhile. The caller closes it.

    Raises:
        BundleError: missing, not a regular file, or unreadable.
    """
    path = Path(path)
    with _regular_file(path) as f:
        digest = _hashed(f, path)
        kept = os.fdopen(os.dup(f.fileno()), "rb")
    kept.seek(0)
    return kept, digest


def fd_path(f: BinaryIO, path: str | os.PathLike) -> str:
    """A path to the open file `f` (/proc/self/fd/N), or `path` where there is none."""
    here = f"/proc/self/fd/{f.fileno()}"
    return here if os.path.exists(here) else str(path)


def _check_inside(f: BinaryIO, path: Path, folder: Path) -> None:
    """The open file `f` (opened as `path`) is in `folder`, every link resolved."""
    real = os.path.realpath(fd_path(f, path))
    where = os.path.realpath(folder)
    if os.path.commonpath([real, where]) != where:
        raise BundleError(f"{path} leads outside {folder} (to {real}): only a file in the "
                          f"folder is read as its own")


def _hashed(f: BinaryIO, path: Path) -> str:
    """The sha256 of the open file `f`, read through once: exactly the size it declares
    (a file of /proc says 0 and reads on, /proc/self/pagemap for ever)."""
    left = os.fstat(f.fileno()).st_size
    digest = hashlib.sha256()
    while left and (block := f.read(min(left, 1 << 20))):
        digest.update(block)
        left -= len(block)
    if left or f.read(1):
        raise BundleError(f"{path} is not a file of fixed size (it changed while it was read, "
                          f"or reads on past its declared size)")
    return digest.hexdigest()


@contextmanager
def _regular_file(path: Path) -> Iterator[BinaryIO]:
    """The regular file at `path`, open for reading (never a FIFO or device, which would
    block or never end); errors as one line."""
    try:
        with open(path, "rb", opener=lambda p, flags: os.open(p, flags | os.O_NONBLOCK)) as f:
            if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
                raise BundleError(f"{path} is not a regular file")
            yield f
    except OSError as exc:
        if isinstance(exc, FileNotFoundError) and not path.is_symlink():
            raise BundleError(f"{path} does not exist") from None
        raise BundleError(f"cannot read {path}: {exc.strerror}") from None  # a link to none
