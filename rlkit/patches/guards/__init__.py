"""Checks that refuse a wrong run: the checkpoint fingerprint (a resume must match the optimizer and patches that saved it)."""
