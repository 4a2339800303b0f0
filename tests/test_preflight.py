"""Config pre-flight: parsing, every trap triggered and not triggered, patches, planner finding, CLI."""
import io
import json
from contextlib import redirect_stdout
from pathlib import Path

import pytest

from rlkit.planning import preflight as PF
from rlkit.verl import config as VC

# A clean config: every trap below is off (vLLM, util in band, per-GPU keys, log stats on, eager, FSDP2).
CLEAN = [
    "actor_rollout_ref.rollout.name=vllm",
    "actor_rollout_ref.rollout.gpu_memory_utilization=0.6",
    "actor_rollout_ref.rollout.max_num_batched_tokens=4096",
    "actor_rollout_ref.rollout.disable_log_stats=False",
    "actor_rollout_ref.rollout.enforce_eager=True",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
    "actor_rollout_ref.actor.strategy=fsdp2",
    "data.max_prompt_length=256",
    "data.max_response_length=256",
    "trainer.n_gpus_per_node=2",
]


def findings(extra=(), patches=(), **kw):
    kw.setdefault("env", {})
    kw.setdefault("ray_version", "2.60.0")
    return PF.check_overrides(CLEAN + list(extra), active_patches=list(patches), **kw)


def by_check(found, name):
    return [f for f in found if f.check == name]


def test_clean_config_has_no_warnings_or_errors():
    found = findings()
    assert [f for f in found if f.severity != "info"] == []


def test_parse_overrides():
    tree = VC.parse_overrides(["a.b=1", "+a.c=[x, y]", "++d='error'", "e.f=True", "a.g=null", "a.h=", "~a.b"])
    assert tree == {"a": {"c": ["x", "y"], "g": None, "h": ""}, "d": "error", "e": {"f": True}}
    with pytest.raises(VC.PreflightInputError, match="not KEY=VALUE"):
        VC.parse_overrides(["a.b"])
    with pytest.raises(VC.PreflightInputError, match="dotted"):
        VC.parse_overrides(["a..b=1"])
    with pytest.raises(VC.PreflightInputError, match="section"):
        VC.parse_overrides(["a=1", "a.b=2"])


def test_overrides_from_command():
    text = ("# comment\nuv run --frozen --extra vllm \\\n  python3 -m verl.trainer.main_ppo \\\n"
            "  algorithm.adv_estimator=grpo \\\n  data.truncation='error' \\\n  trainer.logger=[console]\n")
    assert VC.overrides_from_command(text) == [
        "algorithm.adv_estimator=grpo", "data.truncation=error", "trainer.logger=[console]"]


def test_unknown_patch_is_an_error():
    with pytest.raises(VC.PreflightInputError, match="patch"):
        findings(patches=["offload_view"])


@pytest.mark.parametrize("util", [0.0, 1.5, "high"])
def test_util_out_of_range_is_error(util):
    f = by_check(findings([f"actor_rollout_ref.rollout.gpu_memory_utilization={util}"]), "gpu_memory_utilization")
    assert [x.severity for x in f] == ["error"]


def test_util_sglang_semantics():
    f = by_check(findings(["actor_rollout_ref.rollout.name=sglang"]), "gpu_memory_utilization")
    assert f and f[0].severity == "warning" and "FREE memory" in f[0].message
    assert by_check(findings(), "gpu_memory_utilization") == []


def test_util_band():
    low = by_check(findings(["actor_rollout_ref.rollout.gpu_memory_utilization=0.4"]), "gpu_memory_utilization")
    assert [x.severity for x in low] == ["warning"]
    high = by_check(findings(["actor_rollout_ref.rollout.gpu_memory_utilization=0.85"]), "gpu_memory_utilization")
    assert [x.severity for x in high] == ["warning"]
    offloaded = by_check(findings(["actor_rollout_ref.rollout.gpu_memory_utilization=0.85",
                                   "actor_rollout_ref.actor.fsdp_config.param_offload=True"]),
                         "gpu_memory_utilization")
    assert [x.severity for x in offloaded] == ["info"]


