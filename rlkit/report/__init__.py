"""The generated blocks of README.md and docs/*.md (sections), assembled from each experiment's metrics: python -m rlkit.report --write."""
