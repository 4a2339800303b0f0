"""Measurement aids that change no computation: the emulated smaller card, the rank-identity check, the cast counter."""
