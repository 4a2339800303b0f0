"""Notebook 07's pieces on the CPU: the target-character reward, its rows (synthetic and real DAPO), the qwen3-30m
preset, and the experiment's analysis, resume logic and words on made-up verl step records."""
from __future__ import annotations

import dataclasses
import json

import pyarrow.parquet as pq
import pytest

from rlkit.analysis import learning_curves as LC
from rlkit.core import params as P
from rlkit.core.results import load_profile
from rlkit.experiments import learning as L
from rlkit.experiments import learning_runs as LR
from rlkit.models import data, reward
from rlkit.models import offline as offline_model
from rlkit.models import qwen as models
from rlkit.recipes import grpo as R
from rlkit.recipes.overrides import render_overrides

# A row as DAPO-Math-17k publishes it (problem text of the kind it holds; the index is a UUID string).
REAL_ROW = {
    "data_source": "math_dapo",
    "prompt": [{"role": "user", "content": data.PROMPT_PREFIX + "In triangle $ABC$, $AB = 13$, $BC = 14$ and $CA = 15$. "
                "Find the area of the triangle." + data.PROMPT_SUFFIX}],
    "ability": "MATH",
    "reward_model": {"ground_truth": "84", "style": "rule-lighteval/MATH_v2"},
    "extra_info": {"index": "9a9b6eb4-a1cb-49d1-8c1e-62eaf2f74079"},
}


# ------------------------------------------------------------------------------------------ the reward


def _score(text: str, targets: str) -> float:
    return reward.target_chars("math_dapo", text, "7", {"index": "x", reward.TARGET_KEY: targets})["score"]


@pytest.mark.parametrize("text, expected", [
    ("eort", 1.0), ("EORT", 1.0), ("e o\nr\tt  ", 1.0), ("eaoa", 0.5), ("e123", 0.25), ("xyz 987", 0.0),
    ("", 0.0), ("   \n", 0.0), ("<|filler_3|>", 2 / 12),
])
def test_target_chars_is_the_share_of_target_characters(text, expected):
    assert _score(text, "eort") == pytest.approx(expected)


def test_target_chars_is_deterministic_bounded_and_registered():
    texts = [f"response {i} to the rest" * (i % 4) for i in range(50)]
    scores = [_score(t, "eost") for t in texts]
    assert scores == [_score(t, "eost") for t in texts] and all(0.0 <= s <= 1.0 for s in scores)
    assert "target_chars" in reward.REWARDS
    assert reward.verl_overrides("target_chars") == ["reward.custom_reward_function.path=pkg://rlkit.models.reward",
                                                     "reward.custom_reward_function.name=target_chars"]
    assert R.GRPORecipe().resolved_reward == "synthetic_hash"  # auto is unchanged
    assert R.GRPORecipe(model="/models/Qwen3-4B").resolved_reward == "dapo_math"


def test_a_row_without_a_target_set_is_refused():
    with pytest.raises(ValueError, match=r"extra_info\['target_chars'\].*Fix: prepare the data with rlkit.models.data.target_rows"):
        reward.target_chars("math_dapo", "eort", "84", REAL_ROW["extra_info"])


def test_target_set_is_the_prompts_most_used_characters():
    assert reward.target_set_of("ttt eee oo ss r") == "eost"  # counts 3, 3, 2, 2, 1
    assert reward.target_set_of("TTT EEE oo s r") == "eort"  # case-folded; the tie of s and r goes by alphabet order
    assert reward.target_set_of("") == "abcd"  # no counts: alphabet order
    assert reward.target_set_of("zz 99 zz 9", size=2) == "z9"  # in alphabet order, digits after letters
    with pytest.raises(ValueError):
        reward.target_set_of("x", size=0)


