"""The layers of docs/architecture.md hold: import-linter checks the contracts in pyproject.toml ([tool.importlinter])."""
import subprocess
import sys
from pathlib import Path

from rlkit.core.env import REPO_ROOT


def test_imports_keep_the_layers():
    lint = Path(sys.executable).with_name("lint-imports")  # import-linter, from the [dev] extra
    out = subprocess.run([str(lint), "--no-cache"], cwd=REPO_ROOT, capture_output=True, text=True)
    report = out.stdout[out.stdout.find("Contracts"):] + out.stderr
    assert out.returncode == 0, f"an import breaks rlkit's layers (docs/architecture.md):\n{report}"


MAX_FUNCTION_LINES = 60  # issue 45: a function reads in one screen
MAX_MODULE_LINES = 400  # and a module in one sitting


def _sizes():
    import ast

    for path in sorted((REPO_ROOT / "rlkit").rglob("*.py")):
        text = path.read_text(encoding="utf-8")
        yield path, "module", len(text.splitlines()), MAX_MODULE_LINES
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                yield path, f"{node.name} (line {node.lineno})", node.end_lineno - node.lineno + 1, MAX_FUNCTION_LINES


def test_functions_and_modules_stay_small():
    too_big = [f"{path.relative_to(REPO_ROOT)}: {what} has {lines} lines (at most {limit})"
               for path, what, lines, limit in _sizes() if lines > limit]
    assert not too_big, "split these (docs/architecture.md):\n" + "\n".join(too_big)
