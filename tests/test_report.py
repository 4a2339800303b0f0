"""The generated blocks of README.md and docs/*.md come from committed metrics and must match them."""
import shutil
import subprocess

import pytest

from rlkit.core.results import OUTPUTS_DIR, NotACheckout
from rlkit.report import notebooks as report_notebooks
from rlkit.report import sections as report
from rlkit.report import seed_workload as report_seed


def test_docs_match_committed_metrics():
    try:
        stale = report.stale()
    except NotACheckout as err:
        pytest.skip(str(err))
    assert not stale, f"generated blocks of {stale} are stale: run `python -m rlkit.report --write`"


def test_every_block_has_a_home_and_markers():
    from rlkit.core.env import REPO_ROOT

    assert sorted(n for blocks in report.DOCS.values() for n in blocks) == sorted(report.BLOCKS)
    for doc, names in report.DOCS.items():
        text = (REPO_ROOT / doc).read_text()
        for name in names:
            begin, end = report.markers(name)
            assert text.count(begin) == 1 and text.count(end) == 1, (doc, name)
    with pytest.raises(ValueError, match="expected one 'arc' block"):
        report.replace_block("no markers here", "arc", "")


def _git_repo(path):
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    subprocess.run(["git", "init", "-q", str(path)], check=True)
    return path / "outputs"


def test_missing_results_are_said_not_invented(tmp_path):
    root = _git_repo(tmp_path)
    block = report.results_block(root=root)
    assert block.count("no committed GPU results yet") == len(report.SECTIONS) + 2  # + the verl arms and the sweep
    assert "no committed GPU results yet" in report.block("standin", root)
    assert "no committed run of the seed's workload at lr 0 yet" in report.block("arc", root)
    assert "no committed re-runs yet" in report.block("reruns", root)
    assert "no committed runs of the seed's workload yet" in report.block("seed", root)
    assert "07_does_it_learn: no committed GPU runs yet" in report.block("learning", root)


def test_learning_block_reads_each_run_and_the_verdict_from_notebook_07s_metrics(tmp_path):
    """Each run's row (its commit from its own run folder) and the verdict, from the committed metrics; a
    metrics.json whose compared arm falls outside the band at a step says 'not passed'."""
    import json

    root = _git_repo(tmp_path)
    source = OUTPUTS_DIR / "07_does_it_learn"
    for name in ("h200", "h200-runs"):
        shutil.copytree(source / name, root / "07_does_it_learn" / name)
    subprocess.run(["git", "-C", str(tmp_path), "add", "outputs"], check=True)
    metrics = json.loads((source / "h200" / "metrics.json").read_text())
    text = "\n".join(report_notebooks.learning_section(root))
    for name, r in metrics["analysis"]["per_run"].items():
        commit = json.loads((source / "h200-runs" / name / "env.json").read_text())["git_sha"][:7]
        assert f"| {name} | {commit} | {r['steps_trained']} | {r['reward_first']:.3f} | {r['reward_last']:.3f} |" in text
    steps = metrics["analysis"]["compare"]["per_step"]
    assert f"at {steps['within_band']} of {steps['steps']} steps, inside their range at {steps['in_range']}" in text
    (verdict,) = [line for line in text.splitlines() if line.startswith("Noise (")]
    assert verdict.endswith("Verdict: passed." if metrics["analysis"]["verdict"]["passed"] else "Verdict: not passed.")
    before = metrics["analysis_before_collapse"]
    assert f"before the first entropy collapse (1-{before['last_step']})" in text
    metrics["analysis"]["verdict"]["passed"] = False
    (root / "07_does_it_learn" / "h200" / "metrics.json").write_text(json.dumps(metrics))
    assert any(line.startswith("Noise (") and line.endswith("Verdict: not passed.") for line in report_notebooks.learning_section(root))
    assert "lr 0.001, one H200, the runs side by side" in text  # the committed runs predate n_gpus: one GPU each
    metrics["config"]["n_gpus"] = 2
    (root / "07_does_it_learn" / "h200" / "metrics.json").write_text(json.dumps(metrics))
    assert "lr 0.001, two ranks (one GPU each) of H200s, the runs" in report_notebooks.learning_section(root)[0]


