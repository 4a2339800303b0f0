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

from rlkit.params import ParamError

NOTEBOOK = "04_skip_old_logprob"


@dataclass(frozen=True)
class Config:
    model: str  # rlkit.models preset: tiny (CPU) or qwen3-4b (GPU)
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
    deterministic: bool  # rlkit.determinism.enable in the measuring process (raising mode), so diffs are not noise
    seed: int

    def __post_init__(self) -> None:
        from rlkit.models import PRESETS

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


# ------------------------------------------------------------------------ kernels: verl or local copies
SAFETY_BOUND = 20.0  # verl rollout_corr_helper.SAFETY_BOUND


def _masked_sum(values, mask, axis=None):
    import torch

    return (torch.where(mask.bool(), values, 0.0) * mask).sum(axis=axis)


def local_logprobs_from_logits(logits, labels):
    """verl ``logprobs_from_logits`` without flash-attn: ``logprobs_from_logits_v2`` (float32 path)."""
    import torch

    logits_labels = torch.gather(logits, dim=-1, index=labels.unsqueeze(-1)).squeeze(-1)
    logsumexp_values = torch.stack([torch.logsumexp(logit, dim=-1) for logit in logits])
    return logits_labels - logsumexp_values


def local_entropy_from_logits(logits):
    """verl ``entropy_from_logits``."""
    import torch

    pd = torch.nn.functional.softmax(logits, dim=-1)
    return torch.logsumexp(logits, dim=-1) - torch.sum(pd * logits, dim=-1)


def local_is_weights(log_ratio, response_mask, level: str, threshold: float):
    """verl ``compute_rollout_correction_weights`` (TIS, no batch normalisation), weights only."""
    import torch

    if level == "token":
        raw = torch.exp(torch.clamp(log_ratio, min=-SAFETY_BOUND, max=SAFETY_BOUND))
    else:
        log_ratio_sum = _masked_sum(log_ratio, response_mask, axis=-1).unsqueeze(-1)
        raw = torch.exp(torch.clamp(log_ratio_sum, min=-SAFETY_BOUND, max=SAFETY_BOUND)).expand_as(log_ratio)
    return (raw * response_mask).clamp(max=threshold).detach()


def local_policy_loss_vanilla(old_log_prob, log_prob, advantages, response_mask, clip_low, clip_high, clip_c,
                              batch_num_tokens, rollout_is_weights=None):
    """verl ``compute_policy_loss_vanilla`` with ``loss_agg_mode='token-mean'`` over the global token count."""
    import torch

    negative_approx_kl = torch.clamp(log_prob - old_log_prob, min=-20.0, max=20.0)
    ratio = torch.exp(negative_approx_kl)
    pg_losses1 = -advantages * ratio
    pg_losses2 = -advantages * torch.clamp(ratio, 1 - clip_low, 1 + clip_high)
    clip_pg_losses1 = torch.maximum(pg_losses1, pg_losses2)
    pg_losses3 = -advantages * clip_c
    clip_pg_losses2 = torch.min(pg_losses3, clip_pg_losses1)
    pg_losses = torch.where(advantages < 0, clip_pg_losses2, clip_pg_losses1)
    if rollout_is_weights is not None:
        pg_losses = pg_losses * rollout_is_weights
    return _masked_sum(pg_losses, response_mask) / batch_num_tokens * 1


