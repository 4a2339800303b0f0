"""Measuring on the machine: memory samplers and phase timers, the process's environment report, torch profiler summaries, determinism and the fresh-process launcher."""
