"""Geometry-aware optimizers: the SAM family, geodesic SAM, LLQR and LLQR+SAM.

All wrap a base optimizer and take a closure (zero grads, loss, backward, return loss):

* :class:`SAM`, :class:`ASAM`, :class:`FisherSAM` -- :mod:`wsym.optim.sam`;
* :class:`GeoSAM` -- perturbation along the quotient geometry, :mod:`wsym.optim.geosam`;
* :class:`LLQR` (one gradient per step) and :class:`LLQRSAM` -- steps preconditioned
  by a structured :math:`U` learned from the LQR objective (:mod:`wsym.optim.learned`,
  :mod:`wsym.optim.lqr`, :mod:`wsym.optim.structures`) or estimated from the Fisher
  (:mod:`wsym.optim.precondition`), :mod:`wsym.optim.llqr`.

The two-pass step lives in :class:`~wsym.optim.base.SharpnessAware`;
:func:`~wsym.optim.transport.transport_state` moves an optimizer's state along a group
element (teleportation); :class:`~wsym.optim.plateau.Plateau` is the stopping rule
"train to the plateau" of the benchmarks.
"""

from wsym.optim.base import SharpnessAware
from wsym.optim.geosam import GeoSAM
from wsym.optim.learned import LQRPreconditioner
from wsym.optim.llqr import LLQR, LLQRSAM
from wsym.optim.plateau import Plateau
from wsym.optim.precondition import DiagonalFisher, FixedDiagonal, KroneckerFisher, Preconditioner
from wsym.optim.sam import ASAM, SAM, FisherSAM

__all__ = [
    "ASAM",
    "LLQR",
    "LLQRSAM",
    "SAM",
    "DiagonalFisher",
    "FisherSAM",
    "FixedDiagonal",
    "GeoSAM",
    "KroneckerFisher",
    "LQRPreconditioner",
    "Plateau",
    "Preconditioner",
    "SharpnessAware",
]
