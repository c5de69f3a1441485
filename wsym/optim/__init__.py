"""Geometry-aware optimizers: the SAM family, geodesic SAM and LLQR+SAM.

All wrap a base optimizer and take a closure (zero grads, loss, backward, return loss):

* :class:`SAM`, :class:`ASAM`, :class:`FisherSAM` -- :mod:`wsym.optim.sam`;
* :class:`GeoSAM` -- perturbation along the quotient geometry, :mod:`wsym.optim.geosam`;
* :class:`LLQRSAM` -- preconditioned perturbation and update, :mod:`wsym.optim.llqr`,
  with the preconditioners of :mod:`wsym.optim.precondition`.

The two-pass step lives in :class:`~wsym.optim.base.SharpnessAware`.
"""

from wsym.optim.base import SharpnessAware
from wsym.optim.geosam import GeoSAM
from wsym.optim.llqr import LLQRSAM
from wsym.optim.precondition import DiagonalFisher, FixedDiagonal, KroneckerFisher, Preconditioner
from wsym.optim.sam import ASAM, SAM, FisherSAM

__all__ = [
    "ASAM",
    "LLQRSAM",
    "SAM",
    "DiagonalFisher",
    "FisherSAM",
    "FixedDiagonal",
    "GeoSAM",
    "KroneckerFisher",
    "Preconditioner",
    "SharpnessAware",
]
