"""The bottom layer: strict parameters, results folders and their JSON, where results come from, the phase colours. Imports no other rlkit package."""
