"""MkDocs hook: the Architecture page shows the package's layout as the test holds it.

tests/test_layers.py keeps LAYOUT, the modules bottom-up, and fails when an import points up
or a module is missing from it. docs/concepts/architecture.md holds the marker below; every
build replaces it with LAYOUT, read from the test file's source (nothing is imported or run).
"""
from __future__ import annotations

import ast
from pathlib import Path

MARKER = "<!-- layout -->"
TEST = Path(__file__).resolve().parents[2] / "tests" / "test_layers.py"


def layout() -> str:
    """LAYOUT's text, as tests/test_layers.py assigns it."""
    for node in ast.parse(TEST.read_text()).body:
        if (isinstance(node, ast.Assign) and len(node.targets) == 1
                and isinstance(node.targets[0], ast.Name) and node.targets[0].id == "LAYOUT"):
            return ast.literal_eval(node.value)
    raise ValueError(f"{TEST} assigns no LAYOUT")


def on_page_markdown(markdown: str, page, config, files) -> str:
    if MARKER not in markdown:
        return markdown
    return markdown.replace(MARKER, "```text\n" + layout().rstrip() + "\n```")
