"""Phase-budget planner: the document's script, shapes and parameter counts, hand-computed bytes, CLI."""
import io
import json
import re
import subprocess
import sys
from contextlib import redirect_stdout
from dataclasses import replace
from pathlib import Path

import pytest

from rlkit.core.params import ParamError
from rlkit.experiments import phase_budget as PB
from rlkit.models import shape as MS
from rlkit.planning import budget as B
from rlkit.planning import cost, verdict

GIB = 2**30

# Output of the document's script (seeds/003), run verbatim with CPython 3.11.
SCRIPT_OUTPUT = """\
case                    util   kv_pool  max_seqs   update  verdict
qwen2.5-0.5b-lora       0.40      28.0      4780      9.5  fits
qwen2.5-0.5b-lora       0.60      44.0      7511      9.5  fits
qwen2.5-0.5b-lora       0.70      52.0      8876      9.5  fits
qwen2.5-7b-lora         0.40      10.8       394     28.0  fits
qwen2.5-7b-lora         0.60      26.8       980     28.0  fits
qwen2.5-7b-lora         0.70      34.8      1272     28.0  fits
qwen2.5-7b-fullft       0.40      10.8       394    127.6  OOM in update
qwen2.5-7b-fullft       0.60      26.8       980    127.6  OOM in update
qwen2.5-7b-fullft       0.70      34.8      1272    127.6  OOM in update"""

SEED_DOC = Path(__file__).resolve().parents[2] / "shared" / "seeds" / "003_bda753040e721e5b.txt"


def run_cli(argv):
    out = io.StringIO()
    with redirect_stdout(out):
        rc = PB.main(argv)
    return rc, out.getvalue()


def test_seed_table_reproduces_the_script_exactly():
    assert PB.format_seed_table() == SCRIPT_OUTPUT
    rc, out = run_cli(["--seed-table"])
    assert rc == 0 and out.rstrip("\n") == SCRIPT_OUTPUT


@pytest.mark.skipif(not SEED_DOC.exists(), reason="source document not present in this checkout")
def test_seed_table_equals_running_the_documents_script(tmp_path):
    text = SEED_DOC.read_text()
    script = re.search(r"#!/usr/bin/env python3\n.*?\{verdict\}\"\)\n", text, re.DOTALL).group(0)
    (tmp_path / "s.py").write_text(script)
    out = subprocess.run([sys.executable, str(tmp_path / "s.py")], capture_output=True, text=True, check=True).stdout
    assert out.rstrip("\n") == PB.format_seed_table()


def test_seed_diff_finds_the_rows_where_the_printed_table_differs():
    rows = PB.seed_table_diff()
    assert len(rows) == 9
    differing = {(r["case"], r["util"]): r for r in rows if r["differs"]}
    # 0.5b: printed max_seqs are 2 lower in all three rows; 7b at util 0.40: printed 395, script 394.
    assert set(differing) == {("qwen2.5-0.5b-lora", u) for u in (0.4, 0.6, 0.7)} | {
        ("qwen2.5-7b-lora", 0.4), ("qwen2.5-7b-fullft", 0.4)}
    assert all(r["differs"] == ["max_seqs"] for r in differing.values())
    assert differing[("qwen2.5-0.5b-lora", 0.4)]["max_seqs_delta"] == -2
    assert differing[("qwen2.5-7b-lora", 0.4)]["max_seqs_delta"] == 1
    assert all(r["verdict_script"] == r["verdict_printed"] for r in rows)


@pytest.mark.parametrize("name,count", [
    ("qwen3-4b", 4_022_468_096),
    ("Qwen/Qwen3-4B", 4_022_468_096),
    ("qwen3-8b", 8_190_735_360),
    ("qwen2.5-0.5b", 494_032_768),
    ("Qwen/Qwen2.5-0.5B-Instruct", 494_032_768),
    ("qwen2.5-7b", 7_615_616_512),
])
def test_parameter_count_from_shapes(name, count):
    assert MS.resolve_model(name).params == count


def test_parameter_count_matches_a_real_transformers_model():
    torch = pytest.importorskip("torch")
    from rlkit.models.qwen import build_random_model, count_parameters

    model = build_random_model("tiny", dtype=torch.float32)
    assert MS.resolve_model("tiny").params == count_parameters(model)


