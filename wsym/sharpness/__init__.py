"""Sharpness modulo symmetries: the quotient geometry, the measures, curvature.

* :mod:`wsym.sharpness.measures` -- :func:`sharpness`, the entry point (worst- and
  average-case adaptive, geodesic, Euclidean; curvature measures);
* :mod:`wsym.sharpness.quotient`, :mod:`~wsym.sharpness.vertical`,
  :mod:`~wsym.sharpness.schur`, :mod:`~wsym.sharpness.gauge` -- the quotient by the whole
  continuous group;
* :mod:`wsym.sharpness.geometry` -- metrics, horizontal projections, geodesics of GL blocks;
* :mod:`wsym.sharpness.curvature` -- Hessian and Fisher estimators.
"""

from wsym.sharpness.measures import MEASURES, Estimate, average_case, sharpness, worst_case

__all__ = ["MEASURES", "Estimate", "average_case", "sharpness", "worst_case"]
