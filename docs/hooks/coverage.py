"""MkDocs hook: the families guide shows the coverage table as the last measurement left it.

scripts/coverage_table.py measures every architecture and writes
benchmarks/results/coverage.json; the guide holds the marker below, and every build replaces
it with the table drawn from that file (nothing is imported or run). The script prints the
same table through `table`.
"""
from __future__ import annotations

import json
from pathlib import Path

MARKER = "<!-- coverage -->"
RESULT = Path(__file__).resolve().parents[2] / "benchmarks" / "results" / "coverage.json"


def _cell(row: dict) -> tuple[str, str]:
    """(before, now) of one architecture, each a few words."""
    before = "exports" if row.get("before") == "exports" else "refused"
    if row["status"] == "refused":
        return before, f"refused: {row['reason']}"
    return before, row["status"]


def table(result: dict) -> str:
    """The Markdown table of a coverage result, with the machine and date it was measured."""
    lines = [(f"Measured {result['date']} on {result['machine']} "
             f"({', '.join(f'{k} {v}' for k, v in result['versions'].items())})."), "",
             ("| architecture | framework | before | now | road | exporter | ONNX vs the "
             "framework's forward | source rows |"),
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for row in result["rows"]:
        before, now = _cell(row)
        error = f"{row['onnx_vs_framework']:.1e}" if "onnx_vs_framework" in row else "-"
        lines.append(f"| `{row['name']}` | {row['framework']} | {before} | {now} | "
                     f"{row.get('road', '-')} | {row.get('exporter', '-')} | {error} | "
                     f"{row.get('source') or '-'} |")
    return "\n".join(lines)


def on_page_markdown(markdown: str, page, config, files) -> str:
    if MARKER not in markdown:
        return markdown
    return markdown.replace(MARKER, table(json.loads(RESULT.read_text())))