def test_a_real_dapo_row_becomes_a_target_row():
    (row,) = data.target_rows([REAL_ROW])
    original = REAL_ROW["prompt"][0]["content"]
    targets = reward.target_set_of(original)
    assert row["extra_info"] == {**REAL_ROW["extra_info"], reward.TARGET_KEY: targets}
    assert row["prompt"][0]["content"] == reward.target_instruction(targets) + original
    assert all(c in row["prompt"][0]["content"].split("\n")[0] for c in targets)  # the first line names the set
    assert row["reward_model"] == REAL_ROW["reward_model"] and row["data_source"] == "math_dapo"
    data.validate_row(row)
    assert data.target_rows([row]) == [row]  # a target row is kept as it is
    assert reward.target_chars("math_dapo", targets * 3, "84", row["extra_info"])["score"] == 1.0
    assert reward.target_chars("math_dapo", "Answer: 84", "84", row["extra_info"])["score"] < 0.5
    assert REAL_ROW["extra_info"] == {"index": "9a9b6eb4-a1cb-49d1-8c1e-62eaf2f74079"}  # the input is not changed


# ------------------------------------------------------------------------------------------ the rows


def test_synthetic_target_rows_share_the_real_parquet_schema(tmp_path):
    synthetic = data.synthetic_dapo(40, seed=1, out_path=tmp_path / "s.parquet", targets=True)
    real_dump = data.write_parquet([REAL_ROW, {**REAL_ROW, "extra_info": {"index": "copy"}}], tmp_path / "dump.parquet")
    real = data.load_dapo(str(real_dump), tmp_path / "real.parquet", targets=True)
    assert real.rows_read == 2 and real.rows == 1  # deduplicated before the conversion
    assert pq.read_schema(real.path).equals(pq.read_schema(synthetic.path))
    assert tuple(pq.read_schema(synthetic.path).names) == data.COLUMNS
    rows = data.read_parquet_rows(synthetic.path)
    assert rows == data.target_rows(data.synthetic_rows(40, seed=1))
    for i, row in enumerate(rows):
        data.validate_row(row, where=f"row {i}")
        targets = row["extra_info"][reward.TARGET_KEY]
        assert row["prompt"][0]["content"].startswith(reward.target_instruction(targets))
    summary = L.task_summary(rows, "target_chars")
    assert summary["rows_set_from_prompt"] == 40 and set(summary["target_sets"]) <= {"eort", "eost"}
    assert data.read_parquet_rows(real.path)[0]["extra_info"][reward.TARGET_KEY] == reward.target_set_of(
        REAL_ROW["prompt"][0]["content"])


def test_the_recipe_writes_target_rows_for_the_target_reward(tmp_path):
    r = R.GRPORecipe(model="tiny", reward="target_chars", data_rows=32)
    paths = R.default_paths(r)
    assert paths.train_file.endswith("synthetic-dapo-32-seed0-targets.parquet")
    assert R.default_paths(dataclasses.replace(r, reward="auto")).train_file.endswith("synthetic-dapo-32-seed0.parquet")
    assert data.default_path("/x/dapo.parquet", 0, targets=True).name == "dapo-math-17k.dedup-targets.parquet"
    ov = render_overrides(r, R.Paths(model="/m", train_file=paths.train_file))
    assert "reward.custom_reward_function.name=target_chars" in ov
    info = data.prepare("synthetic", rows=32, out_dir=tmp_path, targets=True)
    assert info.path == str(tmp_path / "synthetic-dapo-32-seed0-targets.parquet")
    assert all(reward.TARGET_KEY in row["extra_info"] for row in data.read_parquet_rows(info.path))


def test_reward_examples_on_rows_score_what_they_must():
    rows = data.target_rows([REAL_ROW, *data.synthetic_rows(3)])
    examples = L.reward_examples(rows, n_rows=3)
    assert len(examples) == 15 and {e["row"] for e in examples} == {0, 1, 2}
    assert all(e["score"] == e["expected"] for e in examples if e["expected"] is not None)
    assert all(0.0 <= e["score"] <= 1.0 for e in examples)


# ------------------------------------------------------------------------------------------ the model


def test_qwen3_30m_is_a_qwen3_of_tens_of_millions_of_parameters():
    import torch
    from transformers import AutoModelForCausalLM

    config = models.preset_config("qwen3-30m")
    assert config.model_type == "qwen3" and config.tie_word_embeddings
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    assert type(model).__name__ == "Qwen3ForCausalLM"
    n = models.count_parameters(model)
    h, layers, vocab, inter = config.hidden_size, config.num_hidden_layers, config.vocab_size, config.intermediate_size
    q, kv = config.num_attention_heads * config.head_dim, config.num_key_value_heads * config.head_dim
    per_layer = h * q + 2 * h * kv + q * h + 3 * h * inter + 2 * h + 2 * config.head_dim
    assert n == vocab * h + layers * per_layer + h == 30_681_728
    assert 10_000_000 <= n < 100_000_000


