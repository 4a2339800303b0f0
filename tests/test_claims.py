"""Hand-written sentences of the docs that state a result are checked against the committed files they cite (issue 46).

A claim names its doc, the words the doc says, and a check that reads the cited file: it returns the values that
file gives, formatted as the sentence writes them (each must be among the words), or a bool for a status or a
comparison. So a number or a status edited in the doc, or in the claim's words to follow it, or in the file, turns
the test red. A sentence outside the generated blocks that states a measured quantity, a status ("passed", "has not
run", "met") or a comparison ("faster", "3.35x") must be checked by a claim or listed in NOT_RESULTS with why it
is not a result. Generated blocks are checked by tests/test_report.py instead."""
from __future__ import annotations

import re

import pytest

from rlkit.analysis import learning_curves
from rlkit.core.env import REPO_ROOT
from rlkit.core.results import pct
from rlkit.models import shape as model_shape
from rlkit.planning import budget, preflight_memory, run_terms
from rlkit.report import limits as report_limits
from rlkit.report import profile as report_profile
from rlkit.report import seed_workload as report_seed

import _claim_session30 as S30C  # session 30's readers
import _claim_session31 as S31C  # session 31's readers
import _claim_session33 as S33C  # session 33's readers
import _claim_session34 as S34C  # session 34's readers
from _claim_sources import (  # readers of the committed files; tests/ is on sys.path under pytest
    GIB, ARM5, ARMS, C5, ENTROPY_BACKPROP, GENERATED, GPU5, GPU12, GQA12, LEVERS12, PADDED, PROFILES, RESUME9,
    SESSION11_PROFILES,
    _arm, _bandwidth_words, _by_test, _compiled_profile, _copies, _dirty, _failed_runs_say, _fastest, _host_gap_range,
    _host_overlap_extra_gib, _idle_in_optimizer, _json, _kind_share, _learning, _learning_words, _limits, _log_passes,
    _no_run_varies, _no_seed_run_with, _pass_seconds, _session26_mean, _node_minutes, _node_setup, _node_time, _outcome, _outcome_of, _padded_failure,
    _padded_plan, _passed, _profile, _quote, _range, _same_commit, _same_sample_ratio, _says, _seed_gen_fractions,
    _seed_levers_arithmetic, _seed_profile, _selective_layer, _session, _session_readme, _source_text, _step1_pair_words,
    _steps_trained, _sweep_card, _sweep_waiting, _tested, _update_mfu, _verl_compat, _verl_compat_words, _verl_steps, _wall, _yaml,
)

S26 = "outputs/_node/session26/README.md"
FWD_BWD = "h100-compiled-fwd-bwd.session26"
S26_COMPILED_3815 = "outputs/_node/session26/gpu-tests-profile-compiled-3815bfb.log"
S26_COMPILED_CFF = "outputs/_node/session26/compiled-tests-cff2abc.log"
PREFETCH_TEST = ("tests/test_grad_prefetch.py::"
                 "test_prefetch_on_two_gloo_ranks_with_accumulation_clipping_and_a_non_finite_step_is_bit_identical")



def _prefetch_on_the_gpu_words() -> tuple[str, ...]:
    """The prefetch's GPU test: both cases passed in the committed log, on the GPU and at the commit its session's
    record names."""
    log, readme = "outputs/_node/session25/prefetch-test.log", _source_text("outputs/_node/session25/README.md")
    assert _passed(log) == 2 and _log_passes(log, "tests/test_grad_prefetch_gpu.py::test_prefetch_on_the_gpu_is_bit_identical")
    assert "got an NVIDIA H100 80GB HBM3" in readme and "RLKIT_GIT_SHA=6d24036" in readme
    return ("passed on an NVIDIA H100 at 6d24036",)


def _sac_profile_commits() -> set[str]:
    """The commits of every committed selective-checkpointing profile (1a788a6 and 3815bfb predate the policy's
    keeping rlkit_varlen's attention, commit ddaee8e)."""
    return {m["commit"] for m in report_profile.committed_profiles().values() if m["config"].get("selective_layers")}


def _session26_profiles(commit: str) -> list[str]:
    return [n for n, m in report_profile.committed_profiles().items() if n.endswith(".session26") and m["commit"] == commit]


def _twice_each_at_3815bfb() -> bool:
    """Base, prefetch, levers and best twice each at 3815bfb; the README's call table puts them on machine A."""
    names = _session26_profiles("3815bfb")
    readme = _source_text(S26)
    return (all(f"{tag}{n}.session26" in names for tag in ("h100-base", "h100-prefetch", "h100-levers", "h100-best")
                for n in ("", "2")) and all(f"| {call} | A" in readme for call in (1, 2, 3, 4)))


def _mfu(profile: str) -> float:
    return _profile(profile)["flops"]["mfu_timed"]


def _at_mfu(profile: str, mfu: float) -> float:
    f = _profile(profile)["flops"]
    return f["model_flops"] / (mfu * f["peak_bf16_flops"])


def _without_the_recompute() -> float:
    """The forward and backward alone (FWD_BWD) less its whole recompute pass: its time were nothing recomputed."""
    return _wall(FWD_BWD) - _pass_seconds("recompute")(FWD_BWD)


def _forty_needs_the_recompute_gone() -> bool:
    """The forward and backward alone are slower than 40% MFU allows, and without the recompute they would not be."""
    return _wall(FWD_BWD) > _at_mfu(FWD_BWD, report_profile.MFU_TARGET) >= _without_the_recompute()


def _one_norm_on_the_gpu() -> tuple[int, int]:
    """Session 26's one-norm test on the H100: how many output elements differed from eager's, of how many."""
    found = re.search(r"one RMSNorm on cuda: (\d+) of (\d+) elements", _source_text(S26_COMPILED_CFF))
    return int(found[1]), int(found[2])


def _log_says(log: str, line: str) -> bool:
    return line in _source_text(log)


def _prefetch_again_words() -> tuple[str, ...]:
    """Session 26's prefetch test: both cases passed, at the commit its session's record names for that call."""
    log, readme = "outputs/_node/session26/prefetch-test.log", _source_text("outputs/_node/session26/README.md")
    assert _passed(log) == 2 and _log_passes(log, "tests/test_grad_prefetch_gpu.py::test_prefetch_on_the_gpu_is_bit_identical")
    assert "| 4 | A | 3815bfb | `node_session.sh /tmp/s4 prefetch-test profile-compiled`" in readme
    return ("passed again on an NVIDIA H100 at 3815bfb",)


def _prefetch_means() -> tuple[float, float, float, float]:
    """Session 26's means of two: prefetch, base, prefetch with the other levers (best), the other levers alone."""
    return tuple(_session26_mean(_wall, tag, f"{tag}2") for tag in ("h100-prefetch", "h100-base", "h100-best",
                                                                    "h100-levers"))


def _largest_spread() -> float:
    return max(abs(_wall(f"{tag}.session26") - _wall(f"{tag}2.session26"))
               for tag in ("h100-prefetch", "h100-base", "h100-best", "h100-levers"))


def _prefetch_change(value, levers: bool = False) -> float:
    """What the prefetch changes in ``value`` of a profile: the mean of two with it less the mean of two without."""
    on, off = ("h100-best", "h100-levers") if levers else ("h100-prefetch", "h100-base")
    return _session26_mean(value, on, f"{on}2") - _session26_mean(value, off, f"{off}2")


def _prefetch_grad_clip_words() -> str:
    """The grad_clip the prefetch's CPU test clips with, as patches.md writes it."""
    clip = re.search(r"^GRAD_CLIP = ([\d.]+)", _source_text(PREFETCH_TEST.split("::")[0]), re.MULTILINE)[1]
    return f"`grad_clip` {clip}"