TOY = {"model_type": "qwen3", "hidden_size": 8, "intermediate_size": 16, "num_hidden_layers": 2,
       "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 4, "vocab_size": 32,
       "tie_word_embeddings": True}


def test_toy_shape_hand_counted():
    s = MS.shape_from_config(TOY)
    # per layer: q 8*8 + k 8*4 + v 8*4 + o 8*8 = 192; mlp 3*8*16 = 384; norms 2*8 + q/k norm 2*4 = 24
    assert s.layer_params == 192 + 384 + 24 == 600
    assert s.root_params == 32 * 8 + 8 == 264  # tied: embedding once + final norm
    assert s.params == 2 * 600 + 264 == 1464
    assert MS.shape_from_config({**TOY, "tie_word_embeddings": False}).params == 1464 + 256
    # Qwen2 adds q/k/v biases (8 + 4 + 4) and has no q/k norm (-8)
    assert MS.shape_from_config({**TOY, "model_type": "qwen2"}).layer_params == 600 + 16 - 8
    # LoRA rank 2 on 7 linears: 2 * ((8+8) + 2*(8+4) + (8+8) + 2*(8+16) + (16+8)) per layer
    assert s.lora_params(2) == 2 * 2 * (16 + 24 + 16 + 48 + 24)
    assert MS.kv_bytes_per_seq(s, 10) == 2 * 2 * 1 * 4 * 2 * 10


def toy_spec(**kw):
    base = {"model": "toy", "gpu_gib": 1.0, "n_gpus": 2, "gpu_memory_utilization": 0.5, "max_prompt_length": 6,
                "max_response_length": 10, "train_batch_size": 4, "group_size": 2, "micro_batch_tokens": 16,
                "log_prob_micro_batch_tokens": 32, "cudagraph_gib": 0.25, "non_torch_gib": 0.125, "logits_path": "torch_fp32"}
    base.update(kw)
    return B.PlanSpec(**base)


def test_toy_plan_hand_computed_bytes():
    s = MS.shape_from_config(TOY, "toy")
    P = 1464
    spec = toy_spec(param_offload=True, optimizer_offload=True, offload_views=True)
    dev, host, d = B.phase_components(spec, s)
    upd = dev["update_fwd_bwd"]
    assert upd["master_fp32"] == 4 * P and upd["compute_copy_bf16"] == 2 * P and upd["grads_fp32"] == 4 * P
    # gradient checkpointing: 2 layers x 16 tokens x hidden 8 x 2 B + one layer's working set
    per_layer = 4 * 8 + 3 * 8 + 3 * 4 + 4 * 16  # elements per token
    assert upd["activations"] == 2 * 16 * 8 * 2 + 16 * per_layer * 2
    assert upd["logits"] == 16 * 32 * 10
    assert dev["log_prob"]["logits"] == 32 * 32 * 14
    assert dev["optimizer_step"]["adam_moments"] == 8 * P  # optimizer_offload loads Adam back for the step
    assert dev["rollout"]["master_fp32"] == 0 and dev["rollout"]["stale_offload_copy"] == 0
    assert dev["rollout"]["kv_pool"] == 0.5 * GIB - 2 * P - 0.25 * GIB - 0.125 * GIB
    assert dev["weight_sync"]["staging"] == 4 * P  # FULL_STATE_DICT fp32 clone
    assert host["rollout"] == {"master_fp32": 4 * P, "adam_moments": 8 * P, "staging_pinned": 0}
    assert host["optimizer_step"]["adam_moments"] == 0
    # 4 prompts x 2 x 16 tokens / 2 GPUs = 64 tokens per GPU -> 4 micro-batches of 16; 3 flat params
    assert d["micro_batches_per_step"] == 4 and d["bf16_casts_per_step"] == 12

    no_ckpt = B.phase_components(replace(spec, gradient_checkpointing=False), s)[0]
    assert no_ckpt["update_fwd_bwd"]["activations"] == 2 * 16 * per_layer * 2


