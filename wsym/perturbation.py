"""Moved to :mod:`wsym.sharpness.perturbation`; this shim re-exports."""

from wsym.sharpness.perturbation import (
    EPS,
    Adaptive,
    Euclidean,
    Geodesic,
    Perturbation,
    Tangent,
)

__all__ = ["EPS", "Adaptive", "Euclidean", "Geodesic", "Perturbation", "Tangent"]
