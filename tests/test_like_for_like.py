"""rlkit.analysis.like_for_like: a target is judged only on a like-for-like pair, in every block that judges one (issue 41).

The pairs are committed runs of notebook 05, changed one field at a time: each field of the rule turns a like pair
unlike, and the report's blocks then never print "met" for it."""
from __future__ import annotations

import copy
import json
import shutil
import subprocess

import pytest

from rlkit.analysis import like_for_like as lfl
from rlkit.core.results import OUTPUTS_DIR
from rlkit.report.seed_workload import seed_workload_section

RUNS = OUTPUTS_DIR / "05_grpo_qwen3_4b"
PADDED, UNPADDED = "h200-seed-1-fixes-hostadamw-padded-tok12288", "h200-seed-1-fixes-hostadamw.session10-lr0"


def _metrics(name: str) -> dict:
    return json.loads((RUNS / name / "metrics.json").read_text())


@pytest.mark.parametrize("field", [*lfl.PROFILE_FIELDS, *lfl.SETTING_FIELDS])
def test_each_field_of_the_rule_makes_a_pair_unlike(field):
    run = _metrics(UNPADDED)
    other = copy.deepcopy(run)
    other["recipe"][field] = "something else"
    assert lfl.pair(run, run, "abc1234", "abc1234").like
    pairing = lfl.pair(other, run, "abc1234", "abc1234")
    assert not pairing.like and field in pairing.basis
    assert lfl.judge(pairing, True) == "not judged" and lfl.judge(pairing, False) == "not judged"
    assert lfl.pair(other, run, "abc1234", "abc1234", varies=(field,)).like  # the field the comparison is about


def test_another_or_an_unknown_commit_is_unlike():
    run = _metrics(UNPADDED)
    assert not lfl.pair(run, run, "abc1234", "def5678").like
    assert not lfl.pair(run, run, "-", "-").like  # no commit recorded: nothing says they are the same code


def test_the_same_step1_sample_admits_a_step1_comparison_only_and_says_so():
    run = _metrics(UNPADDED)
    other = copy.deepcopy(run)
    other["recipe"]["lr"] = 1e-6
    assert not lfl.pair(other, run, "abc1234", "def5678").like  # steps 2.. differ with the lr
    pairing = lfl.pair(other, run, "abc1234", "def5678", step1=True)
    first = run["steps"][0] if "timing_s/step" in run["steps"][0] else run["steps"][1]
    assert pairing.like and f"the same sampled tokens ({int(first['perf/total_num_tokens']):,})" in pairing.basis
    assert "commit abc1234 against def5678" in pairing.basis and "lr" in pairing.basis
    for step in other["steps"]:  # one token more at step 1: another sample
        if "perf/total_num_tokens" in step:
            step["perf/total_num_tokens"] += 1
            break
    assert not lfl.pair(other, run, "abc1234", "def5678", step1=True).like


def test_another_gpu_is_unlike_even_with_the_same_step1_sample():
    run = {**_metrics(UNPADDED), "gpu": "NVIDIA H200"}
    other = {**copy.deepcopy(run), "gpu": "NVIDIA H100 80GB HBM3"}
    assert lfl.pair(run, dict(run), "abc1234", "abc1234", step1=True).like
    for pairing in (lfl.pair(other, run, "abc1234", "abc1234"), lfl.pair(other, run, "abc1234", "abc1234", step1=True)):
        assert not pairing.like and "GPU 'NVIDIA H100 80GB HBM3' against 'NVIDIA H200'" in pairing.basis
        assert lfl.judge(pairing, True) == "not judged"


def _metrics_at(root, name: str) -> tuple:
    path = root / "05_grpo_qwen3_4b" / name / "metrics.json"
    return path, json.loads(path.read_text())


def _launch_start(root, name: str) -> float:
    return lfl.launch_window(_metrics_at(root, name)[1])[0]


def _set_launch_start(root, name: str, start: float) -> None:
    """Move a run's launch on the node's clock (its plugin records' times) to begin at ``start``."""
    path, m = _metrics_at(root, name)
    shift = start - lfl.launch_window(m)[0]
    for record in m["launch"]["plugin_records"]:
        record["time"] = record["time"] + shift if record.get("time") else record.get("time")
    path.write_text(json.dumps(m))


def test_two_leases_are_unlike_and_the_window_is_the_launches_span():
    run = _metrics(UNPADDED)
    later = copy.deepcopy(run)
    for record in later["launch"]["plugin_records"]:
        record["time"] = record["time"] + lfl.LEASE_S + 1 if record.get("time") else record.get("time")
    pairing = lfl.pair(later, run, "abc1234", "abc1234")
    assert not pairing.like and "not one lease" in pairing.basis and lfl.judge(pairing, True) == "not judged"
    untimed = copy.deepcopy(run)
    untimed["launch"]["plugin_records"] = []
    assert "no launch times recorded" in lfl.pair(untimed, run, "abc1234", "abc1234").basis
    start, end = lfl.launch_window(_metrics(PADDED))
    assert end - start >= _metrics(PADDED)["launch"]["wall_s"]


