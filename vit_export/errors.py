"""The errors this package raises. The CLI maps every one of them to exit code 1."""


class VitExportError(Exception):
    """Base class: a check failed or an input was bad. The message is one line for the user."""


class ConfigError(VitExportError, ValueError):
    """A model configuration that cannot describe a ViT (bad sizes, unknown field or preset)."""


class BundleError(VitExportError):
    """A bundle or model file that is missing, truncated, or not what it claims to be."""


class ExportError(VitExportError):
    """Tracing or exporting failed, or the exported graph is not what we promise."""


class ProviderError(VitExportError):
    """An ONNX Runtime provider was asked for and is not the one that runs."""


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


received: list[int] = []  # the signals raise_signalled was called for, in this process


def raise_signalled(signum, frame) -> None:
    """The CLI's SIGTERM handler: the signal as Signalled, and noted in `received`. Python
    prints and drops an exception raised where nothing can take it ("Exception ignored":
    a __del__, a fork hook), so a loop that only waits for a signal checks `received` too."""
    received.append(signum)
    raise Signalled(signum)


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
