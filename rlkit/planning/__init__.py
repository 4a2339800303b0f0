"""Estimates before a GPU is booked: the phase-budget planner, each phase's roofline, multi-node terms, vLLM's measured terms and the pre-flight lint of a verl config."""