# ---------------------------------------------------------------------------------------------------------------
# (doc, the words it says, a check of the cited file: the values it gives, as the words write them, or a bool)
CLAIMS = [
    # README.md
    ("README.md", "one profiled update of the seed workload's actor on an H100 runs at 22% of its dense bf16 peak (10.75 s, "
                  "the mean of two runs)",
     lambda: (f"at {pct(_session26_mean(_mfu, 'h100-base', 'h100-base2'))}",
              f"({_session26_mean(_wall, 'h100-base', 'h100-base2'):.2f} s, the mean of two")),
    ("README.md", "take it to 29% (8.29 s), and its forward and backward alone, without the optimizer step, reach 34%",
     lambda: (f"to {pct(_session26_mean(_mfu, 'h100-levers', 'h100-levers2'))}",
              f"({_session26_mean(_wall, 'h100-levers', 'h100-levers2'):.2f} s)",
              f"reach {pct(_profile(FWD_BWD)['flops']['mfu_timed'])}")),
    ("README.md", "That is short of the 40% target, which would also need most of the checkpoint recompute gone",
     _says("short of the 40% target, which would also need most of the checkpoint recompute gone",
           _forty_needs_the_recompute_gone)),
    ("README.md", "The rollout inside verl generates at 92-98% of a standalone vLLM's tokens per second at the seed's shape",
     lambda: (_range(_seed_gen_fractions()),)),
    ("README.md", "every lever steps in 13.3 s against arm 5's 30.8 s at the same commit (-57%; update_actor at 27% of the peak "
                  "there)",
     lambda: (lambda p: (f"{p['step_s']:.1f} s against", f"{p['base_step_s']:.1f} s at the same commit",
                         f"({p['step_s'] / p['base_step_s'] - 1:+.0%}", f"at {pct(p['limits']['update_actor_fraction'])} of"))(
                             _fastest("h200-1gpu"))),
    ("README.md", "arm 5's patches on one GPU (where no_shard and the rank-0 owner have nothing to do), with full logits, eager "
     "RMSNorm and pointwise, no overlapped copies and verl's 2-s poll, keep arm 5's reward within max(2 x the range of arm 1 "
     "run twice, 0.02) of arm 1's at 40 of 40 steps and inside that range at 22. The 0.02 floor is above the measured noise "
     "(0.0052), and every run's entropy had collapsed by step 18", _learning_words),
    ("README.md", "the fastest variant's levers (chunked log-probs, compiled RMSNorm and pointwise, overlapped copies) were "
     "not part of it", _says("were not part of it", lambda: bool(_learning_words()))),
    ("README.md", "A run resumed from a verl checkpoint with every patch active continues bit for bit, on the CPU with two "
     "ranks and on the H200 with one", _says("continues bit for bit", lambda: _passed(RESUME9) == 1)),

    # docs/results.md
    ("docs/results.md", "Measured on one NVIDIA H200 (offline node, torch 2.11.0+cu130)", lambda: (_node_setup(),)),
    ("docs/results.md", "each process is capped at 48 GiB",
     lambda: (f"{_yaml('outputs/02_host_adamw/h200/params.yaml')['memory_cap_gib']:g} GiB",
              f"{_yaml('outputs/03_cast_once/h200/params.yaml')['memory_cap_gib']:g} GiB")),
    ("docs/results.md", "(`emulate_gpu_gib: 47.4`): every verl and vLLM process sees a 47.4 GiB card",
     lambda: (f"{_arm('1-fixes-hostadamw')['recipe']['emulate_gpu_gib']:g} GiB card",)),
    ("docs/results.md", "the sum of all processes on a GPU can pass 47.4 GiB (the table's device peak)",
     _says("can pass 47.4 GiB", lambda: max(_arm("1-fixes-hostadamw")["summary"]["gpu_peak_used_gib"])
           > _arm("1-fixes-hostadamw")["recipe"]["emulate_gpu_gib"])),
    ("docs/results.md", "(80 GiB for seed 003's small case, 47.4 GiB for Qwen3-4B)",
     lambda: (f"{_sweep_card('doc_small'):g} GiB for seed", f"{_sweep_card('qwen3_4b_48g'):g} GiB for Qwen3-4B")),
    ("docs/results.md", "(256-token responses, 8,192-token micro-batches; arm 0 at 512 and 16,384)",
     lambda: (f"{_arm('1-fixes-hostadamw')['recipe']['max_response_length']}-token responses",
              f"{_arm('1-fixes-hostadamw')['recipe']['ppo_max_token_len_per_gpu']:,}-token",
              f"arm 0 at {_arm('0-stock')['recipe']['max_response_length']} and "
              f"{_arm('0-stock')['recipe']['ppo_max_token_len_per_gpu']:,}")),
    ("docs/results.md", "The planner puts arm 1 padded at 24,576 tokens per micro-batch at 56.6 GiB in update_fwd_bwd",
     lambda: (lambda plan: (f"{plan.peak_gib:.1f} GiB in {plan.peak_phase}",))(_padded_plan(24576)[1])),
    ("docs/results.md", "the padded comparison ran at 12,288, the largest it fits (planned 46.71 of 47.40 GiB)",
     lambda: (lambda card, plan, over: (f"ran at {_arm(PADDED)['recipe']['ppo_max_token_len_per_gpu']:,}",
                                         f"planned {plan.peak_gib:.2f} of {card:.2f} GiB")
                                        if plan.fits and not over.fits else ())(
         *_padded_plan(12288), _padded_plan(12288 + 1024)[1])),
    ("docs/results.md", "Its actor's allocation peaked at 46.76 GiB in steps 1 and 2 and ran out of the card in update_actor at "
                        "step 3",
     lambda: (*{f"peaked at {s['actor/perf/max_memory_allocated_gb']:.2f} GiB" for s in _arm(PADDED)["steps"]},
              f"in steps {' and '.join(str(s['step']) for s in _arm(PADDED)['steps'])}",
              f"in {_padded_failure()[1]} at step {_padded_failure()[2]}" if _padded_failure()[0] == "torch_oom" else "?")),
    ("docs/results.md", "Pre-flight now warns when a padded plan has under 5% of the card to spare",
     lambda: (f"under {preflight_memory.PADDED_HEADROOM_FRACTION:.0%} of",)),
    ("docs/results.md", "the unpadded arm's update_actor processed 3.35x the padded arm's tokens per second, at twice the "
                        "micro-batch",
     lambda: (f"{_same_sample_ratio(PADDED, 'h200-seed-1-fixes-hostadamw.session10-lr0'):.2f}x",
              "twice" if _arm("h200-seed-1-fixes-hostadamw.session10-lr0")["recipe"]["ppo_max_token_len_per_gpu"]
              == 2 * _arm(PADDED)["recipe"]["ppo_max_token_len_per_gpu"] else "(not twice)")),
    ("docs/results.md", "The runs of that shape generate at 92-98% of its output tokens per second",
     lambda: (_range(_seed_gen_fractions()),)),
    ("docs/results.md", "the padded run polls verl's replay buffer every 2 s (92%) and the levers run every 0.2 s (98%)",
     lambda: (f"every {_arm(PADDED)['recipe']['replay_poll_s']:g} s ({pct(_limits()[PADDED]['gen_fraction'])})",
              f"every {_arm(LEVERS12)['recipe']['replay_poll_s']:g} s "
              f"({pct(_limits()[LEVERS12]['gen_fraction'])})")),
    ("docs/results.md", "their rollouts sampled the same mean length (1,332 over steps 2..), and up to 2 s of the padded run's "
                        "38.2-s rollout (5%)",
     lambda: (f"({_arm(PADDED)['summary']['response_length_mean']:,.0f} over",
              f"{_arm(LEVERS12)['summary']['response_length_mean']:,.0f} over",
              f"{_arm(PADDED)['summary']['gen_s']:.1f}-s rollout",
              f"({_arm(PADDED)['recipe']['replay_poll_s'] / _arm(PADDED)['summary']['gen_s']:.0%})")),
    ("docs/results.md", "session 16: 256 sequences of exactly 256 tokens, 65,536 output tokens in 4.16 s, 15,763 tokens/s), "
     "the limit of the two h200-1gpu runs in the table below",
     lambda: (lambda m: (f"{m['generate']['sequences']} sequences of exactly {m['generate']['response_length']['max']} tokens",
                         f"{m['output_tokens']:,} output tokens in {m['wall_s']:.2f} s", f"{m['output_tok_s']:,.0f} tokens/s",
                         "the two h200-1gpu runs" if sum(1 for n in _limits() if n.startswith("h200-1gpu-")) == 2 else "?"))(
         _json("outputs/_node/vllm_standalone/h200-1gpu/metrics.json"))),
    ("docs/results.md", "each of its 256 decode steps reads the 4.02 B bf16 weights (8.0 GB) and the batch's KV cache (147,456 "
                        "bytes a token over a mean context of 81 prompt tokens plus the step's; "
     "2.0 TB over the 256 steps), 4.1 TB in all, 0.85 s at the H200's 4.8 TB/s (data sheet): the standalone vLLM runs at "
     "about 20% of that bound", _bandwidth_words),

    # docs/patches.md
    ("docs/patches.md", "on a GPU only together with every other lever, its own effect not measured yet",
     _says("its own effect not measured yet", lambda: _no_run_varies("replay_poll_s", 2.0))),
    ("docs/patches.md", "timed in profiled updates on the H200, its GPU tests passed there",
     _says("its GPU tests passed there", lambda: _compiled_profile("rmsnorm"))),
    ("docs/patches.md", "on the H200 in bf16 its first call's check and its GPU tests passed",
     _says("its first call's check and its GPU tests passed", lambda: _compiled_profile("pointwise"))),
    ("docs/results.md", "`h100-base` and `h100-sac18` ran one after the other in one lease on one H100 at one commit (session 23): "
     "selective checkpointing of the first 18 of the 36 layers against no lever (36 ran out of the H100's memory)",
     lambda: (f"(session {_session(f'{PROFILES}/h100-base')})", f"first {_profile('h100-sac18')['config']['selective_layers']} of",
              f"the {model_shape.resolve_model('qwen3-4b').layers} layers", f"({_sac36_layers()} ran out")
     if _same_commit("h100-base", "h100-sac18") and "H100" in _profile("h100-base")["device"] else False),
    ("docs/patches.md", "profiled on an H100 in sessions 23, 26 and 30, where it removed recompute and changed the update by "
                        "+2% to -3% against the profile without levers of its lease",
     lambda: S30C.sac_changes() if _sac_removed_recompute_each_time() else False),
    ("docs/patches.md", "on an H100's 79.2 GiB, 36 layers ran out of memory and 18 were profiled",
     lambda: (f"{_sac36_oom_capacity():.1f} GiB", f"{_sac36_layers()} layers ran",
              f"{_profile('h100-sac18')['config']['selective_layers']} were profiled")),
    ("docs/patches.md", "(a GPU test, `tests/test_host_adamw.py`, passed on the H200 in device session 12",
     _says('passed on the H200 in device session 12', lambda: _log_passes(GPU12,
                         "tests/test_host_adamw.py::test_overlapped_copies_are_bit_identical_to_the_serial_step_on_the_gpu"))),
    ("docs/patches.md", "the serial step ran the copies (0.29 s down, 0.29 s up)",
     lambda: (f"({_copies('h200-base')['DtoH']['seconds']:.2f} s down", f"{_copies('h200-base')['HtoD']['seconds']:.2f} s up)")),
    ("docs/patches.md", "the optimizer step's idle time in the profiled update fell from 1.24 to 0.70 s",
     lambda: (f"from {_idle_in_optimizer('h200-base'):.2f} to {_idle_in_optimizer('h200-overlap'):.2f} s",)
     if _same_commit("h200-base", "h200-overlap") else False),
    ("docs/patches.md", "about 5.8 GiB more for Qwen3-4B on two ranks", lambda: (f"{_host_overlap_extra_gib():.1f} GiB",)),
    ("docs/patches.md", "4 bytes a parameter: 16 GB pinned for Qwen3-4B",
     lambda: (f"{4 * _profile('h200-base')['model']['params'] / 1e9:.0f} GB pinned",)),
    ("docs/patches.md", "0.29 s of 16 GB at 55 GB/s in the profiled update",
     lambda: (lambda c: (f"{c['seconds']:.2f} s of {c['bytes'] / 1e9:.0f} GB at {c['bytes'] / c['seconds'] / 1e9:.0f} GB/s",))(
         _copies("h200-base")["DtoH"])),
    ("docs/patches.md", "with overlapped copies, 0.70 s (`outputs/update_profile/h200-overlap/`)",
     lambda: (f"{_idle_in_optimizer('h200-overlap'):.2f} s",)),
    ("docs/patches.md", "copies the gradients to the host during the last backward and clips them there, bit-identical to the "
                        "serial step on the CPU",
     _by_test("bit-identical to the serial step on the CPU", PREFETCH_TEST)),
    ("docs/patches.md", "so the clipped host gradient equals the one the serial step copies down, bit for bit",
     _by_test("bit for bit", PREFETCH_TEST)),
    ("docs/patches.md", "`grad_clip` 0.05 (the coefficient below 1 at every step, which the test asserts)",
     lambda: (_prefetch_grad_clip_words(), *_by_test("below 1 at every step", PREFETCH_TEST)())),
    ("docs/patches.md", "the prefetched and host-clipped step equals the serial HostAdamW step bit for bit",
     _by_test("bit for bit", PREFETCH_TEST)),
    ("docs/results.md", "ten in one lease at 3815bfb: without levers, with the gradient prefetch, with the other levers, and "
                        "with all of them, twice each",
     lambda: (f"{ {10: 'ten'}.get(len(_session26_profiles('3815bfb')))} in one lease at 3815bfb",)
     if _twice_each_at_3815bfb() else False),
    ("docs/results.md", "run at 34% MFU: 6.92 s against the 5.91 s that 40% takes",
     lambda: (f"at {pct(_profile(FWD_BWD)['flops']['mfu_timed'])} MFU", f"{_wall(FWD_BWD):.2f} s",
              f"{_at_mfu(FWD_BWD, report_profile.MFU_TARGET):.2f} s that 40% takes")),
    ("docs/results.md", "Their kernels take 1.82 s forward, 1.20 s recomputing the checkpointed layers and 3.82 s backward",
     lambda: tuple(f"{_pass_seconds(k)(FWD_BWD):.2f} s {w}" for k, w in
                   (("forward", "forward"), ("recompute", "recomputing"), ("backward", "backward")))),
    ("docs/results.md", "With no recompute at all they would take 5.72 s at best, 41%",
     lambda: (f"{_without_the_recompute():.2f} s at best",
              pct(_profile(FWD_BWD)["flops"]["model_flops"]
                  / (_without_the_recompute() * _profile(FWD_BWD)["flops"]["peak_bf16_flops"])))),
    ("docs/results.md", "Keeping all 36 layers' activations ran out of the H100's memory (sessions 23 and 26)",
     lambda: (f"all {_sac36_layers()} layers'",) if "OutOfMemoryError" in _source_text(
         "outputs/_node/session26/h100-sac36-oom.console.log") else False),
    ("docs/results.md", "Selective checkpointing of half the layers removed 0.31 s of recompute for 21.6 GiB more peak memory, "
                        "and the update stayed at 10.66 s against 10.75 s",
     lambda: (f"removed {_session26_mean(_pass_seconds('recompute'), 'h100-base', 'h100-base2') - _pass_seconds('recompute')('h100-sac18.session26'):.2f} s",
              f"{_profile('h100-sac18.session26')['timing']['peak_allocated_gib'] - _profile('h100-base.session26')['timing']['peak_allocated_gib']:.1f} GiB more",
              f"at {_wall('h100-sac18.session26'):.2f} s against {_prefetch_means()[1]:.2f} s")),
    ("docs/results.md", "So 40% needs the optimizer step hidden and most of the recompute gone",
     _says("needs the optimizer step hidden and most of the recompute gone",
           _forty_needs_the_recompute_gone)),
    ("docs/results.md", "Those profiles recomputed the attention too, which the policy now keeps",
     _says("recomputed the attention too", lambda: _sac_profile_commits() - {"e852499"} <= {"1a788a6", "3815bfb"})),
    ("docs/results.md", "With the levers, GEMMs take 42% of the kernel time, attention 16% and the chunked log-probs 14%",
     lambda: tuple(f"{pct(_kind_share('h100-levers2.session26', k))}" for k in ("gemm", "attention", "chunked_logprob"))),
    ("docs/offline-node.md", "without the gradient prefetch, which made the profiled update slower",
     _says("made the profiled update slower", lambda: _prefetch_means()[2] > _prefetch_means()[3])),
    ("docs/patches.md", "It passed again on an NVIDIA H100 at 3815bfb (`outputs/_node/session26/prefetch-test.log`)",
     lambda: _prefetch_again_words()),
    ("docs/patches.md", "The prefetch does not make the update faster",
     _says("does not make the update faster", lambda: _prefetch_means()[0] >= _prefetch_means()[1]
           and _prefetch_means()[2] >= _prefetch_means()[3])),
    ("docs/patches.md", "alone, 10.79 s against 10.75 s without levers (means of two; the runs of one profile differ by "
                        "up to 0.28 s)",
     lambda: ("{:.2f} s against {:.2f} s".format(*_prefetch_means()[:2]), f"up to {_largest_spread():.2f} s")),
    ("docs/patches.md", "on top of the overlapped copies and the compiled kernels, 8.45 s against 8.29 s without it",
     lambda: ("{:.2f} s against {:.2f} s".format(*_prefetch_means()[2:]),)),
    ("docs/patches.md", "the prefetch moves the gradients' copies to the host into the backward, whose kernel time grows "
                        "by 0.34 s",
     lambda: (f"grows by {_prefetch_change(_pass_seconds('backward')):.2f} s",)),
    ("docs/patches.md", "the optimizer step's kernels shrink by 0.29 s and its idle time grows by 0.25 s",
     lambda: (f"shrink by {-_prefetch_change(_pass_seconds('optimizer')):.2f} s",
              f"grows by {_prefetch_change(_idle_in_optimizer):.2f} s")),
    ("docs/patches.md", "with the other levers, the optimizer step's idle time grows by 0.64 s",
     lambda: (f"grows by {_prefetch_change(_idle_in_optimizer, levers=True):.2f} s",)),
    ("docs/patches.md", "The most the prefetch could hide is the copies down (0.29 s of DtoH in the profile without levers)",
     lambda: (f"({_copies('h100-base.session26')['DtoH']['seconds']:.2f} s of DtoH",)),
    ("docs/patches.md", "At the seed's workload it is not measured",
     _says("not measured", lambda: _no_seed_run_with("host_prefetch_grads", False))),
    ("docs/patches.md", "It passed on an NVIDIA H100 at 6d24036 (`outputs/_node/session25/prefetch-test.log`)",
     lambda: _prefetch_on_the_gpu_words()),
    ("docs/patches.md", "The serial run first reproduces itself bit for bit",
     _says("bit for bit", lambda: bool(_prefetch_on_the_gpu_words()))),
    ("docs/patches.md", "Then the prefetched run equals it bit for bit, with and without the overlapped copies",
     _says("bit for bit", lambda: bool(_prefetch_on_the_gpu_words()))),
    ("docs/patches.md", "ran on the H200 with one rank in device session 9 and passed",
     lambda: (f"with one rank in device session 9 and {_outcome(RESUME9)}",)
     if _passed(RESUME9) == 1 else False),
    ("docs/patches.md", "The committed run (492a9ee, every patch selected, `selective_checkpoint` and `grad_prefetch` among "
     "them): 317 tests, every one passing in all three modes, no regression", lambda: _verl_compat_words()),
    ("docs/patches.md", "the modes took 418, 322 and 291 s",
     lambda: (", ".join(f"{s:.0f}" for s in list(_verl_compat()["seconds"].values())[:2])
              + f" and {list(_verl_compat()['seconds'].values())[2]:.0f} s",)),
    ("docs/patches.md", "The kernels' measurements (from a dirty tree) are in `outputs/kernels/h200/`",
     _says("(from a dirty tree)", lambda: _dirty("outputs/kernels/h200"))),
    ("docs/patches.md", "one fwd+bwd of a 24,576-token micro-batch of the seed's lengths took 11.96 ms with the repeat and "
                        "11.45 ms without",
     lambda: (lambda t: (f"{int(t[0]):,}-token", f"{t[1]} ms with the repeat and {t[2]} ms without"))(
         re.search(r"one fwd\+bwd of (\d+) tokens: repeat ([\d.]+) ms, native ([\d.]+) ms",
                   (REPO_ROOT / GQA12).read_text()).groups())
     if _log_passes(GQA12, "tests/test_varlen_attention.py") else ()),
    ("docs/patches.md", "in the profiled update elementwise kernels took 30% of the kernel time",
     lambda: (f"took {pct(_kind_share('h200-base', 'elementwise'))} of",)),
    ("docs/patches.md", "On a GPU they ran on the H200 in device session 12 and passed, 24 of 24",
     lambda: (f"and {_outcome(GPU12)}, "
              f"{_passed(GPU12)} of 24",)),
    ("docs/patches.md", "In device session 26, on an H100 at 3815bfb, the logits' test failed its bound of that time",
     _says("failed", lambda: _log_says(S26_COMPILED_3815, "FAILED tests/test_compiled_patches.py::"
                                                          "test_qwen3_4b_widths_on_the_gpu")
           and "| 4 | A | 3815bfb |" in _source_text(S26))),
    _quote("docs/patches.md", "86,881 of 12,154,880 logits differed, the largest move one step (2^-5) at the largest "
                              "logit, 5.31", S26),
    ("docs/patches.md", "At cff2abc the bound is one step, and the file's tests passed on an H100, 15 with 1 skipped",
     lambda: (f"passed on an H100, {_passed(S26_COMPILED_CFF)} with 1 skipped",) if "tree: cff2abc" in
     _source_text(S26_COMPILED_CFF) and "NVIDIA H100" in _source_text(S26_COMPILED_CFF) else False),
    ("docs/patches.md", "One norm's output there differed from eager's in 0 of 1,310,720 elements",
     lambda: ("in {:,} of {:,} elements".format(*_one_norm_on_the_gpu()),)),
    ("docs/patches.md", "the first call's check passed, so the forward of that call was eager's bit for bit, and the GPU tests, "
     "which also compare the gradients, passed on the H200",
     _says("the first call's check passed", lambda: _compiled_profile("pointwise"))),
    ("docs/patches.md", "(Qwen3-4B: 34,816 elements, 1.6 GiB a layer at 24,576 tokens)",
     lambda: (f"{_selective_layer()[0]:,} elements", f"{_selective_layer()[1]:.1f} GiB a layer")),
    ("docs/patches.md", "one update profiled with all 36 layers selective",
     lambda: (f"all {model_shape.resolve_model('qwen3-4b').layers} layers",)),
    ("docs/patches.md", "Not checked yet: how the policy's dispatch mode combines with the compiled kernels",
     _says("Not checked yet", lambda: not _sac_with_compiled_kernels())),

    # docs/reliability.md
    ("docs/reliability.md", "the padded seed arm planned 1.5% and ran out of the card at step 3",
     lambda: (lambda card, plan: (f"planned {pct(plan.headroom_gib / card)}", f"at step {_padded_failure()[2]}"))(
         *_padded_plan(12288))),
    ("docs/reliability.md", "this was a constant 32-35 GiB per node more than the check counts",
     lambda: (_host_gap_range(),)),
    ("docs/reliability.md", "No committed GPU run lost a worker",
     _says("No committed GPU run lost a worker", lambda: _failed_runs_say("verl exited with timeout"))),
    # design facts: the configuration a sentence describes, read from the parameter file or the run's recipe
    ("README.md", "The arc is measured at the seed's own workload (24,576-token micro-batches, responses up to 4,096 tokens",
     lambda: (f"({_seed_profile()['ppo_max_token_len_per_gpu']:,}-token",
              f"up to {_seed_profile()['max_response_length']:,} tokens")
     if _seed_profile()["use_remove_padding"] else False),
    ("README.md", "the earlier arc at a 256-token stand-in shape on two GPUs",
     lambda: (f"{_arm('1-fixes-hostadamw')['recipe']['max_response_length']}-token",
              "two GPUs" if _arm("1-fixes-hostadamw")["recipe"]["n_gpus"] == 2 else "?")),
    ("docs/results.md", "The seed trained with 24,576-token micro-batches",
     lambda: (f"{_seed_profile()['ppo_max_token_len_per_gpu']:,}-token",)),
    ("docs/results.md", "The chunked log-probs are what make 24,576 tokens per micro-batch fit",
     lambda: (f"{_seed_profile()['ppo_max_token_len_per_gpu']:,} tokens",) if _seed_profile()["logits"] == "chunked" else False),
    ("docs/results.md", "at 512 tokens the lowest value measured (0.4) already ran the whole batch without queueing a request",
     lambda: (lambda w, tokens, low: (f"at {tokens} tokens", f"measured ({low:g})") if w == 0 else False)(*_sweep_waiting(0.4))),
    ("docs/results.md", "at the seed's workload (unpadded, 24,576-token micro-batches) the fraction is several times higher",
     _says("several times higher", lambda: _update_mfu(seed=True) >= 3 * _update_mfu(seed=False))),
    ("docs/results.md", "(`outputs/_node/vllm_standalone/h200-seed/`, session 12: the seed profile's shape at the synthetic "
                        "length mean of 1400)",
     lambda: (f"session {_session('outputs/_node/vllm_standalone/h200-seed')}:",
              f"mean of {_json('outputs/_node/vllm_standalone/h200-seed/metrics.json')['shape']['response_length_mean']})")),
    ("docs/results.md", "with remove-padding, chunked log-probs, 24,576 tokens per micro-batch and every lever",
     lambda: (lambda r: (f"{r['ppo_max_token_len_per_gpu']:,} tokens",) if r["use_remove_padding"] and r["logits"] == "chunked"
              and r["rmsnorm"] == r["pointwise"] == "compiled" and r["host_overlap_copies"] else False)(
         _arm(_fastest("h200-1gpu")["variant"])["recipe"])),
    ("docs/results.md", "`h200` is session 7's; the other four ran one after the other in one lease at one commit (session 11)",
     lambda: (f"session {_session(f'{PROFILES}/h200')}'s", f"(session {_session(f'{PROFILES}/h200-base')})")
     if _same_commit(*SESSION11_PROFILES)
     and len({_session(f"{PROFILES}/{p}") for p in SESSION11_PROFILES}) == 1 else False),
    ("docs/offline-node.md", "the `h200` profile's two replicas are measured as one: 128 of its 256 sequences",
     lambda: (lambda r: (f"{r['train_batch_size'] * r['rollout_n'] // r['n_gpus']} of its "
                         f"{r['train_batch_size'] * r['rollout_n']} sequences",))(
         _yaml("nbs/params/05_grpo_qwen3_4b.h200.yaml"))),
    ("docs/offline-node.md", "4 packed micro-batches of <= 24,576 tokens",
     lambda: (f"{_profile('h200-base')['config']['micro_batches']} packed micro-batches of <= "
              f"{_profile('h200-base')['config']['max_tokens_per_micro_batch']:,} tokens",)),
    ("docs/offline-node.md", "Session 11 lost a finished job that way ([its record](../outputs/_node/session11/README.md)), and "
     "session 16 a running one after a poll that only waited",
     _says('Session 11 lost a finished job', lambda: "was lost" in (REPO_ROOT / "outputs/_node/session11/README.md").read_text()
     and "one seed run lost" in (REPO_ROOT / "outputs/_node/session16/README.md").read_text())),
]