def test_seed_block_lists_only_seed_runs_with_their_per_step_lengths(tmp_path):
    """Folders named h200-seed-<arm> are the seed workload's rows (and only they); the drift sentence carries each
    run's per-step response means from its own metrics."""
    import json

    root = _git_repo(tmp_path)
    runs = OUTPUTS_DIR / "05_grpo_qwen3_4b"
    for name in ("h200-seed-5-master-on-host-cast-once", "5-master-on-host-cast-once"):
        shutil.copytree(runs / name, root / "05_grpo_qwen3_4b" / name)
    subprocess.run(["git", "-C", str(tmp_path), "add", "outputs"], check=True)
    lines = report_seed.seed_workload_section(root)
    rows = [line for line in lines if line.startswith("| h200-seed-") or line.startswith("| 5-")]
    assert [r.split(" | ")[0] for r in rows] == ["| h200-seed-5-master-on-host-cast-once"]
    steps = json.loads((runs / "h200-seed-5-master-on-host-cast-once" / "metrics.json").read_text())["steps"]
    means = " -> ".join(f"{s['response_length/mean']:.0f}" for s in steps if "response_length/mean" in s)
    assert f"h200-seed-5-master-on-host-cast-once: {means}" in "\n".join(lines)
    assert "h200-seed" not in "\n".join(report.grpo_arms_section(root))  # the h200 table keeps its own shape


def test_only_results_git_tracks_are_read(tmp_path):
    """A run folder on disk that git does not track (``make demo``'s tiny/, a scratch run) is not a result."""
    root = _git_repo(tmp_path)
    for tag in ("h200", "tiny"):
        shutil.copytree(OUTPUTS_DIR / "01_offload_bug" / "h200", root / "01_offload_bug" / tag)
    assert "*01_offload_bug: no committed GPU results yet.*" in report.results_block(root=root)
    subprocess.run(["git", "-C", str(tmp_path), "add", "outputs/01_offload_bug/h200"], check=True)
    block = report.results_block(root=root)
    assert "**FSDP1 NO_SHARD offload**" in block and "01_offload_bug: no committed" not in block
    from rlkit.core.results import committed_runs

    assert [p.name for p in committed_runs(root / "01_offload_bug")] == ["h200"]


def test_outside_a_checkout_the_report_says_so(tmp_path):
    if subprocess.run(["git", "-C", str(tmp_path), "rev-parse"], capture_output=True, check=False).returncode == 0:
        pytest.skip(f"{tmp_path} is inside a git work tree")
    with pytest.raises(NotACheckout, match="not inside a git checkout"):
        report.results_block(root=tmp_path / "outputs")


def _arm(step_s, peak_gib, *, trained=True, response=256):
    """What arc_summary reads of an arm's metrics.json (outcome() reads launch and steps)."""
    import json

    from conftest import committed_run

    m = json.loads((committed_run(OUTPUTS_DIR / "05_grpo_qwen3_4b/1-fixes-hostadamw") / "metrics.json").read_text())
    m["recipe"] = {**m["recipe"], "max_response_length": response}
    m["summary"] = {**m["summary"], "step_s": step_s, "actor_max_allocated_gib": peak_gib}
    if not trained:
        m["steps"] = []
    return m