def test_qwen3_30m_vocabulary_is_nearly_all_learned_tokens():
    """The offline tokenizer learns about as many tokens as the preset has ids, so sampled ids decode to text,
    not to <|filler_N|> padding."""
    config = models.preset_config("qwen3-30m")
    tokenizer = offline_model.build_tokenizer(data.corpus(data.synthetic_rows(2000)), config.vocab_size,
                                              config.bos_token_id, config.eos_token_id)
    fillers = [t for t in tokenizer.get_vocab() if t.startswith("<|filler_")]
    assert len(tokenizer) == config.vocab_size and len(fillers) < 0.01 * config.vocab_size


def test_probe_scores_the_untrained_models_samples(tmp_path):
    out = offline_model.write_offline_model("tiny", tmp_path / "m", dtype="float32", device="cpu",
                                            texts=data.corpus(data.synthetic_rows(200)))
    rows = data.target_rows(data.synthetic_rows(4))
    probe = L.probe_model(out["path"], rows, groups=2, samples=3, max_tokens=8)
    assert [len(g["scores"]) for g in probe["groups"]] == [3, 3]
    assert all(0.0 <= s <= 1.0 for g in probe["groups"] for s in g["scores"]) and 0.0 <= probe["mean"] <= 1.0
    assert probe == L.probe_model(out["path"], rows, groups=2, samples=3, max_tokens=8)  # seeded


# ------------------------------------------------------------------------------------------ the analysis


def _steps(rewards, **metrics):
    return [{"step": i + 1, "timing_s/step": 5.0, "critic/score/mean": r, "actor/grad_norm": 0.5, "actor/pg_loss": -0.01,
             "actor/entropy": 8.0 - 0.1 * i, "response_length/mean": 128.0, **metrics} for i, r in enumerate(rewards)]


RISING = [0.01 + 0.01 * i for i in range(40)]
BASE, COMP, FAST = "1-fixes-hostadamw", "5-master-on-host-cast-once", "5-fastest"
CRITERIA = {"baseline_arm": BASE, "compare_arm": COMP, "window": 5, "min_gain": 0.05, "noise_factor": 2.0,
            "noise_floor": 0.02}


def _runs(r1, comp, r2):
    return {f"{BASE}.r1": {"arm": BASE, "steps": _steps(r1)}, f"{COMP}.r1": {"arm": COMP, "steps": _steps(comp)},
            f"{BASE}.r2": {"arm": BASE, "steps": _steps(r2)}}


def _c(a):  # the one compared run of _runs
    return a["compared"][f"{COMP}.r1"]


def test_analysis_passes_when_every_run_learns_alike():
    wiggle = [v + (0.01 if i % 2 else -0.01) for i, v in enumerate(RISING)]
    a = LC.analyze(_runs(RISING, [v + 0.005 for v in RISING], wiggle), **CRITERIA)
    first, last = sum(RISING[:5]) / 5, sum(RISING[-5:]) / 5
    assert a["per_run"][f"{BASE}.r1"]["reward_first"] == pytest.approx(first)
    assert a["per_run"][f"{BASE}.r1"]["gain"] == pytest.approx(last - first) and a["per_run"][f"{BASE}.r1"]["learned"]
    assert a["noise"]["curve_distance"] == pytest.approx(0.01)
    assert _c(a)["mean_distance"] == pytest.approx((0.005 + 0.01) / 2)
    assert _c(a)["threshold"] == pytest.approx(0.02) and _c(a)["within_noise"]
    assert a["verdict"]["passed"] and a["verdict"]["all_learned"]


def test_a_flat_curve_is_reported_as_not_learning():
    flat = [0.01] * 40
    a = LC.analyze(_runs(flat, flat, flat), **CRITERIA)
    assert all(r["learned"] is False and r["gain"] == 0.0 for r in a["per_run"].values())
    assert _c(a)["within_noise"]  # three flat curves agree, and still nothing learned
    assert a["verdict"]["all_learned"] is False and not a["verdict"]["passed"]
    assert "does NOT learn" in L.describe(_metrics(a, _runs(flat, flat, flat)))


