"""Notebook 04: is the separate old-log-prob pass redundant when training is strictly on-policy?

On a random-init Qwen3 (tiny on CPU, Qwen3-4B on a GPU in bf16 with gradient checkpointing, as verl's
FSDP actor runs it) and one batch split into identical micro-batches, this measures:

- ``max|log_prob.detach() - old_log_probs|`` between the update's forward (train mode, grad,
  checkpointing) and a separate no-grad forward (eval mode), as verl's old_log_prob pass runs it;
  also the same with *different* micro-batching of the old pass (the noise the skip removes);
- the truncated IS weights exp(old - rollout) computed both ways, token and sequence level, with
  rollout log-probs simulated by perturbing old_log_probs; the decoupled weights are computed over
  the whole padded batch (verl's driver), the served ones per micro-batch (the loss);
- the PPO loss and every gradient with the skip vs without it on the same batch (and a rerun of the
  unskipped arm: the run-to-run floor of the device's backward);
- for every check, the unskipped run against a repeat of itself (the first and the last old pass, the
  rerun of the update): ``metrics["determinism"]`` puts each difference next to that spread;
- the time and peak memory of the old-log-prob pass, and of what replaces it (a placeholder copy).

verl's own functions are used when verl imports (``logprobs_from_logits``, ``entropy_from_logits``,
``compute_policy_loss_vanilla``, ``compute_rollout_correction_weights``); otherwise (the GPU node has
no verl) local copies of them; ``metrics["implementation"]`` says which ran.

``python -m rlkit.experiments.skip_old_logprob --profile tiny|h200``
"""
from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any, Literal

from rlkit.core.params import ParamError
from rlkit.experiments.onpolicy_kernels import Kernels, masked_max_abs_diff, masked_sum

NOTEBOOK = "04_skip_old_logprob"


@dataclass(frozen=True)
class Config:
    model: str  # rlkit.models.qwen preset: tiny (CPU) or qwen3-4b (GPU)
    device: Literal["cpu", "cuda"]
    dtype: Literal["float32", "bfloat16"]  # bfloat16 = compute dtype of verl's FSDP mixed precision
    attn_implementation: Literal["sdpa", "eager"]
    gradient_checkpointing: bool  # verl's actor default (enable_gradient_checkpointing)
    num_sequences: int  # sequences in the batch (= one PPO mini-batch: strictly on-policy)
    prompt_length: int  # tokens per prompt
    response_length: int  # max response tokens; lengths drawn in [response_length/2, response_length]
    micro_batch_size: int  # sequences per micro-batch, identical for the old pass and the update
    alt_micro_batch_size: int  # micro-batching of a second old pass, to show non-identical batching; 0: skip
    rollout_noise: float  # std of the perturbation that simulates rollout (vLLM) log-probs
    is_threshold: float  # truncation of the IS weights (verl rollout_is_threshold)
    clip_ratio_low: float
    clip_ratio_high: float
    clip_ratio_c: float  # dual-clip bound (verl default 3.0)
    timing_repeats: int  # old-log-prob passes timed (after one warm-up micro-batch); the first and last are compared
    deterministic: bool  # rlkit.measure.determinism.enable in the measuring process (raising mode), so diffs are not noise
    seed: int

    def __post_init__(self) -> None:
        from rlkit.models.qwen import PRESETS

        if self.model not in PRESETS:
            raise ParamError(f"model={self.model!r} is not a preset; fix: one of {sorted(PRESETS)}")
        for key in ("num_sequences", "prompt_length", "response_length", "micro_batch_size", "timing_repeats"):
            if getattr(self, key) < 1:
                raise ParamError(f"{key}={getattr(self, key)} must be >= 1; fix: set a positive value")
        if self.micro_batch_size > self.num_sequences:
            raise ParamError(
                f"micro_batch_size={self.micro_batch_size} > num_sequences={self.num_sequences}; "
                "fix: micro_batch_size <= num_sequences"
            )
        if self.alt_micro_batch_size < 0 or self.alt_micro_batch_size == self.micro_batch_size:
            raise ParamError(
                f"alt_micro_batch_size={self.alt_micro_batch_size} must be 0 (off) or a positive size other "
                f"than micro_batch_size={self.micro_batch_size}; fix: e.g. {max(1, self.micro_batch_size // 2)}"
            )
        if self.rollout_noise < 0:
            raise ParamError(f"rollout_noise={self.rollout_noise} must be >= 0; fix: e.g. 0.05")
        if self.is_threshold <= 1.0:
            raise ParamError(f"is_threshold={self.is_threshold} must be > 1 (verl default 2.0); fix: e.g. 2.0")
        if not 0 < self.clip_ratio_low < 1 or self.clip_ratio_high <= 0 or self.clip_ratio_c <= 1:
            raise ParamError(
                "clip ratios out of range: need 0 < clip_ratio_low < 1, clip_ratio_high > 0, clip_ratio_c > 1; "
                "fix: e.g. 0.2, 0.28, 3.0"
            )