def test_max_num_batched_tokens():
    f = by_check(findings(["actor_rollout_ref.rollout.max_num_batched_tokens=2048"]), "max_num_batched_tokens")
    assert [x.key for x in f] == ["actor_rollout_ref.rollout.max_num_batched_tokens"]
    assert by_check(findings(["actor_rollout_ref.rollout.max_num_batched_tokens=2049"]), "max_num_batched_tokens") == []


def test_deprecated_micro_batch_keys():
    f = by_check(findings(["actor_rollout_ref.rollout.log_prob_micro_batch_size=16"]), "deprecated_micro_batch")
    assert [(x.severity, x.key) for x in f] == [("warning", "actor_rollout_ref.rollout.log_prob_micro_batch_size")]
    both = by_check(findings(["actor_rollout_ref.actor.ppo_micro_batch_size=8"]), "deprecated_micro_batch")
    assert [x.severity for x in both] == ["error"]
    assert by_check(findings(["actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=16"]),
                    "deprecated_micro_batch") == []


def test_dynamic_bsz_token_floor():
    on = "actor_rollout_ref.actor.use_dynamic_bsz=True"
    warn = by_check(findings([on, "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=1000"]), "dynamic_bsz_floor")
    # floor 2 x (256 + 256) = 1024; the rollout/ref forward limits follow the actor's by default
    assert {x.key for x in warn} == {"actor_rollout_ref.actor.ppo_max_token_len_per_gpu",
                                     "actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu",
                                     "actor_rollout_ref.ref.log_prob_max_token_len_per_gpu"}
    assert all(x.severity == "warning" and "1024" in x.fix for x in warn)
    err = by_check(findings([on, "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=500",
                             "actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu=4096",
                             "actor_rollout_ref.ref.log_prob_max_token_len_per_gpu=4096"]), "dynamic_bsz_floor")
    assert [(x.severity, x.key) for x in err] == [("error", "actor_rollout_ref.actor.ppo_max_token_len_per_gpu")]
    assert by_check(findings([on, "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=1024"]), "dynamic_bsz_floor") == []
    assert by_check(findings(["actor_rollout_ref.actor.ppo_max_token_len_per_gpu=10"]), "dynamic_bsz_floor") == []


def test_disable_log_stats():
    default = [x for x in CLEAN if "disable_log_stats" not in x]
    f = PF.check_overrides(default, active_patches=[], env={}, ray_version=None)
    assert [x.severity for x in by_check(f, "disable_log_stats")] == ["warning"]
    assert by_check(findings(), "disable_log_stats") == []


def test_cuda_graph_memory():
    ignored = by_check(findings(["actor_rollout_ref.rollout.cudagraph_capture_sizes=[1,2,4]"]), "cuda_graphs")
    assert [x.severity for x in ignored] == ["warning"]
    captured = by_check(findings(["actor_rollout_ref.rollout.enforce_eager=False"]), "cuda_graphs")
    assert [x.severity for x in captured] == ["info"] and "cannot be offloaded" in captured[0].message
    assert by_check(findings(), "cuda_graphs") == []


def test_ray_uv_hook():
    env_on = {"RAY_ENABLE_UV_RUN_RUNTIME_ENV": "1"}
    assert [x.severity for x in by_check(findings(env=env_on), "ray_uv_hook")] == ["error"]
    assert by_check(findings(env=env_on, ray_version="2.46.0"), "ray_uv_hook") == []
    assert by_check(findings(env={"RAY_ENABLE_UV_RUN_RUNTIME_ENV": "0"}), "ray_uv_hook") == []
    uv = by_check(findings(["+ray_kwargs.ray_init.runtime_env.py_executable='uv run python'"]), "ray_uv_hook")
    assert [x.severity for x in uv] == ["warning"]
    assert by_check(findings(["+ray_kwargs.ray_init.runtime_env.py_executable=/opt/venv/bin/python"]), "ray_uv_hook") == []