def test_an_arm_outside_the_repeats_noise_fails():
    a = LC.analyze(_runs(RISING, [0.01] * 40, [v + 0.002 for v in RISING]), **CRITERIA)
    assert a["per_run"][f"{COMP}.r1"]["learned"] is False
    assert _c(a)["mean_distance"] > _c(a)["threshold"] and _c(a)["within_noise"] is False
    assert not a["verdict"]["passed"]
    lower = LC.analyze(_runs(RISING, [v - 0.1 for v in RISING], RISING), **CRITERIA)
    assert lower["per_run"][f"{COMP}.r1"]["learned"] and _c(lower)["within_noise"] is False  # learns, less
    assert _c(lower)["last_window_difference"] == pytest.approx(-0.1)
    assert lower["noise"]["curve_distance"] == 0.0 and _c(lower)["threshold"] == 0.02  # identical repeats: floor


def test_one_step_outside_the_band_fails_though_the_mean_distance_is_within():
    jump = [v + (0.3 if i == 20 else 0.0) for i, v in enumerate(RISING)]
    a = LC.analyze(_runs(RISING, jump, [v + 0.01 for v in RISING]), **CRITERIA)
    assert _c(a)["within_noise"] and _c(a)["mean_distance"] < _c(a)["threshold"]
    steps = _c(a)["per_step"]
    assert steps["steps"] == 40 and steps["within_band"] == 39 and steps["in_range"] == 39  # it equals r1 elsewhere
    assert steps["worst"]["step"] == 21 and steps["worst"]["difference"] == pytest.approx(0.295)
    assert _c(a)["every_step_within_band"] is False and not a["verdict"]["passed"]
    assert "at every step: False" in L.describe(_metrics(a, _runs(RISING, jump, RISING)))


def test_per_step_band_counts_the_range_and_the_band_at_each_step():
    r1, r2 = [[1, 0.1], [2, 0.2], [3, 0.3]], [[1, 0.12], [2, 0.2], [3, 0.3]]
    band = LC.per_step_band([[1, 0.13], [2, 0.2], [3, 0.5]], [r1, r2], noise_factor=2.0, noise_floor=0.02)
    assert band["steps"] == 3 and band["in_range"] == 1 and band["within_band"] == 2  # step 1: outside the range, in
    assert band["worst"] == {"step": 3, "difference": pytest.approx(0.2), "band": 0.02, "in_range": False,
                             "within_band": False}
    assert band["expected_in_range"] == pytest.approx(1 / 3) and "rising" not in band  # no plateau given: no split
    assert LC.per_step_band(r1, [r1], noise_factor=2.0, noise_floor=0.02) is None  # one repeat: no spread


def test_entropy_collapse_is_the_first_step_at_one_percent_of_the_first():
    assert LC.entropy_collapse([[1, 8.0], [2, 1.0], [3, 0.08], [4, 0.01]]) == 3
    assert LC.entropy_collapse([[1, 8.0], [2, 7.0]]) is None and LC.entropy_collapse([]) is None


def test_the_analysis_before_the_collapse_reads_only_the_steps_before_it():
    runs = _runs(RISING, RISING, RISING)
    for i, step in enumerate(runs[f"{BASE}.r2"]["steps"]):
        step["actor/entropy"] = 8.0 if i < 14 else 0.05  # step 15: below 1% of step 1's
    a = LC.analyze(runs, **CRITERIA)
    assert a["per_run"][f"{BASE}.r2"]["entropy_collapsed_at"] == 15 and a["per_run"][f"{BASE}.r1"]["entropy_collapsed_at"] is None
    before = LC.analyze_before_collapse(runs, a)
    assert before["last_step"] == 14 and before["criteria"] == a["criteria"]
    assert {r["steps_trained"] for r in before["per_run"].values()} == {14}
    assert before["per_run"][f"{BASE}.r1"]["reward_last"] == pytest.approx(sum(RISING[9:14]) / 5)
    assert LC.analyze_before_collapse(_runs(RISING, RISING, RISING), LC.analyze(_runs(RISING, RISING, RISING), **CRITERIA)) is None


