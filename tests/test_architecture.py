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