def _set_gpu(root, name: str, gpu: str) -> None:
    env = root / "05_grpo_qwen3_4b" / name / "env.json"
    saved = json.loads(env.read_text())
    env.write_text(json.dumps({**saved, "gpus": [{**saved["gpus"][0], "name": gpu}]}))


def test_the_arc_is_one_gpu_model(tmp_path):
    """Runs of one commit on two GPU models are two arcs: the one covering more arms is the headline, it names its GPU,
    and arm 5 on the other GPU is neither in its table nor judged against its arm 1."""
    from rlkit.report import arc as report_arc

    arm0, arm1, arm5 = "h200-seed-0-stock", "h200-seed-1-fixes-hostadamw", "h200-seed-5-master-on-host-cast-once"
    root = _repo_with(tmp_path, {f"{arm0}.session1": "h200-seed-0-stock.session19",
                                 f"{arm1}.session1": "h200-seed-1-fixes-hostadamw.session19",
                                 f"{arm5}.session2": "h200-seed-5-master-on-host-cast-once.session18"})
    for name in (f"{arm0}.session1", f"{arm1}.session1", f"{arm5}.session2"):
        _set_commit(root, name, "a" * 40)
    _set_gpu(root, f"{arm5}.session2", "NVIDIA H100 80GB HBM3")
    _, runs, _ = report_arc.arc_runs(root)
    assert sorted(runs) == [f"{arm0}.session1", f"{arm1}.session1"]
    text = "\n".join(report_arc.seed_arc_table(root))
    assert "1 x NVIDIA H200 emulating" in text and f"{arm5}.session2" not in text and ": met" not in text


def _repo_with(tmp_path, names: dict[str, str]):
    """A git repo whose outputs/05_grpo_qwen3_4b holds committed runs copied under new names."""
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    root = tmp_path / "outputs"
    for new, old in names.items():
        shutil.copytree(RUNS / old, root / "05_grpo_qwen3_4b" / new)
    subprocess.run(["git", "-C", str(tmp_path), "add", "outputs"], check=True)
    return root


def _set_commit(root, name: str, sha: str) -> None:
    env = root / "05_grpo_qwen3_4b" / name / "env.json"
    env.write_text(json.dumps({**json.loads(env.read_text()), "git_sha": sha}))


def test_the_remove_padding_target_is_never_met_on_an_unlike_pair(tmp_path):
    """The padded run and arm 1's rerun of its commit meet the 1.3x target like for like; the same two runs with the
    rerun's commit changed are no longer like for like, and no line of the seed block calls the target met."""
    base = "h200-seed-1-fixes-hostadamw"
    root = _repo_with(tmp_path, {base: UNPADDED, f"{base}-padded": PADDED})
    judged = [x for x in seed_workload_section(root) if "Remove-padding target" in x]
    assert judged and all("target 1.3x: met (like for like: one lease, the same commit" in x for x in judged)
    _set_commit(root, base, "f" * 40)
    judged = [x for x in seed_workload_section(root) if "Remove-padding target" in x]
    assert judged and not [x for x in judged if "1.3x: met" in x]
    assert all("target 1.3x: not judged (not like for like: commit" in x for x in judged)


def test_the_arc_is_one_commit_and_arm_5_is_judged_against_arm_1_of_it(tmp_path):
    """The headline takes the commit whose lr-0 seed runs cover the most arms; a run of another commit is not in it;
    arm 5 against arm 1 is judged only when both come from that commit."""
    from rlkit.report import arc as report_arc

    arm1, arm5 = "h200-seed-1-fixes-hostadamw", "h200-seed-5-master-on-host-cast-once"
    root = _repo_with(tmp_path, {f"{arm1}.session1": "h200-seed-1-fixes-hostadamw.session19",
                                 f"{arm1}.session2": "h200-seed-1-fixes-hostadamw.session19",
                                 f"{arm5}.session1": "h200-seed-5-master-on-host-cast-once.session18",
                                 f"{arm5}.session0": "h200-seed-5-master-on-host-cast-once.session17"})
    for name in (f"{arm1}.session1", f"{arm1}.session2", f"{arm5}.session1"):
        _set_commit(root, name, "a" * 40)
    commit, runs, _ = report_arc.arc_runs(root)
    assert commit == "aaaaaaa" and sorted(runs) == [f"{arm1}.session1", f"{arm1}.session2", f"{arm5}.session1"]
    text = "\n".join(report_arc.seed_arc_table(root))
    assert f"{arm5}.session0" not in text and "| 2-skip-old-logprob | - | no run at aaaaaaa yet |" in text
    assert "not like for like: not one lease" in text and "step spread 0.0%" in text  # sessions 18 and 19
    assert ": met" not in text
    assert "its rank-0 owner is a no-op on one rank" not in text  # arm 4 has no run to note

    _set_launch_start(root, f"{arm5}.session1", _launch_start(root, f"{arm1}.session1"))  # now both in one lease
    text = "\n".join(report_arc.seed_arc_table(root))
    assert "like for like: one lease, the same commit (aaaaaaa)" in text

    _set_commit(root, f"{arm5}.session1", "b" * 40)  # arm 5 now from another commit: out of the arc, nothing judged
    text = "\n".join(report_arc.seed_arc_table(root))
    assert "| 5-master-on-host-cast-once | - | no run at aaaaaaa yet |" in text and "not judged" in text
    assert ": met" not in text


