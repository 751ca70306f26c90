"""scripts/cuda_proof.sh rehearsed on CPU (PROVIDER=cpu, the seed preset): the stages that run
vit-export run here too, so that a renamed option fails this test and not the few minutes of
GPU time a session may be lent (issue 24), and the pinned timm and transformers are packed
(scripts/pack_pins.sh, from PyPI) and installed first on every later stage's path (issue 37).
Not rehearsed: env and ort (they read the GPU), tests (the suite itself), ray and serve (they
need Ray's wheels packed from PyPI), the aoti stage's fp16 package (compiled for CUDA: its
refusal is rehearsed instead). The peers stage (issue 38) is parsed quickly for both
providers' peer lists, and its summary (scripts/peers_summary.py) checked on a made-up
result; its host-input benchmark (benchmarks/host_input.py) runs in the rehearsal."""
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import h100_peers_result

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
try:
    import peers_summary
finally:
    sys.path.remove(str(ROOT / "scripts"))

STAGES = ["pins", "export", "validate", "infer", "families", "embed", "aoti", "bench", "peers",
          "profile"]


@pytest.mark.slow
def test_every_command_of_the_cuda_proof_runs_on_cpu(tmp_path):
    pytest.importorskip("timm")
    pytest.importorskip("transformers")
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import cuda_families
    finally:
        sys.path.remove(str(ROOT / "scripts"))

    families, logs, work = tmp_path / "families", tmp_path / "logs", tmp_path / "work"
    pins, site = tmp_path / "pins", tmp_path / "pins-site"
    cuda_families.main(families, only={"eva02", "hf-clip"})
    env = {**os.environ, "PROVIDER": "cpu", "PRESET": "vit_seed_tiny", "LOGS": str(logs),
           "WORK": str(work), "FAMILIES": str(families), "BATCHES": "1,8",
           "SECONDS_EACH": "0.05", "PINS": str(pins), "PINS_SITE": str(site), "OUT": str(pins),
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    packed = subprocess.run(["bash", str(ROOT / "scripts" / "pack_pins.sh")], env=env,
                            capture_output=True, text=True, timeout=600, check=False)
    assert packed.returncode == 0, packed.stderr[-3000:]
    assert sorted(p.name.split("-")[0] for p in pins.glob("*.whl")) == ["timm", "transformers"]
    done = subprocess.run(["bash", str(ROOT / "scripts" / "cuda_proof.sh"), *STAGES], env=env,
                          capture_output=True, text=True, timeout=1200, check=False)
    assert done.returncode == 0, done.stdout[-3000:]  # every stage, every command

    exits = {}
    for stage in STAGES:
        text = (logs / f"{stage}.log").read_text()
        commands = re.findall(r"^\$ (.*)$", text, re.MULTILINE)
        codes = [int(c) for c in re.findall(r"^\[exit (\d+), ", text, re.MULTILINE)]
        assert commands and len(codes) == len(commands), stage
        exits.update({command: code for command, code in zip(commands, codes) if code})
    assert not exits, exits
    # the pins were installed and imported from where the stage put them
    installed = re.findall(r"^(timm|transformers) (\S+) from (\S+) ok$",
                           (logs / "pins.log").read_text(), re.MULTILINE)
    assert [name for name, _, _ in installed] == ["timm", "transformers"]
    assert all(Path(path).is_relative_to(site) for _, _, path in installed), installed

    for name in ("digits", "base", "base-io", "aoti"):
        report = json.loads((logs / f"{name}.json").read_text())
        assert report["passed"] and report["provider_used"] == "cpu", name
    # the fp16 package is compiled for CUDA: on CPU the same command (its options parsed, so
    # a misspelt one is exit 2, not 1) is refused in one line, before any step or file
    lines = (logs / "aoti.log").read_text().splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("$ expect_exit 1 vx export ")
              and "--aoti --aoti-precision fp16 " in line)
    assert lines[at + 1].startswith("Error: --aoti-precision fp16 compiles model.aoti.pt2 for "
                                    "CUDA, and ")
    assert lines[at + 2] == "(exit 1, expected 1)" and lines[at + 3].startswith("[exit 0, ")
    assert not (work / "aoti-fp16").exists() and not (logs / "aoti-fp16.json").exists()
    for name in ("bench", "bench-compile"):
        rows = json.loads((logs / f"{name}.json").read_text())["rows"]
        assert {row["batch"] for row in rows} == {1, 8}, name
    # peers: eager, the fused fp16 model and timm's own model, eager and compiled, each
    # matched eager at both sizes; the summary judged the file against timm-compile
    rows = json.loads((logs / "peers.json").read_text())["rows"]
    assert {(r["backend"], r["batch"], r["validated"], r["peer"]) for r in rows} == {
        (name, batch, True, peer) for batch in (1, 64) for name, peer in [
            ("eager", False), ("onnxruntime[model.opt.fp16.onnx]", False), ("timm", True),
            ("timm-compile", True)]}
    summary = re.findall(r"^(against|batch|goal) (.*)$", (logs / "peers.log").read_text(),
                         re.MULTILINE)
    assert [kind for kind, _ in summary] == ["against", "batch", "batch", "goal", "goal", "goal"]
    assert summary[0][1].startswith("timm-compile on cpu; ")
    assert summary[-1][1] == ("host input >= 0.85x device input: not measured (host input "
                              "only on cpu)")
    lowered = re.findall(r"^  batch +(\d+): conv .* gemm .* \(max abs diff ([0-9.e+-]+)\)$",
                         (logs / "peers.log").read_text(), re.MULTILINE)
    assert [b for b, _ in lowered] == ["1", "64"] and all(float(d) <= 1e-4 for _, d in lowered)
    # host input: ONNX Runtime's own run, staged, streamed, and uint8 through model.e2e.onnx
    # (their outputs compared with the own run's first); device input is CUDA's alone
    peers_log = (logs / "peers.log").read_text()
    hosted = re.findall(r"^  batch +(\d+): host-ort +[0-9.]+  host +[0-9.]+  stream +[0-9.]+  "
                        r"e2e-stream +[0-9.]+$", peers_log, re.MULTILINE)
    assert hosted == ["1", "64"], peers_log[-2000:]
    assert "  device input: CUDA only (this run is on cpu)" in peers_log
    assert sorted(p.name for p in work.glob("families/*")) == ["eva02", "hf-clip"]
    cosines = re.findall(r"^worst cosine, .* to .*: ([0-9.]+)$",
                         (logs / "embed.log").read_text(), re.MULTILINE)
    assert len(cosines) == 1 and float(cosines[0]) >= 0.99999  # ONNX Runtime to eager
    embeddings = np.load(work / "embed-onnxruntime-cpu.npy")
    assert len(embeddings) == 8 and np.isfinite(embeddings).all()  # the eight samples