# docs/lab-notes.md, the dated history: each number quoted from the record it cites (a session's README, a
# COMMAND.txt, a log) or from the generated blocks, each status read from the run or the log
L = "docs/lab-notes.md"
LAB_NOTES = [
    (L, "The verl arms of notebook 05 ran on an offline node with 2 x H200 over several device sessions",
     lambda: tuple({f"{_arm(a)['recipe']['n_gpus']} x H200" for a in ("1-fixes-hostadamw", "4-rank0-owner", ARM5)})),
    (L, "Its GPU runs (arm 5 on 2 x H200) stopped twice",
     lambda: ("stopped twice",) if len(list((REPO_ROOT / ARMS).glob(f"{ARM5}.session*.failed"))) == 2 else False),
    (L, "the fourth and fifth device sessions trained the arm 3 of 3 steps with both ranks bit-identical",
     lambda: tuple({f"the arm {_steps_trained(a)} of {_arm(a)['recipe']['steps']} steps" for a in
                    (f"{ARM5}.session4", ARM5)})
     if all(_arm(a)["sanity"].get("rank_max_abs_diff") == 0 for a in (f"{ARM5}.session4", ARM5)) else False),
    (L, "the third session's 2-skip-old-logprob hit the launch's time limit after two of its three steps",
     lambda: ("after two of its three steps",) if re.search(r"exited with timeout .* logged 2/3 steps", _source_text(
         f"{ARMS}/2-skip-old-logprob.session3.failed/FAILED.txt")) else False),
    (L, "that recompute ran out of the 47.4 GiB card in the skip arms",
     lambda: tuple({f"{_arm(a)['recipe']['emulate_gpu_gib']:g} GiB card" for a in
                    ENTROPY_BACKPROP})
     if all(_outcome_of(a).startswith("torch_oom") for a in ENTROPY_BACKPROP) else False),
    (L, "The GPU test passed on that node", lambda: (f"The GPU test {_outcome(GPU5)}",)),
    (L, "the two-GPU test of that path passed on the node", lambda: (f"test of that path {_outcome(GPU5)}",)),
    _quote(L, "The seed's workload on one H200 (session 6)", C5),
    (L, "so the `h200-seed` profile runs 32 x 8 on one emulated 47.4 GiB card",
     lambda: (lambda r: (f"runs {r['train_batch_size']} x {r['rollout_n']}", f"one emulated {r['emulate_gpu_gib']:g} GiB")
              if r["n_gpus"] == 1 else False)(_arm("h200-seed-1-fixes-hostadamw")["recipe"])),
    _quote(L, "The kernels' GPU tests passed there (3 passed, 24 s)", C5),
    (L, "Arm 5 ran 10 min 14 s from launch to exit and arm 1 12 min 27 s",
     lambda: (f"Arm 5 ran {_node_time(C5, 'h200-seed-5-master-on-host-cast-once ran')}",
              f"arm 1 {_node_time(C5, 'h200-seed-1-fixes-hostadamw')}")),
    _quote(L, "Both arms' first steps sampled the same lengths (mean 1054 tokens); afterwards arm 1's grew to 2094 by step 4",
           GENERATED),
    _quote(L, "the first learning steps (session 7)", _session_readme(7)),
    _quote(L, "One H200, commit 63d5386, 1,639 of the session's 1,800 s of device time", _session_readme(7)),
    _quote(L, "The bundle of session 6 went over again as 11 parts", _session_readme(7), C5),
    _quote(L, "ran under papermill on the node itself (`outputs/01_offload_bug/h200-papermill/`, "
           "`outputs/06_util_sweep/h200-papermill-doc_small-u0.5/`), 297 s and 365.9 s",
           "outputs/01_offload_bug/h200-papermill/COMMAND.txt", _session_readme(7), "outputs/06_util_sweep/COMMAND.txt"),
    (L, "The checkpoint-resume GPU test failed at its first assertion",
     lambda: ("failed at its first assertion",) if "resume" in _source_text(_session_readme(7)) else False),
    _quote(L, "The first learning run (notebook 07, arm 1) reached step 8 of 40 before it was stopped",
           "outputs/07_does_it_learn/h200-session7-stopped/COMMAND.txt"),
    _quote(L, "Its reward rose from 0.009 to 0.216, but each step took about 20 s for a 30.7M-parameter model after a 4-min "
           "start-up: gen 4.1 s (two of verl's 2-s polls), old_log_prob 4.3 s, update_actor 11-13 s, at an MFU of 0.0014",
           "outputs/07_does_it_learn/h200-session7-stopped/COMMAND.txt"),
    _quote(L, "a polling loop waited its full 351.4 s after the profile had finished", _session_readme(7)),
    (L, "No device was lent in session 8", lambda: ("No device was lent in session 8",)
     if not (REPO_ROOT / "outputs/_node/session8").exists() else False),
    _quote(L, "The node's trace of one update (session 7)", f"{PROFILES}/h200/COMMAND.txt"),
    (L, "It is 19% of the kernel time",
     lambda: (f"It is {pct(_profile('h200')['summary']['passes']['recompute']['share'])} of",)),
    (L, "Even with it and the optimizer step's idle time gone, 40% MFU would need most of the forward and backward's "
     "elementwise time gone too", lambda: (f"{report_profile.MFU_TARGET:.0%} MFU",)),
    _quote(L, "session 7 lost about 4 min to a poll whose test never matched", _session_readme(7)),
    _quote(L, "about 10-12 min each on one GPU, from session 6's runs", C5),
    _quote(L, "It learns, and resume is bit-exact on the GPU (session 9)", _session_readme(9)),
    (L, "The checkpoint-resume test passed on the H200",
     lambda: (f"The checkpoint-resume test {_outcome(RESUME9)}",)),
    (L, "Notebook 07's three runs ran side by side on the one GPU and trained 40 steps each, in 23.4 min with start-up",
     lambda: (f"trained {_learning()['config']['steps']} steps each", _node_minutes(_session_readme(9), "learning"))
     if all(r["steps_trained"] == _learning()["config"]["steps"] for r in _learning()["analysis"]["per_run"].values())
     else False),
    (L, "Arm 5 is inside it at 22 of 40 steps",
     lambda: (lambda c: (f"at {c['in_range']} of {c['steps']} steps",))(_learning()["analysis"]["compare"]["per_step"])),
    (L, "HostAdamW's overlapped copies passed their GPU bit-identity test (both cases) in the same run",
     lambda: ("passed their GPU bit-identity test (both "
              "cases)",) if "both of its cases" in _source_text(_session_readme(9)) else False),
    _quote(L, "(session 6's seed runs took 9-13 min each on one GPU", C5),
    (L, "for the 1.3x update tokens/s target", lambda: (f"{report_seed.REMOVE_PADDING_SPEEDUP_TARGET:g}x",)),
    _quote(L, "Padded against unpadded at the seed's shape (session 10)", _session_readme(10)),
    _quote(L, "put arm 1 padded at the profile's 24,576 tokens per micro-batch at 56.6 GiB in update_fwd_bwd, and fit it at "
           "12,288 with 0.69 GiB to spare", "docs/results.md", f"{ARMS}/{PADDED}/metrics.json"),
    _quote(L, "So `seed-padded` ran at 12,288, and the OOM at 24,576 stays the planner's, not measured", "docs/results.md"),
    _quote(L, "The padded run trained steps 1 and 2, peaked at 46.76 GiB and ran out of the card in update_actor at step 3",
           GENERATED),
    (L, "Pre-flight now warns when a padded plan leaves under 5% of the card",
     lambda: (f"under {preflight_memory.PADDED_HEADROOM_FRACTION:.0%} of",)),
    _quote(L, "Its step 1 processed the same tokens as the padded run's step 1 (327,975 and 327,969)", GENERATED),
    _quote(L, "the unpadded update processed 3.35x the padded one's tokens per second", GENERATED),
    _quote(L, "steps 2.. of the session-6 arm 1 (lr 1e-6, longer responses) give 4.22x", GENERATED),
    _quote(L, "The update's levers profiled, the unfused run lost (session 11)", _session_readme(11)),
    _quote(L, "The bundle was rebuilt (359 MiB) and cut into 36-MiB parts: a 50-MiB part with the 23-MiB tree passed the "
           "64 MiB a call carries", _session_readme(11)),
    _quote(L, "ran and ended 7 min 30 s after it started", _session_readme(11)),
    (L, "The compiled kernels cut the elementwise kernel time to about a quarter, and both levers together cut the update "
     "by 19%, to 28% MFU",
     lambda: (f"by {1 - _wall('h200-levers') / _wall('h200-base'):.0%}",
              f"to {pct(_profile('h200-levers')['flops']['mfu_timed'])} MFU")
     if 0.2 <= _profile("h200-compiled")["summary"]["categories"]["elementwise"]["ms"]
     / _profile("h200-base")["summary"]["categories"]["elementwise"]["ms"] <= 0.3 else False),
    _quote(L, "The 40% target stays out of reach from these levers: even with the remaining optimizer-step idle time and "
           "the whole recompute gone, the trace bounds the update at 38%", GENERATED),
    (L, "compiled_pointwise's own first-call check passed on the H200 in bf16",
     lambda: ("first-call check passed",) if _profile("h200-compiled")["config"]["pointwise"] == "compiled"
     and _profile("h200-compiled")["timing"]["timed"] else False),
    (L, "the 0.2-s replay poll",
     lambda: (f"the {_arm(LEVERS12)['recipe']['replay_poll_s']:g}-s",)),
    _quote(L, "The unfused logits' OOM, the rollout's ceiling, native GQA (session 12)", _session_readme(12)),
    (L, "Standalone vLLM at the seed profile's shape: 9,759 output tokens/s",
     lambda: (f"{_json('outputs/_node/vllm_standalone/h200-seed/metrics.json')['output_tok_s']:,.0f} output tokens/s",)),
    (L, "verl's rollout at that shape reaches 92% (the padded run of 957fbb3) and 98% (the levers run) of it, so the gen "
     "target (70%) holds where it is measured",
     lambda: (f"reaches {pct(_limits()[PADDED]['gen_fraction'])}",
              f"and {pct(_limits()[LEVERS12]['gen_fraction'])} (the levers",
              f"target ({report_limits.GEN_FRACTION_TARGET:.0%})")),
    (L, "bit for bit the repeated heads' result in deterministic mode, 11.45 against 11.96 ms per fwd+bwd",
     lambda: (lambda t: (f"{t[2]} against {t[1]} ms",))(re.search(
         r"one fwd\+bwd of (\d+) tokens: repeat ([\d.]+) ms, native ([\d.]+) ms",
         _source_text(GQA12)).groups())),
    (L, "The compiled kernels' profile ran again (8.87 s) and the levers' 24 GPU tests passed",
     lambda: (f"({_wall('h200-compiled.session12'):.2f} s)",
              f"{_passed(GPU12)} GPU tests "
              f"{_outcome(GPU12)}")),
    _quote(L, "`seed-levers` trained 2 of 4 steps before the lease ended (actor peak 31.62 GiB against arm 5's 32.64 at "
           "f548321)", GENERATED),
    _quote(L, "The planner's `compiled_pointwise` option now takes that tensor off (x1.09)", GENERATED),
    (L, "24,576 tokens per micro-batch) and every other lever, in one lease at one commit",
     lambda: (f"{_arm(_fastest('h200-1gpu')['variant'])['recipe']['ppo_max_token_len_per_gpu']:,} tokens",)
     if _fastest("h200-1gpu")["pairing"] else False),
    _quote(L, "At the seed's workload the rollout is over half the step (35.6 of 66.1 s in the levers run's step 2) and "
           "runs at 98% of standalone vLLM", GENERATED),
    (L, "30% off that step would take 19.8 s out of the other 30.5 s; the update at 40% MFU instead of its 32% would save "
     "about 6.0 of its 29.2 s", lambda: _seed_levers_arithmetic()),
    (L, "Issue 23 asks for response means between 25% and 60% of the maximum",
     lambda: (f"between {report_seed.LENGTH_BAND[0]:.0%} and {report_seed.LENGTH_BAND[1]:.0%}",)),
    _quote(L, "Arm 5's committed seed run (f548321, lr 1e-6, synthetic mean 1200) drifted to 917 tokens over steps 2..4, "
           "22% of 4,096; arm 1's is at 43%", GENERATED),
    _quote(L, "The profile has run at lr 0 and mean 1400 since (1,325 expected, 32%; the levers run sampled 1,332)",
           "nbs/params/05_grpo_qwen3_4b.h200-seed.yaml", GENERATED),
    _quote(L, "No machine for the lease (session 13)", _session_readme(13)),
    _quote(L, "A machine that came with 432 s of the lease left ran only `vllm-ceiling-1gpu`", _session_readme(16)),
    (L, "15,763 output tokens/s, about 20% of the H200's memory-bandwidth bound at that small batch",
     lambda: (f"{_json('outputs/_node/vllm_standalone/h200-1gpu/metrics.json')['output_tok_s']:,.0f} output tokens/s",
              _bandwidth_words()[-1].removesuffix(" of that bound"))),
    (L, "Arm 5 at the seed's workload for 3 of 4 steps (session 17)",
     lambda: (f"for {_steps_trained('h200-seed-5-master-on-host-cast-once.session17')} of "
              f"{_arm('h200-seed-5-master-on-host-cast-once.session17')['recipe']['steps']} steps",)),
    (L, "the second ran steps 1 to 3 of 4 before the same happened",
     lambda: (f"steps 1 to {_steps_trained('h200-seed-5-master-on-host-cast-once.session17')} of "
              f"{_arm('h200-seed-5-master-on-host-cast-once.session17')['recipe']['steps']}",)),
    (L, "It has 3 steps where issue 23 asks for at least 4, so `seed-arm5` stays first in the next lease, polled in calls "
     "of at most 240 s", lambda: (f"It has {_steps_trained('h200-seed-5-master-on-host-cast-once.session17')} steps",)),
    _quote(L, "Arm 5 at the seed's workload for 4 steps, and the step-time pair at one commit (session 18)", _session_readme(18)),
    _quote(L, "`outputs/05_grpo_qwen3_4b/COMMAND.txt`, session 18)", C5),
    _quote(L, "`h200-seed-5-master-on-host-cast-once.session18`: 4 of 4 steps, response-length mean 1331 over steps 2.. "
           "(32% of 4,096, inside issue 23's band), actor peak 32.31 GiB allocated, the planner x1.08", GENERATED),
    _quote(L, "With arm 1's `h200-seed-1-fixes-hostadamw` (f548321, 4 steps, 43%) both arms have now trained 4 steps", GENERATED),
    _quote(L, "step 13.3 against 30.8 s (-57%, issue 24's target -30%), update_actor 7.8 against 23.6 s at 27% against 9.0% "
           "MFU, gen 4.5 against 6.1 s (92% and 68% of the standalone vLLM of that shape)", GENERATED),
    (L, "Both passed the sanity bar",
     lambda: ("Both passed",) if all((_arm(n)["sanity"] or {}).get("passed") for n in
                                     (_fastest("h200-1gpu")["variant"], _fastest("h200-1gpu")["base"])) else False),
    (L, "Step 1 processed the same 86,256 tokens in both; the gradient norms there are 2.3992 and 2.3918 (0.31% apart), "
     "about as far apart as arm 5 run in two sessions on that batch (`5-master-on-host-cast-once` 2.3690, `.session4` 2.3765)",
     lambda: _step1_pair_words()),
    _quote(L, "Still short of issue 24's 40% MFU: 27% at this shape, 32% at the seed's (`...-levers.session12`); the profiled "
           "update's trace bounds it at 38% without fused kernels", GENERATED),
    _quote(L, "Session 21 asked for an H200, got an H100 whose machine was taken back for other work after one call, then "
              "waited out the refusals and ran `seed-arm5 seed-arm0` on an NVIDIA H100 80GB HBM3", _session_readme(21)),
    _quote(L, "step 84.9 s, gen 44.8 s, update_actor 39.0 s, actor peak 32.30 GiB", GENERATED),
    _quote(L, "the planner within 10% on gen (x1.06) and update_actor (x1.04)", GENERATED),
    _quote(L, "The H200's arm 5 at 3efa1de took 74.1 s a step, gen 36.8 s", GENERATED),
    _quote(L, "(the H100's 3.35 TB/s against the H200's 4.8)", "rlkit/planning/roofline.py"),
    _quote(L, "One lease cannot hold both arm 1 and arm 5 on the H100 (arm 5 alone took 12 min 28 s from launch to exit, "
              "arm 1 took 14 min 32 s on the H200)", _session_readme(21), _session_readme(19)),
    _quote(L, "The seed's arc from one commit begins: arms 0 and 1 (session 19)", _session_readme(19)),
    _quote(L, "`h200-seed-0-stock.session19`: vLLM refused to start (30.68 GiB free of the 40.29 it asks); the planner put "
           "the free memory at 31.9 GiB", f"{ARMS}/h200-seed-0-stock.session19/verl.log", GENERATED),
    (L, "`h200-seed-1-fixes-hostadamw.session19`: 4 of 4 steps at lr 0",
     lambda: (f"{_steps_trained('h200-seed-1-fixes-hostadamw.session19')} of "
              f"{_arm('h200-seed-1-fixes-hostadamw.session19')['recipe']['steps']} steps at lr "
              f"{_arm('h200-seed-1-fixes-hostadamw.session19')['recipe']['lr']:g}",)),
    _quote(L, "arm 1 took 14 min 32 s from launch to exit, not the 9-10 min of arm 5", _session_readme(19)),
    _quote(L, "Its response means per step (1200, 1342, 1238, 1422) are those of arm 5 at 3efa1de to within 10 "
              "tokens", GENERATED),
    _quote(L, "because a poll was sent more than 30 s after the one before", _session_readme(19)),
    _quote(L, "the planner's CUDA-graph term is what vLLM logged for the model in committed runs (`rlkit.planning.vllm_terms`; 0.61 GiB "
           "for Qwen3-4B, not the assumed 1.0), which closes that miss of notebook 06 (52 of 64 quantities within 10%, 44 "
           "before)", GENERATED, "rlkit/planning/budget.py"),
    (L, "the test now does too (3747d7d), and it ran on the H200 in session 9 (below)",
     lambda: ("it ran on the H200 in session 9",) if _outcome(RESUME9) == "passed" else False),
    (L, "three levers for the update (session "
        "8)", lambda: ("(session 8)",) if not (REPO_ROOT / "outputs/_node/session8").exists() else False),
    (L, "On the GPU the question stayed open until session 11 (below)",
     lambda: ("until session 11",) if _session(f"{PROFILES}/h200-compiled") == 11 else False),
    (L, "so which phase it ran out in was not known until session 12 (below)",
     lambda: ("until session 12",) if "unfused" in _source_text(_session_readme(12)) else False),
    (L, "the padded run against arm 1 of another commit no longer says \"met\"",
     _says("no longer says", lambda: all(": met" not in line and "not judged" in line
                                         for line in _source_text(GENERATED).splitlines()
                                         if f"{PADDED}` against `h200-seed-1-fixes-hostadamw`" in line))),
    (L, "the planner's forward pass had 10 bytes per logit element on the `torch_fp32` path the sweep assumes",
     lambda: ("had 10 bytes",) if __import__("rlkit.planning.budget", fromlist=["x"]).LOGITS_BYTES["torch_fp32"]["forward"]
     == 14 else False),
    (L, "still peak above 1-fixes-hostadamw, which computes no entropy in the update",
     _says("still peak above", lambda: min(_arm(a)["summary"]["actor_max_allocated_gib"]
                                           for a in ("2-skip-old-logprob", "3-pinned"))
           > _arm("1-fixes-hostadamw")["summary"]["actor_max_allocated_gib"])),
    (L, "46.24 GiB without it, 39.87 GiB with it, as 1-fixes-hostadamw's 39.87 GiB",
     lambda: tuple(f"{_arm(a)['summary']['actor_max_allocated_gib']:.2f} GiB{s}" for a, s in
                   (("4-rank0-owner.session4", " without"), ("4-rank0-owner", " with"), ("1-fixes-hostadamw", "")))),
    (L, "Every run learns by notebook 07's criteria, and arm 5 stays within the band around the two arm-1 runs at every step",
     _says("at every step", lambda: _learning()["analysis"]["verdict"]["all_learned"]
           and _learning()["analysis"]["verdict"]["compare_every_step_within_band"])),
    (L, "none measured on a GPU then (sessions 11 and 12 below measured them)",
     _says("sessions 11 and 12 below measured "
           "them", lambda: {_session(f"{PROFILES}/{p}") for p in ("h200-overlap", "h200-compiled")} == {11}
           and _outcome(GPU12) == "passed")),
    (L, "bit-identical by construction; the GPU test exists",
     _by_test("the GPU test exists",
              "tests/test_host_adamw.py::test_overlapped_copies_are_bit_identical_to_the_serial_step_on_the_gpu")),
    (L, "not bit-exact, held to a stated tolerance; in fp32 through verl's engine it agrees to fp32 rounding",
     _by_test("agrees to fp32 rounding",
              "tests/test_compiled_patches.py::test_through_verls_engine_in_fp32_the_norm_differs_only_in_summation_order")),
    (L, "rotary and SwiGLU; bit-identical on the CPU)",
     _by_test("bit-identical on the CPU",
              "tests/test_compiled_patches.py::test_a_tiny_qwen3_wrapped_like_verls_actor_matches_eager")),
    (L, "compiled RMSNorm within its tolerance; compiled rotary and SwiGLU bit for bit)",
     _says("bit for bit", lambda: _log_passes(GPU12, "tests/test_compiled_patches.py"))),
    _quote(L, "The bundle had to be cut into 36-MiB parts: with the 26-MiB tree, a 50-MiB part does not fit one 64-MiB call",
           _session_readme(18)),
    _quote(L, "The bundle had to be cut into 30-MiB parts: the tree is now 27.5 MiB, and a 36-MiB part with it was refused",
           _session_readme(19)),
    _quote(L, "the bundle rebuilt and carried in 36-MiB parts", _session_readme(12)),
    _quote(L, "The bundle went over as 11 parts of 34 MiB: a call carries 64 MiB with the tree, and the tracked tree was 25 "
              "MiB", C5,
           _session_readme(11)),
]
S23, S24, S25 = _session_readme(23), _session_readme(24), _session_readme(25)
LAB_NOTES += [
    _quote(L, "Ten calls without a machine, the prefetch's GPU test, the engine settings by arithmetic (session 25)", S25),
    _quote(L, "Ten calls between them could start no machine, H100 or H200", S25),
    (L, "HostAdamW's gradient prefetch passed its GPU test on the H100, bit for bit against the serial step",
     _says("passed its GPU test on the H100, bit for bit", lambda: bool(_prefetch_on_the_gpu_words()))),
    _quote(L, "takes 0.5% of gen at its bound on the H200 and 0.4% on the H100", "docs/results.md"),
    _quote(L, "The next leases stand as in session 21's list", _session_readme(21)),
    _quote(L, "No machine, the prefetch and the decode roofline on the CPU (session 24)", S24),
    _quote(L, "Session 24 began with 119 s of device time, too little to start a machine", S24),
    (L, "bit-identical to the serial step on two gloo ranks through verl's `optimizer_step`", _by_test(
        "bit-identical", "tests/test_grad_prefetch.py::"
        "test_prefetch_on_two_gloo_ranks_with_accumulation_clipping_and_a_non_finite_step_is_bit_identical")),
    _quote(L, "The levers profiled twice on one H100, compiled_rmsnorm's bound found at half a step (session 26)", S26),
    (L, "The forward and backward alone, without the optimizer step, reach 34% MFU",
     lambda: (f"reach {pct(_mfu(FWD_BWD))} MFU",)),
    (L, "The 40% target also needs the recompute gone, and the H100 has no room for the activations that would take",
     _says("also needs the recompute gone", lambda: _forty_needs_the_recompute_gone()
           and "OutOfMemoryError" in _source_text("outputs/_node/session26/h100-sac36-oom.console.log"))),
    (L, "The GPU tests of the compiled kernels failed once at 3815bfb",
     _says("failed once at 3815bfb", lambda: _log_says(S26_COMPILED_3815, "2 failed, 23 passed")
           and "| 4 | A | 3815bfb |" in _source_text(S26))),
    _quote(L, "On the H100 one logit of 5.31 moved by a whole step, which the H200 of session 12 had not shown", S26,
           "outputs/_node/session12/gpu-tests-profile-compiled.log"),
    (L, "At cff2abc the file passed on the H100",
     _says("passed", lambda: _passed(S26_COMPILED_CFF) == 15 and "tree: cff2abc" in _source_text(S26_COMPILED_CFF))),
    _quote(L, "Selective checkpointing profiled on an H100 (session 23)", S23),
    _quote(L, "old_log_prob's miss named on the CPU, no machine (session 22)", "outputs/06_util_sweep/COMMAND.txt"),
    _quote(L, "No call of session 22 got a machine", "outputs/06_util_sweep/COMMAND.txt"),
    _quote(L, "Session 23 began with 604 s of device time, too little for the bundle", S23),
    (L, "In one lease on an NVIDIA H100 80GB HBM3 at 1a788a6",
     lambda: (_profile("h100-sac18")["device"], _sac_pair()["commit"]) if _same_commit("h100-base", "h100-sac18") else False),
    (L, "(selective checkpointing of the first 18 layers)",
     lambda: (f"first {_profile('h100-sac18')['config']['selective_layers']} layers",)),
    (L, "the recompute pass fell from 1731 to 1415 ms, its GEMMs from 618 to 309 ms",
     lambda: (lambda p: (f"from {p['recompute'][0]:.0f} to {p['recompute'][1]:.0f} ms",
                         f"from {p['recompute_gemm'][0]:.0f} to {p['recompute_gemm'][1]:.0f} ms"))(_sac_pair())),
    (L, "entropy identical, the gradient norm within the run-to-run difference of two profiles without levers",
     _says("within the run-to-run difference", lambda: _sac_pair()["grad_within_run_to_run"])),
    (L, "The update did not get faster (10.93 s against 10.76 s, one timed update each)",
     lambda: (f"({_wall('h100-sac18'):.2f} s against {_wall('h100-base'):.2f} s",)
     if len(_profile("h100-sac18")["timing"]["timed"]) == 1 and _wall("h100-sac18") >= _wall("h100-base") else False),
    (L, "the GPU's idle time rose from 1228 to 1588 ms",
     lambda: (lambda p: (f"from {p['idle'][0]:.0f} to {p['idle'][1]:.0f} ms",))(_sac_pair())),
    (L, "The new waits are 126 `cudaEventSynchronize` calls (394 ms)",
     lambda: (lambda e: (f"are {e['count']} `cudaEventSynchronize` calls ({e['ms']:.0f} ms)",))(_sac_pair()["event_syncs"])
     if "cudaEventSynchronize" not in _profile("h100-base")["summary"]["host_syncs"]["calls"] else False),
    (L, "freeing cached blocks to find room at a 63.7 GiB peak on the 79.2 GiB card",
     lambda: (f"at a {_profile('h100-sac18')['timing']['peak_allocated_gib']:.1f} GiB peak",
              f"on the {_sac36_oom_capacity():.1f} GiB card")),
    (L, "The peak rose by 21.6 GiB where the planner's kept-outputs term gives 26.2 GiB for 18 layers at the largest "
        "micro-batch (x0.83 of it)",
     lambda: (lambda p: (f"rose by {p['peak_rise']:.1f} GiB", f"gives {p['kept_planned']:.1f} GiB for "
                         f"{p['layers']} layers", f"(x{p['peak_rise'] / p['kept_planned']:.2f} of it)"))(_sac_pair())),
    (L, "3.1 GiB of the difference is the attention output, which the run did not keep",
     lambda: (f"{_sac_pair()['attention_gib']:.1f} GiB of the difference",)),
    (L, "so it was recomputed (the recompute's attention time 224 ms against 220 ms)",
     lambda: (lambda a: (f"time {a[0]:.0f} ms against {a[1]:.0f} ms",) if a[1] > 0.9 * a[0] else False)(
         _sac_pair()["recompute_attention"])),
    (L, "The remaining 1.5 GiB (x0.94 of the term without the attention output) is not named",
     lambda: (lambda p: (f"remaining {p['kept_planned'] - p['attention_gib'] - p['peak_rise']:.1f} GiB",
                         f"(x{p['peak_rise'] / (p['kept_planned'] - p['attention_gib']):.2f} of"))(_sac_pair())),
    (L, "36 layers ran out of the H100's memory", lambda: (f"{_sac36_layers()} layers ran out",)),
    _quote(L, "the experiment now keeps the run's own error (commit 0d34c7b)", S23),
    (L, "so the pass holds 14 bytes per logit element where the planner had 10",
     lambda: (f"holds {budget.LOGITS_BYTES['torch_fp32']['forward']} bytes", f"had {budget.LOGITS_BYTES['torch_fp32']['train']}")),
    (L, "With that term the planner gives qwen3_4b_48g's old_log_prob 34.91 GiB against 38.56 GiB measured at util 0.5 "
        "(x1.10) and 39.14 GiB at util 0.6 (x1.12)",
     lambda: tuple(w for u in ("0.5", "0.6") for w in _old_log_prob_words(u))),
    (L, "old_log_prob's rest named (session 29)",
     _says("(session 29)", lambda: (REPO_ROOT / "tests/test_run_terms.py").exists())),
    (L, "The actor's process holds 1.15 GiB outside torch's allocator, not the planner's 0.5: verl's \"After FSDP\" line "
        "gives used minus reserved of 1.15 GiB in all 25 one-GPU runs of notebooks 05 and 06, both models",
     lambda: _after_fsdp_words()),
    (L, "its \"Before FSDP\" line reads 0.51 GiB, the actor's CUDA context, as the actor's own sample does",
     lambda: _before_fsdp_words()),
    (L, "The planner's old note took the baseline off again (0.55 GiB)",
     lambda: (f"({run_terms.actor_non_torch_term()['gib'] - _sweep_point('qwen3_4b_48g-u0.5')['measured']['baseline_used_gib']:.2f} GiB)",)),
    (L, "vLLM's sleeping worker holds 1.48 GiB for Qwen3-4B at util 0.5 and 2.06 GiB at 0.6, where the planner counted its "
        "CUDA graphs and context, 1.11 GiB; for Qwen2.5-0.5B 1.21-1.24 GiB", lambda: _asleep_words()),
    (L, "The peak does not rise with util: 38.56 GiB at util 0.4, 0.5 and 0.7, 39.14 GiB at 0.6, where vLLM logged 3.26 GiB "
        "still in use after its first sleep against 2.67 at the others", lambda: _util_words()),
    (L, "in step 1 every response ran to 256 tokens, so verl's cap of 8,192 tokens fits at most 24 sequences, 8,136 "
        "positions once padded to the longest", lambda: _step1_micro_batch_words()),
    (L, "verl pads them to the longest sequence without the prompts' left padding, 4 x (93 + 256) positions, not 4 x 512",
     lambda: _doc_small_micro_batch_words()),
    (L, "With them the planner gives qwen3_4b_48g's old_log_prob x1.06 at util 0.5 and x1.07 at 0.6, doc_small's x0.98 at "
        "every util, and 58 of notebook 06's 64 compared quantities within 10% (52 before)", lambda: _sweep_now_words()),
    (L, "at util 0.5 the actor's process peaked at 37.02 GiB, 2.57 GiB above the planner's actor share of 34.45 GiB",
     lambda: _actor_rest_words()),
    (L, "Its memory outside torch read 1.35 GiB in step 2's rollout",
     lambda: (f"read {_actor_in('qwen3_4b_48g-u0.5', 'gen', 2)[-1]:.2f} GiB",)),
    (L, "Through step 1's pass the process grew from 35.18 to 36.41 GiB",
     lambda: (lambda a: (f"from {next(x for x in a if x > 30):.2f} to {max(a):.2f} GiB",))(
         _actor_in("qwen3_4b_48g-u0.5", "old_log_prob", 1))),
]
S27, NB07 = _session_readme(27), "nbs/params/07_does_it_learn.h200.yaml"