FSDP1_SIZE1 = ["actor_rollout_ref.actor.strategy=fsdp", "actor_rollout_ref.actor.fsdp_config.fsdp_size=1"]


def test_fsdp1_fsdp_size_1_grad_sync():
    f = by_check(findings(FSDP1_SIZE1), "fsdp1_grad_sync")
    assert [x.severity for x in f] == ["error"]
    fixed = by_check(findings(FSDP1_SIZE1, patches=["no_shard"]), "fsdp1_grad_sync")
    assert [x.severity for x in fixed] == ["info"] and "no_shard" in fixed[0].message
    assert by_check(findings(FSDP1_SIZE1 + ["trainer.n_gpus_per_node=1"]), "fsdp1_grad_sync") == []
    assert by_check(findings(["actor_rollout_ref.actor.fsdp_config.fsdp_size=1"]), "fsdp1_grad_sync") == []  # fsdp2
    assert by_check(findings(["actor_rollout_ref.actor.strategy=fsdp"]), "fsdp1_grad_sync") == []  # fsdp_size -1


def test_fsdp1_param_offload_frees_nothing():
    offload = FSDP1_SIZE1 + ["actor_rollout_ref.actor.fsdp_config.param_offload=True"]
    f = by_check(findings(offload), "fsdp1_offload_frees_nothing")
    assert [x.severity for x in f] == ["error"]
    fixed = by_check(findings(offload, patches=["offload_views", "no_shard"]), "fsdp1_offload_frees_nothing")
    assert [x.severity for x in fixed] == ["info"]
    one_gpu = ["actor_rollout_ref.actor.strategy=fsdp", "actor_rollout_ref.actor.fsdp_config.param_offload=True",
               "trainer.n_gpus_per_node=1"]  # fsdp_size -1 on one GPU is NO_SHARD too
    assert [x.severity for x in by_check(findings(one_gpu), "fsdp1_offload_frees_nothing")] == ["error"]
    assert by_check(findings(offload + ["actor_rollout_ref.actor.fsdp_config.use_orig_params=True"]),
                    "fsdp1_offload_frees_nothing") == []
    sharded = ["actor_rollout_ref.actor.strategy=fsdp", "actor_rollout_ref.actor.fsdp_config.param_offload=True"]
    assert by_check(findings(sharded), "fsdp1_offload_frees_nothing") == []


def test_metric_entropy_with_an_entropy_bonus_is_an_error():
    bonus = ["actor_rollout_ref.actor.entropy_coeff=0.01"]
    f = by_check(findings(bonus, patches=["metric_entropy"]), "metric_entropy_coeff")
    assert [x.severity for x in f] == ["error"] and "entropy_coeff=0" in f[0].fix
    assert by_check(findings(bonus), "metric_entropy_coeff") == []
    assert by_check(findings(patches=["metric_entropy"]), "metric_entropy_coeff") == []


def test_active_patches_default_to_the_registry(monkeypatch):
    from rlkit import patches

    monkeypatch.setattr(patches, "active", lambda: ["no_shard"])
    f = PF.check_overrides(CLEAN + FSDP1_SIZE1, env={}, ray_version=None)
    assert [x.severity for x in by_check(f, "fsdp1_grad_sync")] == ["info"]


SEED4B = FSDP1_SIZE1 + [
    "actor_rollout_ref.model.path=Qwen/Qwen3-4B", "actor_rollout_ref.rollout.enforce_eager=False",
    "actor_rollout_ref.actor.fsdp_config.param_offload=True",
    "actor_rollout_ref.actor.fsdp_config.optimizer_offload=True",
    "actor_rollout_ref.rollout.gpu_memory_utilization=0.85", "actor_rollout_ref.rollout.n=8",
    "data.train_batch_size=32", "actor_rollout_ref.actor.use_dynamic_bsz=True",
    "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=4096", "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
]