def test_arc_summary_judges_the_full_arc_against_the_targets():
    from rlkit.recipes.grpo import ARMS

    later = list(ARMS)[list(ARMS).index(report.FIRST_WORKING_ARM) + 1:]
    base = {report.FIRST_WORKING_ARM: _arm(100.0, 40.0)}
    assert "no complete run yet" in report.arc_summary({})
    partial = report.arc_summary({**base, later[0]: _arm(90.0, 41.0), later[-1]: _arm(50.0, 20.0, response=512)})
    assert f"{later[0]}: step 90.0 s (x0.900), actor peak +1.00 GiB." in partial
    sessions = {report.FIRST_WORKING_ARM: "aaa", later[0]: "bbb"}
    assert "+1.00 GiB (another device session: bbb vs aaa)" in report.arc_summary({**base, later[0]: _arm(90.0, 41.0)}, sessions)
    assert "not measured yet" in partial and later[-1] in partial.split("no complete run of")[1]  # other response length
    one_commit = {a: "aaa" for a in ARMS}
    met = report.arc_summary({**base, later[-1]: _arm(84.0, 33.0)}, one_commit)
    assert "16.0% shorter (target 16%: met)" in met and "7.00 GiB lower (target 7 GiB: met)" in met
    assert f"arms without a complete run: {', '.join(later[:-1])}." in met
    # the same numbers from two commits are not like for like: never "met"
    unlike = report.arc_summary({**base, later[-1]: _arm(84.0, 33.0)}, {**one_commit, later[-1]: "bbb"})
    assert "met" not in unlike.replace("not measured", "").split("Full arc")[1].replace("not judged", "")
    assert "(target 16%: not judged)" in unlike and "not like for like: commit bbb against aaa" in unlike
    missed = report.arc_summary({**base, **{a: _arm(85.0, 33.5) for a in later}}, one_commit)
    assert "15.0% shorter (target 16%: not met)" in missed and "6.50 GiB lower (target 7 GiB: not met)" in missed
    assert "arms without" not in missed
    assert "not measured yet" in report.arc_summary({**base, later[-1]: _arm(50.0, 20.0, trained=False)})


def test_a_seed_variant_is_compared_with_the_run_it_varies(tmp_path):
    """``h200-seed-<arm>-padded`` beside ``h200-seed-<arm>``: a row of its own, and a line comparing the update's
    tokens per second of both (here the variant's update_actor takes twice as long: the base does 2.00x) and the
    step time."""
    import json

    root = _git_repo(tmp_path)
    runs = OUTPUTS_DIR / "05_grpo_qwen3_4b"
    base, variant = "h200-seed-1-fixes-hostadamw", "h200-seed-1-fixes-hostadamw-padded"
    shutil.copytree(runs / base, root / "05_grpo_qwen3_4b" / base)
    shutil.copytree(runs / base, root / "05_grpo_qwen3_4b" / variant)
    metrics_file = root / "05_grpo_qwen3_4b" / variant / "metrics.json"
    metrics = json.loads(metrics_file.read_text())
    for step in metrics["steps"]:
        if "timing_s/update_actor" in step:
            step["timing_s/update_actor"] *= 2
    metrics_file.write_text(json.dumps(metrics))
    subprocess.run(["git", "-C", str(tmp_path), "add", "outputs"], check=True)
    text = "\n".join(report_seed.seed_workload_section(root))
    assert f"| {variant} |" in text and f"| {base} |" in text
    (line,) = [x for x in text.splitlines()  # the steps 2.. line (a copy also has the same step 1: a line of its own)
               if x.startswith(f"- `{variant}` against `{base}`") and "tokens, response mean" not in x]
    assert f"(`{base}` 2.00x the variant's)" in line and "(+0%)" in line  # step_s is the copied summary's
    tokens = report_seed.update_tokens_per_s(json.loads((runs / base / "metrics.json").read_text()))
    assert f"against {tokens:.0f} tokens/s" in line
    assert "Not like for like" not in line  # a copy: the same workload


def test_a_variant_of_another_workload_or_without_steps_says_so(tmp_path):
    """A variant at another synthetic length mean and lr than its base gets its line with what differs, and a
    variant that ran out of memory before its first step gets its outcome instead of empty numbers."""
    import json

    root = _git_repo(tmp_path)
    runs = OUTPUTS_DIR / "05_grpo_qwen3_4b"
    base, other, failed = ("h200-seed-1-fixes-hostadamw", "h200-seed-1-fixes-hostadamw-other",
                           "h200-seed-1-fixes-hostadamw-oom")
    for name in (base, other, failed):
        shutil.copytree(runs / base, root / "05_grpo_qwen3_4b" / name)
    for name, change in ((other, lambda m: m["recipe"].update(response_length_mean=1400, lr=0.0)),
                         (failed, lambda m: (m.update(steps=[]), m["launch"].update(
                             failure={"kind": "torch_oom", "phase": "update_actor"}, returncode=1)))):
        path = root / "05_grpo_qwen3_4b" / name / "metrics.json"
        metrics = json.loads(path.read_text())
        change(metrics)
        path.write_text(json.dumps(metrics))
    subprocess.run(["git", "-C", str(tmp_path), "add", "outputs"], check=True)
    lines = report_seed.seed_workload_section(root)
    (line,) = [x for x in lines if x.startswith(f"- `{other}` against `{base}`") and "tokens, response mean" not in x]
    assert line.endswith("Not like for like: response_length_mean 1400 against 1200; lr 0.0 against 1e-06.")
    (line,) = [x for x in lines if x.startswith(f"- `{failed}` against `{base}`")]
    assert "torch_oom in update_actor" in line and line.endswith("no step to compare.")
    (drift,) = [x for x in lines if x.startswith("Response-length mean per step")]
    assert f"{failed}:" not in drift