def test_compiled_pointwise_keeps_one_intermediate_less_per_token():
    """The compiled SwiGLU's backward recomputes silu(gate) (tests/test_compiled_patches.py counts what each keeps),
    so the recomputed layer's working set loses one intermediate-wide bf16 tensor per token, here 16 x 16 x 2 B."""
    s = MS.shape_from_config(TOY, "toy")
    spec = toy_spec(offload_views=True)
    eager = B.phase_components(spec, s)[0]
    compiled = B.phase_components(B.with_options(spec, ["offload_views", "compiled_pointwise"]), s)[0]
    for phase, tokens in (("update_fwd_bwd", 16), ("log_prob", 32)):
        assert eager[phase]["activations"] - compiled[phase]["activations"] == tokens * 16 * 2


def test_toy_plan_rlkit_options():
    s = MS.shape_from_config(TOY, "toy")
    P, largest = 1464, 600
    spec = toy_spec(offload_views=True, cpu_optimizer_step=True, rank0_owner=True, master_on_host=True,
                    cast_once=True, skip_old_logprob=True)
    dev, host, d = B.phase_components(spec, s)
    assert "log_prob" not in dev
    assert dev["update_fwd_bwd"]["master_fp32"] == 0 and dev["update_fwd_bwd"]["staging"] == 4 * largest
    assert dev["optimizer_step"]["adam_moments"] == 0
    assert dev["optimizer_step"]["compute_copy_bf16"] == 2 * P  # cast-once copy resident until the step
    assert host["update_fwd_bwd"] == {"master_fp32": 4 * P, "adam_moments": 8 * P, "staging_pinned": 8 * largest}
    assert d["bf16_casts_per_step"] == 3
    p = verdict.plan(spec, s)
    # rank-0 owner: the other rank holds the host master but no Adam state and no staging
    assert p.host_other_rank_gib["update_fwd_bwd"] == pytest.approx(4 * P / GIB)
    assert p.host_node_peak_gib == pytest.approx((4 * P + 8 * P + 8 * largest + 4 * P) / GIB)


def test_lora_only_adapters_get_grads_and_adam():
    s = MS.shape_from_config(TOY, "toy")
    dev = B.phase_components(toy_spec(lora_rank=2, optimizer_offload=False, param_offload=False), s)[0]
    T = s.lora_params(2)
    assert dev["update_fwd_bwd"]["grads_fp32"] == 4 * T and dev["update_fwd_bwd"]["adam_moments"] == 8 * T
    assert dev["update_fwd_bwd"]["master_fp32"] == 4 * 1464


def test_stale_offload_copy_makes_vllm_refuse_to_start():
    spec = B.PlanSpec(model="qwen3-4b", gpu_gib=139.8, n_gpus=1, gpu_memory_utilization=0.9)
    p = verdict.plan(spec)
    assert p.verdict == "vLLM refuses to start" and "stale_offload_copy" in p.binding
    assert verdict.plan(replace(spec, offload_views=True)).verdict != "vLLM refuses to start"


def test_seed_setup_full_finetune_oom_in_optimizer_step_without_host_step():
    spec = B.PlanSpec(logits_path="flash_ce", offload_views=True)
    assert verdict.plan(spec).verdict == "OOM in optimizer_step"
    full = B.with_options(spec, "offload_views,cpu_optimizer_step,rank0_owner,master_on_host,cast_once,skip_old_logprob")
    p = verdict.plan(full)
    assert p.device_gib["optimizer_step"].get("adam_moments", 0) == 0
    assert p.device_total_gib["update_fwd_bwd"] < verdict.plan(spec).device_total_gib["update_fwd_bwd"]


def test_kv_pool_and_concurrency():
    p = verdict.plan(B.PlanSpec(model="qwen2.5-0.5b", gpu_gib=80, n_gpus=1, gpu_memory_utilization=0.6,
                          max_prompt_length=256, max_response_length=256, train_batch_size=32, group_size=8,
                          micro_batch_tokens=2048, log_prob_micro_batch_tokens=2048, cudagraph_gib=3.0,
                          non_torch_gib=0.0, offload_views=True))
    weights = 2 * 494_032_768 / GIB
    assert p.kv_pool_gib == pytest.approx(0.6 * 80 - weights - 3.0)
    assert p.kv_gib_per_seq == pytest.approx(PB.seed_kv_per_seq(24, 2, 64, 512))
    assert p.max_concurrent_seqs == int(p.kv_pool_gib / p.kv_gib_per_seq)
    assert p.seqs_per_gpu == 256 and p.rollout_waves == 1


