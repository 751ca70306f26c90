"""The errors this package raises. The CLI maps every one of them to exit code 1, but
`OptionError` (options that do not go together), a usage error: 2.

A message states the fact. Where it also says which parameter to use, it names the
parameter once, by its keyword, through `param()`: the front door's functions (`vit_export.
export(..., fp16_io=True)`) and the CLI's commands (`--fp16-io`) share one vocabulary, so a
Python caller reads the keyword argument and the CLI's user the flag click's own table
gives for that keyword, from the one message."""
import math
import numbers
import re
import signal
from collections.abc import Iterator, Mapping
from contextlib import contextmanager

_OPEN, _SEP, _CLOSE = "\ue000", "\ue001", "\ue002"  # private-use marks: never printable
_PARAM = re.compile(f"{_OPEN}([^{_SEP}{_CLOSE}]*){_SEP}([^{_SEP}{_CLOSE}]*){_SEP}"
                    f"([^{_CLOSE}]*){_CLOSE}")
_BARE = object()
_EACH = "\ue003"  # between a mapping's KEY=VALUE pairs: the flag is repeated for each


def param(name: str, value: object = _BARE) -> str:
    """The parameter `name` (a keyword of the front door, and the name of the CLI option
    that sets it), with `value` if given, inside a message: `str(error)` shows it as a
    keyword argument (`provider='cpu'`, `pt2=True`, `fp16_io`), `cli_message()` as the flag
    (`--provider cpu`, `--pt2`, `--fp16-io`). A mapping value is --set's KEY=VALUE pairs."""
    if value is _BARE:
        python, cli = name, ""
    elif value is True:
        python, cli = f"{name}=True", ""
    elif isinstance(value, Mapping):
        python = f"{name}={dict(value)!r}"
        cli = _EACH.join(f"{k}={v}" for k, v in value.items())  # the flag once each
    else:
        python, cli = f"{name}={value!r}", str(value) or "''"
    return f"{_OPEN}{name}{_SEP}{python}{_SEP}{cli}{_CLOSE}"


def flag_of(name: str) -> str:
    """The flag a keyword is spelled as where a command's table does not name it."""
    return "--" + name.replace("_", "-")


def for_python(message: str) -> str:
    """`message` with each param() in it as the keyword argument."""
    return _PARAM.sub(lambda m: m.group(2), message)


def for_cli(message: str, flags: Mapping[str, str] = {}) -> str:
    """`message` with each param() in it as the CLI's flag: `flags` maps a keyword to its
    flag (click's parameter table of the command that runs), else `flag_of`."""
    def shown(m: re.Match) -> str:
        flag = flags.get(m.group(1)) or flag_of(m.group(1))
        return " ".join(f"{flag} {value}" if value else flag
                        for value in m.group(3).split(_EACH))

    return _PARAM.sub(shown, message)


class Note(str):
    """A note that names parameters (`param()`): as a str it reads as Python spells them;
    `cli(flags)` is the same note with the flags of the command that runs."""

    def __new__(cls, text: str) -> "Note":
        note = super().__new__(cls, for_python(text))
        note.marked = text
        return note

    def cli(self, flags: Mapping[str, str] = {}) -> str:
        return for_cli(self.marked, flags)


class VitExportError(Exception):
    """Base class: a check failed or an input was bad. The message is one line for the user.
    str() speaks to a Python caller; `cli_message(flags)` is the same line with the flags a
    command's user types (`param()`). A message that quotes another error quotes
    `exc.args[0]` (or `raw(exc)`) so that both spellings survive."""

    def __str__(self) -> str:
        return for_python(super().__str__())

    def cli_message(self, flags: Mapping[str, str] = {}) -> str:
        return for_cli(super().__str__(), flags)


def raw(exc: BaseException) -> str:
    """The message of `exc` with its option marks kept: what a message quoting it embeds."""
    if isinstance(exc, VitExportError) and exc.args and isinstance(exc.args[0], str):
        return exc.args[0]
    return str(exc)


class ConfigError(VitExportError, ValueError):
    """A model configuration that cannot describe a ViT (bad sizes, unknown field or preset)."""


class BundleError(VitExportError):
    """A bundle or model file that is missing, truncated, or not what it claims to be."""


class FrameworkMissing(BundleError):
    """A framework-road bundle's eager model is its framework's module, and this machine
    does not have that framework."""


class ExportError(VitExportError):
    """Tracing or exporting failed, or the exported graph is not what we promise."""


class ProviderError(VitExportError):
    """An ONNX Runtime provider was asked for and is not the one that runs."""


class OptionError(VitExportError, ValueError):
    """Options that cannot go together (an options object refused when made): the CLI
    reports it as it reports its own usage errors, exit code 2."""


def within(name: str, value: object, low: float, high: float = math.inf,
           whole: bool = False, error: type = OptionError) -> None:
    """`error` (an OptionError) naming the parameter `name` unless `value` is a number in
    [low, high], an integer where `whole`: the front door holds a keyword to the range the
    command's flag holds it to (NaN and the infinities are no numbers here; True is no 1)."""
    kind = numbers.Integral if whole else numbers.Real
    if isinstance(value, kind) and not isinstance(value, bool) and \
            (isinstance(value, numbers.Integral) or math.isfinite(value)) and \
            low <= value <= high:
        return
    what = "an integer" if whole else "a finite number"
    shown = [f"{b:g}" if isinstance(b, float) else str(b) for b in (low, high)]
    bounds = f">= {shown[0]}" if high == math.inf else f"in [{shown[0]}, {shown[1]}]"
    raise error(f"{param(name, value)} is not {what} {bounds}")


