"""Alignment: move one checkpoint onto another's basis, modulo the detected symmetries.

Both state dicts are first canonicalized in every group but permutations
(scales balanced, GL blocks factored, signs and column signs fixed), so that
matching compares like with like. Permutations are then matched

* by **weights**: coordinate descent over all permutation classes at once
  (Git Re-Basin's weight matching): each class solves a linear assignment
  between the units' slices in every tensor the class touches, with the other
  classes' current permutations applied, until no class moves;
* by **activations**: per class, the correlation of its units' activations at a
  traced site over a few batches, solved by linear assignment; classes without
  a site fall back to weight matching.

Heads are units of their permutation class, so they are matched as blocks; a
residual-stream permutation moves every tensor of the stream. GL/orthogonal
blocks (query/key, value/output per head), balanced by canonicalization, are
then rotated onto the reference's by orthogonal Procrustes. The result is
expressed in the reference's own basis (its canonicalization is undone).
"""

from __future__ import annotations

import random

import torch
from scipy.optimize import linear_sum_assignment

from wsym.act import GroupElement, act
from wsym.canon import canonical_element
from wsym.errors import WsymInputError
from wsym.spec import SymmetrySpec
from wsym.units import block_classes, block_matrices, odd_rows, unit_matrix

# Canonicalized before matching. Sign conventions read off two different networks need
# not agree unit by unit, so weight matching also matches signs (signed units).
NO_PERMUTATION = ("norm_scaling", "scaling", "gl", "orthogonal", "translation", "sign")


def align(
    sd_ref: dict,
    sd_other: dict,
    spec: SymmetrySpec,
    method: str = "weights",
    *,
    model: torch.nn.Module | None = None,
    batches=None,
    max_iter: int = 100,
    seed: int = 0,
) -> dict:
    """``sd_other`` moved onto ``sd_ref``'s basis (same function as ``sd_other``).

    Args:
        sd_ref: the reference state dict (of the architecture ``spec`` describes).
        sd_other: the state dict to move.
        spec: the :class:`~wsym.spec.SymmetrySpec`.
        method: ``"weights"`` or ``"activations"`` (needs ``model`` and ``batches``).
        model: the module (activation matching runs it at both state dicts).
        batches: iterable of ``(inputs, targets)``; only the inputs are used.
        max_iter: sweeps of weight matching.
        seed: order of the classes in weight matching.

    Example:
        >>> import torch, wsym
        >>> mlp = torch.nn.Sequential(torch.nn.Linear(3, 6), torch.nn.ReLU(), torch.nn.Linear(6, 2))
        >>> spec = wsym.detect(mlp, torch.randn(2, 3))
        >>> sd = {k: v.double() for k, v in mlp.state_dict().items()}
        >>> moved = spec.act(spec.sample(seed=4), sd)
        >>> back = wsym.align(sd, moved, spec)
        >>> max(float((back[k] - sd[k]).abs().max()) for k in sd) < 1e-9
        True
    """
    check_same_architecture(spec, sd_ref, sd_other)
    ref, g_ref = canonical_element(sd_ref, spec, kinds=NO_PERMUTATION)
    other, _ = canonical_element(sd_other, spec, kinds=NO_PERMUTATION)
    if method == "weights":
        perms = weight_matching(spec, ref, other, max_iter=max_iter, seed=seed)
    elif method == "activations":
        if model is None or batches is None:
            raise WsymInputError(
                "activation matching needs model= and batches=; or use method='weights'"
            )
        perms = activation_matching(spec, model, ref, other, batches)
        done = {i for i, _ in perms}
        rest = [i for i, g in enumerate(spec.groups) if g.kind == "permutation" and i not in done]
        other = act(spec, GroupElement(tuple(perms)), other)
        perms = weight_matching(spec, ref, other, max_iter=max_iter, seed=seed, groups=rest)
    else:
        raise WsymInputError(f"unknown alignment method {method!r}; use 'weights' or 'activations'")
    aligned = act(spec, GroupElement(tuple(perms)), other)
    aligned = act(spec, GroupElement(tuple(procrustes(spec, ref, aligned))), aligned)
    back = act(spec, g_ref.inverse(), aligned)
    return {k: v.to(sd_other[k].dtype) if k in sd_other else v for k, v in back.items()}


def check_same_architecture(spec: SymmetrySpec, *state_dicts: dict) -> None:
    """One-line errors for state dicts that do not fit ``spec`` or hold NaNs."""
    different = "checkpoints of different architectures?"
    for key, dims in spec.layouts:
        shape = tuple(t.size for t in dims)
        for i, sd in enumerate(state_dicts):
            if key not in sd:
                raise WsymInputError(f"checkpoint {i + 1} has no tensor {key!r}: {different}")
            if tuple(sd[key].shape) != shape:
                got = tuple(sd[key].shape)
                raise WsymInputError(
                    f"{key} has shape {got} in checkpoint {i + 1}, not {shape}: {different}"
                )
            if sd[key].is_floating_point() and not torch.isfinite(sd[key]).all():
                raise WsymInputError(f"{key} holds NaN or infinite values in checkpoint {i + 1}")