def test_planner_finding():
    skipped = by_check(findings(SEED4B), "planner")
    assert skipped[0].severity == "info" and "--gpu-gib" in skipped[0].message
    refused = by_check(findings(SEED4B, gpu_gib=47.4), "planner")
    assert refused[0].severity == "error" and "vLLM refuses to start" in refused[0].message
    opts = ["cpu_optimizer_step", "rank0_owner", "master_on_host", "cast_once", "skip_old_logprob"]
    fits = by_check(findings(SEED4B, patches=["offload_views", "no_shard"], gpu_gib=47.4, planner_options=opts),
                    "planner")
    assert fits[0].severity == "info" and ": fits:" in fits[0].message
    host_step = ["actor_rollout_ref.actor.optim.optimizer_impl=rlkit.optim",
                 "+actor_rollout_ref.actor.optim.override_optimizer_config.rank0_owner=True"]
    from_config = by_check(findings(SEED4B + host_step, patches=["offload_views", "master_on_host"], gpu_gib=47.4),
                           "planner")
    assert "cpu_optimizer_step, rank0_owner, master_on_host" in from_config[0].message
    unknown = by_check(findings(SEED4B + ["actor_rollout_ref.model.path=/nope/model"], gpu_gib=47.4), "planner")
    assert unknown[0].severity == "info" and "no planner preset" in unknown[0].message


def test_yaml_file_and_cli(tmp_path):
    cfg = tmp_path / "run.yaml"
    cfg.write_text("defaults: [ppo_trainer]\nactor_rollout_ref:\n  rollout:\n    name: vllm\n"
                   "    max_num_batched_tokens: 2048\n")
    tree = VC.load_config(cfg)
    assert tree == {"actor_rollout_ref": {"rollout": {"name": "vllm", "max_num_batched_tokens": 2048}}}
    out = io.StringIO()
    with redirect_stdout(out):
        rc = PF.main([str(cfg), "trainer.n_gpus_per_node=1", "--json", "--patches", ""])
    data = json.loads(out.getvalue())
    assert {"severity", "key", "message", "fix"} <= set(data[0])
    assert any(d["check"] == "max_num_batched_tokens" for d in data)
    assert rc == (1 if any(d["severity"] == "error" for d in data) else 0)
    with redirect_stdout(io.StringIO()):
        assert PF.main(CLEAN + FSDP1_SIZE1 + ["--patches", ""]) == 1
        assert PF.main(CLEAN + FSDP1_SIZE1 + ["--patches", "no_shard"]) == 0
        assert PF.main([str(tmp_path / "missing.yaml")]) == 2


SEED_DOC = Path(__file__).resolve().parents[2] / "shared" / "seeds" / "003_bda753040e721e5b.txt"


@pytest.mark.verl
def test_defaults_match_verl_generated_config():
    """VERL_DEFAULTS must equal verl's own generated trainer config for every key it lists."""
    import importlib.util

    import yaml

    spec = importlib.util.find_spec("verl")
    path = Path(spec.origin).parent / "trainer" / "config" / "_generated_ppo_trainer.yaml"
    tree = yaml.safe_load(path.read_text())
    for key, expected in VC.VERL_DEFAULTS.items():
        node = tree
        for part in key.split("."):
            node = node[part]
        if node == "???":  # mandatory in verl: no default
            node = None
        assert node == expected, f"{key}: verl has {node!r}, rlkit.planning.preflight assumes {expected!r}"
    for key, source in VC.FOLLOWS.items():
        node = tree
        for part in key.split("."):
            node = node[part]
        assert node.startswith("${oc.select:") and source.rsplit(".", 1)[-1] in node, f"{key}: verl has {node!r}"