class Kernels:
    """The log-prob, entropy, IS-weight and PPO-loss functions: verl's own, or the local copies."""

    def __init__(self, cfg: Config, prefer_verl: bool = True) -> None:
        self.cfg = cfg
        self.source = "local"
        self.why_local = "" if prefer_verl else "local copies requested"
        if prefer_verl:
            try:
                from verl.trainer.ppo.core_algos import compute_policy_loss_vanilla
                from verl.trainer.ppo.rollout_corr_helper import compute_rollout_correction_weights
                from verl.utils import torch_functional as verl_F
                from verl.workers.config import ActorConfig
            except ImportError as err:
                self.why_local = f"verl not importable: {err}"
            else:
                self.source = "verl"
                self._verl_loss = compute_policy_loss_vanilla
                self._verl_is = compute_rollout_correction_weights
                self._verl_F = verl_F
                self._actor_config = ActorConfig(
                    strategy="fsdp", ppo_mini_batch_size=cfg.num_sequences, rollout_n=1,
                    ppo_micro_batch_size_per_gpu=cfg.micro_batch_size, clip_ratio_low=cfg.clip_ratio_low,
                    clip_ratio_high=cfg.clip_ratio_high, clip_ratio_c=cfg.clip_ratio_c,
                )

    def describe(self) -> dict[str, str]:
        if self.source == "verl":
            return {
                "source": "verl",
                "log_probs": "verl.utils.torch_functional.logprobs_from_logits",
                "entropy": "verl.utils.torch_functional.entropy_from_logits",
                "is_weights": "verl.trainer.ppo.rollout_corr_helper.compute_rollout_correction_weights",
                "policy_loss": "verl.trainer.ppo.core_algos.compute_policy_loss_vanilla (token-mean)",
            }
        return {
            "source": "local",
            "why_local": self.why_local,
            "log_probs": "rlkit copy of verl logprobs_from_logits_v2 (float32 path)",
            "entropy": "rlkit copy of verl entropy_from_logits",
            "is_weights": "rlkit copy of verl compute_rollout_correction_weights (TIS)",
            "policy_loss": "rlkit copy of verl compute_policy_loss_vanilla (token-mean)",
        }

    def log_probs(self, logits, labels):
        if self.source == "verl":
            return self._verl_F.logprobs_from_logits(logits, labels)
        return local_logprobs_from_logits(logits, labels)

    def entropy(self, logits):
        if self.source == "verl":
            return self._verl_F.entropy_from_logits(logits)
        return local_entropy_from_logits(logits)

    def is_weights(self, log_ratio, response_mask, level: str):
        if self.source == "verl":
            weights, _ = self._verl_is(log_ratio, response_mask, rollout_is=level,
                                       rollout_is_threshold=self.cfg.is_threshold)
            return weights
        return local_is_weights(log_ratio, response_mask, level, self.cfg.is_threshold)

    def policy_loss(self, old_log_prob, log_prob, advantages, response_mask, batch_num_tokens, weights):
        c = self.cfg
        if self.source == "verl":
            self._actor_config.global_batch_info.update(
                dp_size=1, batch_num_tokens=batch_num_tokens, global_batch_size=c.num_sequences, loss_scale_factor=None
            )
            loss, _ = self._verl_loss(
                old_log_prob=old_log_prob, log_prob=log_prob, advantages=advantages,
                response_mask=response_mask.bool(), loss_agg_mode="token-mean", config=self._actor_config,
                rollout_is_weights=weights,
            )
            return loss
        return local_policy_loss_vanilla(old_log_prob, log_prob, advantages, response_mask.bool(), c.clip_ratio_low,
                                         c.clip_ratio_high, c.clip_ratio_c, batch_num_tokens, weights)


# ------------------------------------------------------------------------ the measurement (child process)
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


def _masked_max_abs_diff(a, b, mask) -> float:
    import torch

    return float(torch.where(mask.bool(), (a.float() - b.float()).abs(), 0.0).max())