def test_runs_without_steps_give_no_verdict():
    a = LC.analyze({f"{BASE}.r1": {"arm": BASE, "steps": []}, f"{COMP}.r1": {"arm": COMP, "steps": []}}, **CRITERIA)
    assert a["per_run"] == {} and a["compared"] == {} and a["compare_spread"] is None and a["rising"] is None
    assert a["verdict"] == {"runs_analyzed": 0, "baseline_runs": 0, "compare_runs": 0, "all_learned": None,
                            "compare_within_noise": None, "compare_every_step_within_band": None,
                            "compare_spread_within_noise": None, "passed": False}
    short = LC.analyze(_runs(RISING[:6], RISING[:6], RISING[:6]), **CRITERIA)  # fewer than 2 x window steps
    assert all(r["learned"] is None for r in short["per_run"].values()) and not short["verdict"]["passed"]


def test_curves_come_from_the_trained_steps():
    steps = [{"step": 0, "val/score": 0.0}, *_steps([0.1, 0.2])]
    c = LC.curves(steps)
    assert c["reward"] == [[1, 0.1], [2, 0.2]] and c["entropy"] == [[1, 8.0], [2, pytest.approx(7.9)]]
    assert set(c) == set(LC.CURVES)
    assert LC.curve_distance([[1, 0.1], [2, 0.3]], [[2, 0.1], [3, 0.0]]) == pytest.approx(0.2)
    assert LC.curve_distance([[1, 0.1]], [[2, 0.1]]) is None


# ------------------------------------------------------------------------------------------ the experiment


def _cfg(**changes) -> L.Config:
    return P.build(L.Config, {**load_profile(L.NOTEBOOK, "tiny"), **changes})


def _metrics(analysis, runs, launched=True):
    cfg = _cfg(steps=40, window=5)
    return {"config": P.as_dict(cfg), "synthetic": {"task": True, "model": True},
            "task": {"reward": "target_chars", "target_sets": {"eort": 3}, "rows_set_from_prompt": 3, "rows": 3},
            "data": {"rows": 3, "source": "synthetic"}, "model": {"parameters": 30_681_728}, "probe": None,
            "plan": [{"run": n, "arm": r["arm"]} for n, r in runs.items()], "pending": [], "launched": launched,
            "launch_reason": "no GPU", "analysis": analysis,
            "runs": {n: {"arm": r["arm"]} for n, r in runs.items()}, "curves": {n: LC.curves(r["steps"]) for n, r in runs.items()}}


@pytest.mark.parametrize("profile", ["tiny", "h200"])
def test_profiles_are_valid_configs_whose_recipes_are_valid(profile):
    values = load_profile(L.NOTEBOOK, profile)
    assert set(values) == set(P.field_names(L.Config))
    cfg = P.build(L.Config, values)
    plan = LR.run_plan(cfg)
    assert [side for _, side in plan] == [BASE, FAST, BASE, FAST] and len({n for n, _ in plan}) == 4
    recipes = [LR.build_recipe(cfg, side) for _, side in plan]
    assert recipes[0] == recipes[2] and recipes[1] == recipes[3] and recipes[0].patches != recipes[1].patches
    assert all(r.n_gpus == 1 and r.reward == "target_chars" and r.steps == cfg.steps for r in recipes)
    fast = P.as_dict(recipes[1])
    assert {k: v for k, v in fast.items() if k in R.ARMS[COMP] and k not in cfg.compare_overrides} == {
        k: v for k, v in R.ARMS[COMP].items() if k not in cfg.compare_overrides}
    # every lever of the fastest correct variant that changes the computation (scripts/node_session.sh, seed-best)
    assert fast["host_overlap_copies"] and not fast["host_rank0_owner"] and fast["logits"] == "chunked"
    assert fast["rmsnorm"] == fast["pointwise"] == "compiled" and fast["replay_poll_s"] == 0.2
    assert fast["attn_implementation"] == "rlkit_varlen" and fast["use_remove_padding"]
    assert {"chunked_logprobs", "compiled_rmsnorm", "compiled_pointwise", "replay_poll",
            "varlen_attention"} <= set(recipes[1].active_patches)
    assert fast["gpu_memory_utilization"] == cfg.gpu_memory_utilization  # the card is shared: not seed-best's 0.95
    assert cfg.repeats >= 2 and cfg.compare_repeats >= 2
    if profile == "h200":
        assert cfg.parallel == len(plan) and cfg.runs_dir  # its steps: test_learning_analysis, from a measured rise
        assert cfg.parallel * cfg.gpu_memory_utilization <= 0.8 + 1e-9  # the side-by-side runs fit one card


