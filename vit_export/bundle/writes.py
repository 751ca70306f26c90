"""Atomic writes: every file through a temporary name in the same folder and a rename, and a
bundle folder staged beside its destination and moved into place only when complete, so a
failed write leaves nothing half-written behind."""
from __future__ import annotations

import hashlib
import os
import shutil
import stat
import tempfile
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Optional

from .. import jsonio
from ..errors import BundleError, OptionError, param, raise_noted
from .names import CONFIG_FILE


def sha256_file(path: Path, chunk: int = 1 << 20) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def output_target(path: str | os.PathLike) -> tuple[Path, bool]:
    """Where an output named `path` goes, and whether it is written through rather than
    replaced: (target, write_through). A new path or a regular file is the target itself,
    replaced atomically. A symlink is followed, never replaced (the link stays; what it points
    to is written by these rules). A character device or a FIFO (/dev/null, /dev/stdout, a
    pipe) is written through, as a shell redirection would: renaming a file over it would
    destroy the node. A folder or any other kind of file is refused."""
    path = Path(path)
    try:
        target = path.resolve() if path.is_symlink() else path
        mode = target.stat().st_mode if target.exists() else None
    except (OSError, RuntimeError) as exc:  # RuntimeError: a symlink loop (Python < 3.13)
        raise BundleError(f"cannot write {path}: {getattr(exc, 'strerror', None) or exc}") \
            from None
    if mode is None or stat.S_ISREG(mode):
        return target, False
    if stat.S_ISCHR(mode) or stat.S_ISFIFO(mode):
        return target, True
    kind = "a folder" if stat.S_ISDIR(mode) else "not a regular file, device or FIFO"
    raise BundleError(f"cannot write {path}: it is {kind}")


def _resolved(path: str | os.PathLike, shown: str) -> Path:
    """The absolute path with every symlink resolved; a loop is a usage error, one line
    (`shown`: the path as the message names it)."""
    try:  # not abspath first: it would drop a "link/.." before the link is followed
        return Path(path).resolve()
    except (RuntimeError, OSError) as exc:  # RuntimeError: "Symlink loop" (Python < 3.13)
        raise OptionError(f"{shown}: {getattr(exc, 'strerror', None) or exc}") from None


def refuse_overwriting(outputs: Mapping[str, Optional[str | os.PathLike]],
                       inputs: Iterable[str | os.PathLike],
                       shown: Callable[[str, Any], str] = lambda name, out: f"{name} {out}"
                       ) -> None:
    """Before any work, OptionError where an output is, lies inside or holds a path the
    command reads (an export into the checkpoint's folder would replace the checkpoint), or
    where two outputs are one file. `outputs` maps each output's name to its path (None:
    not written); `shown(name, path)` is how a message names it (a command's argument, or
    `param()` of a keyword)."""
    reads = [(source, read) for source in inputs for read in _read_paths(source)]
    seen: dict[Path, str] = {}
    for name, out in outputs.items():
        if out is None:
            continue
        target = _resolved(out, shown(name, out))
        if target in seen and not (target.exists() and not target.is_file()
                                   and not target.is_dir()):  # two reports to /dev/null: fine
            raise OptionError(f"{name} and {seen[target]} name the same file {out}")
        seen[target] = name
        for source, read in reads:
            if target == read or read in target.parents or target in read.parents:
                raise OptionError(f"{shown(name, out)} would overwrite {source}, which this "
                                  f"command reads")


def _read_paths(source: str | os.PathLike) -> list[Path]:
    """What reading `source` reads: the path, and for a bundle (a folder with config.json)
    the file each of its symlinks points to, which may lie elsewhere. A link that leads
    nowhere is its reader's to report, not a reason to refuse the output."""
    read = _resolved(source, f"input {source}")
    found = [read]
    try:
        links = [e for e in read.iterdir() if e.is_symlink()] \
            if (read / CONFIG_FILE).is_file() else []
    except OSError:  # a folder that cannot be listed: its reader says so
        links = []
    for link in links:
        try:
            found.append(link.resolve(strict=True))
        except (RuntimeError, OSError):  # a loop, or nothing there
            continue
    return found


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
    atomic_write_chunks(path, [data])


