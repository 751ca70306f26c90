"""The pictures on the documentation site, drawn when it is built from the result files
kept in benchmarks/results/ (docs/hooks/charts.py, docs/hooks/coverage.py): each chart's file
exists and draws, the table beside a chart is that file's figures, and a missing file fails
the build. Not in the unit tier: drawing loads matplotlib, and the per-stage chart is the
library's own (vit_export.render), which loads torch."""
from __future__ import annotations

import re

import pytest
from test_docs import DOCS, ROOT, hook


def test_the_families_guide_shows_every_architecture_the_coverage_script_measures():
    """The table is drawn from benchmarks/results/coverage.json at build time: a row for each
    architecture the script lists, each one as the file records it."""
    import json

    coverage = hook("coverage")
    assert coverage.MARKER in (DOCS / "guides" / "families.md").read_text()
    result = json.loads(coverage.RESULT.read_text())
    script = (ROOT / "scripts" / "coverage_table.py").read_text()
    listed = set(re.findall(r'"((?:[a-z0-9_]+\.)?[a-z0-9_]+)": dict\(', script)) | set(
        re.findall(r'"([A-Za-z0-9]+(?:Model|ForImageClassification))": \("', script))
    measured = {row["name"] for row in result["rows"]}
    assert listed and listed <= measured, sorted(listed - measured)
    page = coverage.on_page_markdown(coverage.MARKER, None, None, None)
    for row in result["rows"]:
        line = next(x for x in page.splitlines() if x.startswith(f"| `{row['name']}` |"))
        if "onnx_vs_framework" in row:
            assert f"| {row['onnx_vs_framework']:.1e} |" in line
        assert (row["status"] if row["status"] != "refused" else row["reason"]) in line
    assert result["date"] in page and result["machine"] in page


def test_every_chart_is_drawn_from_a_result_file_and_its_table_is_that_file():
    """Each chart marker names a result file that exists; the chart draws, and the table
    under a bench chart holds that file's figures, row by row."""
    import json

    charts = hook("charts")
    asked = [(page, kind, path) for page in DOCS.rglob("*.md")
             for kind, path, _ in charts.charts(page.read_text())]
    assert {kind for _, kind, _ in asked} == {"bench", "accuracy", "coverage", "export",
                                              "layers", "scaling"}, asked
    for page, kind, path in asked:
        assert (ROOT / path).is_file(), f"{page} draws {path}, which is missing"
        assert charts.draw(kind, path).startswith(b"<?xml")
        result = json.loads((ROOT / path).read_text())
        shown = charts.replaced(f"<!-- chart: {kind} {path} -->", 0)
        if kind == "bench":
            for row in charts.bench_rows(result):
                assert (f"| {row['backend']} | {row.get('precision', '')} | {row['batch']} | "
                        f"{row['p50_ms']:.1f} ms | {row['images_per_s']:.1f} | "
                        f"{row['speedup']:.2f}x |") in shown
        if kind == "bench":
            for name, peak in result["peaks"].items():
                if peak.get("gflops"):
                    assert f"{name} {peak['gflops']:.0f} " in shown and peak["kernel"] in shown
        if kind == "export":
            for row in result["rows"]:
                assert (f"| {row['model']} | {row['tool']} | {row['wall_s']:.1f} | "
                        f"{row['cpu_s']:.1f} | {row['peak_rss_mb']:.0f} | "
                        f"{row['folder_mb']:.1f} |") in shown
                for step in row.get("steps", []):
                    assert (f"| {row['model']} | {row['tool']} | {step['step']} | "
                            f"{step['s']:.1f} |") in shown
            ours = [r for r in result["rows"] if r["tool"] == "vit-export"]
            assert ours and all(r.get("steps") for r in ours), f"{path}: no steps recorded"
        if kind == "scaling":
            assert [r["nodes"] for r in result["results"]] == [1, 2, 3], path
            for r in result["results"]:
                assert (f"| {r['nodes']} | {r['cpus_per_node']:g} | {r['images_per_s']:.1f} |"
                        in shown)
        if kind == "accuracy":
            assert result["accuracy"], f"{path} holds no top-1 accuracy"
            for name, found in result["accuracy"].items():
                assert (f"| {found['images']} | {found['accuracy']:.2%} | "
                        f"{found['eager_accuracy']:.2%} | {found['drop']:.2f} |") in shown, name


def test_a_chart_whose_result_file_is_missing_fails_the_build(tmp_path):
    charts = hook("charts")
    with pytest.raises(FileNotFoundError):
        charts.replaced("<!-- chart: bench benchmarks/results/none-2026-01-01/bench.json -->", 0)


def test_a_record_is_shown_as_its_run_wrote_it():
    """A benchmark's Markdown table goes in as the file holds it; a console log's N-th
    command with what it printed, up to the next command and without per-stage rows."""
    charts = hook("charts")
    table = "benchmarks/results/zen4-2026-11-23/cpu_peers_aoti.md"
    shown = charts.replaced(f"<!-- record: {table} -->", 0)
    assert (ROOT / table).read_text().strip() in shown and "zen4, 2026-11-23" in shown
    log = "benchmarks/results/h100-2026-11-23/validate.log"
    shown = charts.replaced(f"<!-- record: {log}:2 -->", 0)
    lines = (ROOT / log).read_text().splitlines()
    second = [i for i, line in enumerate(lines) if line.startswith("$ ")][1]
    assert shown.startswith(f"```console\n{lines[second]}\n")
    assert "--batch-sizes 1,3,7,64" in shown and "stage " not in shown
    assert "onnxruntime[model.opt.onnx]  fp32       64" in shown
    with pytest.raises(ValueError, match="holds 4 commands, not a command 9"):
        charts.replaced(f"<!-- record: {log}:9 -->", 0)
    with pytest.raises(FileNotFoundError):
        charts.replaced("<!-- record: benchmarks/results/none-2026-01-01/run.md -->", 0)


def test_the_benchmarks_page_pastes_no_figures_by_hand():
    """Its only table in the source is the list of machines: every table of figures is put
    there by a marker, from a result file that exists."""
    charts = hook("charts")
    page = (DOCS / "benchmarks.md").read_text()
    rows = [line for line in page.splitlines() if line.startswith("|")]
    machines = [line for line in rows if re.match(r"\| (name|---|zen\d|h100) ", line)]
    assert rows == machines, sorted(set(rows) - set(machines))
    records = charts.RECORD.findall(page)
    assert records and len(charts.charts(page)) >= 4
    for path, _ in records:
        assert (ROOT / path).is_file(), path