def test_no_kv_cache_verdict():
    p = verdict.plan(B.PlanSpec(model="qwen3-8b", gpu_gib=24, gpu_memory_utilization=0.3, offload_views=True))
    assert p.verdict == "no KV cache" and not p.fits


@pytest.mark.parametrize("kw,field", [
    ({"gpu_gib": -1.0}, "gpu_gib"),
    ({"gpu_memory_utilization": 0.0}, "gpu_memory_utilization"),
    ({"gpu_memory_utilization": 1.5}, "gpu_memory_utilization"),
    ({"n_gpus": 0}, "n_gpus"),
    ({"lora_rank": -1}, "lora_rank"),
    ({"logits_path": "fp8"}, "logits_path"),
    ({"rank0_owner": True}, "rank0_owner"),
    ({"master_on_host": True}, "master_on_host"),
])
def test_bad_spec_names_the_field(kw, field):
    with pytest.raises(ParamError, match=field):
        B.PlanSpec(**kw)


def test_bad_model_inputs_name_the_field():
    with pytest.raises(ParamError, match="model"):
        MS.resolve_model("qwen9-1b")
    with pytest.raises(ParamError, match="num_hidden_layers"):
        MS.shape_from_config({k: v for k, v in TOY.items() if k != "num_hidden_layers"})
    with pytest.raises(ParamError, match="model_type"):
        MS.shape_from_config({**TOY, "model_type": "gpt2"})
    with pytest.raises(ParamError, match="unknown rlkit option"):
        B.with_options(B.PlanSpec(), "cpu_step")


def test_model_from_config_json_path(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(TOY))
    assert MS.resolve_model(str(tmp_path)).params == 1464


def test_cost_metric():
    # The document's examples: 1, 2, 4 GPUs x $2.50/GPU-hour x 5 days.
    assert [cost.run_cost(n, 2.5, 120) for n in (1, 2, 4)] == [300.0, 600.0, 1200.0]
    assert cost.cost_per_million_samples(2, 2.5, 120, 3_000_000) == pytest.approx(200.0)
    with pytest.raises(ParamError, match="samples"):
        cost.cost_per_million_samples(1, 2.5, 1, 0)
    rc, out = run_cli(["--cost", "--n-gpus", "2", "--price-per-gpu-hour", "2.5", "--hours", "120",
                       "--samples", "3e6", "--json"])
    assert rc == 0 and json.loads(out)["cost_per_million_samples"] == pytest.approx(200.0)


def test_cli_plan_json_and_exit_status():
    rc, out = run_cli(["--model", "qwen3-4b", "--gpu-gib", "47.4", "--logits-path", "flash_ce", "--json",
                       "--options", "offload_views,cpu_optimizer_step,rank0_owner,master_on_host,cast_once"])
    data = json.loads(out)
    assert data["units"] == "GiB" and set(data["device_gib"]) == set(B.PHASES)
    assert rc == (0 if data["fits"] else 1)
    rc, out = run_cli(["--model", "qwen3-4b", "--gpu-gib", "47.4"])
    assert "GiB" in out and "verdict:" in out
    assert run_cli(["--util", "1.2"])[0] == 2


def test_budget_module_does_not_import_torch():
    code = ("import sys, rlkit.planning.budget as b, rlkit.planning.verdict as v, rlkit.experiments.phase_budget as pb; "
            "v.plan(b.PlanSpec()); "
            "pb.run(pb.Config(**NB)); assert 'torch' not in sys.modules")
    nb = {"model": "qwen3-4b", "gpu_gib": 47.4, "n_gpus": 2, "gpu_memory_utilization": 0.85, "max_prompt_length": 2048,
              "max_response_length": 10240, "train_batch_size": 32, "group_size": 8, "micro_batch_tokens": 24576,
              "log_prob_micro_batch_tokens": 24576, "lora_rank": 0, "gradient_checkpointing": True, "param_offload": True,
              "optimizer_offload": True, "cudagraph_gib": 1.0, "non_torch_gib": 0.5, "logits_path": "flash_ce", "host_gib": 0.0,
              "option_sets": ("", "offload_views,cpu_optimizer_step")}
    subprocess.run([sys.executable, "-c", f"NB={nb!r}\n{code}"], check=True)


