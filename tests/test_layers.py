"""The package's layering, checked on every run: imports only ever point down."""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def test_the_import_contracts_in_pyproject_hold() -> None:
    # import-linter comes with the test extra; without it this check would silently pass.
    executable = shutil.which("lint-imports") or str(Path(sys.executable).parent / "lint-imports")
    if not Path(executable).exists():
        pytest.fail("lint-imports not found: install the test extra (pip install -e '.[test]')")
    result = subprocess.run(
        [executable, "--no-cache"], cwd=ROOT, capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    assert "0 broken" in result.stdout


def _own_imports_in_functions(path: Path) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text())
    found = []
    for function in ast.walk(tree):
        if not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for node in ast.walk(function):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("autotune"):
                found.append((node.lineno, node.module or ""))
            elif isinstance(node, ast.Import):
                found += [
                    (node.lineno, a.name) for a in node.names if a.name.startswith("autotune")
                ]
    return found


def test_own_modules_are_imported_at_top_level_unless_a_comment_says_why() -> None:
    # The import graph is then the one a reader sees at the top of each module; a lazy import
    # of the package's own module must name the heavy library it defers ("# imports torch").
    lazy = []
    for path in sorted((ROOT / "autotune").rglob("*.py")):
        if path.name == "__init__.py":
            continue  # the lazy public names of ``import autotune``
        lines = path.read_text().splitlines()
        for number, module in _own_imports_in_functions(path):
            if "# imports " not in lines[number - 1]:
                lazy.append(f"{path.relative_to(ROOT)}:{number}: {module}")
    assert not lazy, "\n".join(lazy)
