"""scripts/cuda_proof.sh rehearsed on CPU (PROVIDER=cpu, the seed preset): the stages that run
vit-export run here too, so that a renamed option fails this test and not the few minutes of
GPU time a session may be lent (issue 24), and the pinned timm and transformers are packed
(scripts/pack_pins.sh, from PyPI) and installed first on every later stage's path (issue 37).
Not rehearsed: env and ort (they read the GPU), tests (the suite itself), ray and serve (they
need Ray's wheels packed from PyPI)."""
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]

STAGES = ["pins", "export", "validate", "infer", "families", "embed", "aoti", "bench", "profile"]


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
    for name in ("bench", "bench-compile"):
        rows = json.loads((logs / f"{name}.json").read_text())["rows"]
        assert {row["batch"] for row in rows} == {1, 8}, name
    assert sorted(p.name for p in work.glob("families/*")) == ["eva02", "hf-clip"]
    cosines = re.findall(r"^worst cosine, .* to .*: ([0-9.]+)$",
                         (logs / "embed.log").read_text(), re.MULTILINE)
    assert len(cosines) == 1 and float(cosines[0]) >= 0.99999  # ONNX Runtime to eager
    embeddings = np.load(work / "embed-onnxruntime-cpu.npy")
    assert len(embeddings) == 8 and np.isfinite(embeddings).all()  # the eight samples
