"""rlkit.core.env.git_sha: a run's revision is its code's; results written under outputs/ do not make it dirty."""
from __future__ import annotations

import subprocess

from rlkit.core.env import git_sha


def test_only_changes_outside_outputs_make_the_checkout_dirty(tmp_path, monkeypatch):
    monkeypatch.delenv("RLKIT_GIT_SHA", raising=False)
    git = ["git", "-C", str(tmp_path), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    (tmp_path / "outputs").mkdir()
    (tmp_path / "outputs" / "metrics.json").write_text("{}")
    (tmp_path / "code.py").write_text("x = 1\n")
    subprocess.run([*git, "add", "."], check=True)
    subprocess.run([*git, "commit", "-q", "-m", "c"], check=True)
    head = subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
    assert git_sha(tmp_path) == head
    (tmp_path / "outputs" / "metrics.json").write_text('{"analysed": "again"}')
    assert git_sha(tmp_path) == head
    (tmp_path / "code.py").write_text("x = 2\n")
    assert git_sha(tmp_path) == head + "-dirty"