class ParityError(VitExportError):
    """An exported artifact does not compute what eager PyTorch computes."""

    def __init__(self, message: str, report=None):
        super().__init__(message)
        self.report = report  # the ParityReport that failed, when there is one


class SavedRunError(VitExportError):
    """A saved run (validate --save-outputs) that cannot be read, or two that cannot be judged
    against each other: runs of different bundles, or on different inputs."""


class InputError(VitExportError):
    """An input for inference (image, array) that cannot be read or does not fit the model."""


class RunError(VitExportError):
    """A model that failed while it ran: the runtime's own error, in one line."""


class CheckpointError(VitExportError):
    """A foreign checkpoint that cannot be read or mapped onto our model."""


class HubError(VitExportError):
    """A model named on the Hugging Face Hub that cannot be fetched or is refused."""


class NotJSONError(VitExportError, ValueError):
    """A value that JSON cannot hold (NaN, an infinity) on its way into a JSON file or output."""


class Signalled(BaseException):
    """SIGTERM as an exception: like Ctrl-C, it unwinds the stack, so every `finally` and
    staged write cleans up. A BaseException, so no `except Exception` swallows it."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


received: list[int] = []  # the signals our handlers were called for, in this process


def raise_signalled(signum, frame) -> None:
    """The CLI's SIGTERM handler: the signal as Signalled, and noted in `received`. Python
    prints and drops an exception raised where nothing can take it ("Exception ignored":
    a __del__, a fork hook), so a loop that only waits for a signal checks `received` too."""
    received.append(signum)
    raise Signalled(signum)


def raise_interrupted(signum, frame) -> None:
    """The CLI's SIGINT handler: KeyboardInterrupt, as Python's own handler raises, and
    noted in `received` as raise_signalled notes SIGTERM, for the same reason."""
    received.append(signum)
    raise KeyboardInterrupt


def signal_exception(signum: int) -> BaseException:
    """The exception a signal is, as our handlers raise it: KeyboardInterrupt for SIGINT,
    Signalled for any other."""
    return KeyboardInterrupt() if signum == signal.SIGINT else Signalled(signum)


_kept: list[int] = []  # where `received` stood as each signals_kept block began


@contextmanager
def signals_kept() -> Iterator[None]:
    """A signal our handlers noted while the block ran stops it, whatever the code inside
    made of it. A library can lose the exception a handler raised: torch's argument parser
    turned one raised in its Python callback into a TypeError, which torch.onnx's exporter
    reported as its own failure ("Next steps: ..."); Python drops one raised in a weakref
    callback or a __del__ ("Exception ignored"), and the work goes on. Here the first signal
    noted is raised in place of any error that came out of the block (an exit stays an
    exit), or as the block ends where it came out of none. A signal that came out as
    itself, or wrapped as `signal_behind` finds it, is left as it is."""
    before = len(received)
    _kept.append(before)
    try:
        yield
    except BaseException as exc:
        if len(received) > before and not isinstance(exc, SystemExit) \
                and signal_behind(exc) is None:
            raise signal_exception(received[before]) from exc
        raise
    finally:
        _kept.remove(before)
    if len(received) > before:
        raise signal_exception(received[before])


def raise_noted() -> None:
    """The first signal our handlers noted since the outermost `signals_kept` block began
    (the CLI's: the command), raised; nothing where none was noted, or outside such a block.
    Called before an output is moved into place: a signal lost inside some library while
    the work ran still keeps the output out."""
    if _kept and len(received) > min(_kept):
        raise signal_exception(received[min(_kept)])


def signal_behind(exc: BaseException):
    """The KeyboardInterrupt or Signalled that `exc` is, or that caused it, or None. A signal
    handler that raises inside a C extension can come back wrapped: Ray's ray.get, waiting
    in C++, returned a SystemError ("returned a result with an exception set") whose cause
    was our Signalled."""
    if isinstance(exc, (KeyboardInterrupt, Signalled)):
        return exc
    if isinstance(exc, SystemError):  # only this wrapping: an exit raised while a signal
        inner = exc.__cause__ or exc.__context__  # was handled is that exit, not the signal
        return inner if isinstance(inner, (KeyboardInterrupt, Signalled)) else None
    return None


def first_line(exc: BaseException, empty: str = "") -> str:
    """The first line of a third-party exception's message (its C++ or Ray report follows),
    or, when it says nothing, `empty` or else its type's name: what our one-line errors
    quote. The one helper for this: never split a message by hand (an empty one has no
    first line)."""
    return (str(exc).strip().splitlines() or [empty or type(exc).__name__])[0]


def shown(text: object) -> str:
    """`text` as one printable line: every character that is not printable (a line break, an
    escape code that would drive a terminal, a NUL) as its Python escape. Text that came from
    a file (a bundle's names, runner names, sources; a file name) is printed through this,
    so it can neither forge an output line nor drive the terminal."""
    text = str(text)
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)
