"""Patches to PyTorch FSDP1: offload views, NO_SHARD for an (N,1) mesh, the fp32 master on host and the cast-once bf16 copy."""