def _no_machine_in_session27() -> bool:
    return "Nothing ran; nothing came back." in _source_text(S27)


def _notebook07_compares_the_fastest_variant() -> bool:
    """Notebook 07's h200 profile runs arm 1 and arm 5 with every computation-changing lever of seed-best, twice each,
    rlkit_varlen with remove-padding on both sides."""
    cfg = _yaml(NB07)
    levers = {"host_overlap_copies": True, "rmsnorm": "compiled", "pointwise": "compiled", "logits": "chunked",
              "replay_poll_s": 0.2}
    return (cfg["baseline_arm"] == "1-fixes-hostadamw" and cfg["compare_arm"] == ARM5 and cfg["repeats"] >= 2
            and cfg["compare_repeats"] >= 2 and levers.items() <= cfg["compare_overrides"].items()
            and cfg["attn_implementation"] == "rlkit_varlen" and cfg["use_remove_padding"] is True)


def _notebook07_lr_words() -> tuple | bool:
    cfg, committed = _yaml(NB07), _json("outputs/07_does_it_learn/h200/metrics.json")
    halved = cfg["lr"] == committed["config"]["lr"] / 2
    return (f"halved the lr to {cfg['lr']:.0e}".replace("e-0", "e-"),
            f"later than at {committed['config']['lr']:.0e}".replace("e-0", "e-")) if halved else False


S29 = "outputs/_node/session29/README.md"
S29_SELECTIVE = "outputs/_node/session29/selective-gpu-test.log"


def _selective_gpu_test_failed_in_its_helper() -> bool:
    """Session 29's run of the selective GPU test: one failure, raised in the test's _kept_storages (torch 2.11 keeps a
    list per op where 2.13 keeps a dict) while the second model ran, before the loss and gradients were compared."""
    log = _source_text(S29_SELECTIVE)
    return ("1 failed" in log and "def _kept_storages(storage)" in log
            and "AttributeError: 'list' object has no attribute 'values'" in log and "torch.equal" not in log)


LAB_NOTES += [
    (L, "No machine for the whole session; notebook 07 compares the fastest variant (session 27)",
     lambda: ("session 27", "compares the fastest variant")
     if _no_machine_in_session27() and _notebook07_compares_the_fastest_variant() else False),
    (L, "No call of session 27 got a machine", _says("No call of session 27 got a machine", _no_machine_in_session27)),
    (L, "It did not run in session 27; in session 29 it failed on the H200 in the test's own helper, before any "
        "comparison", _says("failed on the H200 in the test's own helper", _selective_gpu_test_failed_in_its_helper)),
    (L, "- Notebook 07 now compares arm 1, run twice, with the fastest correct variant, run twice: arm 5 with the "
        "overlapped copies, compiled RMSNorm and pointwise, chunked log-probs and the 0.2-s poll",
     _says("run twice, with the fastest correct variant, run twice", _notebook07_compares_the_fastest_variant)),
    (L, "(the steps before the baseline's mean reward covers 90% of its rise)",
     lambda: (f"covers {learning_curves.PLATEAU_SHARE:.0%} of its rise",)),
    (L, "The h200 profile halved the lr to 5e-4 so that the rise would come later than at 1e-3",
     _notebook07_lr_words),
    (L, "that choice was reasoned, not measured (session 29 measured it, below)",
     _says("session 29 measured it", lambda: bool(_stopped_curve("5-fastest.r1")))),
]
S28, NB07_2GPU = _session_readme(28), "nbs/params/07_does_it_learn.h200-2gpu.yaml"


def _no_machine_in_session28() -> bool:
    return "Nothing ran; nothing came back." in _source_text(S28)


def _notebook07_runs_on_two_ranks() -> bool:
    """Notebook 07's h200-2gpu profile: the h200 profile's comparison with every run on two ranks, its variant keeping
    arm 5's rank-0 owner in place of the overlapped copies."""
    cfg = _yaml(NB07_2GPU)
    overrides = cfg["compare_overrides"]
    return (cfg["n_gpus"] == 2 and cfg["baseline_arm"] == "1-fixes-hostadamw" and cfg["compare_arm"] == ARM5
            and overrides.get("host_rank0_owner", True) is True and not overrides.get("host_overlap_copies", False))


LAB_NOTES += [
    (L, "No machine again; notebook 07 on two ranks (session 28)",
     lambda: ("session 28", "two ranks") if _no_machine_in_session28() and _notebook07_runs_on_two_ranks() else False),
    (L, "No call of session 28 got a machine", _says("No call of session 28 got a machine", _no_machine_in_session28)),
    (L, "That choice is reasoned from committed runs, not measured on two ranks, and the profile is untested on a GPU",
     _says("not measured on two ranks", lambda: _notebook07_runs_on_two_ranks() and not any(
         (REPO_ROOT / "outputs/07_does_it_learn").glob("h200-2gpu*")))),
]
CLAIMS += LAB_NOTES

# sentences that state what a CPU test of the suite shows: the test is still there (and the suite runs it)
CLAIMS += [
    ("README.md", "bit-exact wherever the kernels are deterministic",
     _says("bit-exact wherever the kernels are deterministic", lambda: all(
         c["verdict"] == "bit-exact" for nb in ("01_offload_bug", "03_cast_once", "04_skip_old_logprob")
         for c in _json(f"outputs/{nb}/h200-deterministic/metrics.json")["determinism"]["checks"]
         if c["patched_vs_unpatched"] is not None))),
    ("README.md", "the AdamW step on the host through pinned buffers, bit-identical to `torch.optim.AdamW`",
     _by_test("bit-identical to `torch.optim.AdamW`",
              "tests/test_host_adamw.py::test_bit_exact_vs_torch_adamw_with_scheduler")),
    ("docs/results.md", "vLLM's PyTorch allocator held more during a rollout (how much: the block's \"Rollout\" line)",
     _says("held more during a rollout", lambda: "- Rollout: util does not cap vLLM's process" in _source_text(GENERATED))),
    ("docs/patches.md", "(bit-exact against the unpatched update), including verl's nesting of a second `train_mode` context",
     _says("bit-exact against the unpatched update", lambda: _tested("tests/test_master_on_host_verl.py",
                                                                     "test_verl_train_mode_cycle_through_its_own_engine_matches_the_baseline"))),
    ("docs/patches.md", "any thread count gives bit-identical parameters and state (`tests/test_host_adamw.py`)",
     _by_test("bit-identical parameters and state",
              "tests/test_host_adamw.py::test_host_threads_do_not_change_the_step")),
    ("docs/patches.md", "Both are bit-exact against torch's AdamW on two gloo ranks (the device path's code runs there on CPU "
                        "tensors), "
     "and a two-GPU test checks the NCCL path",
     _says("Both are bit-exact", lambda: _tested("tests/test_host_adamw.py",
                                                   "test_rank0_owner_two_gloo_ranks_exact_with_checkpoint_restore")
           and _tested("tests/test_host_adamw.py", "test_rank0_owner_broadcasts_over_nccl_by_default_bit_exact"))),
    ("docs/patches.md", "resumed in new processes from other weights, equals the uninterrupted run at steps 3 and 4 bit for bit",
     _says("bit for bit", lambda: _tested("tests/test_checkpoint_resume.py",
                                          "test_resume_through_verl_with_every_patch_is_bit_exact_and_other_patch_sets_are_refused"))),
    ("docs/patches.md", "verl 0.9.1 itself caps transformers below 5.11 where it is installed",
     lambda: tuple(f"below {m.group(1)}" for r in __import__("importlib.metadata", fromlist=["x"]).requires("verl")
                   if (m := re.match(r"transformers[^;]*<([\d.]+)", r)) and ";" not in r)),
    ("docs/patches.md", "It is not bit-exact: the squares of a row and the backward's reductions are summed in other orders",
     _by_test("not bit-exact",
              "tests/test_compiled_patches.py::test_through_verls_engine_in_fp32_the_norm_differs_only_in_summation_order")),
    ("docs/patches.md", "At apply it checks that transformers' forward still computes that expression, bit for bit on a probe, "
                        "and refuses otherwise",
     _by_test("refuses otherwise",
              "tests/test_compiled_patches.py::test_a_transformers_norm_that_computes_otherwise_is_refused")),
    ("docs/patches.md", "on a CPU with torch 2.13 the tiny Qwen3's logits and gradients are bit-identical to eager's",
     _by_test("bit-identical to eager's",
              "tests/test_compiled_patches.py::test_a_tiny_qwen3_wrapped_like_verls_actor_matches_eager")),
    ("docs/patches.md", "so the loss and every gradient are bit-identical to full checkpointing "
                        "(`tests/test_selective_checkpoint.py`",
     _says("bit-identical to full checkpointing", lambda: _tested("tests/test_selective_checkpoint.py",
                                                                   "test_loss_and_every_gradient_are_bit_identical_to_full_checkpointing"))),
    ("docs/offline-node.md", "the Chrome trace, at most 16 MiB",
     lambda: (f"at most {_profile('h200-base')['config']['trace_max_mib']:g} MiB",)),
    ("docs/multinode.md", "four ranks on two Ray nodes with an owner per node end bit-identical to each other and to the same "
                          "four ranks "
     "on one node with one global owner",
     _by_test("end bit-identical",
              "tests/test_multinode_ray.py::test_per_node_owners_on_two_ray_nodes_are_bit_identical_to_one_node")),
    ("docs/multinode.md", "nothing here has run on several real machines yet",
     _says("nothing here has run", lambda: _no_multinode_run())),
    (L, "The bit identity claims stay with the GPU tests, which did not run this lease",
     _says("which did not run this lease",
           lambda: "`profile-compiled`'s GPU tests" in _source_text("outputs/_node/session11/README.md").split("Not run:")[1])),
    ("docs/multinode.md", "Nothing below has run on a real multi-node cluster",
     _says("Nothing below has run", lambda: _no_multinode_run())),
]

