"""Probe: Git Re-Basin weight matching with the PyPI package ``rebasin`` (0.0.47).

Run from the repository root (needs ``pip install rebasin``; not a wsym dependency)::

    .venv/bin/python benchmarks/rebasin_probe.py [--repeats 5] [--width 64] [--threads 1]

1. Aligns two randomly initialized ``MLP(40, [w, w], 10)`` with
   ``rebasin.PermutationCoordinateDescent`` and prints the L2 distance between
   the weights before and after, the wall time (median over repeats), and the
   largest output change of the permuted model (must be round-off).
   For scale it also runs a plain weight-matching reference (coordinate descent
   over ``scipy.optimize.linear_sum_assignment``, as in Ainsworth et al. 2023).
2. Aligns two ``ResidualCNN`` with BatchNorm in evaluation mode and reports
   the output change: rebasin permutes BatchNorm ``weight``/``bias`` but not
   ``running_mean``/``running_var``, so the function changes unless those
   buffers are permuted too (shown) or recomputed from data.

Findings on rebasin 0.0.47: its cost matrix is
``2 * incoming + outgoing`` weight correlations (``permutation_to_info`` lists
each parameter several times), 1-D parameters (biases, BatchNorm weight/bias)
add only a constant to it, and residual-stream channels are left unpermuted,
so it does not minimize the L2 distance that weight matching targets.

rebasin API used (all in place on ``model_b``; ``model_a`` is left untouched)::

    pcd = PermutationCoordinateDescent(model_a, model_b, input_data_b)  # traces with torchview
    pcd.rebasin(max_iterations=100)   # calculate_permutations() + apply_permutations()
    model_b.state_dict()              # the permuted weights
    for perm, infos in pcd.pinit.model_graph.permutation_to_info:
        perm.perm_indices             # new = old.index_select(info.axis, perm_indices)
"""

from __future__ import annotations

import argparse
import copy
import statistics
import warnings
from time import perf_counter

import torch
from scipy.optimize import linear_sum_assignment
from torch import nn

from wsym.reference import MLP, ResidualCNN

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from rebasin import PermutationCoordinateDescent


def l2(sd_a: dict, sd_b: dict) -> float:
    """Euclidean distance over the floating-point entries of two state dicts."""
    keys = [k for k, v in sd_a.items() if v.is_floating_point()]
    with torch.no_grad():
        return float(sum(((sd_a[k] - sd_b[k]) ** 2).sum() for k in keys) ** 0.5)


def rebasin_align(model_a: nn.Module, model_b: nn.Module, x: torch.Tensor) -> nn.Module:
    """``model_b`` permuted onto ``model_a`` by rebasin (a copy; inputs are untouched)."""
    model_b = copy.deepcopy(model_b)
    pcd = PermutationCoordinateDescent(model_a, model_b, x)
    pcd.rebasin(max_iterations=100)
    return model_b


def reference_align_mlp(sd_a: dict, sd_b: dict, iterations: int = 100) -> dict:
    """Weight matching for a Sequential MLP of Linear layers (keys ``{index}.weight``).

    ``perms[i][j]`` is the unit of b placed at position j of hidden layer i.
    """
    layers = sorted({int(k.split(".")[0]) for k in sd_a})
    perms = {i: torch.arange(sd_a[f"{i}.weight"].shape[0]) for i in layers[:-1]}

    def permuted(i, rows=True, cols=True):
        w, b = sd_b[f"{i}.weight"], sd_b[f"{i}.bias"]
        if rows and i in perms:
            w, b = w[perms[i]], b[perms[i]]
        prev = layers.index(i) - 1
        if cols and prev >= 0:
            w = w[:, perms[layers[prev]]]
        return w, b

    for _ in range(iterations):
        progress = False
        for pos in torch.randperm(len(perms)).tolist():
            i, nxt = layers[pos], layers[pos + 1]
            w_b, b_b = permuted(i, rows=False)
            w_next, _ = permuted(nxt, cols=False)
            cost = sd_a[f"{i}.weight"] @ w_b.T + torch.outer(sd_a[f"{i}.bias"], b_b)
            cost += sd_a[f"{nxt}.weight"].T @ w_next
            new = torch.as_tensor(linear_sum_assignment(cost.numpy(), maximize=True)[1])
            rows = torch.arange(len(new))
            progress |= bool(cost[rows, new].sum() > cost[rows, perms[i]].sum() + 1e-12)
            perms[i] = new
        if not progress:
            break
    out = {}
    for i in layers:
        out[f"{i}.weight"], out[f"{i}.bias"] = permuted(i)
    return out