# (check, key of the skip's difference, key of the unskipped run's difference from a repeat of itself)
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

    With ``deterministic`` the process runs in :func:`rlkit.determinism.enable`'s mode; an op torch refuses
    there ends the measurement with ``status="nondeterministic_op"`` and the op's name.
    """
    from rlkit import determinism

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

    from rlkit.measure import PhaseTimer
    from rlkit.models import build_random_model, count_parameters

    if cfg.device == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("device=cuda but no CUDA device is visible; fix: run the tiny profile or on a GPU")
    device = torch.device(cfg.device)
    dtype = getattr(torch, cfg.dtype)
    model = build_random_model(cfg.model, seed=cfg.seed, dtype=dtype, device=device,
                               attn_implementation=cfg.attn_implementation, use_cache=False)
    if cfg.gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    batch = make_batch(cfg, model.config.vocab_size, device)
    n, p, r = cfg.num_sequences, cfg.prompt_length, cfg.response_length
    mask = batch["response_mask"]
    batch_num_tokens = int(mask.sum())

    def forward(rows: slice, with_entropy: bool):
        out = model(input_ids=batch["input_ids"][rows], attention_mask=batch["attention_mask"][rows],
                    use_cache=False, logits_to_keep=r + 1)
        logits = out.logits[:, :-1].float()  # positions p-1 .. p+r-2 predict the response tokens
        labels = batch["input_ids"][rows, p:]
        log_probs = kernels.log_probs(logits, labels)
        return log_probs, (kernels.entropy(logits) if with_entropy else None)

    def micro_batches(size: int):
        return [slice(i, min(i + size, n)) for i in range(0, n, size)]

    def old_log_prob_pass(size: int):
        """verl's compute_log_prob: eval mode, no grad, calculate_entropy=True."""
        model.eval()
        lps, ents = [], []
        with torch.no_grad():
            for rows in micro_batches(size):
                lp, ent = forward(rows, with_entropy=True)
                lps.append(lp)
                ents.append(ent)
        return torch.cat(lps), torch.cat(ents)

    timer = PhaseTimer()
    with timer.phase("warmup"):
        model.eval()
        with torch.no_grad():
            forward(slice(0, cfg.micro_batch_size), with_entropy=True)
    passes = []  # the first and the last pass: the unskipped old pass against a repeat of itself
    for _ in range(cfg.timing_repeats):
        with timer.phase("old_log_prob"):
            passes = [*passes[:1], old_log_prob_pass(cfg.micro_batch_size)]
    if len(passes) == 1:
        passes.append(old_log_prob_pass(cfg.micro_batch_size))  # untimed
    (first_log_probs, first_entropy), (old_log_probs, old_entropy) = passes
    del passes
    alt_diff = None
    if cfg.alt_micro_batch_size:
        with timer.phase("old_log_prob_alt_micro_batch"):
            alt_log_probs, _ = old_log_prob_pass(cfg.alt_micro_batch_size)
        alt_diff = _masked_max_abs_diff(alt_log_probs, old_log_probs, mask)
        del alt_log_probs

    rollout_log_probs = (old_log_probs + batch["rollout_noise"]).clamp(max=0.0) * mask
    # What replaces the pass with the skip: a placeholder copy of the rollout log-probs.
    with timer.phase("old_log_prob_skipped"):
        placeholder = rollout_log_probs.clone()
    del placeholder
    # Decoupled mode: verl's driver computes the IS weights once over the whole padded batch.
    decoupled_weights = {
        level: kernels.is_weights(old_log_probs - rollout_log_probs, mask, level) for level in ("token", "sequence")
    }
    repeat_weights_diff = {  # the same weights from the first old pass: what the unskipped run varies by
        level: _masked_max_abs_diff(kernels.is_weights(first_log_probs - rollout_log_probs, mask, level),
                                    decoupled_weights[level], mask) for level in ("token", "sequence")
    }

    params = [q for q in model.parameters() if q.requires_grad]

    def update(skip: bool, phase: str):
        """One PPO mini-batch: forward (train mode, grad, checkpointing) + loss + backward per micro-batch."""
        model.train()
        model.zero_grad(set_to_none=True)
        served, served_entropy, served_weights, total_loss = [], [], {"token": [], "sequence": []}, 0.0
        ratio_dev = 0.0
        with timer.phase(phase):
            for rows in micro_batches(cfg.micro_batch_size):
                width = int(batch["lengths"][rows].max())  # the loss sees the micro-batch padded to its own max
                log_prob, entropy = forward(rows, with_entropy=True)
                log_prob, entropy = log_prob[:, :width], entropy[:, :width]
                mb_mask = mask[rows, :width]
                rollout = rollout_log_probs[rows, :width]
                if skip:
                    old = log_prob.detach()
                    weights = {lv: kernels.is_weights(old - rollout, mb_mask, lv) for lv in ("token", "sequence")}
                else:
                    old = old_log_probs[rows, :width]
                    weights = {lv: w[rows, :width] for lv, w in decoupled_weights.items()}
                loss = kernels.policy_loss(old, log_prob, batch["advantages"][rows, :width], mb_mask,
                                           batch_num_tokens, weights["token"])
                loss.backward()
                total_loss += float(loss.detach())
                ratio = torch.exp(log_prob.detach() - old)
                ratio_dev = max(ratio_dev, _masked_max_abs_diff(ratio, torch.ones_like(ratio), mb_mask))
                pad = (0, r - width)
                served.append(torch.nn.functional.pad(log_prob.detach(), pad))
                served_entropy.append(torch.nn.functional.pad(entropy.detach(), pad))
                for lv in weights:
                    served_weights[lv].append(torch.nn.functional.pad(weights[lv], pad))
        return {
            "log_probs": torch.cat(served), "entropy": torch.cat(served_entropy), "loss": total_loss,
            "weights": {lv: torch.cat(w) for lv, w in served_weights.items()}, "ratio_max_abs_dev_from_1": ratio_dev,
        }

    def grads_max_abs_diff(a, b) -> float:
        return max(float((x.float() - y.float()).abs().max()) for x, y in zip(a, b, strict=True))

    skip = update(skip=True, phase="update_skip")
    grads_skip = [q.grad.detach().clone() for q in params]
    no_skip = update(skip=False, phase="update_no_skip")
    grads_no_skip = [q.grad.detach().clone() for q in params]
    rerun = update(skip=False, phase="update_no_skip_rerun")
    grads_rerun = [q.grad.detach() for q in params]

    mean_entropy = lambda ent: float(_masked_sum(ent, mask) / batch_num_tokens)
    seconds = {k: timer.seconds[k] / timer.counts[k] for k in timer.seconds}
    env_gpu = torch.cuda.get_device_name(0) if cfg.device == "cuda" else None
    return {
        "setup": {
            "model": cfg.model, "parameters": count_parameters(model), "device": cfg.device, "gpu": env_gpu,
            "dtype": cfg.dtype, "attn_implementation": cfg.attn_implementation,
            "gradient_checkpointing": cfg.gradient_checkpointing, "num_sequences": n,
            "micro_batch_size": cfg.micro_batch_size, "num_micro_batches": len(micro_batches(cfg.micro_batch_size)),
            "alt_micro_batch_size": cfg.alt_micro_batch_size, "prompt_length": p, "response_length": r,
            "response_tokens": batch_num_tokens, "total_tokens": int(batch["attention_mask"].sum()),
            "deterministic_algorithms": torch.are_deterministic_algorithms_enabled(),
            "torch": torch.__version__,
        },
        "bit_exactness": {
            "served_vs_old_log_prob_max_abs_diff": _masked_max_abs_diff(skip["log_probs"], old_log_probs, mask),
            "entropy_update_vs_old_pass_max_abs_diff": _masked_max_abs_diff(skip["entropy"], old_entropy, mask),
            "actor_entropy_old_pass": mean_entropy(old_entropy),
            "actor_entropy_update_forward": mean_entropy(skip["entropy"]),
            "alt_micro_batch_old_log_prob_max_abs_diff": alt_diff,
            "old_log_prob_repeat_max_abs_diff": _masked_max_abs_diff(first_log_probs, old_log_probs, mask),
            "old_entropy_repeat_max_abs_diff": _masked_max_abs_diff(first_entropy, old_entropy, mask),
            "is_weights_token_repeat_max_abs_diff": repeat_weights_diff["token"],
            "is_weights_sequence_repeat_max_abs_diff": repeat_weights_diff["sequence"],
            "is_weights_token_max_abs_diff": _masked_max_abs_diff(
                skip["weights"]["token"], decoupled_weights["token"], mask),
            "is_weights_sequence_max_abs_diff": _masked_max_abs_diff(
                skip["weights"]["sequence"], decoupled_weights["sequence"], mask),
            "is_weights_token_mean": float(_masked_sum(decoupled_weights["token"], mask) / batch_num_tokens),
            "is_weights_token_truncated_fraction": float(
                _masked_sum((decoupled_weights["token"] >= cfg.is_threshold).float(), mask) / batch_num_tokens),
            "loss_skip": skip["loss"], "loss_no_skip": no_skip["loss"],
            "loss_abs_diff": abs(skip["loss"] - no_skip["loss"]),
            "grad_max_abs_diff": grads_max_abs_diff(grads_skip, grads_no_skip),
            "grad_rerun_max_abs_diff": grads_max_abs_diff(grads_no_skip, grads_rerun),
            "loss_rerun_abs_diff": abs(rerun["loss"] - no_skip["loss"]),
            "ratio_max_abs_dev_from_1_skip": skip["ratio_max_abs_dev_from_1"],
            "ratio_max_abs_dev_from_1_no_skip": no_skip["ratio_max_abs_dev_from_1"],
        },
        "timing": {
            "old_log_prob_seconds": seconds["old_log_prob"],
            "old_log_prob_skipped_seconds": seconds["old_log_prob_skipped"],
            "skipped_over_unskipped": seconds["old_log_prob_skipped"] / seconds["old_log_prob"],
            "update_seconds_skip": seconds["update_skip"],
            "update_seconds_no_skip": seconds["update_no_skip"],
            "old_log_prob_peak_device_gib": timer.peak_device_gib["old_log_prob"],
            "update_peak_device_gib": timer.peak_device_gib["update_skip"],
            "timing_repeats": cfg.timing_repeats,
        },
        "phases": timer.as_dict(),
    }


def run(cfg: Config) -> dict[str, Any]:
    """Measure in a fresh process, then add the guard's verdicts (pure config logic, no verl needed)."""
    from rlkit import determinism, onpolicy
    from rlkit.launch import run_module
    from rlkit.params import as_dict

    module = __name__ if __name__ != "__main__" else "rlkit.experiments.skip_old_logprob"
    metrics = run_module(module, as_dict(cfg), env=determinism.child_env(cfg.deterministic))
    metrics["guard"] = onpolicy.guard_examples()
    metrics["overrides"] = onpolicy.onpolicy_overrides(onpolicy.reference_config())
    metrics["metrics_with_skip"] = onpolicy.METRICS_WITH_SKIP
    return metrics


def main(argv=None) -> int:
    from rlkit.experiments import experiment_main

    return experiment_main(Config, run, NOTEBOOK, argv)


if __name__ == "__main__":
    if "--config" in sys.argv:  # launched by rlkit.launch.run_module
        from rlkit.launch import child_main

        child_main(measure)
    else:
        sys.exit(main())