@pytest.mark.parametrize("extra, patches, expected", [
    ([], [], "none"),
    (["actor_rollout_ref.actor.calculate_entropy=true"], [], "backprop"),  # verl backpropagates 0 x entropy
    (["actor_rollout_ref.actor.calculate_entropy=true"], ["metric_entropy"], "detached"),
    (["actor_rollout_ref.actor.entropy_coeff=0.01"], ["metric_entropy"], "backprop"),  # a real entropy bonus
])
def test_planner_knows_how_the_update_computes_the_entropy(extra, patches, expected):
    spec = PF.planner_spec_for_overrides(SEED4B + extra, patches, gpu_gib=47.4)
    assert spec.update_entropy == expected


SEED_WORKLOAD = SEED4B + ["data.max_prompt_length=2048", "data.max_response_length=10240",
                          "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=24576"]
V, H, GIB = 151936, 2560, 2**30


def logits_finding(extra=(), patches=()):
    found = by_check(findings(SEED_WORKLOAD + list(extra), patches=patches, gpu_gib=47.4), "logits_path")
    infos = [f for f in found if f.severity == "info"]
    assert len(infos) == 1, found
    return infos[0], [f for f in found if f.severity != "info"]


def test_logits_path_stock_verl_unfused_padded():
    """(i) verl as shipped, without remove-padding: the full logits of the padded micro-batch, 8 B per element."""
    f, other = logits_finding(["actor_rollout_ref.model.use_remove_padding=False"])
    assert other == [] and f.key == "actor_rollout_ref.model.use_fused_kernels"
    unfused, chunked = 24576 * V * 8 / GIB, (2048 * V * 8 + 4 * V * H) / GIB  # 27.82 and 3.77 GiB
    assert f.message.startswith("logits path: torch_rowwise (verl's unfused path")
    assert f"{unfused:.2f} GiB for the update micro-batch of 24,576 tokens (use_remove_padding=False" in f.message
    assert f"chunked_logprobs would take {chunked:.2f} GiB" in f.message
    assert "chunked_logprobs" in f.fix and f"{unfused - chunked:.2f} GiB less" in f.fix
    spec = PF.planner_spec_for_overrides(SEED_WORKLOAD + ["actor_rollout_ref.model.use_remove_padding=False"], gpu_gib=47.4)
    assert (spec.logits_path, spec.remove_padding) == ("torch_rowwise", False)


def test_logits_path_verl_fused_kernels():
    """(ii) verl's use_fused_kernels: 512-row chunks (24 B per element in backward) + the lm_head gradient sum."""
    f, other = logits_finding(["actor_rollout_ref.model.use_fused_kernels=True"])
    assert other == [] and f.message.startswith("logits path: verl_fused (verl's fused kernels")
    fused, unfused = (512 * V * 24 + 4 * V * H) / GIB, 24576 * V * 8 / GIB
    assert f"{fused:.2f} GiB for the update micro-batch of 24,576 tokens (unpadded" in f.message
    assert f"torch_rowwise would take {unfused:.2f} GiB" in f.message and f.fix == "none needed"
    spec = PF.planner_spec_for_overrides(SEED_WORKLOAD + ["actor_rollout_ref.model.use_fused_kernels=True"], gpu_gib=47.4)
    assert spec.logits_path == "verl_fused"