def test_step_one_of_the_same_sample_is_compared_and_a_different_sample_is_not(tmp_path):
    """The padded variant and arm 1's lr-0 rerun processed the same tokens at step 1 (their rollouts come before any
    update): one line compares their update speed there and says whether the 1.3x remove-padding target is met.
    A step 1 with other tokens is a different sample, and no line compares it."""
    import json

    root = _git_repo(tmp_path)
    runs = OUTPUTS_DIR / "05_grpo_qwen3_4b"
    variant, rerun = "h200-seed-1-fixes-hostadamw-padded-tok12288", "h200-seed-1-fixes-hostadamw.session10-lr0"
    for name in ("h200-seed-1-fixes-hostadamw", variant, rerun):
        shutil.copytree(runs / name, root / "05_grpo_qwen3_4b" / name)
    subprocess.run(["git", "-C", str(tmp_path), "add", "outputs"], check=True)
    first = [json.loads((runs / n / "metrics.json").read_text())["steps"][0] for n in (variant, rerun)]
    speed = [s["perf/total_num_tokens"] / s["timing_s/update_actor"] for s in first]
    (line,) = [x for x in report_seed.seed_workload_section(root) if x.startswith(f"- `{variant}` against `{rerun}`")]
    assert f"update_actor {speed[0]:.0f} against {speed[1]:.0f} tokens/s" in line
    assert f"{speed[1] / speed[0]:.2f}x the variant's" in line
    assert line.endswith("target 1.3x: met (like for like: one lease, the same commit (957fbb3), profile and settings apart from "
                         "attn_implementation, use_remove_padding, ppo_max_token_len_per_gpu).")
    (steps_line,) = [x for x in report_seed.seed_workload_section(root)
                     if x.startswith(f"- `{variant}` against `h200-seed-1-fixes-hostadamw`:")]
    assert "The planner for the variant at 24,576 tokens: OOM in update_fwd_bwd" in steps_line  # why it ran at 12,288

    metrics_file = root / "05_grpo_qwen3_4b" / rerun / "metrics.json"
    metrics = json.loads(metrics_file.read_text())
    metrics["steps"][0]["perf/total_num_tokens"] *= 1.01
    metrics_file.write_text(json.dumps(metrics))
    assert not [x for x in report_seed.seed_workload_section(root) if x.startswith(f"- `{variant}` against `{rerun}`")]


def _write_profile(root, tag, commit, seconds, grad_scale=1.0, device=None, **config):
    """A committed profile folder: the real h200 profile's metrics with ``config`` and the timed update changed."""
    import json

    m = json.loads((OUTPUTS_DIR / "update_profile" / "h200" / "metrics.json").read_text())
    m["config"].update(config)
    m["device"] = device or m["device"]
    m["timing"]["timed"][0]["seconds"] = seconds
    m["timing"]["warmup"][0]["grad_norm"] *= grad_scale
    folder = root / "update_profile" / tag
    folder.mkdir(parents=True)
    (folder / "metrics.json").write_text(json.dumps(m))
    (folder / "env.json").write_text(json.dumps({"git_sha": commit * 40}))


