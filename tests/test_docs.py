"""The documentation site's generated parts: the CLI reference holds every command as its own
--help prints it, every example a --help gives parses, and the architecture page shows the
layout tests/test_layers.py enforces."""
from __future__ import annotations

import ast
import importlib.util
import re
import runpy
import shlex
from pathlib import Path

import click
import pytest
from test_layers import LAYOUT

from vit_export.cli import cli

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"


def hook(name: str):
    """A module of docs/hooks/, loaded as MkDocs loads it: by its path."""
    path = DOCS / "hooks" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"docs_hook_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


cli_reference = hook("cli_reference")


def missing_from(reference: str) -> list[str]:
    """The commands of `vit-export` whose section, or whose whole --help, `reference` lacks."""
    return [name for name in cli.commands
            if f"\n## {name}\n" not in reference
            or cli_reference.help_text(name).rstrip() not in reference]


def examples(command: click.Command) -> list[list[str]]:
    """The command lines of a command's Examples epilog, continuation lines joined."""
    text = (command.epilog or "").replace("\\\n", " ")
    return [shlex.split(line) for line in text.splitlines()[1:] if line.strip()]


def test_the_cli_reference_is_built_from_every_command():
    config = (ROOT / "mkdocs.yml").read_text()
    assert "docs/hooks/cli_reference.py" in config and "reference/cli.md" in config
    assert cli_reference.MARKER in (DOCS / "reference" / "cli.md").read_text()
    reference = cli_reference.reference()
    assert missing_from(reference) == []
    assert [name for name, _ in cli_reference.commands()] == sorted(cli.commands)
    # every command the command modules define joined the group, so the reference holds it
    defined = {ast.literal_eval(d.args[0]) if d.args else f.name.replace("_", "-")
               for path in (ROOT / "vit_export" / "cli").glob("cmd_*.py")
               for f in ast.walk(ast.parse(path.read_text())) if isinstance(f, ast.FunctionDef)
               for d in f.decorator_list
               if isinstance(d, ast.Call) and ast.unparse(d.func) == "cli.command"}
    assert set(cli.commands) == defined


def test_a_command_left_out_of_the_reference_is_found():
    reference = cli_reference.reference()
    head, rest = reference.split("\n## infer\n", 1)
    without_infer = head + rest[rest.index("\n## "):]
    assert missing_from(without_infer) == ["infer"]


def test_a_new_command_joins_the_reference():
    @click.command("zz-new")
    def zz_new() -> None:
        """Does nothing, for this test."""

    cli.add_command(zz_new)
    try:
        reference = cli_reference.reference()
        assert "\n## zz-new\n" in reference and "Does nothing, for this test." in reference
    finally:
        del cli.commands["zz-new"]


@pytest.mark.parametrize("name", sorted(cli.commands))
def test_every_help_ends_with_examples_that_parse(name):
    command = cli.commands[name]
    assert (command.epilog or "").startswith("\b\nExamples:\n")
    top = click.Context(cli, info_name="vit-export", **cli.context_settings)
    lines = [args for args in examples(command) if args[0] == "vit-export"]
    assert lines, f"{name}: no example runs vit-export"
    for args in lines:
        assert args[1] == name
        command.make_context(name, args[2:], parent=top)  # a wrong flag or value raises
    assert cli_reference.help_text(name).rstrip().endswith(
        "  " + command.epilog.splitlines()[-1])


def test_an_example_with_a_wrong_flag_does_not_parse():
    top = click.Context(cli, info_name="vit-export", **cli.context_settings)
    with pytest.raises(click.NoSuchOption):
        cli.commands["infer"].make_context("infer", ["out/digits", "x.png", "--top_k", "1"],
                                           parent=top)


def test_the_architecture_page_shows_the_layout_the_tests_enforce():
    layout = hook("layout")
    assert layout.MARKER in (DOCS / "concepts" / "architecture.md").read_text()
    assert layout.layout() == LAYOUT
    page = layout.on_page_markdown(layout.MARKER, None, None, None)
    assert page == "```text\n" + LAYOUT.rstrip() + "\n```"


@pytest.mark.slow  # an export of its own, a few seconds
def test_the_readmes_python_example_runs_as_written(tmp_path, monkeypatch, capsys):
    readme = (ROOT / "README.md").read_text()
    code = readme.split("```python\n", 1)[1].split("```", 1)[0]
    monkeypatch.chdir(tmp_path)
    example = tmp_path / "readme_example.py"  # run as a script, as a user pastes it
    example.write_text(code)
    runpy.run_path(str(example), run_name="__main__")
    out = capsys.readouterr().out
    said = re.search(r"# (onnxruntime cpu \(2, 10\))", code).group(1)  # what it says it prints
    assert out.splitlines() == ["True True", said]  # exported (validated), validated again
    assert (tmp_path / "out" / "tiny" / "parity.json").is_file()