def test_an_arc_rerun_from_a_newer_commit_takes_over_on_a_tie(tmp_path):
    from rlkit.report import arc as report_arc

    arm1, arm5 = "h200-seed-1-fixes-hostadamw", "h200-seed-5-master-on-host-cast-once"
    root = _repo_with(tmp_path, {f"{arm1}.session1": "h200-seed-1-fixes-hostadamw.session19",
                                 f"{arm5}.session2": "h200-seed-5-master-on-host-cast-once.session18"})
    git = ["git", "-C", str(tmp_path), "-c", "user.name=t", "-c", "user.email=t@t"]
    shas = []
    for when in ("2026-01-01T00:00:00", "2026-02-01T00:00:00"):
        subprocess.run([*git, "commit", "-q", "--allow-empty", "-m", when], check=True,
                       env={"GIT_COMMITTER_DATE": when, "GIT_AUTHOR_DATE": when, "PATH": "/usr/bin:/bin"})
        shas.append(subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout.strip())
    _set_commit(root, f"{arm1}.session1", shas[1])  # one arm each: the newer commit is the arc
    _set_commit(root, f"{arm5}.session2", shas[0])
    assert report_arc.arc_runs(root)[0] == shas[1][:7]
    _set_commit(root, f"{arm1}.session1", shas[0])
    _set_commit(root, f"{arm5}.session2", shas[1])
    assert report_arc.arc_runs(root)[0] == shas[1][:7]


def test_each_arm_says_its_net_effect_on_the_step_beside_its_own_phase():
    from rlkit.report import arc as report_arc

    base = _metrics("h200-seed-1-fixes-hostadamw.session19")
    skip = copy.deepcopy(base)
    skip["summary"].update(old_log_prob_s=0.1, step_s=base["summary"]["step_s"] + 2.0)  # the pass goes, the step grows
    lines = report_arc.net_effect_lines({"h200-seed-1-fixes-hostadamw.session1": base,
                                         "h200-seed-2-skip-old-logprob.session1": skip}, "abc1234")
    own = base["summary"]["old_log_prob_s"]
    step = base["summary"]["step_s"]
    assert (f"- 2-skip-old-logprob against 1-fixes-hostadamw (like for like: one lease, the same commit (abc1234), "
            f"profile and settings): old_log_prob {own:.1f} -> 0.1 s ({0.1 - own:+.1f} s); "
            f"the whole step {step:.1f} -> {step + 2:.1f} s (+2.0 s, {2 / step:+.1%}).") in lines
    assert "- 3-pinned against 2-skip-old-logprob: not measured yet at this commit." in lines


def test_an_arms_net_effect_from_two_leases_says_not_like_for_like():
    """The committed arms 1 (session 30) and 2 (session 31) at c6ceef4 ran in two leases: their net-effect line says so."""
    from rlkit.report import arc as report_arc

    runs = {n: _metrics(n) for n in ("h200-seed-1-fixes-hostadamw.session30", "h200-seed-2-skip-old-logprob.session31")}
    line = report_arc.net_effect_lines(runs, "c6ceef4")[1]
    assert line.startswith("- 2-skip-old-logprob against 1-fixes-hostadamw (not like for like: not one lease (the "
                           "launches span ")


def test_an_update_actor_miss_names_the_allocators_reserve_and_the_ratio_without_it():
    """Arm 1 at the arc's commit: update_actor's device peak is outside the planner's 10%, and the line names the
    measured cause, the actor's reserved-above-allocated GiB (verl's peaks), with the ratio once it is taken out."""
    from rlkit.experiments.estimates import planner_phase_check
    from rlkit.report import arc as report_arc

    run = _metrics("h200-seed-1-fixes-hostadamw.session30")
    entry = planner_phase_check(run)["update_actor"]
    assert not entry["within"]
    s = run["summary"]
    gap = s["actor_max_reserved_gib"] - s["actor_max_allocated_gib"]
    line = report_arc.phase_check_lines({"arm1": run})[1]
    assert (f"update_actor x{entry['ratio']:.2f} (outside 10%; the actor's allocator reserved {gap:.2f} GiB above its "
            f"peak allocation, which the planner does not count: "
            f"x{(entry['measured_gib'] - gap) / entry['planner_gib']:.2f} without it)") in line
    assert line.count("allocator") == 1  # only the miss names a cause, not the phases within the bar
    del run["summary"]["actor_max_reserved_gib"]  # a run without verl's reserved peak: the miss stays unnamed
    assert f"update_actor x{entry['ratio']:.2f} (outside 10%)" in report_arc.phase_check_lines({"arm1": run})[1]