def test_profiles_of_another_card_or_without_the_optimizer_step_are_no_base_and_repeats_go_together(tmp_path):
    """At one commit on two cards: each lever is held against the base of its own card; a forward-and-backward
    profile (no optimizer step) is neither the fastest update nor another's base, and gets its own line; the runs of
    one lever set go in one row, with their mean, spread and change against the base's mean."""
    from rlkit.report import profile as report_profile

    root = tmp_path / "outputs"
    h100, h200 = "NVIDIA H100 80GB HBM3", "NVIDIA H200"
    _write_profile(root, "h100-base", "c", 10.0, grad_scale=1.001, device=h100)
    _write_profile(root, "h100-base2", "c", 10.2, grad_scale=1.001, device=h100)
    _write_profile(root, "h100-levers", "c", 8.0, grad_scale=1.001, device=h100, overlap_copies=True)
    _write_profile(root, "h100-levers2", "c", 8.4, grad_scale=1.001, device=h100, overlap_copies=True)
    _write_profile(root, "h100-fwd-bwd", "c", 6.0, device=h100, optimizer="none")
    _write_profile(root, "h200-base", "c", 9.0, device=h200)
    _write_profile(root, "h200-levers", "c", 7.9, device=h200, overlap_copies=True)
    lines = report_profile.update_profile_section(root)
    text = "\n".join(lines)
    rows = {line.split(" | ")[0].strip("| "): line for line in lines if line.startswith("| h")}
    assert rows["h200-levers"].endswith("| entropy identical, grad_norm identical |")  # against h200-base, not h100's
    assert rows["h100-fwd-bwd"].endswith("| - |") and "| no optimizer step | 6.00 |" in rows["h100-fwd-bwd"]
    assert "The fastest, h200-levers: 7.90 s (12% below h200-base's 9.00 s at the same commit)" in text
    assert ("Forward and backward alone (no optimizer step), the fastest, h100-fwd-bwd (levers: none): 6.00 s, "
            "22% MFU") in text
    repeats = [line for line in lines if line.startswith("| ccccccc |")]
    assert repeats == ["| ccccccc | NVIDIA H100 80GB HBM3 | none | 2 | 10.00, 10.20 | 10.10 | 0.20 | 22% | - |",
                       "| ccccccc | NVIDIA H100 80GB HBM3 | no optimizer step | 1 | 6.00 | 6.00 | - | 22% | - |",
                       "| ccccccc | NVIDIA H100 80GB HBM3 | overlapped copies | 2 | 8.00, 8.40 | 8.20 | 0.40 | 22% | -19% |"]
    # the H200 ran each set once: no repeats there


def test_profiles_go_side_by_side_against_the_base_of_their_commit(tmp_path):
    """Each lever's profile is held against the profile without levers of its commit and workload: its first update's
    entropy and gradient norm bit for bit or as a relative difference, beside the run-to-run difference of two
    profiles without levers; the fastest against its base and the 40% target; a profile of another commit has no
    base. Only the fastest and its base get the detailed block."""
    from rlkit.report import profile as report_profile

    root = tmp_path / "outputs"

    def profile(tag, commit, seconds, grad_scale=1.0, **levers):
        _write_profile(root, tag, commit, seconds, grad_scale, **levers)

    profile("h200", "a", 10.6, grad_scale=1.00002)
    profile("h200-base", "b", 10.0)
    profile("h200-overlap", "b", 9.0, overlap_copies=True)
    profile("h200-compiled", "b", 8.0, grad_scale=1.001, rmsnorm="compiled", pointwise="compiled")
    lines = report_profile.update_profile_section(root)
    rows = {line.split(" | ")[0].strip("| "): line for line in lines if line.startswith("| h200")}
    assert rows["h200-overlap"].endswith("| overlapped copies | 9.00 | 22% | 87% | 1.30 | 2766 | 1705 | 42.3 | entropy identical, grad_norm identical |")
    assert "| compiled RMSNorm, compiled rotary + SwiGLU | 8.00 |" in rows["h200-compiled"]
    assert rows["h200-compiled"].endswith("| entropy identical, grad_norm 1.0e-03 |")
    assert rows["h200"].endswith("| - |") and rows["h200-base"].endswith("| - |")  # no base of another commit; the base
    assert "Run to run, h200 and h200-base (no levers, the same workload) differ by 2.0e-05" in "\n".join(lines)
    assert "The fastest, h200-compiled: 8.00 s (20% below h200-base's 10.00 s at the same commit)" in "\n".join(lines)
    detailed = [line for line in lines if line.startswith("**One update profiled**")]
    assert [line.split("`")[1] for line in detailed] == ["outputs/update_profile/h200-base/",
                                                          "outputs/update_profile/h200-compiled/"]


