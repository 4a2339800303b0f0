"""rlkit.experiments.kernels runs end to end on the CPU with its tiny profile (the command line the GPU node runs,
a results folder with params, env and metrics), its chunked arms agree with the full-logits arm to fp32 rounding,
its attention cases have the lengths they name, and bad parameters are refused naming the key."""
from __future__ import annotations

import json

import pytest

from rlkit.experiments import kernels
from rlkit.patches.kernels import varlen_attention


def test_sequence_lengths_hit_their_totals():
    lengths = kernels.sequence_lengths(total_tokens=16384, min_len=64, max_len=764, seed=0)
    assert sum(lengths) == 16384 and max(lengths) == 764 and min(lengths) >= 1
    five = kernels.sequence_lengths(num_sequences=5, min_len=1024, max_len=5632, seed=0)
    assert len(five) == 5 and max(five) == 5632 and min(five) >= 1024
    with pytest.raises(ValueError, match="exactly one"):
        kernels.sequence_lengths(total_tokens=10, num_sequences=2, min_len=1, max_len=4, seed=0)


def test_tiny_profile_writes_a_results_folder_with_parity_and_attention_rows(tmp_path):
    argv = ["--tiny", "--out", str(tmp_path), "--tag", "cpu", "-p", "seq_len=24", "-p", "chunk_rows=[7]"]
    assert kernels.main(argv) == 0
    folder = tmp_path / kernels.NOTEBOOK / "cpu"
    assert {p.name for p in folder.iterdir()} >= {"params.yaml", "env.json", "metrics.json"}
    metrics = json.loads((folder / "metrics.json").read_text())
    assert not varlen_attention.PATCH.active()  # the run applied it for its attention cases and reverted it

    logprobs = metrics["logprobs"]
    assert [a["arm"] for a in logprobs["arms"]] == ["full", "chunked_7", "chunked_7_no_entropy"]
    assert logprobs["tokens"] == 2 * 24
    assert all(a["median_s"] > 0 and a["peak_allocated_gib"] is None for a in logprobs["arms"])  # no CUDA here
    repeated, *chunked = logprobs["parity"]
    assert repeated["arm"] == "full_repeated" and repeated["grad_rel_diff_max"] == 0.0  # the CPU is deterministic
    assert [row["arm"] for row in chunked] == ["chunked_7", "chunked_7_no_entropy"]
    for row in chunked:
        # fp32 on the CPU: the chunked arms differ from the full one only in the order of their reductions
        # (tests/test_chunked_logprobs.py derives the bound); 1e-5 is ~80 fp32 ulps at |log p| ~ 6.
        assert row["max_abs_logprob_diff"] <= 1e-5 and row["loss_abs_diff"] <= 1e-6
        assert row["grad_rel_diff_max"] <= 1e-5 and row["params"] > 1

    cases = {c["case"]: c for c in metrics["attention"]["cases"]}
    assert set(cases) == set(kernels.ATTENTION_CASES["tiny"])
    assert cases["a_tokens_up_to_40"]["tokens"] == 256 and cases["a_tokens_up_to_40"]["max_len"] == 40
    assert cases["b_five_sequences_up_to_88"]["sequences"] == 5
    for case in cases.values():
        assert not case["varlen_uses_kernel"]  # the CPU runs the per-sequence SDPA fallback
        assert case["padded_tokens"] >= case["tokens"] and case["varlen_ms"] > 0 and case["padded_sdpa_ms"] > 0
        # fp32: the same attention through per-sequence SDPA and through a masked padded SDPA, then the MLP;
        # a few ulps of the output scale are expected (the GPU test bounds the bf16 kernel).
        assert case["max_abs_diff"] <= 64 * 1.2e-7 * case["max_abs_output"]


def test_bad_parameters_are_refused_naming_the_key(tmp_path, capsys):
    assert kernels.main(["--tiny", "--out", str(tmp_path), "-p", "chunk_rowz=[8]"]) == 2
    assert "chunk_rowz" in capsys.readouterr().err
    assert kernels.main(["--tiny", "--out", str(tmp_path), "-p", "attention_cases=h100"]) == 2
    assert "attention_cases='h100'" in capsys.readouterr().err
    assert not (tmp_path / kernels.NOTEBOOK).exists()
