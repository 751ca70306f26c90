"""The `vit-export` command line: parse, call the library, print, map errors to exit codes.

One module per command or group of commands, each registered on the one group (`cli`) when
imported here; `main` is the console script.

Exit codes: 0 ok; 1 a check failed or an input was bad; 2 usage error.
"""
from . import cmd_bench, cmd_export, cmd_infer, cmd_serve, cmd_validate  # noqa: F401 (commands)
from .app import cli, main

__all__ = ["cli", "main"]
