"""Patches that swap a model's kernels: chunked log-probs, varlen attention, compiled RMSNorm and pointwise ops."""
