"""Robustness grid: every wsym.optim optimizer trains three digits models at its grid's best lr.

The cells are those of ``benchmarks/optimizers.py --grid`` (the table in
``benchmarks/optimizers_results.md``): SGD- and Adam-based, a learning-rate grid of four
values spanning 30x, and the loss on 256 training images after the run below 0.7x its
start at the grid's best value.
"""

import importlib.util
from pathlib import Path

import pytest
import torch

_PATH = Path(__file__).parents[1] / "benchmarks" / "optimizers.py"
_SPEC = importlib.util.spec_from_file_location("benchmark_optimizers", _PATH)
bench = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(bench)


# the grid's largest learning rates kill units, where GeoSAM's balancing says it stops early
@pytest.mark.filterwarnings(
    "ignore:the balancing of the diagonal groups:wsym.errors.SymmetryWarning"
)
@pytest.mark.parametrize("base", list(bench.GRID_BASES))
@pytest.mark.parametrize("name", bench.GRID_OPTIMIZERS)
@pytest.mark.parametrize("task", bench.GRID_TASKS)
def test_optimizer_trains_at_best_learning_rate_of_grid(task, name, base):
    lrs = bench.GRID_BASES[base]
    assert len(lrs) >= 4 and max(lrs) / min(lrs) >= 30
    torch.set_num_threads(1)
    ratios = bench.grid_cell(task, name, base)
    assert min(ratios) < 0.7, dict(zip(lrs, ratios, strict=True))