SPECULATIVE = "outputs/speculative_bound/h200-seed"
def _determinism_reruns_from_6afd058() -> bool:
    """Session 29's deterministic parity reruns: every folder from commit 6afd058 (no -dirty), and 04's run began after
    notebook 07's two runs had stopped (the times its COMMAND.txt gives)."""
    shas = {_json(f"outputs/{n}/h200-deterministic/env.json")["git_sha"]
            for n in ("01_offload_bug", "03_cast_once", "04_skip_old_logprob")}
    command = _source_text("outputs/04_skip_old_logprob/h200-deterministic/COMMAND.txt")
    stopped, began = "06:07:20", "06:08:42"
    return (shas == {"6afd05837bbfaf9014bb5634b02a632bedfead39"} and f"stopped making progress at 06:07:13-{stopped}"
            in command and f"on 2026-12-07, {began}-" in command and stopped < began)


S29_STOPPED = "outputs/_node/session29/learning-stopped"


def _stopped_curve(run: str) -> list[tuple[int, float, float, float]]:
    """(step, mean reward, entropy, step seconds) of one of session 29's stopped notebook-07 runs."""
    return [(d["step"], d["critic/score/mean"], d["actor/entropy"], d["timing_s/step"])
            for d in _verl_steps(f"{S29_STOPPED}/{run}")]


def _stopped_runs_words() -> tuple[str, ...]:
    """What session 29's two stopped runs measured: the variant's rise (from the first step above 0.05 to the last
    below the plateau's floor), the plateau from the step after, where its entropy fell below 1, how close arm 1 stayed
    to it, and each side's step time after step 1."""
    fast, arm1 = _stopped_curve("5-fastest.r1"), _stopped_curve("1-fixes-hostadamw.r1")
    reward = {step: r for step, r, _, _ in fast}
    start = next(step for step, r, _, _ in fast if r > 0.05)
    plateau = [r for step, r, _, _ in fast if step > start + 4]
    end = max(step for step, r, _, _ in fast if r < min(plateau))
    assert end == start + 4 and all(r >= min(plateau) for step, r, _, _ in fast if step > end)
    below_one = next(step for step, _, e, _ in fast if e < 1)
    gap = max(abs(a[1] - reward[a[0]]) for a in arm1)
    secs = lambda rows: (min(r[3] for r in rows[1:]), max(r[3] for r in rows[1:]))  # noqa: E731
    (a_lo, a_hi), (f_lo, f_hi) = secs(arm1), secs(fast)
    return (f"rose over steps {start}-{end} ({reward[start]:.3f} to {reward[end]:.3f})",
            f"stayed at {min(plateau):.2f}-{max(plateau):.2f} from step {end + 1} to its last, step {fast[-1][0]}",
            f"its entropy fell below 1 at step {below_one}", f"Arm 1 stayed within {gap:.3f} of it to its last",
            f"step, {arm1[-1][0]}, at {a_lo:.0f}-{a_hi:.0f} s a step against the variant's {f_lo:.0f}-{f_hi:.0f} s")


def _both_stopped_after_waking_weights() -> bool:
    """Each stopped run's last line of vLLM waking its weights is at 06:07:20, and its trainer logged nothing after."""
    for run in ("5-fastest.r1", "1-fixes-hostadamw.r1"):
        lines = _source_text(f"{S29_STOPPED}/{run}/verl.log").splitlines()
        last_wake = max(i for i, line in enumerate(lines) if "wake up tags ['weights']" in line)
        if "06:07:20" not in lines[last_wake] or any("TaskRunnerV1" in line for line in lines[last_wake:]):
            return False
        if any(word in line for line in lines for word in ("Traceback", "Error:")):
            return False
    return True


def _profile_now_30_steps_not_50() -> tuple[str, ...]:
    ran = _yaml(f"{S29_STOPPED}/experiment-params.yaml")
    return (f"now trains {_yaml(NB07)['steps']} steps, not {ran['steps']}",)


def _parity_checks_words() -> tuple[str, ...]:
    checks = [c for n in ("01_offload_bug", "03_cast_once", "04_skip_old_logprob")
              for c in _json(f"outputs/{n}/h200-deterministic/metrics.json")["determinism"]["checks"]
              if c["patched_vs_unpatched"] is not None]
    zero = all(c["patched_vs_unpatched"] == 0.0 for c in checks)
    itself = all(c["unpatched_vs_itself"] == 0.0 for c in checks)
    return (f"{len(checks)} checks, every one 0.0" if zero else "<a check is not 0.0>",
            "the unpatched runs 0.0 against themselves" if itself else "<an unpatched run differs from itself>")


CLAIMS += [  # docs/lab-notes.md: session 29
    (L, "A lease at last: parity from a commit, and two learning runs that stopped (session 29)",
     _says("two learning runs that stopped", _both_stopped_after_waking_weights)),
    (L, "one call got an H200 at 05:56", lambda: ("got an H200 at 05:56",)
     if "05:56:33, `nvidia-h200`: an H200" in _source_text(S29) else False),
    (L, "21 checks, every one 0.0, and the unpatched runs 0.0 against themselves", _parity_checks_words),
    (L, "The selective-checkpoint GPU test** failed in its own helper before comparing anything",
     _says("failed in its own helper", _selective_gpu_test_failed_in_its_helper)),
    (L, "session 30 ran the test again (below)",
     _says("session 30 ran the test again", S30C.selective_gpu_test_failed_at_its_bytes)),
    (L, "Both stopped at 06:07:20, each just after its vLLM woke its weights for the next rollout, with no error in "
        "either log", _says("Both stopped at 06:07:20", _both_stopped_after_waking_weights)),
    (L, "Neither finished, so notebook 07 has no new result",
     _says("no new result", lambda: not (REPO_ROOT / "outputs/07_does_it_learn/h200-fast").exists())),
    (L, "The fastest variant's mean reward rose over steps 7-11 (0.052 to 0.468) and stayed at 0.49-0.56 from step 12 "
        "to its last, step 28; its entropy fell below 1 at step 14. Arm 1 stayed within 0.011 of it to its last step, "
        "7, at 25-31 s a step against the variant's 5-9 s", _stopped_runs_words),
    (L, "So the h200 profile now trains 30 steps, not 50", _profile_now_30_steps_not_50),
]


CLAIMS += [
    ("docs/results.md", "Session 29 reran all three from commit 6afd058 on an H200 it shared with notebook 07's two "
     "runs; both runs had stopped making progress before 04's timed run began",
     _says("reran all three from commit 6afd058", _determinism_reruns_from_6afd058)),
]


CLAIMS += [  # docs/results.md: the seed rollout's decode roofline and what speculation could give it
    ("docs/results.md", "(`outputs/speculative_bound/h200-seed/`, from the session-18 run on the H200)",
     lambda: (f"session-{_run_session(_spec()['run'])} run",
              f"on the {_spec()['gpu'].removeprefix('NVIDIA ')}")),
    ("docs/results.md", "Every step is bound by bandwidth: 19.9 s, as the bandwidth-only bound, against 3.0 s of arithmetic",
     lambda: (lambda m, n: (f"{n['limit_s']:.1f} s, as", f"{n['compute_s']:.1f} s of arithmetic")
              if n["compute_bound_share"] == 0.0 and round(n["limit_s"], 1) == round(m["bandwidth_only"]["limit_s"], 1)
              else False)(_spec(), _spec()["no_speculation"])),
    ("docs/results.md", "Of the 95.4 TB it reads, the KV cache is 62.4 TB and the weights 32.9 TB",
     lambda: (lambda n: (f"{(n['weight_bytes'] + n['kv_bytes']) / 1e12:.1f} TB it reads",
                         f"KV cache is {n['kv_bytes'] / 1e12:.1f} TB", f"weights {n['weight_bytes'] / 1e12:.1f} TB"))(
                             _spec()["no_speculation"])),
    ("docs/results.md", "the bound falls by 1.68x to 2.60x with 2 draft tokens and by 1.67x to 3.54x with 4, at acceptances "
     "0.5 to 0.9", lambda: (*_speedups(2), *_speedups(4), _acceptances())),
    ("docs/results.md", "whose gen runs at 54% of the bound today",
     lambda: (f"at {pct(_spec()['bandwidth_only']['limit_s'] / _spec()['measured_gen_s'])} of the bound",)),
]


ENGINE_SETTINGS = "outputs/engine_settings"
CLAIMS += [  # docs/results.md: which of vLLM's engine settings could move the seed rollout's gen
    ("docs/results.md", "(`outputs/engine_settings/h200-seed/`, from the same session-18 run; `h100-seed/` reads "
                        "session 21's)",
     lambda: (f"session-{_run_session(_engine()['run'])} run", f"reads session {_run_session(_engine('h100-seed')['run'])}'s")
     if _engine()["run"] == _spec()["run"] else False),
    ("docs/results.md", "prefix caching and chunked prefill on, max_num_seqs 256, max_num_batched_tokens 8192, "
                        "gpu_memory_utilization 0.85, and a KV pool of 230,944 tokens",
     lambda: _engine_values(_engine()["engine"])),
    ("docs/results.md", "the 256 sequences of the wave hold at most 189,163 KV tokens (137,622 expected plus 4 sigma of "
                        "12,885, in whole 16-token blocks, each sequence's own prompt counted), 82% of the pool",
     lambda: _kv_demand_words(_engine())),
    ("docs/results.md", "no sequence waits for blocks, so a larger pool (a higher gpu_memory_utilization) cannot add "
                        "concurrency, and max_num_seqs 256 already runs all 256 sequences in one wave",
     lambda: (lambda pool, seqs: (f"max_num_seqs {seqs['run_value']} already runs all {seqs['sequences']} sequences",)
              if not pool["sequences_may_wait"] and not seqs["sequences_may_wait"] else False)(
                  *_engine()["settings"][:2])),
    ("docs/results.md", "The prefill is 20,800 prompt tokens; at the dense bf16 peak it takes 0.17 s, 0.5% of the "
                        "measured 36.8-s gen (under 5% even at a tenth of the peak)",
     lambda: _prefill_words(_engine())),
    ("docs/results.md", "prefix caching, on already, saves at most 7/8 of it",
     lambda: (lambda c: (f"at most {c['rollout_n'] - 1}/{c['rollout_n']} of it",) if c["run_value"] else False)(
         _setting(_engine(), "enable_prefix_caching"))),
    ("docs/results.md", "on the H100 of session 21 the same prefill is 0.4% of a 44.8-s gen",
     lambda: (lambda m, c: (f"session {_run_session(m['run'])}", f"{c['share_of_gen']:.1%} of a {m['measured_gen_s']:.1f}-s gen")
              if m["gpu"].startswith("NVIDIA H100") and c["prefill_tokens"] == _setting(_engine(), c["setting"])[
                  "prefill_tokens"] else False)(_engine("h100-seed"), _setting(_engine("h100-seed"), "enable_chunked_prefill"))),
    ("docs/results.md", "the decode is bound by bandwidth at 19.9 s: none of these settings changes the bytes it reads",
     lambda: (lambda d: (f"at {d['limit_s']:.1f} s",) if d["compute_bound_share"] == 0.0 else False)(
         _engine()["decode_bound"])),
]


def _engine(tag: str = "h200-seed") -> dict:
    return _json(f"{ENGINE_SETTINGS}/{tag}/metrics.json")


def _setting(metrics: dict, name: str) -> dict:
    return next(row for row in metrics["settings"] if row["setting"] == name)


def _engine_values(e: dict) -> tuple[str, ...] | bool:
    """The engine options as written, where prefix caching and chunked prefill were on."""
    if not (e["enable_prefix_caching"] and e["enable_chunked_prefill"]):
        return False
    return (f"max_num_seqs {e['max_num_seqs']}", f"max_num_batched_tokens {e['max_num_batched_tokens']}",
            f"gpu_memory_utilization {e['gpu_memory_utilization']:g}", f"KV pool of {e['kv_cache_tokens']:,} tokens")


def _kv_demand_words(m: dict) -> tuple[str, ...]:
    pool = _setting(m, "gpu_memory_utilization")
    d = pool["demand"]
    return (f"the {m['sequences']} sequences", f"at most {d['upper_tokens']:,.0f} KV tokens",
            f"({d['mean_tokens']:,.0f} expected plus {d['sigmas']:g} sigma of {d['sigma_tokens']:,.0f}",
            f"whole {d['block_tokens']}-token blocks", f"{pct(d['upper_tokens'] / pool['pool_tokens'])} of the pool")


def _prefill_words(m: dict) -> tuple[str, ...] | bool:
    """The prefill's tokens, its compute-bound least time and share of gen, and that ten times it stays under 5%."""
    c = _setting(m, "enable_chunked_prefill")
    if c["prefill_bound_s"] != c["prefill_compute_s"] or 10 * c["share_of_gen"] >= 0.05:
        return False
    return (f"{c['prefill_tokens']:,.0f} prompt tokens", f"takes {c['prefill_bound_s']:.2f} s",
            f"{c['share_of_gen']:.1%} of the measured {m['measured_gen_s']:.1f}-s gen", "under 5% even at a tenth")

def _run_session(run: str) -> str:
    """The device session a run folder's name ends with (``<arm>.session18``)."""
    return re.search(r"[.]session(\d+)$", run).group(1)


def _spec() -> dict:
    return _json(f"{SPECULATIVE}/metrics.json")


def _speedups(draft_tokens: int) -> tuple[str, ...]:
    """The lowest and highest speed-up of the bound over the acceptances, with ``draft_tokens`` drafts, as written."""
    ups = [r["speedup_of_bound"] for r in _spec()["speculative"] if r["draft_tokens"] == draft_tokens]
    return (f"{min(ups):.2f}x to {max(ups):.2f}x with {draft_tokens}",)


def _acceptances() -> str:
    values = sorted({r["acceptance"] for r in _spec()["speculative"]})
    return f"acceptances {values[0]:g} to {values[-1]:g}"


def _no_multinode_run() -> bool:
    """No committed run asked for more than one node: no verl override ``trainer.nnodes`` above 1 in a metrics.json
    (the recipe renders it for every verl run), no ``nodes`` above 1 in a params.yaml."""
    outputs = REPO_ROOT / "outputs"
    many = re.compile(r"trainer\.nnodes=([2-9]|\d\d)|^nodes: *([2-9]|\d\d)", re.MULTILINE)
    files = [*outputs.rglob("metrics.json"), *outputs.rglob("params.yaml")]
    seen = [p for p in files if "nnodes" in (text := p.read_text(errors="replace")) or "nodes:" in text]
    assert seen, "no committed run records its node count: the check would hold for nothing"
    return not any(many.search(p.read_text(errors="replace")) for p in seen)


def _sac_pair() -> dict:
    """Session 23's selective-checkpointing profile against the base of its lease, as the lab notes read them."""
    base, sac = _profile("h100-base"), _profile("h100-sac18")
    both = lambda f: (f(base), f(sac))  # noqa: E731
    layers = sac["config"]["selective_layers"]
    tokens = max(sac["workload"]["tokens_per_micro_batch"])
    kept = layers * tokens * budget._selective_elems_per_token_layer(model_shape.resolve_model("qwen3-4b")) * 2 / GIB
    run_to_run = report_profile.run_to_run(report_profile.committed_profiles())[1]
    grad = lambda m: report_profile._first_update(m)["grad_norm"]  # noqa: E731
    recompute = both(lambda m: m["summary"]["passes"]["recompute"]["ms"])
    return {
        "commit": sac["config"].get("commit") or report_profile.committed_profiles()["h100-sac18"]["commit"][:7],
        "recompute": recompute,
        "recompute_gemm": both(lambda m: m["summary"]["passes"]["recompute"]["ms_by_category"]["gemm"]),
        "idle": both(lambda m: m["summary"]["device"]["idle_ms"]),
        "event_syncs": sac["summary"]["host_syncs"]["calls"]["cudaEventSynchronize"],
        "peak_rise": sac["timing"]["peak_allocated_gib"] - base["timing"]["peak_allocated_gib"],
        "kept_planned": kept, "layers": layers,
        "attention_gib": layers * tokens * model_shape.resolve_model("qwen3-4b").q_dim * 2 / GIB,
        "recompute_attention": both(lambda m: m["summary"]["passes"]["recompute"]["ms_by_category"]["attention"]),
        "removed_recompute_not_wall": recompute[1] < recompute[0] and _wall("h100-sac18") >= _wall("h100-base"),
        "grad_within_run_to_run": report_profile._relative(grad(sac), grad(base)) <= run_to_run
        and report_profile._first_update(sac)["entropy"] == report_profile._first_update(base)["entropy"],
    }


def _sac36_oom_capacity() -> float:
    """The H100's capacity the 36-layer profile's out-of-memory error names (session 23's console)."""
    text = _source_text("outputs/_node/session23/profile-sac36.console.log")
    return float(re.search(r"OutOfMemoryError: .*total capacity of ([\d.]+) GiB", text).group(1))


def _sac36_layers() -> int:
    return int(re.search(r"selective_layers=(\d+)", _source_text(_session_readme(23))).group(1))


def _sac_with_compiled_kernels() -> bool:
    """A committed profile ran selective checkpointing with a compiled kernel."""
    return any(m["config"].get("selective_layers") and "eager" not in (m["config"].get("rmsnorm"), m["config"].get("pointwise"))
               for m in report_profile.committed_profiles().values())


def _comparison_before_session29(name: str) -> list[dict]:
    """A sweep point's comparison as the docs gave it before session 29's planner terms: the one its first re-analysis
    since then replaced (kept in analysis.history), else the one it holds."""
    m = _sweep_point(name)
    replaced = [h["replaced_comparison"] for h in (m.get("analysis") or {}).get("history", []) if "replaced_comparison" in h]
    return replaced[0] if replaced else m["comparison"]