# the cpu list also runs in the slow rehearsal; the cuda list runs nowhere else before a GPU
@pytest.mark.parametrize("provider", [pytest.param("cpu", marks=pytest.mark.slow), "cuda"])
def test_the_peers_stage_asks_bench_only_what_it_takes(tmp_path, provider):
    """The peers stage's bench command, with each provider's peer list (the CUDA one runs
    nowhere before a lent GPU), on a folder without the bundle: bench takes every option and
    peer and stops at the missing bundle (exit 1), not at a usage error (2). The summary's
    peer for that device is among those timed."""
    logs, work = tmp_path / "logs", tmp_path / "work"
    env = {**os.environ, "PROVIDER": provider, "LOGS": str(logs), "WORK": str(work),
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    done = subprocess.run(["bash", str(ROOT / "scripts" / "cuda_proof.sh"), "peers"], env=env,
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 1, done.stdout
    text = (logs / "peers.log").read_text()
    commands = re.findall(r"^\$ (.*)$", text, re.MULTILINE)
    assert len(commands) == 1 and re.findall(r"^\[exit (\d+), ", text, re.MULTILINE) == ["1"]
    assert f"Error: {work / 'base'} does not exist" in text.splitlines()
    peers = re.search(r"--peers (\S+)", commands[0]).group(1).split(",")
    assert peers_summary.STRONGEST[provider] in peers


def test_the_peers_summary_prints_each_goal_met_or_not_with_its_numbers(tmp_path, capsys):
    """On the H100 figures of 2026-11-24: the fused fp16 model against timm-compile-ro-fp16,
    device input for the goals; exit 0 whatever the goals, 1 without the peer's rows."""
    result = tmp_path / "peers.json"
    result.write_text(json.dumps(h100_peers_result()))
    assert peers_summary.main([str(result)]) == 0
    fused = "onnxruntime[model.opt.fp16.onnx]"
    graph = "with a CUDA graph (peer cuda-graph, not what infer runs)"
    assert capsys.readouterr().out.splitlines() == [
        "against timm-compile-ro-fp16 on cuda (NVIDIA H100 80GB HBM3); /tmp/vit-cuda/base",
        (f"batch 1, host input: {fused} 624.6 img/s (0.03 of the fp16 GEMM peak); "
         f"timm-compile-ro-fp16 1200.0 img/s: 0.52x; {graph} 1172.8 img/s, 0.98x"),
        (f"batch 1, device input: {fused} 595.9 img/s (0.03 of the fp16 GEMM peak); "
         f"timm-compile-ro-fp16 1527.5 img/s: 0.39x; {graph} 1405.5 img/s, 0.92x"),
        (f"batch 64, host input: {fused} 5163.2 img/s (0.24 of the fp16 GEMM peak); "
         f"timm-compile-ro-fp16 6000.0 img/s: 0.86x; {graph} 5687.7 img/s, 0.95x"),
        (f"batch 64, device input: {fused} 9106.2 img/s (0.42 of the fp16 GEMM peak); "
         f"timm-compile-ro-fp16 10242.9 img/s: 0.89x; {graph} 9338.2 img/s, 0.91x"),
        (f"goal >= 1x timm-compile-ro-fp16 at each batch (device input): not met (batch 1 "
         f"{fused} 0.39x, batch 64 {fused} 0.89x)"),
        (f"goal peak share >= 0.55 at the largest batch (device input): not met (batch 64 "
         f"{fused} 0.42 of the fp16 GEMM peak)"),
        (f"goal host input (a batch at a time or streamed, the faster) >= 0.85x device input: "
         f"not met (batch 1 {fused} 1.05x, batch 64 "
         f"{fused} 0.57x)")]
    assert peers_summary.main([str(result), "--peer", "timm-compile-fp16"]) == 1
    out, err = capsys.readouterr()
    assert "note: timm-compile-fp16 left out: compiler failed" in out.splitlines()
    assert "goal >= 1x timm-compile-fp16 at each batch (device input): not measured (" in out
    assert err == f"error: {result} has no row of timm-compile-fp16\n"