def atomic_write_chunks(path: str | os.PathLike, chunks: Iterable) -> None:
    """Write to a temporary file beside `path`, then rename over it. Every byte goes through
    Python's own file I/O, so a full disk is an OSError ("No space left on device") and the
    temporary file is removed; the old file, if any, stays as it was. What `path` is decides
    first (`output_target`): a symlink is followed, a device or FIFO written through."""
    path, write_through = output_target(path)
    if write_through:
        with open(path, "wb") as f:
            f.writelines(chunks)
        return
    if path.parent and not path.parent.is_dir():
        raise BundleError(f"folder {path.parent} does not exist")
    try:
        fd, tmp = tempfile.mkstemp(prefix=".vx-", suffix=".tmp", dir=path.parent)
    except OSError as exc:
        raise BundleError(f"cannot write {path}: {exc.strerror}") from None
    try:
        with os.fdopen(fd, "wb") as f:
            f.writelines(chunks)  # bytes-like objects, written one after another
            f.flush()
            os.fsync(f.fileno())
        _make_shareable(Path(tmp))
        raise_noted()  # a signal some library lost while the work ran: the old file stays
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_json(path: str | os.PathLike, data: Any) -> None:
    """`data` as JSON (jsonio's one format: NaN refused before anything is written)."""
    atomic_write_text(path, jsonio.dumps(data, what=str(path)))


def _make_shareable(path: Path) -> None:
    """Permissions as a plain file write would give (0666 less umask): mkstemp, safetensors
    and ONNX's external data writer make files 0600, and a bundle is for sharing."""
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(path, 0o666 & ~umask)


def _remove(path: Path) -> None:
    """Remove a file, a symlink (not what it points to) or a folder tree."""
    if path.is_symlink() or path.is_file():
        path.unlink(missing_ok=True)
    elif path.exists():
        shutil.rmtree(path, ignore_errors=True)


@contextmanager
def staged_folder(out_dir: str | os.PathLike, force: bool = False) -> Iterator[Path]:
    """Yield an empty staging folder beside `out_dir`; on success it becomes `out_dir`.

    An existing `out_dir` is replaced only with `force`, and only after the new one is
    complete; a symlink at `out_dir` is replaced, never what it points to. On any error (a
    signal too, once the CLI has turned it into an exception, and one a library lost while
    the command ran: `errors.raise_noted`) the staging folder and any
    parent folders made for it are removed, and `out_dir` is left as it was. The staging
    name is short, so a legal `out_dir` name never becomes too long to stage.
    """
    out_dir = Path(out_dir)
    if (out_dir.exists() or out_dir.is_symlink()) and not force:
        raise BundleError(f"{out_dir} already exists; use {param('force')} to replace it")
    if out_dir.exists() and not out_dir.is_dir():
        raise BundleError(f"{out_dir} exists and is not a folder")
    parent = Path(os.path.abspath(out_dir)).parent
    made = [p for p in [parent, *parent.parents] if not p.exists()]
    try:
        parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        _remove_made(made)
        raise BundleError(f"cannot create {parent}: {exc.strerror}") from None
    tag = uuid.uuid4().hex[:12]
    staging = parent / f".vx-partial-{tag}"
    try:
        try:
            staging.mkdir()
        except OSError as exc:
            raise BundleError(f"cannot write in {parent}: {exc.strerror}") from None
        yield staging
        raise_noted()  # a signal some library lost while the work ran: nothing moves in
        for file in staging.iterdir():
            if file.is_file():
                _make_shareable(file)
        if out_dir.exists() or out_dir.is_symlink():
            if not force:  # made while the work ran (another export, a user): kept
                raise BundleError(f"{out_dir} was made while this ran; use {param('force')} "
                                  f"to replace it")
            old = parent / f".vx-old-{tag}"
            os.rename(out_dir, old)
            try:
                os.rename(staging, out_dir)
            except BaseException:
                os.rename(old, out_dir)  # put the old bundle back
                raise
            _remove(old)
        else:
            os.rename(staging, out_dir)
    except BaseException:
        _remove(staging)
        _remove_made(made)
        raise


def _remove_made(made: list[Path]) -> None:
    """Remove the parent folders a failed write created (innermost first), if still empty."""
    for folder in made:
        try:
            folder.rmdir()
        except OSError:
            break