def _old_log_prob_words(util: str) -> tuple[str, ...]:
    row = next(r for r in _comparison_before_session29(f"qwen3_4b_48g-u{util}") if r["quantity"] == "peak_old_log_prob_gib")
    return (f"{row['planner']:.2f} GiB", f"{row['measured']:.2f} GiB", f"util {util}", f"(x{row['ratio']:.2f})")


def _sweep_point(name: str) -> dict:
    return _json(f"outputs/06_util_sweep/{name}/metrics.json")


SWEEP_POINTS = tuple(f"{c}-u{u}" for c in ("doc_small", "qwen3_4b_48g") for u in ("0.4", "0.5", "0.6", "0.7"))


def _rows_now(name: str) -> tuple[dict, dict]:
    """A committed point's plan and comparison rows with the planner of this code (its metrics.json keeps the rows of
    the commit that analysed it)."""
    from rlkit.core import params as P
    from rlkit.experiments import util_sweep as U
    from rlkit.planning import verdict

    m = _sweep_point(name)
    cfg = P.build(U.Config, m["config"])
    plan = verdict.plan(U.planner_spec(cfg)).as_dict()
    return plan, {r["quantity"]: r for r in U.comparison_rows(plan, m["measured"], cfg.case_spec)}


def _after_fsdp_words() -> tuple[str, ...]:
    found = [(m.get("model", {}).get("preset"), run_terms.after_fsdp_non_torch(m, folder))
             for _, m, folder in run_terms._runs(run_terms._outputs(None)) if m.get("recipe", {}).get("n_gpus") == 1]
    values = [v for _, v in found if v is not None]
    presets = {p for p, v in found if v is not None}
    term = run_terms.actor_non_torch_term()
    if len(set(values)) != 1 or presets != {"qwen3-4b", "qwen2.5-0.5b"} or term["runs"] != len(values):
        return ("<the one-GPU runs do not all log one value for both models>",)
    return (f"holds {values[0]:.2f} GiB", f"planner's {budget.PlanSpec().non_torch_gib:g}",
            f"reserved of {values[0]:.2f} GiB in all {len(values)} one-GPU runs")


def _before_fsdp_words() -> tuple[str, ...]:
    measured = _sweep_point("qwen3_4b_48g-u0.5")["measured"]
    before = next(r for r in measured["verl_memory_log"] if r["label"] == "Before FSDP")
    first = next(gib for _, held in measured["process_samples"] for _, gib, title in held
                 if "WorkerDict" in title and gib > 0.1)
    return (f"reads {before['device_used_gib']:.2f} GiB",) if abs(first - before["device_used_gib"]) < 0.01 else False


def _vllm_asleep(name: str) -> float:
    held = _sweep_point(name)["measured"]["process_phase_peaks"]["old_log_prob"]
    return next(gib for process, gib in held.items() if "VLLM" in process)


def _asleep_words() -> tuple[str, ...]:
    log_prob = _sweep_point("qwen3_4b_48g-u0.5")["planner"]["device_gib"]["log_prob"]
    small = [_vllm_asleep(p) for p in SWEEP_POINTS if p.startswith("doc_small")]
    return (f"holds {_vllm_asleep('qwen3_4b_48g-u0.5'):.2f} GiB for Qwen3-4B at util 0.5",
            f"{_vllm_asleep('qwen3_4b_48g-u0.6'):.2f} GiB at 0.6", f"{log_prob['cuda_graphs'] + log_prob['non_torch']:.2f} GiB;",
            f"{min(small):.2f}-{max(small):.2f} GiB")


def _util_words() -> tuple[str, ...]:
    def peak(u):
        return _sweep_point(f"qwen3_4b_48g-u{u}")["measured"]["phase_peaks"]["old_log_prob"]["peak_job_gib"]

    def still(u):
        return _sweep_point(f"qwen3_4b_48g-u{u}")["measured"]["vllm"]["sleeps"][0]["still_in_use_gib"]

    if not (peak("0.4") == peak("0.5") == peak("0.7") and still("0.4") == still("0.5") == still("0.7")):
        return ("<the points at 0.4, 0.5 and 0.7 differ>",)
    return (f"{peak('0.5'):.2f} GiB at util 0.4", f"{peak('0.6'):.2f} GiB at 0.6", f"logged {still('0.6'):.2f} GiB",
            f"against {still('0.5'):.2f} at the others")


def _step1_micro_batch_words() -> tuple[str, ...]:
    m = _sweep_point("qwen3_4b_48g-u0.5")
    step = m["measured"]["steps"][0]
    cap = m["recipe"]["ppo_max_token_len_per_gpu"]
    if step["response_length/min"] != step["response_length/max"]:
        return ("<step 1's responses differ in length>",)
    response = int(step["response_length/max"])
    n = cap // (int(step["prompt_length/min"]) + response)
    return (f"ran to {response} tokens", f"cap of {cap:,} tokens", f"at most {n} sequences",
            f"{n * (int(step['prompt_length/max']) + response):,} positions")


def _doc_small_micro_batch_words() -> tuple[str, ...]:
    plan, _ = _rows_now("doc_small-u0.5")
    case = _sweep_point("doc_small-u0.5")["case"]
    longest = run_terms.longest_prompt_term(case["model"], "synthetic", case["data_rows"])["tokens"]
    n, response = case["micro_batch_size_per_gpu"], case["max_response_length"]
    if plan["spec"]["log_prob_micro_batch_tokens"] != n * (longest + response):
        return ("<the planner's micro-batch is another>",)
    return (f"{n} x ({longest} + {response}) positions", f"not {n} x {case['max_prompt_length'] + response}")


def _sweep_now_words() -> tuple[str, ...]:
    rows = {p: _rows_now(p)[1] for p in SWEEP_POINTS}
    small = {f"{rows[p]['peak_old_log_prob_gib']['ratio']:.2f}" for p in SWEEP_POINTS if p.startswith("doc_small")}
    compared = [r for p in SWEEP_POINTS for r in rows[p].values() if r["ratio"] is not None]
    before = [r for p in SWEEP_POINTS for r in _comparison_before_session29(p) if r["ratio"] is not None]
    if len(small) != 1:
        return ("<doc_small's ratios differ>",)
    return (f"x{rows['qwen3_4b_48g-u0.5']['peak_old_log_prob_gib']['ratio']:.2f} at util 0.5",
            f"x{rows['qwen3_4b_48g-u0.6']['peak_old_log_prob_gib']['ratio']:.2f} at 0.6", f"x{small.pop()} at every util",
            f"{sum(not r['off_by_more_than_10pct'] for r in compared)} of notebook 06's {len(compared)} compared",
            f"({sum(not r['off_by_more_than_10pct'] for r in before)} before)")


def _actor_rest_words() -> tuple[str, ...]:
    plan, _ = _rows_now("qwen3_4b_48g-u0.5")
    share = sum(v for c, v in plan["device_gib"]["log_prob"].items()
                if c in (*budget.ACTOR_ALLOCATED_COMPONENTS, "actor_non_torch"))
    peak = next(gib for process, gib in _sweep_point("qwen3_4b_48g-u0.5")["measured"]["process_phase_peaks"]
                ["old_log_prob"].items() if "WorkerDict" in process)
    return (f"peaked at {peak:.2f} GiB", f"{peak - share:.2f} GiB above", f"actor share of {share:.2f} GiB")


def _actor_in(name: str, phase: str, step: int) -> list[float]:
    """The actor process's per-process samples (GiB) during ``phase`` of ``step``, in order."""
    measured = _sweep_point(name)["measured"]
    return [gib for row, (_, held) in zip(measured["timeline"], measured["process_samples"])
            if row["phase"] == phase and row["step"] == step for _, gib, title in held if "WorkerDict" in title]


CLAIMS += [  # docs/patches.md: the old_log_prob memory instrument
    ("docs/patches.md", "it has run on a GPU only in notebook 07's small model, not yet at the seed's workload",
     _says("not yet at the seed's workload", S33C.instrument_ran_only_in_notebook_07)),
    ("docs/patches.md", "The old_log_prob memory instrument has run on a GPU only in arm 1 of notebook 07's runs: first "
                        "in the run that stopped in session 33",
     _says("only in arm 1 of notebook 07's runs", S33C.instrument_ran_only_in_notebook_07)),
    ("docs/patches.md", "old_log_prob's peak allocated was 0.35-0.38 GiB a step on that small model",
     S33C.instrument_peak_words),
    ("docs/patches.md", "then in the run that finished in session 34 "
                        "(`outputs/07_does_it_learn/h200-fast-runs/1-fixes-hostadamw.r1/`), 0.35-0.38 GiB again",
     lambda: S34C.instrument_words() if S33C.instrument_ran_only_in_notebook_07() else False),
    ("docs/patches.md", "No run at the seed's workload records these numbers yet",
     _says("No run at the seed's workload", S33C.instrument_ran_only_in_notebook_07)),
    ("docs/lab-notes.md", "The instrument for old_log_prob's peaks had not yet run on a GPU; its first run was in "
                          "session 33", _says("its first run was in session 33", S33C.instrument_ran_only_in_notebook_07)),
    ("docs/patches.md", "the committed points predate the instrument and compare as before",
     _by_test("compare as before", "tests/test_util_sweep.py::"
              "test_committed_points_compare_exactly_as_before_without_the_instruments_record")),
]


def _sac_removed_recompute_each_time() -> bool:
    """Every selective profile's recompute pass is shorter than that of the profile without levers of its lease."""
    pairs = (("h100-sac18", "h100-base"), ("h100-sac18.session26", "h100-base.session26"),
             ("h100-sac18.session30", "h100-base.session30"))
    return all(_pass_seconds("recompute")(sac) < _pass_seconds("recompute")(base) for sac, base in pairs)


def _sac30_lab_words() -> tuple[str, ...]:
    """Session 30's selective profile against its base as the lab notes give it, with the planner's kept-outputs term
    for its layers at its largest micro-batch."""
    s, sac = S30C.sac30(), _profile("h100-sac18.session30")
    tokens = max(sac["workload"]["tokens_per_micro_batch"])
    kept = s["layers"] * tokens * budget._selective_elems_per_token_layer(model_shape.resolve_model("qwen3-4b")) * 2 / GIB
    sac_s, base_s = s["walls"]
    return (f"Selective checkpointing of {s['layers']} layers", f"{s['removed_s']:.2f} s less recompute",
            f"{s['peak_rise']:.1f} GiB more peak", f"gives {kept:.1f} GiB, x{s['peak_rise'] / kept:.2f}",
            f"{sac_s:.2f} s against {base_s:.2f} s ({sac_s / base_s - 1:+.0%})")


def _uint64_bytes() -> str:
    return re.search(r"\{torch\.uint64: (\d+)\}", _source_text(S30C.S30_SELECTIVE))[1]


def _session30_ran() -> bool:
    command = _source_text(S30C.S30_TESTS)
    return (S30C.one_lease_at_e852499() and S30C.kernels_ran_on_an_h100_at_e852499() and S30C.COMMIT30 in command
            and "NVIDIA H100" in command)


CLAIMS += [  # device session 30: the H100 profiles at e852499, its GPU tests, liger-kernel's first run
    ("docs/results.md", "The `*.session30` profiles ran once each in one lease on one H100 at e852499 (session 30): without "
                        "levers, with selective checkpointing of 18 layers",
     lambda: (f"checkpointing of {S30C.sac30()['layers']} layers",) if S30C.one_lease_at_e852499() else False),
    ("docs/results.md", "With it (session 30, one profile each) the same layers removed 0.43 s of recompute (the recompute's "
                        "attention went from 225 to 111 ms), the peak rose by 24.8 GiB, and the update took 10.62 s against "
                        "10.97 s",
     lambda: S30C.sac30_words() if S30C.sac30()["layers"] == _profile("h100-sac18.session26")["config"]["selective_layers"]
     else False),
    ("docs/patches.md", "and at e852499 (`outputs/_node/session30/prefetch-gpu-test.log`)",
     _says("and at e852499", lambda: S30C.prefetch30_passed() and _session30_ran())),
    ("docs/patches.md", "Session 30 profiled each once more, at e852499 (`outputs/update_profile/*.session30/`): 10.92 s "
                        "against 10.97 s alone, 8.53 s against 8.39 s with the other levers, both differences inside the "
                        "spread above",
     lambda: (*S30C.prefetch30_words(), "inside the spread above") if S30C.prefetch30_inside_spread() else False),
    ("docs/patches.md", "The optimizer pass's kernels took 387 ms against 726 ms there", S30C.optimizer_pass_words),
    ("docs/patches.md", "On an H100 at e852499 it passed again, bit for bit, at 24,576 tokens 12.95 ms with the repeat and "
                        "12.28 ms without",
     lambda: S30C.gqa30_words() if _session30_ran() else False),
    ("docs/patches.md", "one SwiGLU alone at 24,576 tokens) its output was eager's bit for bit but its input gradients were "
                        "not, up to 2.3e-04 of the largest apart", S30C.compiled_swiglu_words),
    ("docs/patches.md", "whose model gradients were bit-identical on an H100 at cff2abc, runs 2 x 40 tokens",
     lambda: ("bit-identical on an H100 at cff2abc", "2 x 40 tokens")
     if S30C.compiled_on_h100_at_cff2abc() and "(2, 40)" in _source_text("tests/test_compiled_patches.py") else False),
    ("docs/patches.md", "(forward and backward at the seed's 24,576 tokens, each arm against eager)",
     lambda: (f"{_json(S30C.KERNELS30 + '/metrics.json')['config']['tokens']:,} tokens",
              f"{_seed_profile()['ppo_max_token_len_per_gpu']:,} tokens")),
    ("docs/patches.md", "Its first run, on an H100 at e852499 in session 30 (`outputs/elementwise_kernels/h100.session30/`), "
                        "took in ms, eager / compiled / liger: RMSNorm 3.38 / 1.12 / 0.73, rotary 3.65 / 1.41 / 1.24 (with "
                        "the old inputs), SwiGLU 2.89 / 2.05 / 1.97",
     lambda: S30C.kernel_ms_words() if S30C.kernels_ran_on_an_h100_at_e852499() else False),
    ("docs/patches.md", "liger's rotary and its RMSNorm's gradients there are not valid",
     _says("are not valid", S30C.liger_invalid_words)),
    ("docs/patches.md", "found the loss and every gradient bit-identical to full checkpointing on an H100 in session 30 at "
                        "e852499, and the test still failed",
     _says("bit-identical to full checkpointing on an H100 in session 30 at e852499, and the test still failed",
           S30C.selective_gpu_test_failed_at_its_bytes)),
    ("docs/patches.md", "besides the planner's bf16 bytes and the kernel's fp32 log-sum-exp, 16 bytes of uint64",
     lambda: (f"{_uint64_bytes()} bytes of uint64",)),
    ("docs/patches.md", "The test now counts those 16 bytes per layer",
     lambda: (f"those {_uint64_bytes()} bytes",) if S30C.selective_test_expects_the_rng_state() else False),
    ("docs/offline-node.md", "They did on an H100 in sessions 30 and 31 (`outputs/elementwise_kernels/h100.session30/`, "
                             "`outputs/elementwise_kernels/h100.session31/`)",
     _says("They did on an H100 in sessions 30 and 31",
           lambda: S30C.kernels_ran_on_an_h100_at_e852499() and S31C.ran_on_an_h100_at_3aa2b34())),
    (L, "The update's levers on one H100 again, liger-kernel's first run (session 30)",
     _says("(session 30)", _session30_ran)),
    (L, "these jobs ran one at a time from commit e852499", _says("from commit e852499", _session30_ran)),
    (L, "without levers 10.97 s (22%), with the overlapped copies and the compiled kernels 8.39 s (28%), against session "
        "26's 10.75 and 8.29 s (means of two)",
     lambda: (*S30C.levers30_words(), "{:.2f} and {:.2f} s (means of two)".format(_prefetch_means()[1], _prefetch_means()[3]))),
    (L, "The gradient prefetch again made no difference outside the runs' spread",
     _says("no difference outside the runs' spread", S30C.prefetch30_inside_spread)),
    (L, "Selective checkpointing of 18 layers, now keeping the attention**: 0.43 s less recompute, 24.8 GiB more peak "
        "memory (the planner's term gives 26.2 GiB, x0.95), the update 10.62 s against 10.97 s (-3%), one profile each",
     _sac30_lab_words),
    (L, "compared the loss and every gradient bit for bit and passed those, then failed at its bytes check: each layer's "
        "cache also holds 16 bytes of RNG state",
     lambda: ("then failed at its bytes check", f"{_uint64_bytes()} bytes of RNG state")
     if S30C.selective_gpu_test_failed_at_its_bytes() else False),
    (L, "The test now expects them, and with them it passed in session 31 (below)",
     _says("it passed in session 31", S31C.selective_passed)),
    (L, "The prefetch and native-GQA GPU tests passed** (native GQA bit for bit the repeated K/V heads' result, one "
        "fwd+bwd of 24,576 tokens 12.95 ms with the repeat and 12.28 ms without)",
     lambda: (*S30C.gqa30_words(), "tests passed") if S30C.prefetch30_passed() else False),
    (L, "its Triton kernels compiled and ran with the node's Triton",
     _says("compiled and ran", S30C.kernels_ran_on_an_h100_at_e852499)),
    (L, "Both are fixed with CPU tests that fail on the old code", _says("fixed with CPU tests", S30C.liger_invalid_words)),
    (L, "fail on the old code; rerun in session 31 (below)",
     _says("old code; rerun in session 31", S31C.valid_in_every_entry)),
    (L, "Its SwiGLU's input gradients differ from eager's by up to 7.4e-03 of the largest, and the compiled SwiGLU's, "
        "claimed bit-exact, by 2.3e-04 at that shape",
     lambda: (lambda ops: (f"by up to {ops['liger']['input_grads']['max_rel_diff']:.1e} of the largest",
                           f"by {ops['compiled']['input_grads']['max_rel_diff']:.1e} at that shape"))(
         _json(S30C.KERNELS30 + "/metrics.json")["ops"]["swiglu"])),
]


# Sentences the detector flags that state no measured result, each with why: a configuration value the user sets,
# a rule of the code, a formula, or the word "failed" naming a folder. Each must still be in its doc.
S30 = "outputs/_node/session30/README.md"
ARC1_S30, ARC5_S21, ARM1_S19 = ("h200-seed-1-fixes-hostadamw.session30", "h200-seed-5-master-on-host-cast-once.session21",
                                "h200-seed-1-fixes-hostadamw.session19")


def _phase_check(run: str) -> dict[str, dict]:
    from rlkit.experiments.estimates import planner_phase_check

    return planner_phase_check(_arm(run))


def _phase_ratios(run: str) -> dict[str, float]:
    return {phase: e["ratio"] for phase, e in _phase_check(run).items() if e["ratio"] is not None}


def _gpu_of(run: str) -> str:
    from rlkit.core.env import gpu_name

    return gpu_name(_json(f"{ARMS}/{run}/env.json"))


def _allocator_gap(run: str) -> float:
    from rlkit.report.arc import allocator_gap_gib

    return allocator_gap_gib(_arm(run)["summary"])


