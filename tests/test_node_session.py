"""scripts/node_session.sh, the driver of one device session's GPU work: every job's command names scripts, arms,
profiles and parameters that exist (a renamed field fails here, not an hour into a lease), an unknown job is refused
before anything runs, and a job that runs on this CPU (the resume test, skipped without CUDA) goes through the real
driver: its console, the progress lines with its exit status, and DONE, the poll's exit test."""
from __future__ import annotations

import dataclasses
import importlib.util
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from rlkit.core.env import REPO_ROOT
from rlkit.core.results import load_profile
from rlkit.experiments import learning, update_profile
from rlkit.recipes.grpo import ARMS, GRPORecipe

SCRIPT = REPO_ROOT / "scripts" / "node_session.sh"
JOBS = re.findall(r"^#   ([a-z0-9-]+)\s{2,}\S", SCRIPT.read_text(), flags=re.M)  # the header's job list


def _driver(root: Path, *jobs: str, dry: bool = False, timeout: int = 60) -> subprocess.CompletedProcess:
    # the node's python3 is the one with torch; here it is this interpreter's
    env = {**os.environ, "RLKIT_DRY_RUN": "1" if dry else "0",
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    return subprocess.run(["bash", str(SCRIPT), str(root), *jobs], capture_output=True, text=True, env=env,
                          timeout=timeout, check=False)


def _poll_command(root: Path, out: Path, seconds: str) -> list[str]:
    return ["bash", str(REPO_ROOT / "scripts" / "node_poll.sh"), str(root), str(out), seconds]


def _poll(root: Path, out: Path, seconds: str) -> subprocess.CompletedProcess:
    return subprocess.run(_poll_command(root, out, seconds), capture_output=True, text=True, timeout=60, check=False)


def _fields(cls) -> set[str]:
    return {f.name for f in dataclasses.fields(cls)}


def _params(words: list[str]) -> list[str]:
    """The keys of every ``-p key=value`` in a command, the ones inside RLKIT_GRPO_ARGS too."""
    words = [w for word in words for w in (shlex.split(word.split("=", 1)[1]) if word.startswith("RLKIT_GRPO_ARGS=")
                                           else [word])]
    return [words[i + 1].split("=", 1)[0] for i, w in enumerate(words[:-1]) if w == "-p"]


def test_every_job_names_what_exists(tmp_path):
    assert len(JOBS) == 34
    proc = _driver(tmp_path / "s", *JOBS, dry=True)
    assert proc.returncode == 0, proc.stderr
    commands = dict(line.split(": ", 1) for line in proc.stdout.splitlines())
    assert list(commands) == JOBS and not (tmp_path / "s").exists()  # a dry run writes nothing
    known = {**{job: _fields(learning.Config) for job in JOBS if job.startswith("learning")},
             **{job: _fields(update_profile.Config) for job in JOBS if job.startswith("profile-")},
             **dict.fromkeys(("resume-test", "gqa-test", "prefetch-test"), {"no:cacheprovider"})}  # pytest's -p: a plugin, not a parameter
    for job, command in commands.items():
        words = shlex.split(command)
        scripts = [w for w in words if w.startswith("scripts/")]
        for script in scripts:
            assert os.access(REPO_ROOT / script, os.X_OK), f"{job}: {script} is not an executable script"
        if any("node_grpo_arms" in s for s in scripts):
            arms = words[words.index(scripts[0]) + 2:]
            assert arms and set(arms) <= set(ARMS), f"{job}: {arms}"
            (profile,) = [w.split("=", 1)[1] for w in words if w.startswith("RLKIT_PROFILE=")]
            assert (REPO_ROOT / "nbs" / "params" / f"05_grpo_qwen3_4b.{profile}.yaml").exists(), f"{job}: {profile}"
        fields = known.get(job, _fields(GRPORecipe))
        assert set(_params(words)) <= fields, f"{job}: {_params(words)} not all in {sorted(fields)}"
        modules = [words[i + 1] for i, w in enumerate(words[:-1]) if w == "-m" and words[i + 1].startswith("rlkit.")]
        assert all(importlib.util.find_spec(m) for m in modules), f"{job}: {modules}"
    assert _params(shlex.split(commands["seed-sac"])) == ["activation_checkpointing"]
    assert _params(shlex.split(commands["profile-sac"])) == ["selective_layers"]
    assert _params(shlex.split(commands["profile-prefetch"])) == ["prefetch_grads"]
    assert _params(shlex.split(commands["profile-best"])) == [*_params(shlex.split(commands["profile-levers"])),
                                                               "prefetch_grads"]
    assert "tests/test_grad_prefetch_gpu.py" in commands["prefetch-test"] and "-m gpu" in commands["prefetch-test"]
    assert _params(shlex.split(commands["seed-util"])) == ["gpu_memory_utilization"]
    assert "rlkit.experiments.elementwise_kernels" in commands["kernels-liger"]
    assert _params(shlex.split(commands["seed-overlap"])) == ["host_rank0_owner", "host_overlap_copies"]
    assert _params(shlex.split(commands["seed-prefetch"])) == ["host_rank0_owner", "host_overlap_copies",
                                                                "host_prefetch_grads"]
    assert _params(shlex.split(commands["seed-unfused"])) == ["logits", "expect_failure"]
    assert _params(shlex.split(commands["seed-levers"])) == ["host_rank0_owner", "host_overlap_copies", "rmsnorm",
                                                              "pointwise", "replay_poll_s"]
    assert _params(shlex.split(commands["seed-best"])) == [*_params(shlex.split(commands["seed-levers"])),
                                                            "gpu_memory_utilization"]
    assert _params(shlex.split(commands["h200-1gpu-fast"])) == ["attn_implementation", "use_remove_padding", "logits",
                                                                 "ppo_max_token_len_per_gpu", *_params(
                                                                     shlex.split(commands["seed-levers"]))]
    assert f"runs_dir={tmp_path}/s/learning/runs" in commands["learning"]
    assert f"runs_dir={tmp_path}/s/learning-2gpu/runs" in commands["learning-2gpu"]


@pytest.mark.parametrize("job, profile, tag", [("learning", "h200", "h200-fast"), ("learning-2gpu", "h200-2gpu", "h200-2gpu")])
def test_the_learning_jobs_run_the_profile_and_tag_their_yaml_names(tmp_path, job, profile, tag):
    """Notebook 07's jobs: the profile's parameter file exists and its comment gives the same command (the tag its
    rendering instructions name), so what the node writes is the folder the profile says to render."""
    proc = _driver(tmp_path / "s", job, dry=True)
    words = shlex.split(proc.stdout.split(": ", 1)[1])
    assert words[:6] == ["python3", "-m", "rlkit.experiments.learning", "--profile", profile, "--tag"], words
    assert words[6] == tag
    yaml = REPO_ROOT / "nbs" / "params" / f"{learning.NOTEBOOK}.{profile}.yaml"
    assert f"python -m rlkit.experiments.learning --profile {profile} --tag {tag}" in yaml.read_text()
    # one run of each side per lease, after the runs of earlier leases, which the job copies in from the profile's
    # runs_dir (where they are committed) so that it launches only the missing ones
    assert words[-2:] == ["-p", "launch_limit=2"]
    runs_dir = load_profile(learning.NOTEBOOK, profile)["runs_dir"]
    assert proc.stderr.strip() == f"{job} reads back the runs in {runs_dir}"


def test_an_unknown_job_is_refused_before_anything_runs(tmp_path):
    proc = _driver(tmp_path / "s", "resume-test", "seed-armz")
    assert proc.returncode == 2 and "unknown job 'seed-armz'" in proc.stderr
    assert not (tmp_path / "s").exists()


@pytest.mark.skipif(bool(os.environ.get("CUDA_VISIBLE_DEVICES")) and os.path.exists("/dev/nvidia0"),
                    reason="on a GPU node the resume test runs for real (minutes): -m gpu covers it")
def test_a_job_runs_through_the_real_driver_and_done_is_written_last(tmp_path):
    root = tmp_path / "s"
    proc = _driver(root, "resume-test", timeout=600)
    assert proc.returncode == 0, proc.stderr + (root / "resume-test" / "resume-test.console.log").read_text()
    progress = (root / "progress.txt").read_text().splitlines()
    assert [line.split(" ", 1)[1] for line in progress] == ["resume-test/resume-test start",
                                                            "resume-test/resume-test exit 0",
                                                            "all jobs done (status 0)"]
    console = (root / "resume-test" / "resume-test.console.log").read_text()
    assert "skipped" in console  # no CUDA here: the GPU test skips, and the driver still records its job
    assert (root / "DONE").read_text().strip() == "0"


def test_the_pack_keeps_results_and_leaves_weights_behind(tmp_path):
    """scripts/node_pack.sh: one tarball per job folder and one of the session's own files; weights, data and verl
    checkpoints stay on the node; the sizes are printed with their total."""
    import tarfile

    root, out = tmp_path / "s", tmp_path / "out"
    run = root / "seed-arms" / "h200-seed-1-fixes-hostadamw"
    (run / "global_step_2").mkdir(parents=True)
    for name in ("metrics.json", "model.safetensors", "train.parquet", "global_step_2/optim.pt"):
        (run / name).write_text("x")
    (root / "learning").mkdir()
    (root / "learning" / "progress.txt").write_text("done\n")
    (root / "progress.txt").write_text("all jobs done (status 0)\n")
    (root / "DONE").write_text("0\n")
    proc = subprocess.run(["bash", str(REPO_ROOT / "scripts" / "node_pack.sh"), str(root), str(out)],
                          capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    assert sorted(p.name for p in out.iterdir()) == ["learning.tgz", "seed-arms.tgz", "session.tgz"]
    with tarfile.open(out / "seed-arms.tgz") as tar:
        assert [m.name for m in tar.getmembers() if m.isfile()] == ["seed-arms/h200-seed-1-fixes-hostadamw/metrics.json"]
    with tarfile.open(out / "session.tgz") as tar:
        assert sorted(m.name for m in tar.getmembers()) == ["DONE", "progress.txt"]
    assert proc.stdout.strip().endswith("MiB  total")


def test_a_poll_packs_even_when_the_session_has_not_ended(tmp_path):
    """scripts/node_poll.sh: a poll whose wait runs out still packs what the session has, so a machine that goes back
    after the call takes nothing already polled; one whose session has ended says so."""
    root, out = tmp_path / "s", tmp_path / "out"
    (root / "seed-arm5").mkdir(parents=True)
    (root / "seed-arm5" / "progress.txt").write_text("10:13:56 h200-seed-5 start\n")
    (root / "progress.txt").write_text("10:13:56 seed-arm5/seed-arm5 start\n")
    running = _poll(root, out, "0")
    assert running.returncode == 0, running.stderr
    assert "session still running after 0s" in running.stdout and "h200-seed-5 start" in running.stdout
    assert sorted(p.name for p in out.iterdir()) == ["seed-arm5.tgz", "session.tgz"]
    (root / "DONE").write_text("0\n")
    ended = _poll(root, out, "600")
    assert ended.returncode == 0 and "session ended" in ended.stdout


def test_a_poll_refuses_a_wait_that_is_not_seconds(tmp_path):
    (tmp_path / "s").mkdir()
    proc = _poll(tmp_path / "s", tmp_path, "9m")
    assert proc.returncode == 2 and "SECONDS must be a whole number" in proc.stderr


def test_a_poll_waits_for_the_driver_to_make_its_root(tmp_path):
    """A poll started right after the driver waits for ROOT within its time, and names the fix when ROOT never comes."""
    root = tmp_path / "s"
    poll = subprocess.Popen(_poll_command(root, tmp_path / "out", "30"), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    root.mkdir()
    (root / "DONE").write_text("0\n")
    out, err = poll.communicate(timeout=60)
    assert poll.returncode == 0 and "session ended" in out, err
    missing = _poll(tmp_path / "none", tmp_path / "out", "0")
    assert missing.returncode == 2 and "start scripts/node_session.sh first" in missing.stderr
