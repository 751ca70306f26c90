"""The command group, how errors become one line and an exit code, and the checks every
command shares (outputs writable and not overwriting inputs, batches that fit in memory)."""
from __future__ import annotations

import logging
import os
import signal
import sys
import threading
from pathlib import Path
from typing import Any, Optional

import click

from .. import __version__
from ..errors import (
    OptionError,
    Signalled,
    VitExportError,
    for_cli,
    raise_interrupted,
    raise_signalled,
    shown,
    signal_behind,
    signals_kept,
)
from ..exporting.variants import VARIANTS

VARIANT_NAMES = tuple(v for v in VARIANTS if v != "static")  # static needs images


def examples(*lines: str) -> str:
    """A command's --help epilog: example command lines, printed as written (click's \\b)."""
    return "\b\nExamples:\n" + "\n".join(f"  {line}" for line in lines)


def signal_number(exc: BaseException) -> Optional[int]:
    """The number of the signal that stopped us, where `exc` is (or was caused by) one."""
    stop = signal_behind(exc)
    if stop is None:
        return None
    return signal.SIGINT if isinstance(stop, KeyboardInterrupt) else stop.signum


def command_flags(command: Optional[click.Command]) -> dict[str, str]:
    """Each parameter of `command` by its keyword -> the flag that sets it (click's own
    table): what an error's `param()` marks are shown as (`fp16_io` -> `--fp16-io`)."""
    flags: dict[str, str] = {}
    for p in getattr(command, "params", ()):
        if isinstance(p, click.Option) and p.name:
            flags[p.name] = next((o for o in p.opts if o.startswith("--")), p.opts[0])
    return flags


def message(exc: VitExportError) -> str:
    """A library error's line as the running command's user reads it: its parameters as
    that command's flags."""
    ctx = click.get_current_context(silent=True)
    return exc.cli_message(command_flags(ctx.command if ctx else None))


def note(text: str) -> str:
    """A library's note as the running command's user reads it (`note: ...`): its
    parameters as that command's flags (an `errors.Note`), any text from a bundle escaped."""
    ctx = click.get_current_context(silent=True)
    marked = getattr(text, "marked", str(text))
    return "note: " + shown(for_cli(marked, command_flags(ctx.command if ctx else None)))


def _error(message: str) -> None:
    """One line on stderr, whatever the message holds (a file name with a newline, say)."""
    click.echo("Error: " + shown(message), err=True)


def _signals_unprinted(previous):
    """sys.unraisablehook while a command runs: a signal's exception raised where Python
    cannot raise it (a weakref callback, a __del__) is noted by our handler and raised by
    `signals_kept`, so Python's "Exception ignored" report of it is not printed beside the
    one line; anything else goes to the hook before."""

    def hook(unraisable) -> None:
        if isinstance(unraisable.exc_value, (KeyboardInterrupt, Signalled)):
            logging.getLogger(__name__).debug("a signal arrived in %r, which cannot raise it: "
                                              "raised where the step ends",
                                              unraisable.object)
            return
        previous(unraisable)

    return hook


class _Group(click.Group):
    """Turns the library's errors, OS errors and signals into one line on stderr and an exit
    code: 1 for a failed check or bad input, 128 + the signal's number for a signal, also
    where a library lost the signal or reported it as an error of its own."""

    def invoke(self, ctx: click.Context) -> Any:
        main_thread = threading.current_thread() is threading.main_thread()
        previous = signal.signal(signal.SIGTERM, raise_signalled) if main_thread else None
        # Ctrl-C as Python raises it, noted too (unless ignored, as under nohup)
        ours = main_thread and signal.getsignal(signal.SIGINT) is signal.default_int_handler
        if ours:
            signal.signal(signal.SIGINT, raise_interrupted)
        unraisable = sys.unraisablehook
        if main_thread:
            sys.unraisablehook = _signals_unprinted(unraisable)
        try:
            with signals_kept():
                return super().invoke(ctx)
        except click.UsageError as exc:  # one line, like every other error; exit 2
            _error(exc.format_message())
            ctx.exit(2)
        except OptionError as exc:  # options that do not go together: a usage error
            _error(exc.cli_message(self._flags(ctx)))
            ctx.exit(2)
        except VitExportError as exc:
            _error(exc.cli_message(self._flags(ctx)))
            ctx.exit(1)
        except BrokenPipeError:  # the reader left (`| head`): quiet, as a tool killed by
            # SIGPIPE is; stdout to /dev/null, so the exit's own flush has nowhere to fail
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            ctx.exit(128 + signal.SIGPIPE)
        except OSError as exc:  # a file we could not read or write: permissions, disk, ...
            where = f": {exc.filename}" if exc.filename else ""
            _error(f"{exc.strerror or exc}{where}")
            ctx.exit(1)
        except BaseException as exc:  # a signal, maybe wrapped by a C extension it stopped
            signum = signal_number(exc)
            if signum is None:
                raise
            _error(f"{'interrupted' if signum == signal.SIGINT else 'stopped'} by "
                   f"{signal.Signals(signum).name}; nothing half-written was left")
            ctx.exit(128 + signum)
        finally:
            if main_thread:
                signal.signal(signal.SIGTERM, previous)
                sys.unraisablehook = unraisable
            if ours:
                signal.signal(signal.SIGINT, signal.default_int_handler)

    def _flags(self, ctx: click.Context) -> dict[str, str]:
        """The flags of the command that ran, by keyword."""
        return command_flags(self.commands.get(ctx.invoked_subcommand or ""))