def test_issue_24s_targets_judge_the_fastest_correct_variant_against_arm_5_of_its_commit(tmp_path):
    """Arm 5 and three variants of it at one commit: the fastest correct one is judged (its step 40% shorter: the
    step target met); a faster variant that stopped early and one of another commit are no candidates."""
    import json

    from rlkit.report import limits as report_limits

    root = _git_repo(tmp_path)
    runs = OUTPUTS_DIR / "05_grpo_qwen3_4b"
    base = "h200-seed-5-master-on-host-cast-once"
    changes = {"-fast": (0.6, None, None), "-slow": (0.9, None, None), "-stopped": (0.3, 2, None),
               "-elsewhere": (0.2, None, "0123456789abcdef")}
    shutil.copytree(runs / base, root / "05_grpo_qwen3_4b" / base)
    for suffix, (factor, steps, sha) in changes.items():
        folder = root / "05_grpo_qwen3_4b" / (base + suffix)
        shutil.copytree(runs / base, folder)
        metrics = json.loads((folder / "metrics.json").read_text())
        metrics["summary"]["step_s"] *= factor
        if steps:
            metrics["steps"] = metrics["steps"][:steps]
        (folder / "metrics.json").write_text(json.dumps(metrics))
        if sha:
            env = json.loads((folder / "env.json").read_text())
            env["git_sha"] = sha
            (folder / "env.json").write_text(json.dumps(env))
    subprocess.run(["git", "-C", str(tmp_path), "add", "outputs"], check=True)
    (pair,) = report_limits.fastest_pairs(root)
    assert (pair["variant"], pair["base"], pair["shape"]) == (base + "-fast", base, "h200-seed")
    (row,) = [x for x in report_limits.speed_targets_section(root) if x.startswith("| h200-seed |")]
    assert "| -40%: met |" in row
    # the other three from the variant's own phases (a copy of arm 5's: 24% MFU, 0.3% between phases); no ceiling is
    # committed in this repository for the run's shape, so its gen is not measured
    assert row.endswith("| 24%: not met | -: not measured | 0.3%: met |")
    assert "No arm-5 run" in report_limits.speed_targets_section(_git_repo(tmp_path / "empty"))[0]


def test_a_seed_run_outside_issue_23s_length_band_is_named(tmp_path):
    """Arm 1's committed seed run (a mean of 43% of the maximum) inside the band, and a copy whose mean is 10% of it
    outside."""
    import json

    root = _git_repo(tmp_path)
    runs = OUTPUTS_DIR / "05_grpo_qwen3_4b"
    base, short = "h200-seed-1-fixes-hostadamw", "h200-seed-1-fixes-hostadamw-short"
    for name in (base, short):
        shutil.copytree(runs / base, root / "05_grpo_qwen3_4b" / name)
    path = root / "05_grpo_qwen3_4b" / short / "metrics.json"
    metrics = json.loads(path.read_text())
    metrics["summary"]["response_length_mean"] = 0.1 * metrics["recipe"]["max_response_length"]
    path.write_text(json.dumps(metrics))
    subprocess.run(["git", "-C", str(tmp_path), "add", "outputs"], check=True)
    (line,) = [x for x in report_seed.seed_workload_section(root) if x.startswith("Response-length mean against the band")]
    assert line.endswith(f"inside: {base} 43%; outside: {short} 10%.")


def test_a_run_from_a_dirty_tree_says_so_in_its_table_and_a_clean_one_does_not(tmp_path):
    """Issue 46: a result from a tree with uncommitted changes is labelled in every table that shows it."""
    import json

    root = _git_repo(tmp_path)
    for notebook, sha in (("01_offload_bug", "f860009edfe90fc0d7ade08aaaf8e9c62a76964b-dirty"),
                          ("03_cast_once", "1234567edfe90fc0d7ade08aaaf8e9c62a76964b")):
        run = root / notebook / "h200-deterministic"
        shutil.copytree(OUTPUTS_DIR / notebook / "h200-deterministic", run)
        env = json.loads((run / "env.json").read_text())
        (run / "env.json").write_text(json.dumps({**env, "git_sha": sha}))
    subprocess.run(["git", "-C", str(tmp_path), "add", "outputs"], check=True)
    rows = {line.split("|")[1].strip(): line for line in report_notebooks.determinism_section(root) if line.startswith("| 0")}
    assert rows["01_offload_bug"].split("|")[2].strip() == "f860009" + report_notebooks.DIRTY
    assert rows["03_cast_once"].split("|")[2].strip() == "1234567"