def _arc_arm_words(run: str, session: int, job: str) -> tuple[str, ...]:
    """An arc arm's node window (its driver's progress file) and its trained steps out of those asked for."""
    from rlkit.verl.logs import training_steps

    m, progress = _arm(run), _source_text(f"outputs/05_grpo_qwen3_4b/node-progress-session{session}.txt")
    start, end = (re.search(rf"(\d\d:\d\d:\d\d) {job}/{job} {w}", progress).group(1) for w in ("start", "exit 0"))
    return (f"{start} to {end}", f"trained {len(training_steps(m['steps']))} of {m['recipe']['steps']} steps")


def _arm_phase_words(run: str) -> tuple[str, ...]:
    """An arm's step, its three phases and its actor peak, as the lab notes word them."""
    s = _arm(run)["summary"]
    return (f"a step of {s['step_s']:.1f} s", f"gen {s['gen_s']:.1f} s", f"old_log_prob {s['old_log_prob_s']:.1f} s",
            f"update_actor {s['update_actor_s']:.1f} s", f"peak of {s['actor_max_allocated_gib']:.2f} GiB")


def _arc_pair_words() -> tuple[str, ...]:
    a1, a5 = _arm(ARC1_S30)["summary"], _arm(ARC5_S21)["summary"]
    return (f"took {a5['step_s']:.1f} s", f"peaked at {a5['actor_max_allocated_gib']:.2f} GiB",
            f"{1 - a5['step_s'] / a1['step_s']:.1%} shorter",
            f"{a1['actor_max_allocated_gib'] - a5['actor_max_allocated_gib']:.2f} GiB lower")


def _arc_sentence_unlike() -> bool:
    readme = _source_text("README.md")
    line = next(l for l in readme.splitlines() if l.startswith("5-master-on-host-cast-once against 1-fixes-hostadamw"))
    return "not like for like" in line and line.count("not judged") == 2


CLAIMS += [  # docs/lab-notes.md: session 30, the arc's arm 1
    (L, "Arm 1 of the arc on one H100 (session 30)",
     _says("(session 30)", lambda: _json(f"{ARMS}/{ARC1_S30}/env.json")["git_sha"].startswith("c6ceef4"))),
    (L, "A call asking for an H200 got an H100 at 10:20",
     lambda: ("got an H100 at 10:20",) if "10:20:20, `nvidia-h200`: an NVIDIA H100 80GB HBM3 came" in _source_text(S30)
     and _gpu_of(ARC1_S30).startswith("NVIDIA H100") else False),
    (L, "10:22:00 to 10:34:03, and trained 4 of 4 steps", lambda: _arc_arm_words(ARC1_S30, 30, "seed-arm1")),
    (L, "a step of 98.8 s (gen 44.8 s, old_log_prob 10.6 s, update_actor 42.2 s) and an actor peak of 40.97 GiB",
     lambda: _arm_phase_words(ARC1_S30)),
    (L, "took 84.9 s and peaked at 32.30 GiB: 14.0% shorter and 8.67 GiB lower", _arc_pair_words),
    (L, "the README's arc sentence calls the pair not like for like and judges neither of the seed's targets",
     _says("not like for like and judges neither", _arc_sentence_unlike)),
    (L, "arm 1's session-19 run on an H200 (commit e7f8328) took 89.4 s",
     lambda: (f"took {_arm(ARM1_S19)['summary']['step_s']:.1f} s", f"commit {_json(f'{ARMS}/{ARM1_S19}/env.json')['git_sha'][:7]}")
     if _gpu_of(ARM1_S19).startswith("NVIDIA H200") else False),
    (L, "Its gen was 36.1 s against 44.8 s here, its update_actor 41.7 s against 42.2 s",
     lambda: (lambda h200, h100: (f"gen was {h200['gen_s']:.1f} s against {h100['gen_s']:.1f} s",
                                  f"update_actor {h200['update_actor_s']:.1f} s against {h100['update_actor_s']:.1f} s"))(
                                      _arm(ARM1_S19)["summary"], _arm(ARC1_S30)["summary"])),
    (L, "gen x1.07 and old_log_prob x1.08 are within its 10%; update_actor is x1.13",
     lambda: (lambda r: (f"gen x{r['gen']:.2f}", f"old_log_prob x{r['old_log_prob']:.2f}",
                         f"update_actor is x{r['update_actor']:.2f}") if abs(r["gen"] - 1) <= 0.1
              and abs(r["old_log_prob"] - 1) <= 0.1 < abs(r["update_actor"] - 1) else False)(_phase_ratios(ARC1_S30))),
    (L, "The actor's caching allocator reserved 5.93 GiB above its peak allocation (46.90 against 40.97 GiB",
     lambda: (f"reserved {_allocator_gap(ARC1_S30):.2f} GiB",
              f"({_arm(ARC1_S30)['summary']['actor_max_reserved_gib']:.2f} against "
              f"{_arm(ARC1_S30)['summary']['actor_max_allocated_gib']:.2f} GiB")),
    (L, "Without it update_actor is x0.99. Arm 5's gap was 3.30 GiB, and its update_actor x1.04",
     lambda: (lambda e: (f"is x{(e['measured_gib'] - _allocator_gap(ARC1_S30)) / e['planner_gib']:.2f}",
                         f"gap was {_allocator_gap(ARC5_S21):.2f} GiB",
                         f"update_actor x{_phase_ratios(ARC5_S21)['update_actor']:.2f}"))(
                             _phase_check(ARC1_S30)["update_actor"])),
]

S31 = "outputs/_node/session31/README.md"
ARC2_S31 = "h200-seed-2-skip-old-logprob.session31"


def _arm2_net_words() -> tuple[str, ...]:
    one, two = _arm(ARC1_S30)["summary"], _arm(ARC2_S31)["summary"]
    return (f"old_log_prob from {one['old_log_prob_s']:.1f} to {two['old_log_prob_s']:.1f} s",
            f"update_actor went from {one['update_actor_s']:.1f} to {two['update_actor_s']:.1f} s",
            f"step from {one['step_s']:.1f} to {two['step_s']:.1f} s ({two['step_s'] / one['step_s'] - 1:.1%})",
            f"gets {one['step_s'] - two['step_s']:.1f} s of the pass's {one['old_log_prob_s'] - two['old_log_prob_s']:.1f} s")


def _hold_left_words() -> tuple[str, ...] | bool:
    held = re.search(r"13:35:22, `nvidia-h100-x1`: an NVIDIA H100 80GB HBM3 came \(`held_s` ([\d.]+)", _source_text(S31))
    return (f"about {round((1800 - float(held.group(1))) / 60)} minutes",) if held else False


CLAIMS += [  # docs/lab-notes.md: session 31, the arc's arm 2
    (L, "Arm 2 of the arc on one H100 (session 31)",
     _says("(session 31)", lambda: _json(f"{ARMS}/{ARC2_S31}/env.json")["git_sha"].startswith("c6ceef4")
           and _gpu_of(ARC2_S31).startswith("NVIDIA H100"))),
    (L, "Five calls got no machine and three were not asked for",
     _says("Five calls got no machine and three", lambda: "five answered that none could be started" in _source_text(S31)
           and "three were not asked for" in _source_text(S31))),
    (L, "at 13:35 a call naming `nvidia-h100-x1` got an H100", lambda: ("at 13:35",) if "13:35:22, `nvidia-h100-x1`: an "
     "NVIDIA H100 80GB HBM3 came" in _source_text(S31) else False),
    (L, "with about 22 minutes of its hold left", _hold_left_words),
    (L, "13:37:04 to 13:49:06, and trained 4 of 4 steps", lambda: _arc_arm_words(ARC2_S31, 31, "seed-arm2")),
    (L, "a step of 89.1 s (gen 44.8 s, old_log_prob 0.1 s, update_actor 43.0 s) and an actor peak of 40.95 GiB",
     lambda: _arm_phase_words(ARC2_S31)),
    (L, "the skipped pass took old_log_prob from 10.6 to 0.1 s, update_actor went from 42.2 to 43.0 s, and the whole "
        "step from 98.8 to 89.1 s (-9.8%). So a user gets 9.7 s of the pass's 10.6 s", _arm2_net_words),
    (L, "the results page calls the pair not like for like; it now says that beside every arm's net effect",
     _says("not like for like", lambda: "- 2-skip-old-logprob against 1-fixes-hostadamw (not like for like: not one lease"
           in _source_text("docs/results.md"))),
    (L, "gen x1.07 and update_weights x1.07 are within its 10%; update_actor is x1.13",
     lambda: (lambda r: (f"gen x{r['gen']:.2f}", f"update_weights x{r['update_weights']:.2f}",
                         f"update_actor is x{r['update_actor']:.2f}") if abs(r["gen"] - 1) <= 0.1
              and abs(r["update_weights"] - 1) <= 0.1 < abs(r["update_actor"] - 1) else False)(_phase_ratios(ARC2_S31))),
    (L, "where the actor's allocator reserved 5.99 GiB above its peak allocation",
     lambda: (f"reserved {_allocator_gap(ARC2_S31):.2f} GiB",)),
    (L, "Without that reserve it is x0.99, as for arm 1",
     lambda: tuple({f"it is x{(e['measured_gib'] - _allocator_gap(run)) / e['planner_gib']:.2f}"
                    for run, e in ((r, _phase_check(r)["update_actor"]) for r in (ARC2_S31, ARC1_S30))})),
]

def _step_target_words() -> tuple[str, ...] | bool:
    """Both arm-5 runs of the step-target block: update_actor alone above the MFU target, gen alone below its bound."""
    lines = [x for x in report_limits.step_target_section() if x.startswith("- h200-seed-")]
    mfus = [float(re.search(r"at (\d+)% MFU\. With", x).group(1)) / 100 for x in lines]
    below = all("gen alone would have to take" in x and x.rstrip(".").split(", ")[-1].startswith("below its HBM bound")
                for x in lines)
    return (f"In {'both' if len(lines) == 2 else len(lines)} runs", f"the {report_limits.UPDATE_MFU_TARGET:.0%} MFU") \
        if lines and below and min(mfus) > report_limits.UPDATE_MFU_TARGET else False


CLAIMS += [  # docs/results.md: issue 42's step target as arithmetic (rlkit.report.limits.step_target_section)
    ("docs/results.md", "Issue 42 asks for a step 25% below arm 5's at the seed's workload",
     lambda: (f"a step {report_limits.STEP_CUT_TARGET:.0%} below",)),
    ("docs/results.md", "In both runs, update_actor alone would need more than the 40% MFU that issue 42 targets, and "
                        "gen alone would have to beat its HBM bound",
     lambda: _step_target_words()),
    ("docs/results.md", "So the step target needs the update near 40% MFU and a gen faster than a standalone vLLM at once",
     _says("faster than a standalone vLLM", lambda: (lambda speeds: bool(speeds) and min(speeds) > 100)(
         [int(m.group(1)) for x in report_limits.step_target_section()
          if (m := re.search(r"(\d+)% of a standalone vLLM's speed", x))]))),
    ("docs/results.md", "No like-for-like pair of arm 5 and its fastest variant at one commit has run yet",
     _says("has run yet", lambda: not any(p["shape"] == "h200-seed" and p["pairing"].like
                                          for p in report_limits.fastest_pairs()))),
]


FUSED_SWIGLU_TEST = ("tests/test_compiled_patches.py::"
                     "test_the_patched_swiglu_runs_eagers_backward_kernels_on_eagers_operands")



CLAIMS += [  # the patched SwiGLU's eager backward (after session 30's kernels run)
    ("docs/patches.md", "So SwiGLU's backward no longer runs Inductor's fused kernel: it runs the ATen kernels eager's "
                        "autograd runs, on the same operands", _by_test("eager's autograd runs", FUSED_SWIGLU_TEST)),
    ("docs/patches.md", "bit-identical by construction", _by_test("bit-identical by construction", FUSED_SWIGLU_TEST)),
    (L, "Since then the patched SwiGLU's backward runs eager's own kernels", _by_test("eager's own kernels", FUSED_SWIGLU_TEST)),
    (L, "runs eager's own kernels ([patches](patches.md)), checked on a GPU in session 31 (below)",
     _says("kernels ([patches](patches.md)), checked on a GPU in session 31", lambda: S31C.swiglu_words()[-1] == "no faster" and S31C.ran_on_an_h100_at_3aa2b34())),
]


def _profiles_after_the_eager_swiglu_backward() -> list[str]:
    """The committed update profiles that ran from a commit with the patched SwiGLU's eager backward (e5c7f13)."""
    import subprocess

    shas = {f.parent.name: _json(str(f.relative_to(REPO_ROOT))).get("git_sha")
            for f in (REPO_ROOT / PROFILES).glob("*/env.json")}
    fix = subprocess.run(["git", "-C", str(REPO_ROOT), "log", "-1", "--format=%H", "-S", "class _SwiGLU", "--",
                          "rlkit/patches/kernels/compiled_pointwise.py"], capture_output=True, text=True, check=False).stdout.strip()
    if not fix:
        pytest.skip("this checkout has no history of compiled_pointwise (a shallow clone)")
    assert None not in shas.values()
    return sorted(name for name, sha in shas.items() if subprocess.run(
        ["git", "-C", str(REPO_ROOT), "merge-base", "--is-ancestor", fix, sha], check=False).returncode == 0)


def _first_with_the_eager_swiglu_backward() -> str:
    """The profile of the earliest device session (its COMMAND.txt's) among those with the SwiGLU's eager backward."""
    return min(_profiles_after_the_eager_swiglu_backward(), key=lambda n: _session(f"{PROFILES}/{n}"))


def _compiled_swiglu_backward_off_on_an_h100() -> bool:
    k = S30C._kernels()
    s = k["ops"]["swiglu"]["compiled"]
    return (k["device"].startswith("NVIDIA H100") and k["config"]["tokens"] == 24576 and s["outputs"]["bit_identical"]
            and not s["input_grads"]["bit_identical"])


CLAIMS += [
    ("docs/results.md", "Its SwiGLU backward was not eager's bit for bit on an H100 at 24,576 tokens (session 30)",
     _says("not eager's bit for bit on an H100", _compiled_swiglu_backward_off_on_an_h100)),
    ("docs/results.md", "every profile here predates that but `h100-base.session34`, `h100-compiled.session31` and "
                        "`h100-compiled.session34`",
     lambda: (lambda names: (f"predates that but {', '.join(names[:-1])} and {names[-1]}",) if len(names) > 1 else False)(
         [f"`{n}`" for n in _profiles_after_the_eager_swiglu_backward()])),
]


CLAIMS += [  # device session 31: the selective GPU test, kernels-liger's valid run and one compiled profile, at 3aa2b34
    ("docs/results.md", "`h100-compiled.session31` is one update with the compiled kernels at 3aa2b34 (session 31), the "
                        "first with the SwiGLU's eager backward: 9.05 s (26% MFU)",
     lambda: (f"{S31C.profile31_words()[0]} ({S31C.profile31_words()[1]} MFU)", "at 3aa2b34 (session 31)")
     if _first_with_the_eager_swiglu_backward() == S31C.PROFILE31 and S31C.ran_on_an_h100_at_3aa2b34() else False),
    ("docs/results.md", "No profile without levers ran in its lease or at its commit (its last column is empty), so it is "
                        "not comparable with the other profiles",
     _says("not comparable with the other profiles", S31C.profile31_not_comparable)),
    ("docs/patches.md", "and with them its GPU tests passed on an H100",
     lambda: ("its GPU tests passed on an H100",) if S31C.compiled_tests_words()[0].startswith("29 passed")
     and S31C.ran_on_an_h100_at_3aa2b34() else False),
    ("docs/patches.md", "bit-identical loss and gradients to full checkpointing on the CPU and in its GPU test on an H100",
     _says("bit-identical loss and gradients to full checkpointing on the CPU and in its GPU test on an H100",
           S31C.selective_passed)),
    ("docs/patches.md", "On an H100 at 3aa2b34 (session 31, `outputs/elementwise_kernels/h100.session31/`) this form's "
                        "outputs and input gradients were eager's bit for bit at 24,576 tokens, and it took 3.28 ms against "
                        "eager's 3.20 ms, no faster",
     lambda: ("On an H100 at 3aa2b34 (session 31", *S31C.swiglu_words()) if S31C.ran_on_an_h100_at_3aa2b34() else False),
    ("docs/patches.md", "The GPU tests passed with it there, the two Qwen3-4B-wide layers' logits and gradients bit for bit",
     lambda: ("tests passed with it there", *S31C.compiled_tests_words()[1:])
     if S31C.compiled_tests_words()[0].endswith("skipped") else False),
    ("docs/patches.md", "The rerun at 3aa2b34 in session 31 (`outputs/elementwise_kernels/h100.session31/`), valid in every "
                        "entry, took in ms, eager / compiled / liger: RMSNorm 3.43 / 1.15 / 0.89, rotary 3.92 / 1.58 / 1.06, "
                        "SwiGLU 3.20 / 3.28 / 2.29",
     lambda: (*S31C.kernel_ms_words(), "The rerun at 3aa2b34 in session 31", "valid in every entry")
     if S31C.valid_in_every_entry() else False),
    ("docs/patches.md", "liger was the fastest on each op, and its input gradients differed from eager's on each, by up to "
                        "5.2e-03 (RMSNorm), 5.9e-03 (rotary) and 7.4e-03 (SwiGLU) of the largest, where the compiled "
                        "RMSNorm's differed by 2.6e-03 and the compiled rotary and SwiGLU were eager's bit for bit",
     lambda: (*S31C.liger_grad_words(), f"compiled RMSNorm's differed by {S31C.compiled_norm_grad_words()}",
              "the compiled rotary and SwiGLU were eager's bit for bit")
     if S31C.liger_fastest_and_least_exact() and S31C.compiled_rotary_and_swiglu_bit_for_bit() else False),
    ("docs/patches.md", "No liger kernel is adopted: a faster kernel is kept only at equal or better exactness (issue 42), "
                        "and each of liger's is less exact than the compiled one",
     _says("each of liger's is less exact than the compiled one", S31C.liger_fastest_and_least_exact)),
    ("docs/patches.md", "and passed on an H100 at 3aa2b34 in session 31",
     _says("passed on an H100 at 3aa2b34 in session 31", S31C.selective_passed)),
    (L, "`kernels-liger` and the selective GPU test ran again in session 31 (below)",
     _says("ran again in session 31", lambda: S31C.selective_passed() and S31C.valid_in_every_entry())),
    (L, "Kernels and the selective test on the H100 (session 31)", _says("the H100 (session 31)", S31C.ran_on_an_h100_at_3aa2b34)),
    (L, "these jobs ran one at a time from commit 3aa2b34", _says("from commit 3aa2b34", S31C.ran_on_an_h100_at_3aa2b34)),
    (L, "The selective-checkpoint GPU test passed**, its bytes check included, now that it counts the 16 bytes of RNG "
        "state per layer", lambda: ("GPU test passed**", f"the {_uint64_bytes()} bytes of RNG")
     if S31C.selective_passed() else False),
    (L, "kernels-liger's first valid run** (`outputs/elementwise_kernels/h100.session31/`, forward and backward at 24,576 "
        "tokens), in ms, eager / compiled / liger: RMSNorm 3.43 / 1.15 / 0.89, rotary 3.92 / 1.58 / 1.06, SwiGLU 3.20 / 3.28 "
        "/ 2.29",
     lambda: (*S31C.kernel_ms_words(), f"at {S31C._kernels()['config']['tokens']:,} tokens")
     if S31C.valid_in_every_entry() else False),
    (L, "The compiled rotary and SwiGLU were eager's bit for bit in outputs and input gradients; the compiled RMSNorm was "
        "not, as its patch states (its input gradients up to 2.6e-03 of the largest apart)",
     lambda: ("The compiled rotary and SwiGLU were eager's bit for bit", "the compiled RMSNorm was not",
              f"up to {S31C.compiled_norm_grad_words()} of the largest")
     if S31C.compiled_rotary_and_swiglu_bit_for_bit() else False),
    (L, "liger is not adopted.** It was the fastest on every op, and its input gradients differed from eager's on every op, "
        "by up to 5.2e-03 (RMSNorm), 5.9e-03 (rotary) and 7.4e-03 (SwiGLU) of the largest",
     lambda: ("liger is not adopted", *S31C.liger_grad_words()) if S31C.liger_fastest_and_least_exact() else False),
    (L, "Issue 42 keeps a faster kernel only at equal or better exactness, and each of liger's is less exact than the "
        "compiled one", _says("less exact than the compiled one", S31C.liger_fastest_and_least_exact)),
    (L, "The SwiGLU's eager backward is exact and no faster than eager**: 3.28 ms against eager's 3.20 ms, in one run",
     lambda: (S31C.swiglu_words()[0].removeprefix("took "), "no faster") if S31C.swiglu_words()[-1] == "no faster" else False),
    (L, "With Inductor's fused backward, in session 30, it took 2.05 ms against eager's 2.89 ms", S31C.swiglu30_words),
    (L, "the first with the SwiGLU's eager backward: 9.05 s (26% MFU), its elementwise kernels 945 ms",
     lambda: ("{} ({} MFU), its elementwise kernels {}".format(*S31C.profile31_words()),)
     if _first_with_the_eager_swiglu_backward() == S31C.PROFILE31 else False),
    (L, "no profile without levers ran in this lease or at this commit, so it is not comparable with the profiles of "
        "sessions 26 and 30", _says("not comparable", S31C.profile31_not_comparable)),
    (L, "Its GPU tests: 29 passed, 1 skipped**, among them the two Qwen3-4B-wide layers with the compiled rotary and "
        "SwiGLU, logits and gradients bit for bit", S31C.compiled_tests_words),
    (L, "The skipped one is the patched SwiGLU's dispatch test, a CPU test that the node's torch 2.11 skips",
     lambda: ("torch 2.11 skips",) if S31C.compiled_tests_words()[0].endswith("1 skipped")
     and "torch 2.11.0" in _source_text(S31C.S31_TESTS) else False),
]


