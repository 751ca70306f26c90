"""Reports as people and CI tools read them: text, Markdown and JUnit XML. Pure functions.

The text and Markdown forms say the same things: the provider that ran, every comparison row,
accuracy on labelled sets, the per-stage comparison, node placement on CUDA, static checks
and the verdict. JUnit has one test case per comparison row, check and stage, so its failure
count is the report's.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Optional
from xml.etree import ElementTree as ET

from .benchmarking import BenchResult
from .bundle import atomic_write_bytes
from .errors import shown
from .parity import E2E_REFERENCE, ParityReport


def _verdict(report: ParityReport) -> str:
    return "PASS" if report.passed else f"FAIL: {len(report.failures)} check(s) failed"


def _result(failures: list[str]) -> str:
    return "ok" if not failures else "FAIL: " + "; ".join(failures)


def _accuracy_lines(report: ParityReport) -> list[str]:
    return [f"accuracy on {r.inputs} ({r.batch} labelled): {_reference(r)} "
            f"{r.reference_accuracy:.2%}, {r.candidate} {r.accuracy:.2%}"
            for r in report.results if r.accuracy is not None]


def _reference(r) -> str:
    """The reference as accuracy lines name it: "eager" for validate's own (eager, and
    Pillow + eager before model.e2e.onnx), else its name (a saved run's, `eager@cuda (A)`)."""
    return "eager" if r.reference in ("eager", E2E_REFERENCE) else r.reference


def _name(r) -> str:
    """The candidate, and its reference when that is not eager PyTorch on the same input."""
    return r.candidate if r.reference == "eager" else f"{r.candidate} (vs {r.reference})"


def _short(provider: str) -> str:
    return provider.replace("ExecutionProvider", "")


def _placement_lines(report: ParityReport) -> list[str]:
    lines = []
    for model, placement in report.placement.items():
        parts = [f"{op} " + "/".join(f"{_short(p)} {n}" for p, n in by.items())
                 for op, by in placement.items()]
        lines.append(f"placement: {model}: {', '.join(parts)}")
    return lines


def _tf32(report: ParityReport) -> str:
    return "TF32 on in ONNX Runtime (eager in full fp32)" if report.tf32 else "TF32 off"


def _decisions(report: ParityReport, t) -> str:
    """What a profile asks of each output compared beyond values and cosine: the decisions
    to agree on (top-1, nn@10), and the tokens' own cosine floor."""
    return "".join(f", token cosine >= {t.min_token_cosine}" if o == "tokens" else
                   f", {ParityReport.agreement(o)} >= "
                   f"{t.min_top1 if o == 'logits' else t.min_neighbours}"
                   for o in report.outputs)


def source_line(source: dict) -> str:
    """What the source framework's comparison was: its model and files, and how it ended
    (rows of their own, "(vs transformers)"); "" where the bundle was not imported."""
    if not source:
        return ""
    if source.get("status") == "skipped":
        return shown(f"source: not compared, skipped: {source.get('reason', '?')}")
    files = ", ".join(f"{name} {digest[:12]}" for name, digest in source.get("files", {}).items())
    sizes = ", ".join(f"{h}x{w}" for h, w in source.get("sizes", []))
    compared = source.get("compared")
    outputs = f" on {', '.join(compared)}" if compared else ""
    return shown(f"source: {source.get('framework')} {source.get('version')} "
                 f"{source.get('model')} ({files}) against eager and model.onnx{outputs} at "
                 f"{sizes}: {source.get('status')}")


def _agreement(report: ParityReport) -> str:
    """The agreement column's name: what it measures, or "agree" over several outputs."""
    return ParityReport.agreement(report.outputs[0]) if len(report.outputs) == 1 else "agree"


def text(report: ParityReport) -> str:
    """The report as the CLI prints it."""
    lines = [(f"provider: requested {report.provider_requested}, ran on {report.provider_used}; "
             f"torch device {report.torch_device}; {_tf32(report)}; "
             f"seed {report.seed}")]
    lines += [shown(f"note: {note}") for note in report.notes]
    lines += [f"profile {name}: max abs <= {t.atol:g}, max rel <= {t.rtol:g}, "
              f"cosine >= {t.min_cosine}{_decisions(report, t)}"
              for name, t in report.profiles.items()]
    width = max([12] + [len(_name(r)) for r in report.results])
    pw = max([7] + [len(r.profile) for r in report.results])
    several = len(report.outputs) > 1  # then a column says which output a row compares

    def output(name: str) -> str:
        return f"{name:<9} " if several else ""

    head = "eager vs" if any(r.reference == "eager" for r in report.results) else "runner"
    lines += [(f"{head:<{width}} {'profile':<{pw}} {'batch':>5}  {'inputs':<16} "
               f"{output('output')}{'max abs':>9} {'max rel':>9} {'cosine':>10} "
               f"{_agreement(report):>6}  result")] if report.results else []
    lines += [f"{_name(r):<{width}} {r.profile:<{pw}} {r.batch:>5}  {r.inputs:<16} "
              f"{output(r.output)}{r.max_abs:>9.2e} {r.max_rel:>9.2e} {r.cosine:>10.7f} "
              f"{_share(r.top1):>6}  {_result(r.failures)}" for r in report.results]
    lines += _accuracy_lines(report)
    lines += [source_line(report.source)] if report.source else []
    if report.stages:
        w = max(len(f"{s.model} {s.label}") for s in report.stages)
        lines.append(f"{'stage':<{w}} {'batch':>5} {'max abs':>9} {'rel L2':>9} {'cosine':>10}")
        lines += [f"{s.model + ' ' + s.label:<{w}} {s.batch:>5} {s.max_abs:>9.2e} "
                  f"{s.rel_l2:>9.2e} {s.cosine:>10.7f}  {'ok' if s.passed else 'FAIL'}"
                  for s in report.stages]
    lines += [f"divergence: {model}: {line}" for model, line in report.first_divergence.items()]
    lines += _placement_lines(report)
    lines += [f"check: {c.name}: {'ok' if c.passed else 'FAIL'} ({c.detail})"
              for c in report.checks]
    lines.append(_verdict(report))
    return "\n".join(lines) + "\n"


def _share(value) -> str:
    """An agreement as a percentage; "-" where there was nothing to agree on."""
    return "-" if value is None else f"{value:.1%}"


def markdown(report: ParityReport, layers_chart: Optional[str] = None) -> str:
    """A summary for a pull-request comment; `layers_chart`: the file name of the per-stage
    chart (`layers_chart`) written beside it, shown above the stage table."""
    verdict = "PASS" if report.passed else f"FAIL ({len(report.failures)} failed)"
    lines = [f"### vit-export parity: {verdict}", "",
             (f"Bundle `{report.bundle}`; provider requested `{report.provider_requested}`, "
              f"ran on `{report.provider_used}`; {_tf32(report)}; "
              f"seed {report.seed}; batch sizes {report.batch_sizes}."), "",
             (f"| candidate | profile | batch | inputs | output | max abs | max rel | "
              f"cosine | {_agreement(report)} | accuracy | result |"),
             "| --- | --- | ---: | --- | --- | ---: | ---: | ---: | ---: | ---: | --- |"]
    for r in report.results:
        accuracy = (f"{r.accuracy:.2%} ({_reference(r)} {r.reference_accuracy:.2%})"
                    if r.accuracy is not None else "")
        lines.append(f"| {r.candidate} | {r.profile} | {r.batch} | {r.inputs} | {r.output} | "
                     f"{r.max_abs:.2e} | {r.max_rel:.2e} | {r.cosine:.6f} | {_share(r.top1)} | "
                     f"{accuracy} | {_result(r.failures)} |")
    if report.stages and layers_chart:
        lines += ["", f"![The error after each stage, against eager]({layers_chart})"]
    if report.stages:
        lines += ["", "| model | stage | batch | max abs | rel L2 | cosine | result |",
                  "| --- | --- | ---: | ---: | ---: | ---: | --- |"]
        lines += [f"| {s.model} | {s.label} | {s.batch} | {s.max_abs:.2e} | {s.rel_l2:.2e} | "
                  f"{s.cosine:.6f} | {'ok' if s.passed else 'FAIL'} |" for s in report.stages]
    if report.source:
        lines += ["", source_line(report.source)]
    failed_checks = [c for c in report.checks if not c.passed]
    lines += ["", (f"Static checks: {len(report.checks) - len(failed_checks)}/"
                  f"{len(report.checks)} passed.")]
    lines += [f"- FAIL {c.name}: {c.detail}" for c in failed_checks]
    lines += [f"- `{model}`: {line}" for model, line in report.first_divergence.items()]
    lines += [f"- {line}" for line in _placement_lines(report)]
    return "\n".join(lines) + "\n"


def junit(report: ParityReport) -> str:
    """JUnit XML: one test case per comparison row, per check and per stage."""
    suite = ET.Element("testsuite", name="vit-export parity")
    several = len(report.outputs) > 1
    cases = [(r.candidate, f"{_reference(r)} vs {r.candidate} batch {r.batch} {r.inputs}"
              + (f" {r.output}" if several else ""),
              "; ".join(r.failures) if not r.passed else None) for r in report.results]
    cases += [("checks", c.name, None if c.passed else c.detail) for c in report.checks]
    cases += [(s.model, f"{s.label} batch {s.batch}",
               None if s.passed else f"rel L2 {s.rel_l2:.3g} (max abs {s.max_abs:.3g})")
              for s in report.stages]
    for classname, name, failure in cases:
        case = ET.SubElement(suite, "testcase", classname=classname, name=name)
        if failure is not None:
            ET.SubElement(case, "failure", message=failure).text = failure
    if report.source.get("status") == "skipped":  # skipped, never passed
        case = ET.SubElement(suite, "testcase", classname="source", name="source framework")
        ET.SubElement(case, "skipped", message=str(report.source.get("reason", "")))
        cases.append(("source", "source framework", None))
        suite.set("skipped", "1")
    suite.set("tests", str(len(cases)))
    suite.set("failures", str(sum(1 for c in cases if c[2] is not None)))
    suite.set("errors", "0")
    return ET.tostring(suite, encoding="unicode", xml_declaration=True)


def _peak_line(result: BenchResult) -> str:
    parts = []
    for precision, peak in result.peaks.items():
        unit = "GOP/s" if precision == "int8" else "GFLOP/s"
        note = f"; {peak['note']}" if peak.get("note") else ""
        parts.append(f"{precision} {peak['gflops']:.4g} {unit} ({peak['kernel']}{note})")
    if all(peak.get("statistic") == "median" for peak in result.peaks.values()):
        return "GEMM peaks, timed in turns with the runners (medians): " + "; ".join(parts)
    return "GEMM peaks, measured now: " + "; ".join(parts)


def bench_table(result: BenchResult, target: str) -> str:
    """The bench table: the CPU and its peaks, one row per backend, input placement and batch
    size (peak: against the GEMM peak of the row's own precision), then the fastest
    validated backend at each batch size."""
    lines = [(f"{target}: {result.gflop_per_image:.3g} GFLOP/image; {result.threads} threads; "
             f"{result.device}; fp32 matmul peak {result.matmul_peak_gflops:.0f} GFLOP/s "
             f"(measured now)")]
    if result.gpu:
        lines.append(f"gpu: {result.gpu}")
    elif result.isa:
        lines.append(f"cpu: {result.cpu_model}; ISA {result.isa}")
    if result.peaks:
        lines.append(_peak_line(result))
    width = max(len(r.backend) for r in result.rows)
    accuracy = result.accuracy  # the drop column only where labelled images were measured
    lines.append(f"{'backend':<{width}} {'device':<6} {'input':<6} {'batch':>5} {'p50 ms':>9} "
                 f"{'p90 ms':>9} {'p99 ms':>9} {'img/s':>8} {'GFLOP/s':>8} {'prec':<4} "
                 f"{'peak':>5} {'vs eager':>8} {'RSS MB':>7}" + (" top-1 drop" if accuracy else ""))
    lines += [f"{r.backend:<{width}} {r.device:<6} {r.io:<6} {r.batch:>5} {_ms(r.p50_ms)} "
              f"{_ms(r.p90_ms)} {_ms(r.p99_ms)} {r.images_per_s:>8.2f} {r.gflops:>8.1f} "
              f"{r.precision:<4} {r.peak_fraction:>5.2f} {r.speedup:>7.2f}x "
              f"{r.peak_rss_mb:>7.0f}" + (_drop(accuracy.get(r.backend)) if accuracy else "")
              for r in result.rows]
    for batch, best in result.recommendation.items():
        lines.append(f"fastest validated at batch {batch}: {best['backend']} "
                     f"({best['precision']}), {best['p50_ms']:.3g} ms, "
                     f"{best['speedup_vs_eager']:.2f}x eager")
        if best.get("note") and best["note"] not in result.notes:
            lines.append(f"note: {best['note']}")
    if accuracy:
        first = next(iter(accuracy.values()))
        lines.append(f"top-1 drop: points of top-1 accuracy below eager's "
                     f"({100 * first['eager_accuracy']:.2f}%) on {shown(first['inputs'])} "
                     f"({first['images']} labelled images), as the bundle's parity.json "
                     f"measured them")
    unvalidated = sorted({r.backend for r in result.rows if not r.validated and not r.peer})
    if unvalidated:
        lines.append(f"not recommended (no passing parity.json row): {', '.join(unvalidated)}")
    peers = {r.backend: True for r in result.rows if r.peer}
    for r in result.rows:
        if r.peer:
            peers[r.backend] &= r.validated
    if peers:
        lines.append("peers, timed beside the bundle and never recommended: " + ", ".join(
            f"{name} ({'matched' if ok else 'did NOT match'} eager)"
            for name, ok in peers.items()))
    lines += [f"note: {note}" for note in result.notes]
    return "\n".join(lines) + "\n"


def _drop(found: Optional[dict[str, Any]]) -> str:
    """A row's top-1 drop in the bench table's last column; blank where not measured."""
    return f" {found['drop']:>7.2f} pt" if found else ""


def _ms(value: float) -> str:
    """A latency in 9 columns: one decimal from 10 ms up, three below (GPU batch 1)."""
    return f"{value:>9.1f}" if value >= 10 else f"{value:>9.3f}"


def layers_chart(report: ParityReport, path: str | os.PathLike) -> None:
    """`validate --layers` drawn: the error after each stage of each model against eager
    (relative L2, what a stage is judged by; max abs; 1 - cosine), one line per model, its
    profile's allowed relative L2 a dashed line in its colour; values under 1e-12 (exact)
    are drawn at 1e-12. An SVG, shown without scripts."""
    import io

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    models = list(dict.fromkeys(s.model for s in report.stages))
    labels = list(dict.fromkeys(s.label for s in report.stages))
    fig, axes = plt.subplots(3, 1, figsize=(max(7.0, 0.32 * len(labels)), 8), sharex=True)
    for model in models:
        rows = [s for s in report.stages if s.model == model]
        x = [labels.index(s.label) for s in rows]
        profile = rows[0].profile
        for ax, values in zip(axes, ([s.rel_l2 for s in rows], [s.max_abs for s in rows],
                                     [max(1 - s.cosine, 1e-12) for s in rows])):
            line, = ax.plot(x, [max(v, 1e-12) for v in values], marker="o", markersize=3,
                            label=f"{model} ({profile})")
        allowed = report.profiles.get(profile)
        if allowed is not None:  # the model's allowance, in its colour
            axes[0].axhline(allowed.stage_rel_l2, linestyle="--", linewidth=0.9,
                            color=line.get_color(), label=f"{profile}: allowed relative L2")
    for ax, name in zip(axes, ("relative L2", "max abs", "1 - cosine")):
        ax.set_yscale("log")
        ax.set_ylabel(name)
        ax.grid(True, alpha=0.3)
    axes[0].legend(fontsize=7)
    axes[0].set_title(f"{Path(report.bundle).name}: the error after each stage, against "
                      f"eager ({report.provider_used})", fontsize=9)
    axes[-1].set_xticks(range(len(labels)), labels, rotation=70, fontsize=7, ha="right")
    fig.tight_layout()
    svg = io.StringIO()
    fig.savefig(svg, format="svg")
    plt.close(fig)
    atomic_write_bytes(path, svg.getvalue().encode())


def bench_plot(result: BenchResult, path: str | os.PathLike) -> None:
    """Throughput against batch size, one line per backend and input placement."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for name, placement in dict.fromkeys((r.backend, r.io) for r in result.rows):
        rows = [r for r in result.rows if r.backend == name and r.io == placement]
        label = name if placement == "host" else f"{name} ({placement} input)"
        ax.plot([r.batch for r in rows], [r.images_per_s for r in rows], marker="o", label=label)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("batch size")
    ax.set_ylabel("images / s")
    ax.set_title(f"{Path(result.model).name}: {result.threads} threads, {result.device}, "
                 f"fp32 matmul peak {result.matmul_peak_gflops:.0f} GFLOP/s", fontsize=9)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    import io

    png = io.BytesIO()
    fig.savefig(png, format="png", dpi=100)
    plt.close(fig)
    atomic_write_bytes(path, png.getvalue())
