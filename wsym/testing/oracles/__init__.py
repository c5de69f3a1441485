"""Slow, obvious float64 references that the fast paths are tested against."""
