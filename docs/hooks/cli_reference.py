"""MkDocs hook: the CLI reference, made from each command's own --help.

docs/reference/cli.md holds the marker below; every build replaces it with one section per
command of `vit-export`, in the order `vit-export --help` lists them, each the exact text
that `vit-export COMMAND --help` prints. Nothing is copied by hand, so the reference cannot
fall behind the command line. tests/test_docs.py checks that every command is in it.
"""
from __future__ import annotations

import click

MARKER = "<!-- cli-reference -->"


def commands() -> list[tuple[str, click.Command]]:
    """Every command of the `vit-export` group, as (name, command), in --help's order."""
    from vit_export.cli import cli

    ctx = click.Context(cli, info_name="vit-export")
    return [(name, cli.get_command(ctx, name)) for name in cli.list_commands(ctx)]


def help_text(name: str | None = None) -> str:
    """What `vit-export [NAME] --help` prints, at 88 columns: the page's code width."""
    from vit_export.cli import cli

    top = click.Context(cli, info_name="vit-export", max_content_width=88, terminal_width=88,
                        **cli.context_settings)
    if name is None:
        return cli.get_help(top)
    command = cli.get_command(top, name)
    ctx = click.Context(command, info_name=name, parent=top, max_content_width=100,
                        terminal_width=100)
    return command.get_help(ctx)


def reference() -> str:
    """The reference as Markdown: the group's --help, then one section per command."""
    parts = ["## vit-export", "", "```text", help_text().rstrip(), "```", ""]
    for name, _ in commands():
        parts += [f"## {name}", "", "```text", help_text(name).rstrip(), "```", ""]
    return "\n".join(parts)


def on_page_markdown(markdown: str, page, config, files) -> str:
    if MARKER not in markdown:
        return markdown
    return markdown.replace(MARKER, reference())