def make_batch(cfg: Config, vocab_size: int, device):
    """Random prompts + responses of varied length (right-padded), GRPO-style advantages, rollout log-probs seed."""
    import torch

    gen = torch.Generator().manual_seed(cfg.seed + 1)
    n, p, r = cfg.num_sequences, cfg.prompt_length, cfg.response_length
    input_ids = torch.randint(3, vocab_size, (n, p + r), generator=gen)
    lengths = torch.randint(max(1, r // 2), r + 1, (n,), generator=gen)
    response_mask = (torch.arange(r).unsqueeze(0) < lengths.unsqueeze(1)).float()
    attention_mask = torch.cat([torch.ones(n, p), response_mask], dim=1).long()
    input_ids = input_ids * attention_mask
    advantages = torch.randn(n, 1, generator=gen) * response_mask
    rollout_noise = torch.randn(n, r, generator=gen) * cfg.rollout_noise
    return {
        "input_ids": input_ids.to(device), "attention_mask": attention_mask.to(device),
        "response_mask": response_mask.to(device), "advantages": advantages.to(device),
        "rollout_noise": rollout_noise.to(device), "lengths": lengths,
    }


CHECKS = (
    ("served log-probs vs old pass", "served_vs_old_log_prob_max_abs_diff", "old_log_prob_repeat_max_abs_diff"),
    ("entropy, update forward vs old pass", "entropy_update_vs_old_pass_max_abs_diff", "old_entropy_repeat_max_abs_diff"),
    ("IS weights, token", "is_weights_token_max_abs_diff", "is_weights_token_repeat_max_abs_diff"),
    ("IS weights, sequence", "is_weights_sequence_max_abs_diff", "is_weights_sequence_repeat_max_abs_diff"),
    ("PPO loss", "loss_abs_diff", "loss_rerun_abs_diff"),
    ("gradients", "grad_max_abs_diff", "grad_rerun_max_abs_diff"),
)


def measure(config: dict[str, Any], prefer_verl: bool = True) -> dict[str, Any]:
    """The measurement (runs in a fresh process; tests call it directly with ``prefer_verl=False``).

    With ``deterministic`` the process runs in :func:`rlkit.measure.determinism.enable`'s mode; an op torch refuses
    there ends the measurement with ``status="nondeterministic_op"`` and the op's name.
    """
    from rlkit.measure import determinism

    cfg = Config(**config)
    settings = determinism.enable(cfg.seed) if cfg.deterministic else determinism.settings(seed=cfg.seed)
    kernels = Kernels(cfg, prefer_verl=prefer_verl)
    result: dict[str, Any] = {"status": "ok", "implementation": kernels.describe()}
    with determinism.recording_nondeterministic_op(result):
        result.update(_measure(cfg, kernels))
    bits = result.get("bit_exactness", {})
    checks = [determinism.check(name, bits.get(diff), bits.get(spread)) for name, diff, spread in CHECKS]
    ops = {"measure": result["nondeterministic_op"]} if "nondeterministic_op" in result else {}
    result["determinism"] = determinism.summary(checks, settings, ops)
    return result


def _measure(cfg: Config, kernels: Kernels) -> dict[str, Any]:
    import torch

    if cfg.device == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("device=cuda but no CUDA device is visible; fix: run the tiny profile or on a GPU")
    h = _Harness(cfg, kernels)
    with h.timer.phase("warmup"):
        h.model.eval()
        with torch.no_grad():
            h.forward(slice(0, cfg.micro_batch_size), with_entropy=True)
    old = _old_passes(h)
    rollout_log_probs = (old["log_probs"] + h.batch["rollout_noise"]).clamp(max=0.0) * h.mask
    # What replaces the pass with the skip: a placeholder copy of the rollout log-probs.
    with h.timer.phase("old_log_prob_skipped"):
        placeholder = rollout_log_probs.clone()
    del placeholder
    # Decoupled mode: verl's driver computes the IS weights once over the whole padded batch.
    decoupled = {level: kernels.is_weights(old["log_probs"] - rollout_log_probs, h.mask, level)
                 for level in ("token", "sequence")}
    old["repeat_weights_diff"] = {  # the same weights from the first old pass: what the unskipped run varies by
        level: masked_max_abs_diff(kernels.is_weights(old["first_log_probs"] - rollout_log_probs, h.mask, level),
                                    decoupled[level], h.mask) for level in ("token", "sequence")
    }
    params = [q for q in h.model.parameters() if q.requires_grad]
    updates, grads = {}, {}
    for name, skip in (("skip", True), ("no_skip", False), ("no_skip_rerun", False)):
        updates[name] = h.update(skip, f"update_{name}", old["log_probs"], rollout_log_probs, decoupled)
        grads[name] = [q.grad.detach().clone() for q in params]
    return {
        "setup": _setup(h),
        "bit_exactness": _bit_exactness(h, old, decoupled, updates, grads),
        "timing": _timing(h),
        "phases": h.timer.as_dict(),
    }


class _Harness:
    """One measurement's random-init model, batch, kernels and timer, and verl's two passes over them in small: the
    separate old-log-prob pass (no grad, eval mode) and the update's forward + loss + backward per micro-batch."""

    def __init__(self, cfg: Config, kernels: Kernels) -> None:
        import torch

        from rlkit.measure.samplers import PhaseTimer
        from rlkit.models.qwen import build_random_model

        self.cfg, self.kernels = cfg, kernels
        device = torch.device(cfg.device)
        self.model = build_random_model(cfg.model, seed=cfg.seed, dtype=getattr(torch, cfg.dtype), device=device,
                                        attn_implementation=cfg.attn_implementation, use_cache=False)
        if cfg.gradient_checkpointing:
            self.model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        self.batch = make_batch(cfg, self.model.config.vocab_size, device)
        self.mask = self.batch["response_mask"]
        self.batch_num_tokens = int(self.mask.sum())
        self.timer = PhaseTimer()

    def forward(self, rows: slice, with_entropy: bool):
        p, r = self.cfg.prompt_length, self.cfg.response_length
        out = self.model(input_ids=self.batch["input_ids"][rows], attention_mask=self.batch["attention_mask"][rows],
                         use_cache=False, logits_to_keep=r + 1)
        logits = out.logits[:, :-1].float()  # positions p-1 .. p+r-2 predict the response tokens
        log_probs = self.kernels.log_probs(logits, self.batch["input_ids"][rows, p:])
        return log_probs, (self.kernels.entropy(logits) if with_entropy else None)

    def micro_batches(self, size: int) -> list[slice]:
        n = self.cfg.num_sequences
        return [slice(i, min(i + size, n)) for i in range(0, n, size)]

    def old_log_prob_pass(self, size: int):
        """verl's compute_log_prob: eval mode, no grad, calculate_entropy=True."""
        import torch

        self.model.eval()
        lps, ents = [], []
        with torch.no_grad():
            for rows in self.micro_batches(size):
                lp, ent = self.forward(rows, with_entropy=True)
                lps.append(lp)
                ents.append(ent)
        return torch.cat(lps), torch.cat(ents)

    def update(self, skip: bool, phase: str, old_log_probs, rollout_log_probs, decoupled_weights) -> dict[str, Any]:
        """One PPO mini-batch: forward (train mode, grad, checkpointing) + loss + backward per micro-batch; with
        ``skip`` the update's own detached log-probs stand for the old ones (and the IS weights come from them)."""
        import torch

        self.model.train()
        self.model.zero_grad(set_to_none=True)
        served, served_entropy, served_weights, total_loss = [], [], {"token": [], "sequence": []}, 0.0
        ratio_dev = 0.0
        with self.timer.phase(phase):
            for rows in self.micro_batches(self.cfg.micro_batch_size):
                width = int(self.batch["lengths"][rows].max())  # the loss sees the micro-batch padded to its own max
                log_prob, entropy = self.forward(rows, with_entropy=True)
                log_prob, entropy = log_prob[:, :width], entropy[:, :width]
                mb_mask = self.mask[rows, :width]
                if skip:
                    old = log_prob.detach()
                    rollout = rollout_log_probs[rows, :width]
                    weights = {lv: self.kernels.is_weights(old - rollout, mb_mask, lv) for lv in ("token", "sequence")}
                else:
                    old = old_log_probs[rows, :width]
                    weights = {lv: w[rows, :width] for lv, w in decoupled_weights.items()}
                loss = self.kernels.policy_loss(old, log_prob, self.batch["advantages"][rows, :width], mb_mask,
                                                self.batch_num_tokens, weights["token"])
                loss.backward()
                total_loss += float(loss.detach())
                ratio = torch.exp(log_prob.detach() - old)
                ratio_dev = max(ratio_dev, masked_max_abs_diff(ratio, torch.ones_like(ratio), mb_mask))
                pad = (0, self.cfg.response_length - width)
                served.append(torch.nn.functional.pad(log_prob.detach(), pad))
                served_entropy.append(torch.nn.functional.pad(entropy.detach(), pad))
                for lv in weights:
                    served_weights[lv].append(torch.nn.functional.pad(weights[lv], pad))
        return {
            "log_probs": torch.cat(served), "entropy": torch.cat(served_entropy), "loss": total_loss,
            "weights": {lv: torch.cat(w) for lv, w in served_weights.items()}, "ratio_max_abs_dev_from_1": ratio_dev,
        }

    def mean_entropy(self, entropy) -> float:
        return float(masked_sum(entropy, self.mask) / self.batch_num_tokens)


def _old_passes(h: _Harness) -> dict[str, Any]:
    """The timed old-log-prob passes: the first and the last (the unskipped pass against a repeat of itself), and the
    largest difference that another micro-batch size makes."""
    cfg = h.cfg
    passes = []
    for _ in range(cfg.timing_repeats):
        with h.timer.phase("old_log_prob"):
            passes = [*passes[:1], h.old_log_prob_pass(cfg.micro_batch_size)]
    if len(passes) == 1:
        passes.append(h.old_log_prob_pass(cfg.micro_batch_size))  # untimed
    (first_log_probs, first_entropy), (log_probs, entropy) = passes
    alt_diff = None
    if cfg.alt_micro_batch_size:
        with h.timer.phase("old_log_prob_alt_micro_batch"):
            alt_log_probs, _ = h.old_log_prob_pass(cfg.alt_micro_batch_size)
        alt_diff = masked_max_abs_diff(alt_log_probs, log_probs, h.mask)
    return {"first_log_probs": first_log_probs, "first_entropy": first_entropy, "log_probs": log_probs,
            "entropy": entropy, "alt_diff": alt_diff}


def _setup(h: _Harness) -> dict[str, Any]:
    import torch

    from rlkit.models.qwen import count_parameters

    cfg = h.cfg
    return {
        "model": cfg.model, "parameters": count_parameters(h.model), "device": cfg.device,
        "gpu": torch.cuda.get_device_name(0) if cfg.device == "cuda" else None,
        "dtype": cfg.dtype, "attn_implementation": cfg.attn_implementation,
        "gradient_checkpointing": cfg.gradient_checkpointing, "num_sequences": cfg.num_sequences,
        "micro_batch_size": cfg.micro_batch_size, "num_micro_batches": len(h.micro_batches(cfg.micro_batch_size)),
        "alt_micro_batch_size": cfg.alt_micro_batch_size, "prompt_length": cfg.prompt_length,
        "response_length": cfg.response_length, "response_tokens": h.batch_num_tokens,
        "total_tokens": int(h.batch["attention_mask"].sum()),
        "deterministic_algorithms": torch.are_deterministic_algorithms_enabled(),
        "torch": torch.__version__,
    }


def _grads_max_abs_diff(a, b) -> float:
    return max(float((x.float() - y.float()).abs().max()) for x, y in zip(a, b, strict=True))


def _bit_exactness(h: _Harness, old, decoupled, updates, grads) -> dict[str, Any]:
    """What the skip changes, and what repeating the unskipped run changes (the bar the skip is held to)."""
    mask, tokens, skip, no_skip = h.mask, h.batch_num_tokens, updates["skip"], updates["no_skip"]
    return {
        "served_vs_old_log_prob_max_abs_diff": masked_max_abs_diff(skip["log_probs"], old["log_probs"], mask),
        "entropy_update_vs_old_pass_max_abs_diff": masked_max_abs_diff(skip["entropy"], old["entropy"], mask),
        "actor_entropy_old_pass": h.mean_entropy(old["entropy"]),
        "actor_entropy_update_forward": h.mean_entropy(skip["entropy"]),
        "alt_micro_batch_old_log_prob_max_abs_diff": old["alt_diff"],
        "old_log_prob_repeat_max_abs_diff": masked_max_abs_diff(old["first_log_probs"], old["log_probs"], mask),
        "old_entropy_repeat_max_abs_diff": masked_max_abs_diff(old["first_entropy"], old["entropy"], mask),
        "is_weights_token_repeat_max_abs_diff": old["repeat_weights_diff"]["token"],
        "is_weights_sequence_repeat_max_abs_diff": old["repeat_weights_diff"]["sequence"],
        "is_weights_token_max_abs_diff": masked_max_abs_diff(skip["weights"]["token"], decoupled["token"], mask),
        "is_weights_sequence_max_abs_diff": masked_max_abs_diff(
            skip["weights"]["sequence"], decoupled["sequence"], mask),
        "is_weights_token_mean": float(masked_sum(decoupled["token"], mask) / tokens),
        "is_weights_token_truncated_fraction": float(
            masked_sum((decoupled["token"] >= h.cfg.is_threshold).float(), mask) / tokens),
        "loss_skip": skip["loss"], "loss_no_skip": no_skip["loss"],
        "loss_abs_diff": abs(skip["loss"] - no_skip["loss"]),
        "grad_max_abs_diff": _grads_max_abs_diff(grads["skip"], grads["no_skip"]),
        "grad_rerun_max_abs_diff": _grads_max_abs_diff(grads["no_skip"], grads["no_skip_rerun"]),
        "loss_rerun_abs_diff": abs(updates["no_skip_rerun"]["loss"] - no_skip["loss"]),
        "ratio_max_abs_dev_from_1_skip": skip["ratio_max_abs_dev_from_1"],
        "ratio_max_abs_dev_from_1_no_skip": no_skip["ratio_max_abs_dev_from_1"],
    }


def _timing(h: _Harness) -> dict[str, Any]:
    timer = h.timer
    seconds = {k: timer.seconds[k] / timer.counts[k] for k in timer.seconds}
    return {
        "old_log_prob_seconds": seconds["old_log_prob"],
        "old_log_prob_skipped_seconds": seconds["old_log_prob_skipped"],
        "skipped_over_unskipped": seconds["old_log_prob_skipped"] / seconds["old_log_prob"],
        "update_seconds_skip": seconds["update_skip"],
        "update_seconds_no_skip": seconds["update_no_skip"],
        "old_log_prob_peak_device_gib": timer.peak_device_gib["old_log_prob"],
        "update_peak_device_gib": timer.peak_device_gib["update_skip"],
        "timing_repeats": h.cfg.timing_repeats,
    }


def run(cfg: Config) -> dict[str, Any]:
    """Measure in a fresh process, then add the guard's verdicts (pure config logic, no verl needed)."""
    from rlkit.core.params import as_dict
    from rlkit.measure import determinism
    from rlkit.measure.launch import run_module
    from rlkit.patches.verl import onpolicy

    module = __name__ if __name__ != "__main__" else "rlkit.experiments.skip_old_logprob"
    metrics = run_module(module, as_dict(cfg), env=determinism.child_env(cfg.deterministic))
    metrics["guard"] = onpolicy.guard_examples()
    metrics["overrides"] = onpolicy.onpolicy_overrides(onpolicy.reference_config())
    metrics["metrics_with_skip"] = onpolicy.METRICS_WITH_SKIP
    return metrics


def describe(metrics: dict[str, Any]) -> str:
    """The notebook's findings: the served log-probs against the skipped pass, what the skip saves, the guard, in plain sentences, every number read from ``metrics`` (:func:`rlkit.experiments.prose.skip_old_logprob`)."""
    from rlkit.experiments.prose import skip_old_logprob

    return skip_old_logprob(metrics)


def main(argv=None) -> int:
    from rlkit.experiments import experiment_main

    return experiment_main(Config, run, NOTEBOOK, argv)


if __name__ == "__main__":
    if "--config" in sys.argv:  # launched by rlkit.measure.launch.run_module
        from rlkit.measure.launch import child_main

        child_main(measure)
    else:
        sys.exit(main())