def test_notebook_run_metrics():
    import yaml

    from rlkit.core.params import build
    from rlkit.core.results import PARAMS_DIR

    values = yaml.safe_load((PARAMS_DIR / f"{PB.NOTEBOOK}.tiny.yaml").read_text())
    cfg = build(PB.Config, values)
    m = PB.run(cfg)
    assert set(m) >= {"units", "seed_table", "seed_diff", "plans", "ablations"}
    assert len(m["seed_table"]) == 9 and len(m["plans"]) == len(cfg.option_sets)
    with pytest.raises(ParamError, match="option"):
        build(PB.Config, {**values, "option_sets": ["cpu_step"]})


def test_update_entropy_recomputed_in_backward_costs_six_bytes_per_logit():
    base = B.PlanSpec(micro_batch_tokens=4096)
    shape = MS.resolve_model(base.model)
    logits = {mode: verdict.plan(replace(base, update_entropy=mode)).device_gib["update_fwd_bwd"]["logits"]
              for mode in B.UPDATE_ENTROPY_BYTES}
    assert logits["detached"] == logits["none"]
    assert logits["backprop"] - logits["none"] == pytest.approx(6 * 4096 * shape.vocab / B.GIB)
    with pytest.raises(ParamError, match="update_entropy"):
        B.PlanSpec(update_entropy="sometimes")


def test_chunked_logits_paths_hand_computed_bytes():
    """A chunked path holds one chunk of rows x vocabulary, whatever the micro-batch, plus in the update the
    lm_head gradient's accumulator (vocab x hidden x 4 B; none with LoRA, whose lm_head is frozen)."""
    s = MS.shape_from_config(TOY, "toy")  # vocab 32, hidden 8
    lm_head_grad = 4 * 32 * 8
    chunked = B.phase_components(toy_spec(logits_path="chunked_logprobs", logits_chunk_rows=4), s)[0]
    assert chunked["update_fwd_bwd"]["logits"] == 4 * 32 * 8 + lm_head_grad  # 4 rows x 32 x (fp32 logits + a temporary)
    assert chunked["log_prob"]["logits"] == 4 * 32 * 8
    backprop = B.phase_components(toy_spec(logits_path="chunked_logprobs", logits_chunk_rows=4, update_entropy="backprop"), s)[0]
    assert backprop["update_fwd_bwd"]["logits"] == 4 * 32 * (8 + 2) + lm_head_grad
    lora = B.phase_components(toy_spec(logits_path="chunked_logprobs", logits_chunk_rows=4, lora_rank=2), s)[0]
    assert lora["update_fwd_bwd"]["logits"] == 4 * 32 * 8
    # the path's own chunk (2048 rows) is larger than the toy's 16-token micro-batch: the micro-batch's rows count
    own = B.phase_components(toy_spec(logits_path="chunked_logprobs"), s)[0]
    assert own["update_fwd_bwd"]["logits"] == 16 * 32 * 8 + lm_head_grad
    fused = B.phase_components(toy_spec(logits_path="verl_fused"), s)[0]  # 512-row chunks
    assert fused["update_fwd_bwd"]["logits"] == 16 * 32 * 24 + lm_head_grad and fused["log_prob"]["logits"] == 32 * 32 * 12
    assert B.phase_components(toy_spec(), s)[0]["update_fwd_bwd"]["logits"] == 16 * 32 * 10  # unchunked: all rows
    with pytest.raises(ParamError, match="logits_chunk_rows"):
        toy_spec(logits_chunk_rows=4)  # torch_fp32 does not work in chunks


