"""Judging runs against each other: learning curves and like-for-like comparisons of notebook 05's runs."""
