"""scripts/cuda_proof.sh rehearsed on CPU (PROVIDER=cpu, the seed preset): the stages that run
vit-export run here too, so that a renamed option fails this test and not the few minutes of
GPU time a session may be lent, and the pinned timm and transformers are packed
(scripts/pack_pins.sh, from PyPI) and installed first on every later stage's path.
Not rehearsed: tests and cudatests (the suite itself), ray and serve (they need Ray's wheels
packed from PyPI), the aoti stage's fp16 package (compiled for CUDA: its refusal is rehearsed
instead). The plans at the top of the script are parsed: each fits its window of device
time, call by call. A window (WINDOW=seconds) is run on CPU and killed as the device kills a
command that runs past its limit: the logs packed so far are there, whole. The peers stage is
parsed quickly for both providers' peer lists, and its summary (scripts/peers_summary.py)
checked on a made-up result; its host-input benchmark (benchmarks/host_input.py) runs in the
rehearsal."""
import json
import os
import re
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import numpy as np
import pytest
from conftest import h100_peers_result

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "cuda_proof.sh"
sys.path.insert(0, str(ROOT / "scripts"))
try:
    import peers_summary
finally:
    sys.path.remove(str(ROOT / "scripts"))

STAGES = ["pins", "env", "export", "staged", "infer", "families", "embed", "aoti",
          "precisions", "bench", "peers", "profile"]
# the proof's one command, in the order that puts what matters first
WINDOW_STAGES = ["env", "pins", "export", "staged", "infer", "families", "peers", "cudatests"]
DEVICE_MINUTES = 15  # a lent machine's device time, all calls together
COMMAND_LIMIT_S = 600  # the most one device call may run
ORT_PARTS = 5  # onnxruntime-gpu's wheel in parts (../shared/gpu/pack.sh)


def cpu_env(tmp_path, **extra) -> dict:
    return {**os.environ, "PROVIDER": "cpu", "PRESET": "vit_seed_tiny",
            "LOGS": str(tmp_path / "logs"), "WORK": str(tmp_path / "work"),
            "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}", **extra}


def plans() -> dict[str, dict]:
    """The plans at the top of cuda_proof.sh: name -> {rows: [(call, minutes, timeout_s,
    rest)], total, budget}. A call is boot, N or N-M (M - N + 1 calls alike)."""
    header = SCRIPT.read_text().split("\nset -uo pipefail", 1)[0]
    found, plan = {}, None
    for line in header.splitlines():
        if m := re.match(r"^# Plan (\w+): ", line):
            plan = found[m.group(1)] = {"rows": [], "total": None, "budget": None}
        elif plan and (m := re.match(r"^#   (boot|\d+(?:-\d+)?) +([\d.]+) +(\S+) +(.*)$", line)):
            plan["rows"].append((m.group(1), float(m.group(2)), m.group(3), m.group(4)))
        elif plan and (m := re.match(r"^#   total ([\d.]+) of (\d+)$", line)):
            plan["total"], plan["budget"] = float(m.group(1)), int(m.group(2))
    return found


def test_each_plan_fits_its_window_call_by_call():
    """Every plan: a boot, calls numbered 1..N, minutes that add up to its total, within
    the device time; the onnxruntime-gpu parts one a call first; one last command under
    the per-call limit, within which its WINDOW ends, naming stages the script has."""
    found = plans()
    assert set(found) == {"A", "B1", "B2"}
    stages = set(re.findall(r"^stage_(\w+)\(\)", SCRIPT.read_text(), re.MULTILINE))
    for name, plan in found.items():
        rows = plan["rows"]
        assert rows[0][0] == "boot" and plan["budget"] == DEVICE_MINUTES, name
        assert plan["total"] == pytest.approx(sum(m for _, m, _, _ in rows)), name
        assert plan["total"] <= plan["budget"], name
        calls = []
        for call, _, timeout_s, _ in rows[1:]:
            first, _, last = call.partition("-")
            calls += range(int(first), int(last or first) + 1)
            assert int(timeout_s) <= COMMAND_LIMIT_S, (name, call)
        assert calls == list(range(1, len(calls) + 1)), name
        # the wheel's parts first, from the first call on: nothing runs before they are in
        assert re.search(r"\.gpu/ort\.part00 ", rows[1][3]) and rows[1][0] in ("1", "1-5")
        *_, (call, minutes, timeout_s, rest) = rows
        window = int(re.search(r"\bWINDOW=(\d+) ", rest).group(1))
        # one command of at most 8 minutes, its window ending before the call is cut
        assert window < int(timeout_s) <= 8 * 60 <= minutes * 60, name
        named = rest.split("scripts/cuda_proof.sh ", 1)[1].split()
        assert set(named) <= stages, (name, set(named) - stages)
        if name == "A":
            assert named == WINDOW_STAGES
            carried = [re.search(r"ort\.part(\d\d)", r).group(1) for _, _, _, r in rows[1:-1]]
            assert carried == [f"{i:02d}" for i in range(ORT_PARTS)]
            assert len(calls) == ORT_PARTS + 1  # the parts, then the one command


