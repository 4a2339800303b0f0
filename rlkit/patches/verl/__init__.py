"""Patches to verl 0.9.1: the on-policy old-log-prob skip, master-on-host wiring, metric-only entropy, replay polling, selective checkpointing."""
