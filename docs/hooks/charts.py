"""MkDocs hook: charts drawn from the recorded runs when the site is built, never pasted.

A page asks for one with a marker on its own line:

    <!-- chart: bench benchmarks/results/zen5-2026-11-28/bench.json -->
    <!-- chart: coverage benchmarks/results/coverage.json -->

`bench` draws a `vit-export bench --report` result (each backend's speed against eager at
each batch size, and the fraction of its precision's peak), `accuracy` the same result's
top-1 drop on labelled images against its speed (a bundle exported with --real-data), `coverage` the families
coverage (scripts/coverage_table.py: each architecture's error against its framework, by
road), `export` an export-cost result (benchmarks/export_cost.py: wall time and folder size
of each exporter on each model), `scaling` a benchmarks/cluster_scaling.py result (images/s
on 1, 2, 3 ... Ray worker nodes), `layers` a `validate --layers --report` result as validate draws it beside a
Markdown report (vit_export.render.layers_chart). The marker becomes the chart (an SVG, shown without scripts), a line naming the
machine, the date and the file, and for `bench` the table of the figures drawn. A bench
result's folder is named MACHINE-YYYY-MM-DD, which gives the date. matplotlib draws them
(the docs extra).

A run whose result is a table, not figures to draw, is shown as it was written:

    <!-- record: benchmarks/results/zen4-2026-11-23/cpu_peers_aoti.md -->
    <!-- record: benchmarks/results/h100-2026-11-23/validate.log:2 -->

A `.md` file (what a benchmark's `--out` writes) goes in as it is; `FILE.log:N` is the N-th
command of a kept console log (`$ command` and what it printed, up to the next command),
without the per-stage rows of `validate --layers`, which the file keeps.
"""
from __future__ import annotations

import io
import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MARKER = re.compile(r"^<!-- chart: (bench|accuracy|coverage|export|layers|scaling) (\S+) -->$",
                    re.MULTILINE)
RECORD = re.compile(r"^<!-- record: (\S+?)(?::(\d+))? -->$", re.MULTILINE)
FOLDER = re.compile(r"(?P<machine>.+)-(?P<date>\d{4}-\d{2}-\d{2})$")


def _svg(fig) -> bytes:
    import matplotlib.pyplot as plt

    out = io.StringIO()
    fig.savefig(out, format="svg")
    plt.close(fig)
    return out.getvalue().encode()


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def where(path: str, result: dict) -> str:
    """The line under a chart: the machine, the date and the result file."""
    folder = FOLDER.match(Path(path).parent.name)
    machine = result.get("cpu_model") if result.get("device") == "cpu" else result.get("gpu")
    if "stages" in result:  # a parity report: where it ran
        machine = f"{result.get('provider_used')}, torch {result['versions'].get('torch')}"
    if result.get("device") == "cpu" and result.get("threads"):
        machine = f"{machine}, {result['threads']} threads"
    machine = machine or result.get("machine") or (folder and folder["machine"]) or "?"
    if isinstance(machine, dict):  # benchmarks/cluster_scaling.py: the CPU and its cores
        machine = f"{machine.get('cpu')}, {machine.get('cores')} cores"
    date = str(result.get("date") or (folder and folder["date"]) or "?")[:10]
    return f"Measured on {machine}, {date}; drawn from `{path}`."


def bench_rows(result: dict) -> list[dict]:
    """The rows a bench chart draws: host input, each backend once per batch size."""
    return [r for r in result["rows"] if r.get("io", "host") == "host"]


def bench_chart(result: dict) -> bytes:
    plt = _pyplot()
    rows = bench_rows(result)
    backends = list(dict.fromkeys(r["backend"] for r in rows))
    batches = sorted({r["batch"] for r in rows})
    fig, (speed, peak) = plt.subplots(1, 2, figsize=(10, 0.45 * len(backends) + 1.6),
                                      sharey=True)
    height = 0.8 / len(batches)
    for i, batch in enumerate(batches):
        found = {r["backend"]: r for r in rows if r["batch"] == batch}
        y = [b + i * height for b in range(len(backends))]
        speed.barh(y, [found[b]["speedup"] if b in found else 0 for b in backends], height,
                   label=f"batch {batch}")
        peak.barh(y, [found[b].get("peak_fraction") or 0 if b in found else 0
                      for b in backends], height, label=f"batch {batch}")
    speed.set_yticks([b + 0.4 - height / 2 for b in range(len(backends))], backends,
                     fontsize=8)
    speed.invert_yaxis()
    speed.axvline(1, color="grey", linewidth=0.8)
    speed.set_xlabel("speed against eager PyTorch fp32 (x)")
    peak.set_xlabel("fraction of its precision's GEMM peak")
    for ax in (speed, peak):
        ax.grid(True, axis="x", alpha=0.3)
    speed.legend(fontsize=8)
    fig.tight_layout()
    return _svg(fig)