def archive(path: Path) -> dict[str, str]:
    """Each text file of a packed archive by its name under the logs folder."""
    with tarfile.open(path) as tar:
        return {m.name.split("/", 1)[1]: tar.extractfile(m).read().decode()
                for m in tar.getmembers() if m.isfile()}


@pytest.mark.slow  # several seconds: the whole suite runs it
def test_a_window_packs_its_logs_as_it_goes_and_a_killed_call_keeps_them(tmp_path):
    """The window run as the device runs it, on CPU, killed (the whole group, SIGKILL) as a
    call past its limit is, once the archive shows the export begun: the archive is whole
    and holds env's log, every command with its exit code, and the window's record."""
    out = tmp_path / "out"
    out.mkdir()
    env = cpu_env(tmp_path, WINDOW="300", OUT=str(out))
    run = subprocess.Popen(["bash", str(SCRIPT), "env", "export", "staged"], env=env,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                           start_new_session=True)
    packed, seen = out / "cuda-proof.tgz", {}
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and run.poll() is None:
            if packed.exists():
                seen = archive(packed)
                if "$ vx export" in seen.get("export.log", ""):
                    break
            time.sleep(0.2)
    finally:
        os.killpg(run.pid, signal.SIGKILL)
        run.wait()
    assert "$ vx export" in seen.get("export.log", ""), seen.keys()
    found = archive(packed)  # what the device would return: the last whole archive
    text = found["env.log"]
    commands = re.findall(r"^\$ (.*)$", text, re.MULTILINE)
    codes = re.findall(r"^\[exit (\d+), ", text, re.MULTILINE)
    assert commands[-1] == "vx quick-test --provider cpu" and codes == ["0"] * len(commands)
    lines = found["window.log"].splitlines()
    assert lines[0].startswith("window of 300 s: env export staged (")
    assert re.fullmatch(r"=== env begun, 30 s at most \((300|299) s left\)", lines[1])
    assert re.fullmatch(r"=== env exit 0, \d+ s", lines[2]) and lines[3].startswith(
        "=== export begun, 150 s at most (")
    assert not [p for p in out.iterdir() if p.name != "cuda-proof.tgz"
                and not p.name.endswith(".part")]


def test_a_window_cuts_a_stage_at_its_time_and_skips_what_cannot_start(tmp_path):
    """WINDOW=4: env cannot finish, so it is cut there (its processes with it), and export,
    with no time left, never starts; the run says so and fails."""
    out = tmp_path / "out"
    out.mkdir()
    env = cpu_env(tmp_path, WINDOW="4", MIN_LEFT="1", OUT=str(out))
    done = subprocess.run(["bash", str(SCRIPT), "env", "export"], env=env, capture_output=True,
                          text=True, timeout=60, check=False)
    assert done.returncode == 1, done.stdout
    lines = archive(out / "cuda-proof.tgz")["window.log"].splitlines()
    assert len(lines) == 5, lines
    budget = re.fullmatch(r"=== env begun, ([34]) s at most \(\1 s left\)", lines[1]).group(1)
    assert lines[2] == f"=== env cut at {budget} s"
    assert re.fullmatch(r"=== export skipped: -?\d+ s left", lines[3])
    assert lines[4].startswith("window done: ")
    assert not (tmp_path / "work" / "base").exists()