def weight_matching(
    spec: SymmetrySpec, ref: dict, other: dict, *, max_iter: int = 100, seed: int = 0, groups=None
) -> list[tuple[int, torch.Tensor]]:
    """Permutation (and sign) components that move ``other`` closest to ``ref``.

    Coordinate descent over the permutation classes. Where a sign group acts on
    the class, units are matched as signed units: pairing ``i`` with ``j`` scores
    ``C_even[i, j] + |C_odd[i, j]|`` (the entries a flip negates counted in
    absolute value), and the matched unit takes the sign of ``C_odd[i, j]``.

    A class whose cost matrix cannot have changed since it was last solved (no
    class it shares a tensor block with has moved since, itself included where
    a block holds its axis twice) is not solved again: its assignment would be
    the identity. The reference's unit matrices are
    built once.
    """
    if groups is None:
        groups = [i for i, g in enumerate(spec.groups) if g.kind == "permutation"]
    signs = {g.cls: i for i, g in enumerate(spec.groups) if g.kind == "sign"}
    groups = list(groups)
    coupled = {i: block_classes(spec, spec.groups[i], itself=True) for i in groups}
    ref_units: dict[int, tuple] = {}
    moved_at: dict[int, int] = {}  # class -> step at which it last moved
    solved_at: dict[int, int] = {}  # group -> step at which it was last solved
    rng = random.Random(seed)
    comps: list = []
    current = other
    clock = 0
    for _ in range(max_iter):
        changed = False
        order = groups[:]
        rng.shuffle(order)
        for i in order:
            if i in solved_at and all(moved_at.get(c, -1) < solved_at[i] for c in coupled[i]):
                continue
            clock += 1
            solved_at[i] = clock
            sign = signs.get(spec.groups[i].cls)
            if i not in ref_units:
                ref_units[i] = _units(spec, ref, i, sign)
            step = _match_class(spec, ref_units[i], current, i, sign)
            if step:
                current = act(spec, GroupElement(tuple(step)), current)
                comps.extend(step)
                moved_at[spec.groups[i].cls] = clock
                changed = True
        if not changed:
            break
    return comps


def _units(spec: SymmetrySpec, sd: dict, i: int, sign: int | None) -> tuple:
    """Class ``i``'s unit matrix and, with a sign group, its odd rows."""
    full = unit_matrix(spec, sd, spec.groups[i].cls)
    return full, (None if sign is None else odd_rows(spec, sd, spec.groups[sign]))


def _match_class(spec: SymmetrySpec, ref_units: tuple, current: dict, i: int, sign) -> list:
    """The components (permutation, then sign) that improve class ``i``'s match, if any."""
    ref_full, ref_odd = ref_units
    cur_full, cur_odd = _units(spec, current, i, sign)
    full = ref_full @ cur_full.T
    odd = None if sign is None else ref_odd @ cur_odd.T
    score = full if odd is None else full - odd + odd.abs()
    _, col = linear_sum_assignment(score.numpy(), maximize=True)
    perm = torch.as_tensor(col)
    rows = torch.arange(len(perm))
    gain = float(score[rows, perm].sum() - full.trace())
    if gain <= 1e-12 * max(1.0, float(full.trace().abs())):
        return []
    step = [(i, perm)] if (perm != rows).any() else []
    if odd is not None:
        flips = torch.where(odd[rows, perm] < 0, -1.0, 1.0).to(torch.float64)
        if (flips < 0).any():
            step.append((sign, flips))
    return step


def procrustes(spec: SymmetrySpec, ref: dict, other: dict) -> list[tuple[int, torch.Tensor]]:
    """Per GL/orthogonal group, the rotation of ``other``'s blocks closest to ``ref``'s.

    Canonicalization leaves each GL block balanced (``G^T G = H^T H``); what is
    left of the group is ``O(h)``, and its canonical representative (singular
    vectors with a sign rule) is arbitrary as a match between two different
    networks. Per index (head), ``R = U V^T`` from the SVD ``U S V^T`` of
    ``sum_blocks X_other^T X_ref`` (orthogonal Procrustes; Kabsch's determinant
    fix for special orthogonal groups) maximizes ``sum tr(R^T X_other^T X_ref)``
    over rotations, both factors moving together (``x R`` and ``x R^-T = x R``).
    Identical blocks give ``R = I``, so exact recovery is kept.
    """
    comps = []
    for i, g in enumerate(spec.groups):
        if g.kind not in ("gl", "orthogonal"):
            continue
        mats_ref, mats_other = block_matrices(spec, ref, g), block_matrices(spec, other, g)
        if not mats_ref:
            continue
        cross = sum(mats_other[k].transpose(-1, -2) @ mats_ref[k] for k in mats_ref)
        u, _, vh = torch.linalg.svd(cross)
        if g.special:
            det = torch.linalg.det(u @ vh).sign()
            u = u.clone()
            u[..., :, -1] = u[..., :, -1] * det.unsqueeze(-1)
        rot = u @ vh
        eye = torch.eye(g.size, dtype=rot.dtype)
        if float((rot - eye).abs().max()) > 1e-12:
            comps.append((i, rot))
    return comps


def activation_matching(spec: SymmetrySpec, model, ref: dict, other: dict, batches) -> list:
    """Per class with a traced site, the permutation maximizing activation correlation."""
    from wsym.activations import site_activations

    sites = {c: (node, d) for c, node, d in spec.sites}
    groups = {i: g for i, g in enumerate(spec.groups) if g.kind == "permutation" and g.cls in sites}
    if not groups:
        return []
    wanted = {sites[g.cls] for g in groups.values()}
    acts_ref = site_activations(model, ref, batches, wanted)
    acts_other = site_activations(model, other, batches, wanted)
    comps = []
    for i, g in groups.items():
        a, b = acts_ref[sites[g.cls]], acts_other[sites[g.cls]]
        corr = _standardize(a).T @ _standardize(b) / a.shape[0]
        _, col = linear_sum_assignment(corr.numpy(), maximize=True)
        perm = torch.as_tensor(col)
        if (perm != torch.arange(len(perm))).any():
            comps.append((i, perm))
    return comps


def _standardize(x: torch.Tensor) -> torch.Tensor:
    x = x - x.mean(0)
    return x / x.std(0).clamp_min(1e-12)