def check_writable(path: Path) -> None:
    """`path` can take the output: a device or FIFO (written through) can be opened for
    writing, or else a file can be made in the folder of what it names, a symlink followed
    (tried for real: permission bits lie to root). A folder is refused."""
    import tempfile

    from .. import bundle as B

    try:
        target, write_through = B.output_target(Path(os.path.abspath(path)))
    except VitExportError as exc:
        raise click.UsageError(message(exc)) from None
    if write_through:
        if not os.access(target, os.W_OK):
            raise click.UsageError(f"cannot write {path}: permission denied")
        return
    folder = target.parent
    if not folder.is_dir():
        raise click.UsageError(f"cannot write {path}: folder {folder} does not exist")
    try:
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".vx-probe-"):
            pass
    except OSError as exc:
        raise click.UsageError(f"cannot write {path}: {exc.strerror}") from None


def refuse_overwriting(outputs: dict[str, Optional[Path]], inputs: list[Path]) -> None:
    """Before any work: no output path may be, or lie inside, a path the command reads, nor
    contain one, and no two outputs may be the same file (`bundle.refuse_overwriting`)."""
    from .. import bundle as B

    try:
        B.refuse_overwriting(outputs, inputs)
    except OptionError as exc:
        raise click.UsageError(message(exc)) from None


# Triton's model_config.proto types: max_batch_size and an instance group's count are int32
# (deploy.INT32_MAX), max_queue_delay_microseconds uint64; a larger value is written, then
# Triton rejects it
UINT64_MAX = 2 ** 64 - 1


def check_outputs(outputs: dict[str, Optional[Path]], inputs: list[Path]) -> None:
    """The files a command will write, before minutes of work: none overwrites what it
    reads or another output (`refuse_overwriting`), and each can be written."""
    refuse_overwriting(outputs, inputs)
    for out in outputs.values():
        if out is not None:
            check_writable(out)


def refuse_huge_batches(config, batch_sizes, name: str = "batch_sizes") -> None:
    """A batch whose forward pass would not fit in memory: a usage error, before any work
    (`api.check_memory`, the parameter shown as this command's flag)."""
    from ..api import check_memory

    try:
        check_memory(config, batch_sizes, name)
    except OptionError as exc:
        raise click.UsageError(message(exc)) from None


def parse_overrides(ctx, param, values: tuple[str, ...]) -> dict[str, str]:
    result = {}
    for item in values:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise click.BadParameter(f"expected KEY=VALUE, got {item!r}", ctx, param)
        result[key.strip()] = value.strip()
    return result


def require_runtimes(names) -> None:
    """--runtimes (or --openvino) naming a runtime whose extra is not installed: one line
    before any work, saying how to install it."""
    from ..runtime import check_runtimes

    missing = check_runtimes(names)
    if missing:
        name, how = next(iter(missing.items()))
        raise VitExportError(f"--runtimes {name}: it is not installed; {how}")


def renamed(new: str, what: str):
    """A click callback for a flag that was renamed: its use is a usage error naming the
    new one."""
    def refuse(ctx, param, value):
        if value is not None:
            raise click.UsageError(f"{param.opts[0]} is now {new} ({what})")
    return refuse


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="vit-export")
@click.option("--verbose", is_flag=True, help="Log what the libraries underneath say "
              "(exporter and optimizer messages, warnings) on stderr.")
@click.pass_context
def cli(ctx: click.Context, verbose: bool) -> None:
    """Export Vision Transformers to TorchScript and ONNX, run them, and prove parity."""
    from ..runtime import ort_log_level

    # The application decides what is logged: without --verbose nothing, so third-party
    # warnings never mix into our one-line errors; with it, everything at debug level.
    # Python warnings (Pillow's DecompressionBombWarning, numpy's ComplexWarning, torch's
    # UserWarnings) go through logging too, and ONNX Runtime's own C++ log (coloured lines on
    # stderr) is off unless --verbose: its errors reach the user as our one line.
    handler: logging.Handler = logging.NullHandler()
    root = logging.getLogger()
    saved = root.level
    if verbose:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(name)s: %(message)s"))
        root.setLevel(logging.DEBUG)
    root.addHandler(handler)
    logging.captureWarnings(True)
    if ctx.invoked_subcommand not in ("presets", "quick-test"):
        ort_log_level(0 if verbose else 4)

    def restore() -> None:
        logging.captureWarnings(False)
        root.removeHandler(handler)
        root.setLevel(saved)

    ctx.call_on_close(restore)




OWN_PROCESS: list = []  # not empty when `main` runs: the command owns the process


def main() -> None:
    OWN_PROCESS.append(True)
    try:
        cli(prog_name="vit-export")
    except SystemExit as exc:
        session = sys.modules.get("vit_export.deploy.ray.session")  # loaded: Ray may have run
        if session is not None and session.driver_ran():  # Ray's C++ exit handler can
            session.exit_process(exc.code)  # crash: the Ray wing leaves without it
        raise
