"""Testing helpers (public API): invariance and sensitivity of functions of the weights.

A function ``fn(state_dict) -> Tensor | float`` is *invariant* under a spec when
``fn(act(g, sd)) == fn(sd)`` for every group element ``g``; it is *sensitive*
when it still tells apart weights that are not on one orbit -- in particular a
permutation applied to one tensor only (breaking the coupling) must change it
(cf. nfn's ``test_sensitivity_uncoupled``). A function can pass the first test
trivially (a constant); the second catches that.

Example:
    >>> import torch, wsym
    >>> _ = torch.manual_seed(0)
    >>> mlp = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))
    >>> spec = wsym.detect(mlp, torch.randn(2, 3))
    >>> sd = {k: v.double() for k, v in mlp.state_dict().items()}
    >>> x = torch.randn(16, 3, dtype=torch.float64)  # fixed inputs that reach every unit
    >>> def fn(s):  # the function itself at fixed inputs: invariant and sensitive
    ...     return torch.func.functional_call(mlp, s, (x,))
    >>> assert_invariant(fn, spec, sd) < 1e-10
    True
    >>> assert_sensitive(fn, spec, sd) > 1e-3
    True
"""

from __future__ import annotations

import torch

from wsym.group.kinds import kind_of
from wsym.group.layout import transform
from wsym.group.spec import SymmetrySpec


def _relative(a, b) -> float:
    a = torch.as_tensor(a, dtype=torch.float64)
    b = torch.as_tensor(b, dtype=torch.float64)
    return float((a - b).abs().max() / a.abs().max().clamp(min=1e-30))


def invariance_error(
    fn, spec: SymmetrySpec, state_dict: dict, *, seeds=(0, 1, 2), scale=(1e-2, 1e2), kinds=None
) -> float:
    """Largest relative change ``|fn(g.sd) - fn(sd)| / |fn(sd)|`` over one random ``g`` per seed."""
    ref = fn(state_dict)
    worst = 0.0
    for seed in seeds:
        g = spec.sample(seed=seed, scale=scale, kinds=kinds)
        worst = max(worst, _relative(ref, fn(spec.act(g, state_dict))))
    return worst


def assert_invariant(
    fn,
    spec: SymmetrySpec,
    state_dict: dict,
    *,
    tol: float = 1e-5,
    seeds=(0, 1, 2),
    scale=(1e-2, 1e2),
    kinds=None,
) -> float:
    """Assert ``fn`` is invariant under random elements of ``spec``'s group; return the change.

    Args:
        fn: ``state_dict -> Tensor | float``.
        spec: the symmetry spec to act with.
        state_dict: the point to test at (float64 recommended).
        tol: largest relative change allowed.
        seeds: one random element per seed.
        scale: range of the continuous parts (log-uniform), as in :meth:`SymmetrySpec.sample`.
        kinds: only these group kinds (default: all).
    """
    err = invariance_error(fn, spec, state_dict, seeds=seeds, scale=scale, kinds=kinds)
    if not err < tol:
        raise AssertionError(f"not invariant: relative change {err:.2e} >= tol {tol:.1e}")
    return err


def uncoupled_permutation(spec: SymmetrySpec, state_dict: dict, group: int, seed: int = 0) -> dict:
    """``state_dict`` with permutation group ``group`` applied to its first tensor only."""
    g = spec.groups[group]
    name = g.params[0]
    perm = torch.randperm(g.size, generator=torch.Generator().manual_seed(seed))
    while g.size > 1 and bool((perm == torch.arange(g.size)).all()):
        perm = perm.roll(1)
    layout = spec.layout[name]

    def fn(block, lv):
        for ax, leaf in enumerate(lv):
            if leaf.cls == g.cls:
                return block.index_select(ax, perm)
        return block

    out = dict(state_dict)
    out[name] = transform(state_dict[name], list(layout), fn)
    return out


def perturbed(state_dict: dict, scale: float, seed: int = 0) -> dict:
    """Every floating tensor plus Gaussian noise of ``scale`` times its mean magnitude.

    Example:
        >>> sd = {"w": torch.ones(3), "n": torch.tensor(2)}
        >>> out = perturbed(sd, 0.1)
        >>> bool((out["w"] - 1).abs().max() > 0), int(out["n"])
        (True, 2)
    """
    gen = torch.Generator().manual_seed(seed)
    return {
        k: v + scale * v.abs().mean() * torch.randn(v.shape, generator=gen, dtype=v.dtype)
        if v.is_floating_point()
        else v
        for k, v in state_dict.items()
    }


def assert_sensitive(
    fn, spec: SymmetrySpec, state_dict: dict, *, min_change: float = 1e-3, seed: int = 0
) -> float:
    """Assert ``fn`` changes when a permutation breaks its coupling; return the smallest change.

    Every permutation group with more than one unit is applied to one of its
    tensors only; each such change must move ``fn`` by at least ``min_change``
    (relative). Without permutation groups, a 10% random perturbation of every
    floating tensor must.
    """
    ref = fn(state_dict)
    changes = []
    for i, g in enumerate(spec.groups):
        if kind_of(g).permutes and g.size > 1:
            changes.append(_relative(ref, fn(uncoupled_permutation(spec, state_dict, i, seed))))
    if not changes:
        changes.append(_relative(ref, fn(perturbed(state_dict, 0.1, seed))))
    least = min(changes)
    if not least >= min_change:
        raise AssertionError(f"too symmetric: relative change {least:.2e} < {min_change:.1e}")
    return least