@pytest.mark.parametrize("changes, key", [({"repeats": 1}, "repeats"), ({"compare_repeats": 1}, "compare_repeats"),
                                          ({"compare_arm": "0-stock"}, "compare_arm"),
                                          ({"compare_arm": BASE, "compare_overrides": {}}, "compare_arm"),
                                          ({"compare_name": BASE}, "compare_name"),
                                          ({"compare_name": "a/b"}, "compare_name"), ({"window": 2}, "window"),
                                          ({"min_gain": 0.0}, "min_gain"), ({"launch_limit": -1}, "launch_limit"),
                                          ({"parallel": 0}, "parallel")])
def test_bad_config_names_the_key_and_fix(changes, key):
    with pytest.raises(P.ParamError, match=rf"Config\.{key}: .*Fix: "):
        _cfg(**changes)


def test_runs_resume_from_runs_dir_within_the_launch_limit(tmp_path, monkeypatch):
    """Repeating the command adds one launched run each time; launched runs are read back, never launched twice."""
    from rlkit.experiments import grpo

    launched = []

    def fake_run(recipe, out_dir, how_to_run):
        launched.append(out_dir.name)
        (out_dir / "verl.log").write_text("")
        return {"recipe": P.as_dict(recipe), "launched": True, "launch_reason": "1 GPU", "launch": {"failure": None},
                "steps": _steps(RISING[: recipe.steps]), "summary": {"step_s": 5.0}, "verify": {}}

    monkeypatch.setattr(grpo, "run", fake_run)
    cfg = _cfg(runs_dir=str(tmp_path / "runs"), launch_limit=1, steps=4, window=2)
    done, pending = LR.run_all(cfg, tmp_path / "out")
    assert list(done) == [f"{BASE}.r1"] and pending == [f"{FAST}.r1", f"{BASE}.r2", f"{FAST}.r2"]
    done, pending = LR.run_all(cfg, tmp_path / "out")
    assert done[f"{BASE}.r1"]["reused"] == "read back" and done[f"{FAST}.r1"]["reused"] is None and len(pending) == 2
    assert done[f"{FAST}.r1"]["arm"] == COMP and done[f"{FAST}.r1"]["variant"] == FAST
    for _ in range(2):
        done, pending = LR.run_all(cfg, tmp_path / "out")
    assert not pending and len(launched) == 4 and sorted(p.name for p in (tmp_path / "runs").iterdir()) == sorted(done)
    assert json.loads((tmp_path / "runs" / f"{BASE}.r2" / "metrics.json").read_text())["launched"]
    with pytest.raises(P.ParamError, match="another recipe"):
        LR.run_all(dataclasses.replace(cfg, lr=3e-4), tmp_path / "out")


def test_parallel_runs_go_side_by_side_and_one_failure_lets_the_others_finish(tmp_path, monkeypatch):
    """parallel 4 on a GPU: the four runs (each repeat's recipe identical to its first's) are in flight at once, each
    written whole; when one fails, the others still finish and are saved, and the failure is raised after them."""
    import threading

    from rlkit.experiments import grpo
    from rlkit.recipes import job as verl_job

    monkeypatch.setattr(verl_job, "gpu_count", lambda: 1)
    together = threading.Barrier(4, timeout=10)  # breaks (and the test fails) unless all four are in flight at once

    def fake_run(recipe, out_dir, how_to_run):
        together.wait()
        if failing and failing in out_dir.name:  # the work folder: .<name>.partial-<pid>
            raise RuntimeError("verl exited with 1")
        return {"recipe": P.as_dict(recipe), "launched": True, "launch_reason": "1 GPU", "launch": {"failure": None},
                "steps": _steps(RISING[: recipe.steps]), "summary": {"step_s": 5.0}, "verify": {}}

    monkeypatch.setattr(grpo, "run", fake_run)
    failing = ""
    cfg = _cfg(runs_dir=str(tmp_path / "runs"), parallel=4, steps=4, window=2)
    done, pending = LR.run_all(cfg, tmp_path / "out")
    assert list(done) == [n for n, _ in LR.run_plan(cfg)] and not pending
    assert all(e["reused"] is None and e["metrics"]["launched"] for e in done.values())

    failing, together = f"{FAST}.r1", threading.Barrier(4, timeout=10)
    cfg = dataclasses.replace(cfg, runs_dir=str(tmp_path / "runs2"))
    with pytest.raises(RuntimeError, match="verl exited with 1"):
        LR.run_all(cfg, tmp_path / "out")
    kept = {p.name for p in (tmp_path / "runs2").iterdir()}
    assert {f"{BASE}.r1", f"{BASE}.r2", f"{FAST}.r2"} <= kept and f"{FAST}.r1" not in kept, kept  # the failed run: no result
    assert all((tmp_path / "runs2" / n / "metrics.json").exists() for n in (f"{BASE}.r1", f"{BASE}.r2"))