def bench_table(result: dict) -> str:
    lines = ["| backend | precision | batch | p50 | images/s | speed vs eager | peak fraction |",
             "| --- | --- | ---: | ---: | ---: | ---: | ---: |"]
    for r in bench_rows(result):
        peak = f"{r['peak_fraction']:.2f}" if r.get("peak_fraction") is not None else ""
        lines.append(f"| {r['backend']} | {r.get('precision', '')} | {r['batch']} | "
                     f"{r['p50_ms']:.1f} ms | {r['images_per_s']:.1f} | {r['speedup']:.2f}x | "
                     f"{peak} |")
    return "\n".join(lines)


def accuracy_points(result: dict) -> list[dict]:
    """Each backend with a measured top-1 drop: its speed against eager at the largest batch
    size, its precision and drop (top-1 points lost against eager fp32)."""
    rows = bench_rows(result)
    batch = max(r["batch"] for r in rows)
    speed = {r["backend"]: r for r in rows if r["batch"] == batch}
    return [{"backend": name, "batch": batch, "speedup": speed[name]["speedup"],
             "precision": speed[name].get("precision", ""), **found}
            for name, found in result.get("accuracy", {}).items() if name in speed]


def accuracy_chart(result: dict) -> bytes:
    plt = _pyplot()
    points = accuracy_points(result)
    if not points:
        raise ValueError("the bench result holds no top-1 accuracy (export with --real-data)")
    fig, ax = plt.subplots(figsize=(10, 4.5))
    markers = {"fp32": "o", "fp16": "s", "bf16": "D", "int8": "^"}
    for p in points:  # named in the legend: points of equal drop would hide their labels
        ax.scatter(p["speedup"], p["drop"], marker=markers.get(p["precision"], "o"), s=40,
                   label=f"{p['backend']} ({p['precision']})")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.02, 1))
    ax.axhline(0, color="grey", linewidth=0.8)
    ax.axvline(1, color="grey", linewidth=0.8)
    ax.set_xlabel(f"speed against eager PyTorch fp32 at batch {points[0]['batch']} (x)")
    ax.set_ylabel("top-1 drop against eager fp32 (points)")
    ax.grid(True, alpha=0.3)
    fig.tight_layout()
    return _svg(fig)


def accuracy_table(result: dict) -> str:
    lines = ["| backend | precision | speed vs eager | images | top-1 | eager top-1 | drop |",
             "| --- | --- | ---: | ---: | ---: | ---: | ---: |"]
    for p in accuracy_points(result):
        lines.append(f"| {p['backend']} | {p['precision']} | {p['speedup']:.2f}x | "
                     f"{p['images']} | {p['accuracy']:.2%} | {p['eager_accuracy']:.2%} | "
                     f"{p['drop']:.2f} |")
    return "\n".join(lines)


def coverage_chart(result: dict) -> bytes:
    plt = _pyplot()
    rows = result["rows"]
    fig, ax = plt.subplots(figsize=(8, 0.2 * len(rows) + 1.2))
    colours = {"native": "tab:blue", "framework": "tab:orange"}
    for i, row in enumerate(rows):
        if "onnx_vs_framework" in row:
            ax.barh(i, row["onnx_vs_framework"], color=colours[row["road"]])
        else:
            ax.text(1e-9, i, "refused", va="center", fontsize=7, color="tab:red")
    ax.set_yticks(range(len(rows)), [r["name"] for r in rows], fontsize=7)
    ax.invert_yaxis()
    ax.set_xscale("log")
    ax.set_xlim(1e-9, 1e-3)
    ax.axvline(1e-4, color="grey", linestyle="--", linewidth=0.8)
    ax.set_xlabel("model.onnx against the framework's own forward (max abs / max |ref|)")
    from matplotlib.patches import Patch

    ax.legend(handles=[Patch(color=colour, label=f"{road} road")
                       for road, colour in colours.items()], fontsize=8, loc="lower right")
    ax.grid(True, axis="x", alpha=0.3)
    fig.tight_layout()
    return _svg(fig)


