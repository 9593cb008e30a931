"""Differential fuzzing of the compiled extensions against their pure twins (fuzz.py)."""