def _committed_dirty_commits() -> set[str]:
    """The short commit of every committed run whose env.json records a dirty tree."""
    import json

    from rlkit.core.results import tracked_files

    shas = (json.loads(p.read_text()).get("git_sha") or "" for p in tracked_files(OUTPUTS_DIR) if p.name == "env.json")
    return {sha[:7] for sha in shas if sha.endswith("-dirty")}


def test_every_table_row_of_a_dirty_tree_run_is_labelled():
    try:
        dirty = _committed_dirty_commits()
    except NotACheckout as err:
        pytest.skip(str(err))
    assert dirty, "no committed run is from a dirty tree any more: this test has nothing left to check; drop it"
    rows = [line for doc, names in report.DOCS.items() for name in names
            for line in report.block(name).splitlines() if line.startswith("|")]
    # since session 29's reruns from a commit no generated table shows one (the labelling itself is tested above on a
    # dirty run made for it); a dirty-tree run added to a table without the label turns this red
    shown = [line for line in rows if any(sha in line for sha in dirty)]
    unlabelled = [line for line in shown if report_notebooks.DIRTY not in line or "-dirty" in line]
    assert not unlabelled, f"rows of dirty-tree runs without {report_notebooks.DIRTY!r}: {unlabelled}"


def test_the_skips_net_effect_on_the_step_is_beside_its_pass_saving():
    """Issue 46: the skip saves its pass, and the update it serves may take longer; the step gets the difference."""
    timing = {"old_log_prob_seconds": 3.0, "old_log_prob_skipped_seconds": 0.0, "update_seconds_skip": 14.0,
              "update_seconds_no_skip": 12.0}
    assert "from 15.00 s to 14.00 s: a saving of 1.00 s in the step, against the pass's 3.00 s" in \
        report_notebooks.skip_net(timing)
    slower = report_notebooks.skip_net({**timing, "update_seconds_skip": 16.5})
    assert "from 15.00 s to 16.50 s: a loss of 1.50 s in the step" in slower
    block = report.block("results")
    t = report_notebooks.load_committed("04_skip_old_logprob")["timing"]
    assert report_notebooks.skip_net(t) in block, "the committed skip's net effect is not beside its pass saving"


def test_issue_42s_step_target_is_arithmetic_on_each_correct_arm5_seed_run_at_lr_0():
    """One row per correct arm-5 run of the seed's workload at lr 0 (the stopped session-17 run and the lr 1e-6 run
    are left out), and each run's words say where its gen would have to go against its HBM bound."""
    import json

    from rlkit.planning.roofline import step_cut_needs
    from rlkit.report import limits as report_limits

    lines = report_limits.step_target_section()
    rows = [x.split(" | ")[0].lstrip("| ") for x in lines if x.startswith("| h200-seed-")]
    assert rows == ["h200-seed-5-master-on-host-cast-once.session18", "h200-seed-5-master-on-host-cast-once.session21"]
    for name in rows:
        m = json.loads((OUTPUTS_DIR / "05_grpo_qwen3_4b" / name / "metrics.json").read_text())
        limits = report_limits._limits_row(OUTPUTS_DIR, name, m)
        need = step_cut_needs(m["summary"]["step_s"], limits["update_actor_s"], limits["update_actor_fraction"],
                              limits["gen_s"], 0.25, 0.40)
        (words,) = [x for x in lines if x.startswith(f"- {name}:")]
        side = "below" if need["gen_alone_s"] < limits["gen_hbm_limit_s"] else "above"
        assert f"gen alone would have to take {need['gen_alone_s']:.1f} s, {side} its HBM bound" in words
        assert f"at {need['update_alone_mfu']:.0%} MFU" in words