@pytest.mark.slow
def test_plan_as_one_command_runs_on_cpu_within_its_window(tmp_path):
    """Plan A's last call, its command as the plan writes it (the `start` part aside, which
    needs the GPU's wheel), run on CPU with the seed preset, two families and the window
    and caps stretched for two cores: every stage ends in time with exit 0, in the plan's
    order, and the archive in $OUT holds every stage's whole log."""
    pytest.importorskip("timm")
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import cuda_families
    finally:
        sys.path.remove(str(ROOT / "scripts"))
    *_, (_, _, _, rest) = plans()["A"]["rows"]
    command = rest.split("start ", 1)[1].split()
    assert command[:3] == ["WINDOW=465", "bash", "scripts/cuda_proof.sh"]
    families, pins, out = tmp_path / "families", tmp_path / "pins", tmp_path / "out"
    out.mkdir()
    cuda_families.main(families, only={"deit3", "hf-clip"})
    env = cpu_env(tmp_path, FAMILIES=str(families), PINS=str(pins),
                  PINS_SITE=str(tmp_path / "pins-site"), SECONDS_EACH="0.05", FAMILY_JOBS="2",
                  WORKERS="2", WINDOW="1800", CAP_FACTOR="4", OUT=str(out))
    packed = subprocess.run(["bash", str(ROOT / "scripts" / "pack_pins.sh")],
                            env={**env, "OUT": str(pins)},
                            capture_output=True, text=True, timeout=600, check=False)
    assert packed.returncode == 0, packed.stderr[-3000:]
    done = subprocess.run(["bash", str(SCRIPT), *command[3:]], env=env, capture_output=True,
                          text=True, timeout=2400, check=False)
    found = archive(out / "cuda-proof.tgz")
    ended = re.findall(r"^=== (\w+) exit (\d+), \d+ s$", found["window.log"], re.MULTILINE)
    assert ended == [(stage, "0") for stage in WINDOW_STAGES], found["window.log"]
    assert done.returncode == 0, done.stdout[-3000:]
    for stage in WINDOW_STAGES:
        assert found[f"{stage}.log"] == (tmp_path / "logs" / f"{stage}.log").read_text()
    tests = found["cudatests.log"]
    assert re.search(r" \d+ passed", tests) and " failed" not in tests


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
    pins, site, out = tmp_path / "pins", tmp_path / "pins-site", tmp_path / "out"
    out.mkdir()
    cuda_families.main(families, only={"eva02", "hf-clip"})
    env = cpu_env(tmp_path, FAMILIES=str(families), BATCHES="1,8", SECONDS_EACH="0.05",
                  PINS=str(pins), PINS_SITE=str(site), FAMILY_JOBS="2")
    packed = subprocess.run(["bash", str(ROOT / "scripts" / "pack_pins.sh")],
                            env={**env, "OUT": str(pins)},
                            capture_output=True, text=True, timeout=600, check=False)
    assert packed.returncode == 0, packed.stderr[-3000:]
    assert sorted(p.name.split("-")[0] for p in pins.glob("*.whl")) == ["timm", "transformers"]
    done = subprocess.run(["bash", str(SCRIPT), *STAGES], env={**env, "OUT": str(out)},
                          capture_output=True, text=True, timeout=1800, check=False)
    assert done.returncode == 0, done.stdout[-3000:]  # every stage, every command

    exits = {}
    for stage in STAGES:
        text = (logs / f"{stage}.log").read_text()
        commands = re.findall(r"^\$ (.*)$", text, re.MULTILINE)
        codes = [int(c) for c in re.findall(r"^\[exit (\d+), ", text, re.MULTILINE)]
        assert commands and len(codes) == len(commands), stage
        exits.update({command: code for command, code in zip(commands, codes) if code})
    assert not exits, exits
    assert archive(out / "cuda-proof.tgz")["profile.log"] == (logs / "profile.log").read_text()
    # the pins were installed and imported from where the stage put them
    installed = re.findall(r"^(timm|transformers) (\S+) from (\S+) ok$",
                           (logs / "pins.log").read_text(), re.MULTILINE)
    assert [name for name, _, _ in installed] == ["timm", "transformers"]
    assert all(Path(path).is_relative_to(site) for _, _, path in installed), installed

    for name in ("digits", "base", "base-io", "aoti"):
        report = json.loads((logs / f"{name}.json").read_text())
        assert report["passed"] and report["provider_used"] == "cpu", name
    # the staged path: each file alone and with two threads, bit-equal where fp32
    staged = (logs / "staged.log").read_text()
    for file, bound in [("model.onnx", "bit-equal"), ("model.opt.fp16.onnx", "max abs <= 0.05"),
                        ("model.e2e.onnx", "bit-equal")]:
        assert len(re.findall(rf"^{re.escape(file)} on cpu, staged against the own run, "
                              rf"{bound}: batch 1 .*, batch 64 [0-9.e+-]+$", staged,
                              re.MULTILINE)) == 2, file
        assert len(re.findall(rf"^{re.escape(file)} on cpu, two threads sharing the runner, 12 "
                              rf"batches each \(sizes \[1, 7\] and \[3, 64\]\): 24 of 24 "
                              rf"bit-equal", staged, re.MULTILINE)) == 2, file
    same = re.findall(r"^\S+: on cpu, top-1 as on the CPU for (\d+) of (\d+) samples$",
                      (logs / "infer.log").read_text(), re.MULTILINE)
    assert same == [("8", "8")] * 4
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
    # peers: eager, the three ONNX models and timm's own model, eager and compiled, each
    # matched eager at both sizes; the summary judged the file against timm-compile
    rows = json.loads((logs / "peers.json").read_text())["rows"]
    assert {(r["backend"], r["batch"], r["validated"], r["peer"]) for r in rows} == {
        (name, batch, True, peer) for batch in (1, 64) for name, peer in [
            ("eager", False), ("onnxruntime", False), ("onnxruntime[model.fp16.onnx]", False),
            ("onnxruntime[model.opt.fp16.onnx]", False), ("timm", True),
            ("timm-compile", True)]}
    summary = re.findall(r"^(against|batch|goal|lever) (.*)$",
                         (logs / "peers.log").read_text(), re.MULTILINE)
    assert [kind for kind, _ in summary] == ["against", "batch", "batch", "goal", "goal",
                                             "goal", "lever", "lever", "lever", "lever"]
    assert summary[0][1].startswith("timm-compile on cpu; ")
    assert summary[5][1] == ("host input >= 0.85x device input: not measured (host input "
                             "only on cpu)")
    assert re.fullmatch(r"fp16 \(onnxruntime\[model.fp16.onnx\] over onnxruntime, host "
                        r"input\): batch 1 [0-9.]+x, batch 64 [0-9.]+x", summary[6][1])
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
    assert sorted(p.name for p in (logs / "families").iterdir()) == ["eva02.log", "hf-clip.log"]
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
    env = {**cpu_env(tmp_path), "PROVIDER": provider}
    done = subprocess.run(["bash", str(SCRIPT), "peers"], env=env,
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
         f"{fused} 0.57x)"),
        ("lever fp16 (onnxruntime[model.fp16.onnx] over onnxruntime, device input): "
         "not measured"),
        (f"lever fused graph ({fused} over onnxruntime[model.fp16.onnx], device input): "
         f"not measured"),
        (f"lever CUDA graph ({fused}+cuda-graph over {fused}, device input): batch 1 2.36x, "
         f"batch 64 1.03x"),
        ("lever torch.compile reduce-overhead on timm (timm-compile-ro-fp16 over timm-fp16, "
         "device input): not measured")]
    assert peers_summary.main([str(result), "--peer", "timm-compile-fp16"]) == 1
    out, err = capsys.readouterr()
    assert "note: timm-compile-fp16 left out: compiler failed" in out.splitlines()
    assert "goal >= 1x timm-compile-fp16 at each batch (device input): not measured (" in out
    assert err == f"error: {result} has no row of timm-compile-fp16\n"
