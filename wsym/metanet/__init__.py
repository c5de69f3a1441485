"""Equivariant meta-networks: predict a network's generalization from its weights.

* :mod:`~wsym.metanet.graph` -- weights as torch-geometric graphs, derived from the spec;
* :mod:`~wsym.metanet.universal` -- the same graphs with role features shared by every architecture;
* :mod:`~wsym.metanet.invariant` -- continuous groups and signs removed by canonical forms;
* :mod:`~wsym.metanet.statistics` -- invariant per-tensor statistics, the ensemble branch;
* :mod:`~wsym.metanet.trees` -- gradient-boosted trees as a torch module (optional in that branch);
* :mod:`~wsym.metanet.layers` -- message passing with edge updates;
* :mod:`~wsym.metanet.fit` / :mod:`~wsym.metanet.predictor` -- training, prediction, files;
* :mod:`~wsym.metanet.park` / :mod:`~wsym.metanet.park_fit` -- one network for mixed architectures;
* :mod:`~wsym.metanet.baselines` -- StatNN, flat MLP, NFN, sharpness predictors;
  :mod:`~wsym.metanet.park_baselines` -- their counterparts on mixed zoos.
"""

import warnings

with warnings.catch_warnings():  # torch-geometric calls the deprecated torch.jit.script on import
    warnings.filterwarnings("ignore", message=".*torch.jit.script.*", category=FutureWarning)
    import torch_geometric  # noqa: F401

from wsym.metanet.fit import FitConfig, fit
from wsym.metanet.graph import GraphSchema, batch_graphs
from wsym.metanet.invariant import invariant_form
from wsym.metanet.loading import load
from wsym.metanet.metrics import kendall_tau, r2
from wsym.metanet.park import ParkPredictor
from wsym.metanet.park_fit import fit_park
from wsym.metanet.predictor import Predictor

__all__ = [
    "FitConfig",
    "GraphSchema",
    "ParkPredictor",
    "Predictor",
    "batch_graphs",
    "fit",
    "fit_park",
    "invariant_form",
    "kendall_tau",
    "load",
    "r2",
]
