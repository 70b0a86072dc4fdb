"""docs/layout.md lists every module of textgen/ so that each imports only modules below it: checked here from the
source, every textgen import counted (inside functions and type-checking blocks too)."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "textgen"


def layout_order() -> list[str]:
    """The modules docs/layout.md lists, top first, as dotted names."""
    text = (ROOT / "docs" / "layout.md").read_text(encoding="utf-8")
    paths = re.findall(r"^- `(textgen/[\w/]+\.py)`", text, re.MULTILINE)
    return [path.removesuffix(".py").replace("/", ".") for path in paths]


def modules() -> set[str]:
    """Every module of the package but its ``__init__`` and ``__main__``."""
    return {
        ".".join(path.relative_to(ROOT).with_suffix("").parts)
        for path in PACKAGE.rglob("*.py")
        if path.name not in ("__init__.py", "__main__.py")
    }


def imported(module: str, known: set[str]) -> set[str]:
    """The modules of ``known`` that ``module`` imports, anywhere in its source."""
    tree = ast.parse((ROOT / (module.replace(".", "/") + ".py")).read_text(encoding="utf-8"))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)  # from textgen import api
    return {name for name in names if name in known} - {module}


def test_the_layout_lists_every_module_once() -> None:
    order = layout_order()
    assert len(order) == len(set(order)), "a module is listed twice"
    assert set(order) == modules(), "docs/layout.md and textgen/ differ"


def test_every_module_imports_only_modules_below_it_in_the_layout() -> None:
    order = layout_order()
    rank = {module: i for i, module in enumerate(order)}
    upward = [
        f"{module} imports {other}"
        for module in order
        for other in sorted(imported(module, set(order)))
        if rank[other] < rank[module]
    ]
    assert not upward


def test_planning_and_the_cli_import_no_tensorflow() -> None:
    """``textgen --help`` answers at once, and a run is planned (a bad flag refused) before TensorFlow's import."""
    code = "import sys, textgen.cli, textgen.training.plan; print('tensorflow' in sys.modules, 'keras' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert out.stdout.split() == ["False", "False"]