def export_chart(result: dict) -> bytes:
    """Each exporter's wall time and the size of what it writes, per model, side by side."""
    plt = _pyplot()
    rows = result["rows"]
    models = list(dict.fromkeys(r["model"] for r in rows))
    tools = list(dict.fromkeys(r["tool"] for r in rows))
    fig, axes = plt.subplots(1, 2, figsize=(10, 0.5 * len(models) * len(tools) + 1.4),
                             sharey=True)
    height = 0.8 / len(tools)
    for i, tool in enumerate(tools):
        found = {r["model"]: r for r in rows if r["tool"] == tool}
        y = [m + i * height for m in range(len(models))]
        for ax, field in zip(axes, ("wall_s", "folder_mb")):
            ax.barh(y, [found[m][field] if m in found else 0 for m in models], height,
                    label=tool)
    axes[0].set_yticks([m + 0.4 - height / 2 for m in range(len(models))], models, fontsize=8)
    axes[0].invert_yaxis()
    axes[0].set_xlabel("export wall time (s), median")
    axes[1].set_xlabel("folder written (MB)")
    for ax in axes:
        ax.grid(True, axis="x", alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    return _svg(fig)


def export_table(result: dict) -> str:
    theirs = {r["model"]: r for r in result["rows"] if not r["tool"].startswith("vit-export")}
    lines = ["| model | exporter | wall s | CPU s | peak RSS MB | folder MB | wall vs the peer |",
             "| --- | --- | ---: | ---: | ---: | ---: | ---: |"]
    for r in result["rows"]:
        peer = theirs.get(r["model"])
        ratio = f"{r['wall_s'] / peer['wall_s']:.2f}x" if peer else ""
        lines.append(f"| {r['model']} | {r['tool']} | {r['wall_s']:.1f} | {r['cpu_s']:.1f} | "
                     f"{r['peak_rss_mb']:.0f} | {r['folder_mb']:.1f} | {ratio} |")
    return "\n".join(lines)


def steps_table(result: dict) -> str:
    """Where vit-export's export time went, per model (rows that recorded their steps)."""
    timed = [r for r in result["rows"] if r.get("steps")]
    if not timed:
        return ""
    lines = ["| model | exporter | step | seconds | share of the wall time |",
             "| --- | --- | --- | ---: | ---: |"]
    for r in timed:
        lines += [f"| {r['model']} | {r['tool']} | {s['step']} | {s['s']:.1f} | "
                  f"{s['s'] / r['wall_s']:.0%} |" for s in r["steps"]]
    return "\n".join(lines)


def peaks_line(result: dict) -> str:
    """Each precision's peak a bench result holds its rows to, and the GEMM that set it."""
    units = {"fp32": "GFLOP/s", "bf16": "GFLOP/s", "fp16": "GFLOP/s", "int8": "GOP/s"}
    found = [f"{name} {p['gflops']:.0f} {units.get(name, 'GFLOP/s')} ({p['kernel']})"
             for name, p in (result.get("peaks") or {}).items() if p.get("gflops")]
    return f"Peaks (the fastest GEMM timed in the run): {'; '.join(found)}." if found else ""


def scaling_chart(result: dict) -> bytes:
    """images/s of `infer --ray` on 1, 2, 3 ... worker nodes, and each worker's efficiency."""
    plt = _pyplot()
    rows = result["results"]
    nodes = [r["nodes"] for r in rows]
    fig, (rate, share) = plt.subplots(1, 2, figsize=(10, 3.6))
    rate.bar([str(n) for n in nodes], [r["images_per_s"] for r in rows], color="tab:blue")
    rate.set_xlabel("worker nodes (one worker each)")
    rate.set_ylabel("images/s")
    share.plot([str(n) for n in nodes], [r["efficiency_per_worker"] for r in rows], "o-")
    share.axhline(1, color="grey", linewidth=0.8)
    share.set_ylim(0, 1.2)
    share.set_xlabel("worker nodes")
    share.set_ylabel("images/s per worker / one worker's")
    for ax in (rate, share):
        ax.grid(True, axis="y", alpha=0.3)
    fig.tight_layout()
    return _svg(fig)


def scaling_table(result: dict) -> str:
    head = "| worker nodes | CPUs a node | images/s | each run | per-worker efficiency | wall s |"
    lines = [head, "| ---: | ---: | ---: | --- | ---: | ---: |"]
    for r in result["results"]:
        runs = ", ".join(f"{x:.1f}" for x in r["runs_images_per_s"])
        lines.append(f"| {r['nodes']} | {r['cpus_per_node']:g} | {r['images_per_s']:.1f} | "
                     f"{runs} | {r['efficiency_per_worker']:.2f} | {r['wall_s']:.1f} |")
    return "\n".join(lines)


def layers_chart(result: dict) -> bytes:
    """The per-stage chart `validate --layers --markdown` writes, drawn by the same function
    from the report's JSON."""
    import tempfile
    from types import SimpleNamespace

    from vit_export.render import layers_chart as draw_layers

    report = SimpleNamespace(
        bundle=result["bundle"], provider_used=result["provider_used"],
        stages=[SimpleNamespace(**row) for row in result["stages"]],
        profiles={name: SimpleNamespace(**values) for name, values in result["profiles"].items()})
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "layers.svg"
        draw_layers(report, path)
        return path.read_bytes()


def charts(markdown: str) -> list[tuple[str, str, str]]:
    """(kind, result path, chart file name) of each marker in a page."""
    return [(kind, path, f"charts/{kind}-{Path(path).parent.name}-{Path(path).stem}.svg")
            for kind, path in MARKER.findall(markdown)]


def draw(kind: str, path: str) -> bytes:
    result = json.loads((ROOT / path).read_text())
    return {"bench": bench_chart, "accuracy": accuracy_chart, "coverage": coverage_chart,
            "export": export_chart, "layers": layers_chart,
            "scaling": scaling_chart}[kind](result)


def replaced(markdown: str, page_depth: int) -> str:
    """The page with each marker replaced by its chart, its line and (bench) its table."""
    up = "../" * page_depth

    def one(match: re.Match) -> str:
        kind, path = match.group(1), match.group(2)
        result = json.loads((ROOT / path).read_text())
        name = charts(match.group(0))[0][2]
        parts = [f"![{kind} chart]({up}{name})"]
        if kind != "coverage":  # the coverage table beneath says where it was measured
            parts += ["", where(path, result)]
        if kind == "bench":
            parts += ["", peaks_line(result), "", bench_table(result)]
        if kind == "export":
            parts += ["", export_table(result), "", steps_table(result)]
        if kind == "accuracy":
            parts += ["", accuracy_table(result)]
        if kind == "scaling":
            parts += ["", scaling_table(result)]
        return "\n".join(parts)

    return RECORD.sub(lambda m: record(m.group(1), m.group(2)), MARKER.sub(one, markdown))


def log_command(text: str, n: int) -> list[str]:
    """The n-th command (from 1) of a console log and what it printed, without the per-stage
    table of `validate --layers`."""
    commands = [i for i, line in enumerate(text.splitlines()) if line.startswith("$ ")]
    if not 1 <= n <= len(commands):
        raise ValueError(f"the log holds {len(commands)} commands, not a command {n}")
    lines = text.splitlines()[commands[n - 1]:]
    end = next((i for i, line in enumerate(lines[1:], 1)
                if line.startswith(("$ ", "=== ", "stage "))), len(lines))
    return lines[:end]


def record(path: str, n: str | None) -> str:
    """A kept record as it was written, with the line saying where it was measured."""
    text = (ROOT / path).read_text()
    folder = FOLDER.match(Path(path).parent.name)
    if folder is None:
        raise ValueError(f"{path}: a record's folder is named MACHINE-YYYY-MM-DD")
    line = f"Measured on {folder['machine']}, {folder['date']}; from `{path}`."
    if n is None:
        return f"{text.strip()}\n\n{line}"
    shown = "\n".join(log_command(text, int(n)))
    return f"```console\n{shown}\n```\n\n{line}"


def on_files(files, config):
    """Every chart the pages ask for, drawn once and added to the site."""
    from mkdocs.structure.files import File

    wanted = {}
    for file in list(files.documentation_pages()):
        for kind, path, name in charts(Path(file.abs_src_path).read_text()):
            wanted[name] = (kind, path)
    for name, (kind, path) in wanted.items():
        files.append(File.generated(config, name, content=draw(kind, path)))
    return files


def on_page_markdown(markdown: str, page, config, files) -> str:
    depth = page.file.src_uri.count("/") if page is not None else 0
    return replaced(markdown, depth)