def test_an_interrupt_while_runs_wait_side_by_side_stops_their_sessions(tmp_path, monkeypatch):
    """The runs wait in the pool's threads, where an interrupt does not reach them: the waiting thread stops every
    verl session in flight itself, then the interrupt goes on."""
    import concurrent.futures

    from rlkit.experiments import grpo
    from rlkit.recipes import job as verl_job

    stopped = []
    monkeypatch.setattr(verl_job, "gpu_count", lambda: 1)
    monkeypatch.setattr(verl_job, "stop_running_sessions", lambda: stopped.append(True))
    monkeypatch.setattr(grpo, "run", lambda recipe, out_dir, how_to_run: {
        "recipe": P.as_dict(recipe), "launched": True, "launch_reason": "1 GPU", "launch": {"failure": None},
        "steps": _steps(RISING[: recipe.steps]), "summary": {}, "verify": {}})

    def interrupted(futures, *args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(concurrent.futures, "wait", interrupted)
    with pytest.raises(KeyboardInterrupt):
        LR.run_all(_cfg(runs_dir=str(tmp_path / "runs"), parallel=3, steps=4, window=2), tmp_path / "out")
    assert stopped == [True]


def test_a_repeat_not_launched_is_not_checked_twice(tmp_path, monkeypatch):
    from rlkit.experiments import grpo

    calls = []

    def fake_run(recipe, out_dir, how_to_run):
        calls.append(out_dir.name)
        return {"recipe": P.as_dict(recipe), "launched": False, "launch_reason": f"no GPU; {how_to_run}", "steps": [],
                "summary": {}, "verify": {"active_patches": list(recipe.patches)}}

    monkeypatch.setattr(grpo, "run", fake_run)
    done, pending = LR.run_all(_cfg(), tmp_path)
    assert len(calls) == 2 and not pending and done[f"{BASE}.r2"]["reused"] == f"not launched, as {BASE}.r1"
    row = LR.run_row(f"{BASE}.r2", done[f"{BASE}.r2"])
    assert row["outcome"] == "not launched" and "rlkit.experiments.learning" in row["launch_reason"]
    assert row["folder"] == f"runs/{BASE}.r1"


def test_describe_and_figures_read_only_metrics():
    runs = _runs(RISING, RISING, RISING)
    metrics = _metrics(LC.analyze(runs, **CRITERIA), runs)
    text = L.describe(metrics)
    assert "learns" in text and "within the noise" in text and "30,681,728 parameters" in text
    assert "No run was launched: no GPU" in L.describe({**metrics, "launched": False})
    assert "Speed is not what this measures" not in text  # no run recorded its limits
    runs = {n: {**r, "update_actor_mfu": f} for (n, r), f in zip(metrics["runs"].items(), (0.0009, 0.0012, 0.001))}
    assert "update_actor at 0.09%-0.12% of the GPU's dense bf16 peak" in L.describe({**metrics, "runs": runs})
    from rlkit.viz import learning as V

    assert len(V.curve_figure(metrics).data) == 3 and len(V.curves_grid(metrics).data) == 12


def test_cli_refuses_bad_parameters(capsys):
    assert L.main(["--profile", "tiny", "-p", "repeats=1"]) == 2
    assert "Config.repeats" in capsys.readouterr().err
