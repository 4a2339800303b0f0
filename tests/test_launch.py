"""rlkit.launch: fresh-process runs; a multi-rank run whose rank dies of SIGABRT is run once more."""
import os
import textwrap

import pytest

from rlkit.launch import LaunchError, run_module

ABORT_ONCE = textwrap.dedent('''
    import os, sys
    from pathlib import Path
    from rlkit.launch import child_main

    def main(config):
        marker = Path(config["marker"])
        if int(os.environ["RANK"]) == 1 and (config["always"] or not marker.exists()):
            marker.write_text("aborted once")
            os.abort()  # what a gloo rank does when its teardown fails
        return {"rank0": True, "world": int(os.environ["WORLD_SIZE"])}

    if __name__ == "__main__":
        child_main(main)
''')


@pytest.fixture
def module_dir(tmp_path):
    (tmp_path / "rlkit_abort_once.py").write_text(ABORT_ONCE)
    return tmp_path


def _env(module_dir):
    return {"PYTHONPATH": os.pathsep.join([str(module_dir), os.environ.get("PYTHONPATH", "")])}


def test_a_rank_aborting_once_is_run_again(module_dir, tmp_path, capsys):
    log = tmp_path / "child.log"
    result = run_module("rlkit_abort_once", {"marker": str(tmp_path / "marker"), "always": False}, nproc=2,
                        env=_env(module_dir), log_path=log, timeout=240)
    assert result == {"rank0": True, "world": 2}
    assert "retry after SIGABRT" in log.read_text()
    assert "aborted (SIGABRT); running it once more" in capsys.readouterr().err


def test_a_rank_aborting_every_time_fails_after_one_retry(module_dir, tmp_path):
    with pytest.raises(LaunchError, match="exited with"):
        run_module("rlkit_abort_once", {"marker": str(tmp_path / "marker"), "always": True}, nproc=2,
                   env=_env(module_dir), log_path=tmp_path / "child.log", timeout=240)
    assert (tmp_path / "child.log").read_text().count("retry after SIGABRT") == 1