def test_logits_path_rlkit_chunked_logprobs_patch():
    """(iii) rlkit's chunked_logprobs patch (it needs verl's fused-kernel path, torch backend, to hook into)."""
    fused = ["actor_rollout_ref.model.use_fused_kernels=True"]
    f, other = logits_finding(fused, patches=["chunked_logprobs"])
    assert other == [] and f.message.startswith("logits path: chunked_logprobs (rlkit's chunked_logprobs patch")
    assert f"{(2048 * V * 8 + 4 * V * H) / GIB:.2f} GiB" in f.message and f"{24576 * V * 8 / GIB:.2f}" in f.message
    assert PF.planner_spec_for_overrides(SEED_WORKLOAD + fused, ["chunked_logprobs"], gpu_gib=47.4).logits_path == "chunked_logprobs"
    # without use_fused_kernels the patch refuses to start the engine: say so before a GPU is booked
    found = by_check(findings(SEED_WORKLOAD, patches=["chunked_logprobs"], gpu_gib=47.4), "logits_path")
    errors = [x for x in found if x.severity == "error"]
    assert len(errors) == 1 and "use_fused_kernels=False" in errors[0].message
    assert "use_fused_kernels=True" in errors[0].fix
    # at a micro-batch of one chunk the unfused path is the smaller one, and the finding says so
    small, _ = logits_finding(fused + ["actor_rollout_ref.actor.ppo_max_token_len_per_gpu=2048",
                                       "data.max_prompt_length=512", "data.max_response_length=512"],
                              patches=["chunked_logprobs"])
    assert "unfused path is" in small.fix


def test_padded_positions_follow_the_models_length_model(tmp_path):
    """A random-init folder written with the synthetic length model (its marker) makes responses shorter on
    average: unpadded micro-batches keep their token budget, padded ones hold full-length rows for each."""
    from rlkit.models import lengths as length_model
    from rlkit.models import offline as offline_model
    from rlkit.models import qwen as models

    models.preset_config("qwen3-4b").to_json_file(str(tmp_path / "config.json"))
    (tmp_path / offline_model.MARKER).write_text(json.dumps({"response_length_mean": 3000}))
    model = [f"actor_rollout_ref.model.path={tmp_path}", "actor_rollout_ref.model.use_remove_padding=False"]
    f, _ = logits_finding(model)
    expected = length_model.expected_response_tokens(3000, 10240)  # 2,891 tokens: the cap trims the geometric tail
    positions = 24576 * (2048 + 10240) / (2048 + expected)
    assert f"padded to {positions:,.0f} positions" in f.message and f"{positions * V * 8 / GIB:.2f} GiB" in f.message
    spec = PF.planner_spec_for_overrides(SEED_WORKLOAD + model, gpu_gib=47.4)
    assert spec.mean_response_tokens == pytest.approx(expected) and not spec.remove_padding


def test_a_padded_plan_with_little_headroom_is_a_warning():
    """Arm 1 padded at 12,288 tokens per micro-batch: the planner fits it with 0.69 GiB to spare, and the run ran
    out of the card at step 3. Padded and under 5% of headroom is a warning naming the two fixes; with more
    headroom (8,192 tokens), or unpadded, it is the usual info."""
    from conftest import committed_run

    from rlkit.core import params
    from rlkit.core.results import OUTPUTS_DIR
    from rlkit.experiments import grpo, grpo_runs
    from rlkit.recipes import grpo as R
    from rlkit.recipes.grpo import GRPORecipe

    run = grpo_runs.read_results(committed_run(OUTPUTS_DIR / grpo.NOTEBOOK / "h200-seed-1-fixes-hostadamw-padded-tok12288"))
    recipe = params.build(GRPORecipe, dict(run["recipe"]))
    with R.local_model_overrides(recipe, run["overrides"]) as (overrides, _):
        def planner(tokens, remove_padding):
            changed = [f"actor_rollout_ref.actor.ppo_max_token_len_per_gpu={tokens}",  # a later override wins
                       f"actor_rollout_ref.model.use_remove_padding={remove_padding}"]
            (finding,) = by_check(PF.check_overrides(overrides + changed,
                                                     active_patches=list(recipe.active_patches), gpu_gib=47.4,
                                                     env={}, ray_version="2.60.0"), "planner")
            return finding

        tight = planner(12288, False)
        assert tight.severity == "warning" and "headroom 0.69 GiB" in tight.message and "under 5% of the card" in tight.message
        assert "ppo_max_token_len_per_gpu" in tight.fix and "use_remove_padding=True" in tight.fix
        assert planner(8192, False).severity == "info"
        assert planner(12288, True).severity == "info"