def test_logits_paths_at_the_seed_workload():
    """Qwen3-4B (vocab 151,936, hidden 2,560), 24,576 tokens per update micro-batch."""
    spec = B.PlanSpec()
    gib = verdict.update_logits_gib(spec, ("torch_rowwise", "chunked_logprobs", "verl_fused"))
    V, H = 151936, 2560
    assert gib["torch_rowwise"] == pytest.approx(24576 * V * 8 / GIB)  # 27.82
    rows = B.CHUNKED_LOGITS["chunked_logprobs"]["chunk_rows"]  # rlkit's patch: 2048
    assert gib["chunked_logprobs"] == pytest.approx((rows * V * 8 + 4 * V * H) / GIB)  # 2.32 + 1.45
    assert gib["verl_fused"] == pytest.approx((512 * V * 24 + 4 * V * H) / GIB)  # 1.74 + 1.45
    p = verdict.plan(B.PlanSpec(logits_path="chunked_logprobs"))
    assert p.device_gib["update_fwd_bwd"]["logits"] == pytest.approx(gib["chunked_logprobs"])
    assert "logits path chunked_logprobs" in verdict.format_plan(p)


def test_chunk_rows_are_the_patchs():
    pytest.importorskip("torch")
    from rlkit.patches.kernels import chunked_logprobs

    assert B.CHUNKED_LOGITS["chunked_logprobs"]["chunk_rows"] == chunked_logprobs.CHUNK_ROWS


def test_padded_and_unpadded_micro_batches_hand_computed():
    """remove_padding: a micro-batch's tensors hold its actual tokens. Without it, every sequence is padded to the
    longest (taken as a full sequence, 6 + 10 = 16) while the token budget counts expected lengths (6 + 2 = 8):
    twice the positions here."""
    s = MS.shape_from_config(TOY, "toy")
    per_layer = 4 * 8 + 3 * 8 + 3 * 4 + 4 * 16
    padded = toy_spec(mean_response_tokens=2, remove_padding=False)
    dev, _, d = B.phase_components(padded, s)
    assert d["update_positions"] == 16 * 16 / 8 == 32
    assert dev["update_fwd_bwd"]["activations"] == 2 * 32 * 8 * 2 + 32 * per_layer * 2
    assert dev["update_fwd_bwd"]["logits"] == 32 * 32 * 10
    # the forward-only budget (32 tokens) is a whole step per GPU here: 4 prompts x 2 x 8 tokens / 2 GPUs = 32
    assert d["log_prob_positions"] == 32 * 2 and dev["log_prob"]["logits"] == 64 * 32 * 14
    assert d["micro_batches_per_step"] == 2  # 32 actual tokens per GPU / 16
    unpadded = B.phase_components(replace(padded, remove_padding=True), s)
    assert unpadded[2]["update_positions"] == 16 and unpadded[0]["update_fwd_bwd"]["logits"] == 16 * 32 * 10
    assert unpadded[0]["update_fwd_bwd"]["activations"] == 2 * 16 * 8 * 2 + 16 * per_layer * 2
    # every response at max_response_length (the plain random model): padded = actual
    full = toy_spec(remove_padding=False)
    assert B.phase_components(full, s)[2]["update_positions"] == 16 == B.micro_batch_positions(replace(full, remove_padding=True), 16)
    # a budget above a whole step's tokens holds that step: 4 x 2 x 16 / 2 = 64
    assert B.micro_batch_positions(toy_spec(micro_batch_tokens=1000), 1000) == 64
    with pytest.raises(ParamError, match="mean_response_tokens"):
        toy_spec(mean_response_tokens=11)


@pytest.mark.gpu
def test_chunked_logits_paths_match_the_measured_peak():
    """The chunked paths' bytes (CHUNKED_LOGITS) against torch's peak allocation at Qwen3-4B's lm_head shape (bf16
    hidden states and weight): forward, forward + backward, and with the entropy in the loss; the hidden states'
    gradient (rows x hidden x 2 B) is the only other tensor. Within 3 %, at two micro-batch sizes."""
    torch = pytest.importorskip("torch")
    verl_kernels = pytest.importorskip("verl.utils.experimental.torch_functional")
    from rlkit.patches.kernels.chunked_logprobs import chunked_linear_logprobs

    shape = MS.resolve_model("qwen3-4b")
    V, H, dev = shape.vocab, shape.hidden, "cuda"
    paths = {"chunked_logprobs": lambda h, w, y: chunked_linear_logprobs(h, w, y, 1.0, with_entropy=True),
             "verl_fused": lambda h, w, y: verl_kernels.FusedLinearForPPOFunction.apply(h, w, y, 1.0, 512)}
    for rows in (8192, 16384):
        for path, fn in paths.items():
            for mode in ("forward", "none", "backprop"):
                torch.cuda.empty_cache()
                g = torch.Generator(device=dev).manual_seed(0)
                train = mode != "forward"
                h = torch.randn(rows, H, device=dev, generator=g).bfloat16().requires_grad_(train)
                w = (torch.randn(V, H, device=dev, generator=g) * 0.02).bfloat16().requires_grad_(train)
                y = torch.randint(0, V, (rows,), device=dev, generator=g)
                torch.cuda.synchronize()
                base = torch.cuda.memory_allocated()
                torch.cuda.reset_peak_memory_stats()
                with torch.set_grad_enabled(train):
                    lp, ent = fn(h, w, y)
                    if train:
                        (lp.sum() + (ent.float().sum() * 0.01 if mode == "backprop" else 0.0)).backward()
                torch.cuda.synchronize()
                peak = torch.cuda.max_memory_allocated() - base
                spec = B.PlanSpec(logits_path=path, update_entropy="backprop" if mode == "backprop" else "none")
                planned = B.logits_bytes(spec, shape, rows, train=train) + (rows * H * 2 if train else 0)
                assert peak == pytest.approx(planned, rel=0.03), (path, rows, mode, peak / GIB, planned / GIB)
                del h, w, y, lp, ent


