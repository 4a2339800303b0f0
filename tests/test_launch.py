"""rlkit.measure.launch: fresh-process runs; a run (one process or several ranks) that dies of SIGABRT is run once more."""
import os
import textwrap

import pytest

from rlkit.measure.launch import LaunchError, run_module

ABORT_ONCE = textwrap.dedent('''
    import os, sys
    from pathlib import Path
    from rlkit.measure.launch import child_main

    def main(config):
        marker = Path(config["marker"])
        last_rank = int(os.environ.get("RANK", "0")) == int(os.environ.get("WORLD_SIZE", "1")) - 1
        if last_rank and (config["always"] or not marker.exists()):
            marker.write_text("aborted once")
            os.abort()  # what a gloo rank does when its teardown fails
        return {"rank0": True, "world": int(os.environ.get("WORLD_SIZE", "1"))}

    if __name__ == "__main__":
        child_main(main)
''')


@pytest.fixture
def module_dir(tmp_path):
    (tmp_path / "rlkit_abort_once.py").write_text(ABORT_ONCE)
    return tmp_path


def _env(module_dir):
    return {"PYTHONPATH": os.pathsep.join([str(module_dir), os.environ.get("PYTHONPATH", "")])}


@pytest.mark.parametrize("nproc", [1, 2])
def test_a_rank_aborting_once_is_run_again(module_dir, tmp_path, capsys, nproc):
    log = tmp_path / "child.log"
    result = run_module("rlkit_abort_once", {"marker": str(tmp_path / "marker"), "always": False}, nproc=nproc,
                        env=_env(module_dir), log_path=log, timeout=240)
    assert result == {"rank0": True, "world": nproc}
    assert "retry after SIGABRT" in log.read_text()
    assert "aborted (SIGABRT); running it once more" in capsys.readouterr().err


@pytest.mark.parametrize("nproc", [1, 2])
def test_a_rank_aborting_every_time_fails_after_one_retry(module_dir, tmp_path, nproc):
    with pytest.raises(LaunchError, match="exited with"):
        run_module("rlkit_abort_once", {"marker": str(tmp_path / "marker"), "always": True}, nproc=nproc,
                   env=_env(module_dir), log_path=tmp_path / "child.log", timeout=240)
    assert (tmp_path / "child.log").read_text().count("retry after SIGABRT") == 1


def test_an_ordinary_failure_is_not_run_again(tmp_path):
    (tmp_path / "rlkit_fails.py").write_text(textwrap.dedent('''
        from rlkit.measure.launch import child_main

        def main(config):
            raise ValueError("bad input")

        if __name__ == "__main__":
            child_main(main)
    '''))
    with pytest.raises(LaunchError, match="ValueError: bad input"):
        run_module("rlkit_fails", {}, env=_env(tmp_path), log_path=tmp_path / "child.log", timeout=120)
    assert "retry after SIGABRT" not in (tmp_path / "child.log").read_text()
