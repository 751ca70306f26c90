"""The README's Python example, run as a user pastes it, in a fresh folder: what it prints is
what its comments say, and the bundle it made is one `vit-export validate` passes."""
import contextlib
import io
import re
from pathlib import Path

from conftest import run

README = Path(__file__).resolve().parent.parent / "README.md"


def python_example() -> str:
    text = README.read_text()
    return re.search(r"## From Python.*?```python\n(.*?)```", text, re.DOTALL).group(1)


def test_the_readme_python_example_runs_and_prints_what_it_says(tmp_path, monkeypatch):
    code = python_example()
    assert "import vit_export" in code and "vit_export.export(" in code
    monkeypatch.chdir(tmp_path)
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(compile(code, str(README), "exec"), {})  # noqa: S102 (the README as pasted)  # noqa: S102 (the README, as pasted)
    lines = printed.getvalue().splitlines()
    assert lines[0] == "True True"  # exported (validated) and validated again
    said = re.search(r"# (onnxruntime cpu \(2, 10\))", code).group(1)
    assert lines[1] == said
    code, out, err = run("validate", tmp_path / "out" / "tiny", "--provider", "cpu")
    assert code == 0 and out.rstrip().endswith("PASS"), err
