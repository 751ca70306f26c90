"""The package's layers only point down: the README's Layout lists the modules bottom-up, and
a module imports only modules listed above it (at the top of the file or inside a function:
an import deferred into a function still ties the two together). So no module imports one
that imports it back, and no private name crosses a module boundary."""
from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "vit_export"


def layout_order(readme: str) -> list[str]:
    """The modules the README's Layout block lists, in its order, as dotted names. A folder
    line (`parity/`) names the package, whose __init__ re-exports its modules: it ranks
    after the last of them. A line may name a module in a folder (`preprocessing/graph.py`)
    where its layer is."""
    block = readme.split("## Layout", 1)[1].split("```", 2)[1]
    listing = re.split(r"\nvit_export/ *[^\n]*\n", block, maxsplit=1)[1]
    order: list[str] = []
    folder, pending = None, None  # the folder being listed; its package, ranked at its end
    for line in listing.splitlines():
        if line and not line.startswith(" "):
            break  # the package's listing ends: models/, scripts/, ...
        match = re.match(r"^( {2,4})([\w/]+\.py|\w+/)\s", line + " ")
        if not match:  # a description's next line
            continue
        indent, name = len(match.group(1)), match.group(2)
        if indent <= 2 and pending:
            order.append(pending)
            folder = pending = None
        if name.endswith("/"):
            folder = name.rstrip("/")
            pending = f"vit_export.{folder}"
            continue
        path = f"{folder}/{name}" if indent > 2 and folder else name
        order.append("vit_export." + path.removesuffix(".py").replace("/", "."))
    if pending:
        order.append(pending)
    return order


def modules() -> dict[str, Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def imports(name: str, path: Path, known: set[str]) -> list[tuple[str, int, str]]:
    """(module imported, line, private name or "") for every import of the package in one
    module, and every private attribute it reads from a module it imported."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    tree = ast.parse(path.read_text(), str(path))
    found, aliases = [], {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            if not source.startswith("vit_export"):
                continue
            for alias in node.names:
                target = f"{source}.{alias.name}"
                if target in known:  # `from . import runtime`
                    found.append((target, node.lineno, ""))
                    aliases[alias.asname or alias.name] = target
                else:
                    private = alias.name.startswith("_") and not alias.name.startswith("__")
                    found.append((source, node.lineno, alias.name if private else ""))
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("vit_export"):
                    found.append((alias.name, node.lineno, ""))
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                and node.value.id in aliases and node.attr.startswith("_")
                and not node.attr.startswith("__")):
            found.append((aliases[node.value.id], node.lineno, node.attr))
    return sorted(set(found))


def problems(readme: str) -> list[str]:
    known = modules()
    order = layout_order(readme)
    rank = {name: i for i, name in enumerate(order)}
    out = [f"{name} is not in the README's Layout" for name in sorted(known)
           if name not in rank and name != "vit_export"]
    out += [f"the README's Layout lists {name}, which is not a module" for name in order
            if name not in known]
    for name, path in sorted(known.items()):
        if name not in rank:
            continue
        for target, line, private in imports(name, path, set(known)):
            # importing a.b.c runs a.b's __init__ too, unless a.b is being imported already
            # (the module's own package)
            chain = target.split(".")
            targets = [".".join(chain[:i]) for i in range(2, len(chain) + 1)]
            where = f"{path.relative_to(ROOT)}:{line}"
            for t in targets:
                if name == t or name.startswith(t + "."):
                    continue
                if t in rank and rank[t] > rank[name]:
                    out.append(f"{where}: {name} imports {t}, listed below it")
            if private and target != name:
                out.append(f"{where}: {name} takes the private {target}.{private}")
    return out


def test_the_readme_lists_every_module_and_imports_point_down():
    found = problems((ROOT / "README.md").read_text())
    assert not found, "\n".join(found)


@pytest.mark.parametrize("line, problem", [
    # a module moved above one it imports: the import now points up
    ("  errors.py            moved", "imports vit_export.errors, listed below it"),
])
def test_an_import_pointing_up_is_found(line, problem):
    """The check can fail: errors.py listed last makes every module that imports it point
    up, and a module missing from the Layout is named."""
    readme = (ROOT / "README.md").read_text()
    head, block = readme.split("## Layout", 1)
    lines = [x for x in block.split("\n") if not re.match(r"^\s+errors\.py\s", x)]
    last = next(i for i, x in enumerate(lines) if x.startswith("  cli.py "))
    moved = "## Layout".join([head, "\n".join(lines[:last + 1] + [line] + lines[last + 1:])])
    assert any(problem in p for p in problems(moved))
    dropped = "## Layout".join([head, "\n".join(lines)])
    assert "vit_export.errors is not in the README's Layout" in problems(dropped)


def test_a_private_name_taken_across_modules_is_found(tmp_path):
    (tmp_path / "vit_export").mkdir()
    (tmp_path / "vit_export" / "a.py").write_text("from . import b\nb._hidden()\n"
                                                  "from .b import _other\n")
    found = imports("vit_export.a", tmp_path / "vit_export" / "a.py",
                    {"vit_export.a", "vit_export.b"})
    assert ("vit_export.b", 2, "_hidden") in found and ("vit_export.b", 3, "_other") in found