def timed(fn, repeats: int):
    times, result = [], None
    for _ in range(repeats):
        start = perf_counter()
        result = fn()
        times.append(perf_counter() - start)
    return result, statistics.median(times)


def probe_mlp(width: int, repeats: int) -> None:
    torch.manual_seed(0)
    model_a, model_b = MLP(40, [width, width], 10), MLP(40, [width, width], 10)
    x = torch.randn(16, 40)
    sd_a, sd_b = model_a.state_dict(), model_b.state_dict()
    print(f"MLP(40, [{width}, {width}], 10), two random initializations")
    print(f"  L2 before                   {l2(sd_a, sd_b):.4f}")

    torch.manual_seed(0)  # rebasin visits permutations in torch.randperm order
    aligned, seconds = timed(lambda: rebasin_align(model_a, model_b, x), repeats)
    with torch.no_grad():
        change = float((aligned(x) - model_b(x)).abs().max())
    print(f"  L2 after rebasin            {l2(sd_a, aligned.state_dict()):.4f}")
    print(f"  rebasin wall time (median)  {seconds * 1e3:.1f} ms   output change {change:.1e}")

    torch.manual_seed(0)
    sd_ref, seconds = timed(lambda: reference_align_mlp(sd_a, sd_b), repeats)
    check = MLP(40, [width, width], 10)
    check.load_state_dict(sd_ref)
    with torch.no_grad():
        change = float((check(x) - model_b(x)).abs().max())
    print(f"  L2 after reference          {l2(sd_a, sd_ref):.4f}")
    print(f"  reference wall time         {seconds * 1e3:.1f} ms   output change {change:.1e}")


def randomize_batchnorm(model: nn.Module) -> None:
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, nn.BatchNorm2d):
                module.weight.uniform_(0.5, 2.0)
                module.bias.normal_()
                module.running_mean.normal_()
                module.running_var.uniform_(0.5, 2.0)


def probe_cnn() -> None:
    torch.manual_seed(0)
    model_a, model_b = ResidualCNN(channels=16), ResidualCNN(channels=16)
    for model in (model_a, model_b):
        randomize_batchnorm(model)
        model.eval()
    x = torch.randn(32, 1, 8, 8)
    start = perf_counter()
    model_b2 = copy.deepcopy(model_b)
    pcd = PermutationCoordinateDescent(model_a, model_b2, x)
    pcd.rebasin()
    seconds = perf_counter() - start
    sd, sd_b = model_b2.state_dict(), model_b.state_dict()
    changed = [k for k in sd if not torch.equal(sd[k], sd_b[k])]
    with torch.no_grad():
        change = float((model_b2(x) - model_b(x)).abs().max())
        scale = float(model_b(x).abs().max())
    print("ResidualCNN(channels=16), BatchNorm in eval mode")
    print(f"  rebasin wall time           {seconds * 1e3:.1f} ms")
    print(f"  entries rebasin changed     {', '.join(changed)}")
    params = [dict(m.named_parameters()) for m in (model_a, model_b, model_b2)]
    before, after = l2(params[0], params[1]), l2(params[0], params[2])
    print(f"  L2 of parameters before / after  {before:.3f} / {after:.3f}")
    print(f"  output change               {change:.1e} (outputs up to {scale:.2f})")

    # workaround: permute each BatchNorm's running statistics with its weight's permutation
    # (once per module: permutation_to_info lists each parameter several times)
    done = set()
    with torch.no_grad():
        for perm, infos in pcd.pinit.model_graph.permutation_to_info:
            for info in infos:
                module = info.module.module_b
                if isinstance(module, nn.BatchNorm2d) and id(module) not in done:
                    done.add(id(module))
                    module.running_mean.copy_(module.running_mean[perm.perm_indices])
                    module.running_var.copy_(module.running_var[perm.perm_indices])
        change = float((model_b2(x) - model_b(x)).abs().max())
    print(f"  ... with running stats permuted as well: output change {change:.1e}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--width", type=int, default=64)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: default)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}")
    probe_mlp(args.width, args.repeats)
    probe_cnn()


if __name__ == "__main__":
    main()