S32, S32_CI = "outputs/_node/session32/README.md", "outputs/_node/session32/ci-9ce3993.txt"


def _ci_counts_at_9ce3993() -> tuple[int, int] | None:
    """(failed, passed) of the project's CI run on session 31's submission, where its one failure is the console test
    and the noise it saw is pyzmq's shutdown traceback; else None."""
    text = _source_text(S32_CI)
    counts = re.search(r"^(\d+) failed, (\d+) passed", text, re.M)
    console = "FAILED tests/test_runner.py::test_console_shows_progress_and_summary_only" in text
    if counts and console and "zmq.error.ZMQError: Socket operation on non-socket" in text:
        return int(counts.group(1)), int(counts.group(2))
    return None


def _session32_budget_words() -> tuple[str, ...] | bool:
    held = re.search(r"`budget_left_s` (\d+), `can_start_another: false`", _source_text(S32))
    return (f"{held.group(1)} s being left at its start",) if held else False


CLAIMS += [  # docs/lab-notes.md: session 32, no machine and CI's console flake
    (L, "the console kept clean of the kernel's shutdown (session 32)",
     _says("(session 32)", lambda: "Nothing ran; nothing came back." in _source_text(S32) and bool(_ci_counts_at_9ce3993()))),
    (L, "The project's CI failed session 31's submission in one test of 1701",
     lambda: (f"in one test of {sum(c)}",) if (c := _ci_counts_at_9ce3993()) and c[0] == 1 else False),
    (L, "The same commit had passed a clean-clone run here",
     _says("had passed a clean-clone run", lambda: "had exited 0 with 1701 passed" in _source_text(S32_CI))),
    (L, "Session 31's tries at the same work had spent this session's device time, 172 s being left at its start",
     _session32_budget_words),
    (L, "Next: the plan of session 31, unchanged.",
     _says("session 31, unchanged", lambda: "Next, on an H100 from the pinned tree" in _source_text("docs/lab-notes.md"))),
]


CLAIMS += [  # docs/lab-notes.md: session 33, notebook 07's two runs stopped when the machine was taken back
    (L, "Notebook 07's runs started, and the machine was taken back (session 33)",
     _says("(session 33)", S33C.taken_back_and_not_finished)),
    (L, "by the last pack, arm 1 had finished 3 steps and the fastest variant 10", lambda: S33C.step_words()[:1]),
    (L, "After the first step, arm 1 took 27-28 s a step and the variant 6-7 s, the two sharing the card",
     lambda: S33C.step_words()[1:] if S33C.ran_on_an_h100_at_c1c1f3c() else False),
    (L, "its step 3 took 26.8 s, of which old_log_prob 6.4 s and update_actor 15.9 s; the variant skips old_log_prob, "
        "and its update took 2.5 s in the same step", S33C.arm1_phase_words),
    (L, "So an arm-1 run of 30 steps needs about 20 minutes of a lease after the bundle",
     lambda: (f"run of {_yaml(NB07)['steps']} steps", f"about {S33C.arm1_run_minutes()} minutes")),
    (L, "The old_log_prob memory instrument ran on a GPU for the first time**, in arm 1 (the variant skips the pass)",
     _says("for the first time", S33C.instrument_ran_only_in_notebook_07)),
    (L, "old_log_prob's peak allocated was 0.35-0.38 GiB a step on notebook 07's small model", S33C.instrument_peak_words),
    (L, "No run at the seed's workload records it yet", _says("No run at the seed's workload", S33C.instrument_ran_only_in_notebook_07)),
    (L, "Next: notebook 07's runs alone on a card with at least 25 minutes of its hold left; otherwise the plan of "
        "session 31", _says("the plan of session 31", lambda: "For the next lease" in _source_text(S33C.S33_README))),
]


CLAIMS += [  # device session 34: notebook 07's first pair at lr 5e-4 and the compiled kernels beside their base, at 78bfa72
    ("README.md", "With the SwiGLU's eager backward, which those profiles predate, the compiled kernels took one update "
                  "from 11.24 s to 9.35 s (-17%), from 21% to 25% MFU, against no lever in one lease at one commit (78bfa72)",
     lambda: (*S34C.profile_pair_words(), "in one lease at one commit (78bfa72)")
     if S34C.ran_on_an_h100_at_78bfa72() and "h100-compiled.session34" in _profiles_after_the_eager_swiglu_backward()
     else False),
    ("docs/results.md", "`h100-base.session34` and `h100-compiled.session34` ran one after the other in one lease on one "
                        "H100 at 78bfa72", _says("at 78bfa72", S34C.ran_on_an_h100_at_78bfa72)),
    ("docs/results.md", "They took the update from 11.24 s to 9.35 s (-17%), from 21% to 25% MFU, one profile each; the "
                        "compiled patches' GPU tests after it: 28 passed, 2 skipped",
     lambda: (*S34C.profile_pair_words(), *S34C.compiled_tests_words())),
    ("README.md", "at lr 5e-4 one run a side so far, both learned, plateaus 0.11 apart",
     lambda: (f"at lr {S34C.lr_words(_yaml(NB07))} one run a side so far", "both learned",
              S34C.pair_words()[-1].replace("differ by", "plateaus") + " apart")
     if not S34C.pair_words()[0].startswith("<") else False),
    ("docs/results.md", "Notebook 07's h200 profile compares arm 1 with 5-fastest (arm 5 with the overlapped copies, "
                        "compiled RMSNorm and pointwise, chunked log-probs and the 0.2-s poll), two runs each",
     lambda: S34C.profile_words(_yaml(NB07))),
    ("docs/results.md", "Session 34 ran the first of each side by side on one H100 from 78bfa72",
     _says("from 78bfa72", S34C.ran_on_an_h100_at_78bfa72)),
    ("docs/results.md", "Both trained their 30 steps and learned: over the first and last five steps, arm 1 from 0.015 to "
                        "0.428 and the fastest variant from 0.014 to 0.543", lambda: S34C.pair_words()[:2]),
    ("docs/results.md", "Their entropy collapsed at step 26 and 27. Their plateaus differ by 0.11, where the two arm-1 runs "
                        "at lr 1e-3 above ended 1.2e-05 apart",
     lambda: (*S34C.collapse_words(), S34C.pair_words()[-1],
              f"ended {_learning()['analysis']['noise']['last_window_spread']:.1e} apart")),
    (L, "Notebook 07's first pair finished, and the compiled kernels beside their base (session 34)",
     _says("first pair finished", S34C.ran_on_an_h100_at_78bfa72)),
    (L, "both trained their 30 steps and learned, arm 1 from 0.015 to 0.428 and the fastest variant from 0.014 to 0.543 "
        "over the first and last five steps", lambda: S34C.pair_words()[:2]),
    (L, "Their entropy collapsed at step 26 and 27", S34C.collapse_words),
    (L, "after the first step, arm 1 took 22.9 s a step and the variant 5.7 s, with update_actor 13.4 s against 1.7 s",
     S34C.step_time_words),
    (L, "The job took 17 minutes from the driver's start", lambda: (f"took {S34C.job_minutes()} minutes",)),
    (L, "Arm 1's old_log_prob, a forward pass alone, took 4.8 s a step for about 75,000 tokens, some 64 us a token; the "
        "variant's chunked log-probs replace that path, and its whole update took 1.7 s", S34C.per_token_words),
    (L, "At the seed's workload every arm runs with chunked log-probs",
     _says("every arm runs with chunked log-probs", S34C.seed_arms_chunked)),
    (L, "ran in arm 1 again: 0.35-0.38 GiB again", S34C.instrument_words),
    (L, "from 11.24 s to 9.35 s (-17%), from 21% to 25% MFU. The compiled patches' GPU tests after it: 28 passed, 2 skipped",
     lambda: (*S34C.profile_pair_words(), *S34C.compiled_tests_words())),
]


NOT_RESULTS = [
    ("README.md", "Packages in layers, each importing only those below it", "the house's rule, which tests/test_architecture.py "
                                                                        "enforces"),
    ("docs/lab-notes.md", "both launches within a device machine's 30-minute hold", "the device service's rule"),
    ("docs/lab-notes.md", "Only a call naming `nvidia-h100-x1` is sure to get that card", "the device kind's name"),
    ("docs/lab-notes.md", "The next leases (c6ceef4, pinned tree, `nvidia-h100-x1`;", "a plan"),
    ("docs/lab-notes.md", "about 2 min of bundle in 30-MiB parts): 1.", "a plan"),
    ("README.md", "2 x 48 GB cards over PCIe, no NVLink", "the target hardware the project is for"),
    ("docs/lab-notes.md", "How the GPU runs went, what failed and what was fixed", "the doc's subject"),
    ("docs/lab-notes.md", "Runs that stopped keep their folder as `<arm>.session<N>.failed/`", "the results folder's rule"),
    ("README.md", "A failed run leaves `outputs/<notebook>/<tag>.failed/`", "what the results folder does; tests/test_runner.py"),
    ("README.md", "A run that fails leaves `<tag>.failed/`", "the same rule"),
    ("README.md", "how the GPU runs went, what failed and how it was fixed", "a link's description"),
    ("docs/results.md", "Issue 41 asks for the planner within 10% on every phase", "the issue's requirement, not a result"),
    ("docs/patches.md", "(1) verl adds `-0 x entropy` to the loss", "verl's code, not a measurement"),
    ("docs/patches.md", "A resume that loads no optimizer", "what the checkpoint guard compares (a rule of the code)"),
    ("docs/patches.md", "`RLKIT_EMULATE_GPU_GIB=47.4` makes every verl / vLLM process see", "a setting's example value"),
    ("docs/patches.md", "`seed-sac` (arm 5 at the seed's workload on the 47.4 GiB card", "what a launcher job would run"),
    ("docs/patches.md", "fixed 2 s", "verl's constant, which the patch replaces"),
    ("docs/offline-node.md", "a machine goes back 30 s after a call ends", "the device service's rule"),
    ("docs/offline-node.md", "A poll sent more than 30 s after the one before finds the machine "
                             "gone", "the device service's rule"),
    ("docs/reliability.md", "A run that raised is renamed to `<tag>.failed/`", "the results folder's rule"),
    ("docs/reliability.md", "Paths in `FAILED.txt` point into `<tag>.failed/`", "the results folder's rule"),
    ("docs/reliability.md", "`<tag>.failed/`", "a table cell naming the folder a fault leaves"),
    ("docs/reliability.md", "inside a run, `<tag>.failed/FAILED.txt`", "a table cell naming the folder a fault leaves"),
    ("docs/reliability.md", "HostAdamW holds 125.67 GiB of host memory per node", "the message's text, which "
         "tests/test_faults.py computes"),
    ("docs/reliability.md", "The failed runs that are committed show other "
                            "faults", "names committed folders (tests/test_docs.py)"),
    ("docs/multinode.md", "2 (W - 1) / W x 4 B x trainable parameters", "a formula"),
    ("docs/multinode.md", "it does not exist yet", "a converter not written (code, not a run)"),
    ("docs/lab-notes.md", "Its cause was not yet pinned (session 22 found it: below)", "history: an open question then, no measurement"),
    ("docs/reliability.md", "`Fix: lower actor_rollout_ref.rollout.gpu_memory_utilization to at most "
                            "0.63", "a message's text, which tests/test_faults.py asserts"),
    ("docs/lab-notes.md", "about 2 min of bundle in 30-MiB parts, then about 25 min of jobs", "a plan for later leases"),
    ("docs/reliability.md", "`verl exited with 1 after N s having logged 1/3 "
                            "steps", "a message's template (tests/test_faults.py)"),
    ("docs/multinode.md", "or a faster link are what shorten it", "advice, no measurement"),
    ("docs/lab-notes.md", "issue 42's targets (update_actor at 40% MFU, a step 25% below arm 5's) are not judged from "
                          "them", "the issue's targets, which these single-update profiles do not judge"),
]

DOCS = ("README.md", "docs/results.md", "docs/patches.md", "docs/offline-node.md", "docs/reliability.md", "docs/multinode.md",
        "docs/lab-notes.md")

BLOCK = re.compile(r"<!-- (\w+):begin .*?<!-- \1:end -->", re.DOTALL)  # any generated block (rlkit.report.sections, rlkit.planning.multinode)
FENCE = re.compile(r"^```.*?^```", re.DOTALL | re.MULTILINE)
MEASURED = re.compile(
    r"\d[\d,.]*[\s-]?(?:-s\b|s\b|ms\b|GiB|MiB|GB\b|MB\b|TB\b|GB/s|TB/s|%|x\b|tokens/s)|\b\d+(?:\.\d+)?x\b|\bx\s?\d|\b\d+ of \d+\b"
    r"|\b\d[\d,]*[- ]tokens?\b|\bsession \d+|\b\d+ (?:steps|layers|sequences|tests)\b"
    r"|has not run|not run yet|not run on a GPU|is not committed|no run of [^.]* is committed|not measured|not checked"
    r"|\bhas run\b|\bhave run\b|\bdid not run\b|\byet\b"
    r"|\bpassed\b|\bfailed\b|\bnot met\b|\bmet\b|\bfaster\b|\bslower\b|\bfell\b|\bhigher\b|\blower\b|\bthe same as\b"
    r"|\bbit for bit\b|\bbit-identical\b|\bbit-exact\b|\blearns\b|\babove (?=\S*\d)"
    r"|(?<!table )(?<!block )(?<!tables )(?<!rows )(?<!section )(?<!folders )(?<!column )\bbelow\b(?!\))")


def _units(doc: str) -> list[str]:
    """A doc's sentences and table cells outside its generated blocks and code, each on one line."""
    text = FENCE.sub("", BLOCK.sub("", (REPO_ROOT / doc).read_text()))
    out = []
    for para in re.split(r"\n\s*\n|\n(?=#)", text):
        if para.lstrip().startswith("|"):
            out += [c.strip() for line in para.splitlines() for c in line.strip().strip("|").split("|") if c.strip()]
        else:
            out += re.split(r"(?<=[.;])\s+", " ".join(para.split()))
    return [u for u in out if u]


def _covers(words: str, unit: str) -> bool:
    """A claim covers a sentence it contains, that contains it, or that it shares 40 characters with (a claim may
    run across a ';' where the sentences split)."""
    from difflib import SequenceMatcher

    unit = unit.rstrip(".;")
    if words in unit or unit in words:
        return True
    match = SequenceMatcher(None, words, unit, autojunk=False).find_longest_match(0, len(words), 0, len(unit))
    return match.size >= min(40, len(unit))


def _prose(doc: str) -> str:
    return " ".join(_units(doc))


def _holds(words: str, result) -> list[str]:
    """What of ``result`` (a check's answer) the words do not bear out; empty when they do."""
    if isinstance(result, bool):
        return [] if result else ["the cited file does not bear it out"]
    missing = [value for value in result if value not in words]
    return missing if result else ["the check found nothing to compare"]


@pytest.mark.parametrize("doc,words,check", CLAIMS, ids=[f"{c[0]}:{c[1][:40]}" for c in CLAIMS])
def test_each_claim_is_in_its_doc_and_its_file_bears_it_out(doc, words, check):
    assert words in _prose(doc), f"{doc} no longer says {words!r}: update or drop the claim"
    wrong = _holds(words, check())
    assert not wrong, f"{doc} says {words!r}, which its cited file contradicts: the file gives {wrong}"


@pytest.mark.parametrize("doc,words,why", NOT_RESULTS, ids=[f"{c[0]}:{c[1][:40]}" for c in NOT_RESULTS])
def test_each_listed_non_result_is_still_in_its_doc(doc, words, why):
    assert words in _prose(doc), f"{doc} no longer says {words!r}: drop it from NOT_RESULTS"


@pytest.mark.parametrize("doc", DOCS)
def test_no_result_sentence_goes_unchecked(doc):
    known = [w for d, w, _ in CLAIMS + NOT_RESULTS if d == doc]
    unchecked = [u for u in _units(doc) if MEASURED.search(u) and not any(_covers(w, u) for w in known)]
    assert not unchecked, f"{doc}: sentences stating a result that no claim checks (add one to CLAIMS): {unchecked}"