def test_selective_layers_keep_their_matmul_and_attention_outputs():
    """Per selective layer and token (toy: q_dim 8, kv_dim 4, hidden 8, intermediate 16): q, k, v, the attention
    output, o_proj, down_proj, gate and up = 8 + 4 + 4 + 8 + 8 + 8 + 16 + 16 = 72 bf16 elements, in the update only."""
    s = MS.shape_from_config(TOY, "toy")
    full = B.phase_components(toy_spec(offload_views=True), s)[0]
    for layers in (1, 2):
        kept = B.phase_components(toy_spec(offload_views=True, selective_layers=layers), s)[0]
        assert kept["update_fwd_bwd"]["activations"] - full["update_fwd_bwd"]["activations"] == layers * 16 * 72 * 2
        assert kept["log_prob"]["activations"] == full["log_prob"]["activations"]
    with pytest.raises(ParamError, match="selective_layers: 3 is more than toy's 2 layers"):
        B.phase_components(toy_spec(selective_layers=3), s)
    with pytest.raises(ParamError, match="selective_layers: selective checkpointing is a mode of gradient"):
        toy_spec(selective_layers=1, gradient_checkpointing=False)


def _seed_arm5() -> B.PlanSpec:
    """Arm 5 at the seed's workload on the 47.4-GiB card: the planner's inputs of that run."""
    return B.PlanSpec(model="qwen3-4b", gpu_gib=47.4, n_gpus=1, max_prompt_length=256, max_response_length=4096,
                      micro_batch_tokens=24576, log_prob_micro_batch_tokens=24576, optimizer_offload=False,
                      logits_path="chunked_logprobs", update_entropy="detached", remove_padding=True,
                      mean_response_tokens=1325.0, offload_views=True, cpu_optimizer_step=True, master_on_host=True,
                      cast_once=True, skip_old_logprob=True)


def test_the_most_selective_layers_is_the_largest_count_that_fits():
    """At arm 5's seed workload: the count that fits and one more that does not."""
    spec = _seed_arm5()
    n = verdict.most_selective_layers(spec)
    assert 0 < n < 36
    assert verdict.plan(replace(spec, selective_layers=n)).fits and not verdict.plan(replace(spec, selective_layers=n + 1)).fits
    assert verdict.most_selective_layers(replace(spec, gpu_gib=139.8, gpu_memory_utilization=0.3)) == 36  # the H200 itself
    assert verdict.most_selective_layers(replace(spec, gradient_checkpointing=False)) == 0


def test_arm5_at_the_seeds_workload_still_starts_vllm_at_a_larger_kv_pool():
    """scripts/node_session.sh's seed-util: gpu_memory_utilization 0.95 instead of 0.85 still fits (vLLM starts
    beside the actor's rollout residue) and gives the KV pool more sequences."""
    base, more = verdict.plan(_seed_arm5()), verdict.plan(replace(_seed_arm5(), gpu_memory_utilization=0.95))
    assert base.fits and more.fits and more.max_concurrent_seqs > base.max_concurrent_seqs
