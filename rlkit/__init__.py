"""rlkit: GRPO post-training with verl + vLLM on academic GPUs, without changing training dynamics."""

__version__ = "0.1.0"
