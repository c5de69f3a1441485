"""Weight matching: coordinate descent over permutation classes and GL/orthogonal rotations.

Two checkpoints ``ref`` and ``other`` (both canonicalized in their continuous
groups) are brought together by maximizing ``sum_k <ref_k, g . other_k>`` over
the permutations, signs and rotations ``g`` that the spec detected
(Git Re-Basin's weight matching, generalized). One coordinate is one
permutation class, solved by a linear assignment over its units with every
other coordinate held fixed; what else acts on the class is maximized *inside*
the pairing score, so that the score of pairing unit ``i`` with unit ``j`` is
the best over what is left free:

* **signs**: each sign group ``s`` acting on the class negates a set of entries
  ``odd_s``; pairing ``i`` with ``j`` scores
  ``C[i, j] - sum_s C_s[i, j] + sum_s |C_s[i, j]|`` (``C_s`` the correlation of
  the negated entries), and the matched unit takes the sign of ``C_s[i, j]``
  for each group separately (a transformer's residual stream has one sign group
  per LayerNorm; entries that several of them negate are left to the plain score);
* **GL/orthogonal blocks** indexed by the class (a head's query/key and
  value/output blocks): after balancing, what is left of ``GL(h)`` is ``O(h)``,
  and the best rotation of head ``j``'s blocks onto head ``i``'s scores the
  nuclear norm ``||X_j^T X_i||_*`` (orthogonal Procrustes) instead of the
  frame-dependent ``tr(X_j^T X_i)``. Heads are thus matched on a GL-invariant
  quantity.

After every sweep over the classes the rotations themselves are solved
(:func:`procrustes`), so that classes that read a rotated block (the residual
stream reads every head's query, key and value rows) compare like with like,
and so are the sign groups of classes that no permutation acts on
(:func:`lone_signs`: per unit, the combination of the class's signs whose negated
entries overlap most with the reference's). The sweeps stop when no class, sign and
rotation moves.

A permutation group with one copy per index value (one ``S_n`` per expert of a
mixture of experts) is matched per copy: its pairing scores are ``(*index, n, n)``,
one assignment per copy, in the current basis of the index classes. The experts'
own permutation is a class of its own, and the permutations inside the experts
are maximized inside its pairing score: pairing expert ``i`` with expert ``j``
scores what the best assignment of ``j``'s units onto ``i``'s gains (one assignment
per pair of experts, up to :data:`INNER_ENTRIES` scores in all), so that experts are
paired whatever order their units are in.
"""

from __future__ import annotations

import itertools
import random
from dataclasses import dataclass

import torch

from wsym.align.assignment import assignment
from wsym.align.precision import round_off
from wsym.group.elements import GroupElement, act
from wsym.group.kinds import kind_of
from wsym.group.spec import SymmetrySpec
from wsym.group.units import (
    ClassRows,
    block_classes,
    block_matrices,
    odd_patterns,
    own_odd_rows,
    unit_matrix,
)

ROTATION_TOL = 1e-9  # a rotation closer than this to the identity does not count as a move
# Per-copy permutations inside an index class (an expert's units) are maximized inside that
# class's pairing score (m^2 assignments of n units for m experts) where the m^2 n^2 scores
# are at most this many (8 experts of 2048 units); above, the experts are paired on their
# units in the current order.
INNER_ENTRIES = 2**28


@dataclass(frozen=True)
class ClassPlan:
    """What acts on permutation group ``group``'s class besides the permutation.

    Attributes:
        group: index of the permutation group.
        signs: sign groups on the same class.
        blocks: GL/orthogonal groups whose only index is the class (heads).
        coupled: classes that share a parameter block with it (its cost depends on them).
        fixed: the permutation is held (only the signs are matched).
        incremental: another permutation class (or itself, twice in a block) shares a
            block with it: between its solves a few columns of its unit matrix move,
            so the matrix is kept to update the pairing score (:func:`plain_score`);
            otherwise the score is taken block by block (:class:`~wsym.group.units.ClassRows`)
            and nothing is kept. A group with one copy per index value shares its
            blocks with its index classes: its unit matrix is ``(*index, n, features)``.
        inner: plans of the permutation groups with one copy per unit of this class
            (an expert's hidden units, this class the experts), maximized inside its
            pairing score (:func:`inner_gain`).
    """

    group: int
    signs: tuple[int, ...]
    blocks: tuple[int, ...]
    coupled: frozenset[int]
    fixed: bool = False
    incremental: bool = True
    inner: tuple[ClassPlan, ...] = ()


def plans(spec: SymmetrySpec, groups=None, fixed=()) -> list[ClassPlan]:
    """One :class:`ClassPlan` per permutation group (all, or those in ``groups``)."""
    permuted = {g.cls for g in spec.groups if kind_of(g).permutes}
    if groups is None:
        groups = [i for i, g in enumerate(spec.groups) if kind_of(g).permutes]
    out = []
    for i in groups:
        cls = spec.groups[i].cls
        signs = tuple(j for j, g in enumerate(spec.groups) if kind_of(g).flips and g.cls == cls)
        blocks = tuple(
            j for j, g in enumerate(spec.groups) if kind_of(g).matrix and g.index == (cls,)
        )
        coupled = frozenset(block_classes(spec, spec.groups[i], itself=True))
        incremental = bool(coupled & permuted)
        inner = tuple(
            plans(spec, [j])[0]
            for j, g in enumerate(spec.groups)
            if kind_of(g).permutes
            and g.index == (cls,)
            and (spec.groups[i].size * g.size) ** 2 <= INNER_ENTRIES
        )
        out.append(ClassPlan(i, signs, blocks, coupled, i in fixed, incremental, inner))
    return out


def class_units(spec: SymmetrySpec, sd: dict, plan: ClassPlan) -> tuple:
    """``(unit rows, [odd rows per sign group], [block matrices per GL group], [inner units])``.

    The unit rows are :func:`~wsym.group.units.unit_matrix` for an
    :attr:`ClassPlan.incremental` class, else a :class:`~wsym.group.units.ClassRows`
    that reads ``sd`` block by block when the score is taken.
    """
    group = spec.groups[plan.group]
    if plan.incremental:
        full = unit_matrix(spec, sd, group.cls, group=group)
    else:
        full = ClassRows(spec, sd, group.cls)
    odds = [own_odd_rows(spec, sd, s, plan.signs) for s in plan.signs]
    blocks = [block_matrices(spec, sd, spec.groups[b]) for b in plan.blocks]
    return full, odds, blocks, [class_units(spec, sd, p) for p in plan.inner]


def pairing_score(
    spec: SymmetrySpec, plan: ClassPlan, ref_units: tuple, cur_units: tuple, previous=None
):
    """``(score, plain, odd correlations)``: the ``(n, n)`` pairing scores of a class.

    ``(*index, n, n)``, one per copy, for a group with index classes.

    ``plain = R C^T`` is the score with nothing else free; ``score`` adds what
    the best sign per sign group and the best rotation per GL block gain.
    ``previous``, a ``(C_old, R C_old^T)`` pair, lets ``plain`` be updated on
    the columns where ``C`` changed (see :func:`plain_score`).
    """
    ref_full, ref_odds, ref_blocks, ref_inner = ref_units
    cur_full, cur_odds, cur_blocks, cur_inner = cur_units
    plain = plain_score(ref_full, cur_full, previous)
    others = any(o is not None for o in ref_odds) or any(ref_blocks) or ref_inner
    score = plain.clone() if others else plain
    odds = []
    for r, c in zip(ref_odds, cur_odds, strict=True):
        odd = None if r is None else r @ c.transpose(-1, -2)
        odds.append(odd)
        if odd is not None:
            score += odd.abs() - odd
    for b, r, c in zip(plan.blocks, ref_blocks, cur_blocks, strict=True):
        if not r:
            continue
        # cross[i, j] = sum_parity X_j^T X_i: (n, n, h, h); its trace is already in plain.
        cross = sum(torch.einsum("irl,jrk->ijkl", r[p], c[p]) for p in r)
        sv = torch.linalg.svdvals(cross)
        best = sv.sum(-1)
        if spec.groups[b].special:  # Kabsch: a reflection is not allowed
            negative = torch.linalg.det(cross) < 0
            best = best - 2 * torch.where(negative, sv[..., -1], torch.zeros_like(best))
        score += best - torch.diagonal(cross, dim1=-2, dim2=-1).sum(-1)
    for inner, r, c in zip(plan.inner, ref_inner, cur_inner, strict=True):
        score += inner_gain(spec, inner, r, c)
    return score, plain, odds


def inner_gain(spec: SymmetrySpec, inner: ClassPlan, ref_units: tuple, cur_units: tuple):
    """``(m, m)``: per pair of index values, what the best per-copy assignment gains.

    ``inner`` is a permutation group with one copy per value of an index class of
    ``m`` values (an expert's units); entry ``[i, j]`` is the best assignment's
    score of copy ``j``'s units onto copy ``i``'s (signs maximized inside, as
    :func:`pairing_score` does) less the score of their current order, which the
    index class's plain score already holds.
    """
    m = ref_units[0].shape[0]
    gain = torch.zeros(m, m, dtype=ref_units[0].dtype)
    for i, j in itertools.product(range(m), repeat=2):
        score, plain, _ = pairing_score(spec, inner, _copy(ref_units, i), _copy(cur_units, j))
        best = score.gather(-1, assignment(score).unsqueeze(-1)).sum()
        gain[i, j] = best - plain.trace()
    return gain


def _copy(units: tuple, i: int) -> tuple:
    """Copy ``i`` of a per-copy group's :func:`class_units` (its rows and odd rows)."""
    full, odds, blocks, inner = units
    return full[i], [None if o is None else o[i] for o in odds], blocks, inner


def plain_score(ref: torch.Tensor, cur: torch.Tensor, previous=None) -> torch.Tensor:
    """``ref @ cur.T``, or its update from ``previous = (old, ref @ old.T)``.

    Coordinate descent changes a class's unit matrix only where another class
    moved (a few of its columns late in the descent), so
    ``ref @ cur.T = ref @ old.T + ref[:, J] @ (cur - old)[:, J].T`` over the
    columns ``J`` that differ costs ``|J| / features`` of the product. Past a
    quarter of the columns the product is formed anew.

    Shapes:
        ``ref``, ``cur``, ``old``: ``(n, features)``; returns ``(n, n)``. Per copy
        (``(*index, n, features)``) the product is formed anew.

    Example:
        >>> ref, old = torch.randn(2, 4, 6, dtype=torch.float64)
        >>> cur = old.clone(); cur[:, 2] = 1.0
        >>> torch.allclose(plain_score(ref, cur, (old, ref @ old.T)), ref @ cur.T)
        True
    """
    if isinstance(ref, ClassRows):
        return ref.product(cur)
    if cur.dim() > 2:
        return ref @ cur.transpose(-1, -2)
    if previous is not None and previous[0].shape == cur.shape:
        old, old_plain = previous
        changed = (cur != old).any(0).nonzero().squeeze(1)
        if len(changed) <= cur.shape[1] // 4:
            delta = cur.index_select(1, changed) - old.index_select(1, changed)
            return old_plain + ref.index_select(1, changed) @ delta.T
    return ref @ cur.T


def match_class(
    spec: SymmetrySpec, plan: ClassPlan, ref_units: tuple, current: dict, memo=None, warm=False
) -> list:
    """The components (permutation, then signs) that improve the class's match, if any.

    ``memo`` (a dict) keeps each class's unit matrix and plain score, in the
    basis after its own step, for the next call's update (:func:`plain_score`).
    ``warm``: the identity is expected near the optimum even on a first solve.
    """
    cur = class_units(spec, current, plan)
    previous = memo.get(plan.group) if memo is not None else None
    score, plain, odds = pairing_score(spec, plan, ref_units, cur, previous)
    rows = torch.arange(score.shape[-1]).expand(score.shape[:-1])
    if plan.fixed:
        perm = rows
    else:
        perm = per_copy_assignment(score, warm=warm or previous is not None)
        # no strict gain from moving a copy's units: keep them, only fix signs
        gain = score.gather(-1, perm.unsqueeze(-1)).sum((-2, -1)) - _trace(score)
        tie = gain <= round_off(score.dtype) * _trace(plain).abs().clamp_min(1.0)
        perm = torch.where(tie.unsqueeze(-1), rows, perm)
    step = [(plan.group, perm)] if (perm != rows).any() else []
    if memo is not None and plan.incremental and score.dim() == 2:
        # its rows move with its permutation, so do the columns of its score
        memo[plan.group] = (cur[0][perm], plain[:, perm]) if step else (cur[0], plain)
    for s, odd in zip(plan.signs, odds, strict=True):
        if odd is not None:
            paired = odd.gather(-1, perm.unsqueeze(-1)).squeeze(-1)
            flips = torch.where(paired < 0, -1.0, 1.0).to(torch.float64)
            if (flips < 0).any():
                step.append((s, flips))
    return step


def per_copy_assignment(score: torch.Tensor, warm: bool = False) -> torch.Tensor:
    """:func:`~wsym.align.assignment.assignment` of each ``(n, n)`` matrix of ``score``.

    Shapes:
        ``score``: ``(*index, n, n)``; returns ``(*index, n)``.
    """
    if score.dim() == 2:
        return assignment(score, warm=warm)
    flat = score.reshape(-1, *score.shape[-2:])
    return torch.stack([assignment(one, warm=warm) for one in flat]).reshape(score.shape[:-1])


def _trace(x: torch.Tensor) -> torch.Tensor:
    """Per copy, the trace of ``x`` (``(*index, n, n)``)."""
    return torch.diagonal(x, dim1=-2, dim2=-1).sum(-1)


def _apply(spec: SymmetrySpec, current: dict, step: list, comps: list, moved_at: dict, clock: int):
    """``current`` moved by ``step``, whose components are recorded with the time they moved."""
    comps.extend(step)
    for j, _ in step:
        moved_at[spec.groups[j].cls] = clock
    return act(spec, GroupElement(tuple(step)), current)


def weight_matching(
    spec: SymmetrySpec,
    ref: dict,
    other: dict,
    *,
    max_iter: int = 100,
    seed: int = 0,
    groups=None,
    fixed=(),
    rotations: bool = True,
    warm: bool = False,
) -> list[tuple[int, object]]:
    """Components (permutations, signs, rotations) that move ``other`` closest to ``ref``.

    Coordinate descent: sweeps over the permutation classes in a seeded random
    order, each solved by :func:`match_class`; then, with ``rotations``, every
    GL/orthogonal block rotated onto the reference's (:func:`procrustes`).
    A class whose cost cannot have changed since it was last solved (no class
    it shares a block with has moved since, itself included where a block holds
    its axis twice) is not solved again: its answer would be the same.

    Args:
        spec: the :class:`~wsym.group.spec.SymmetrySpec`.
        ref: the reference state dict (float64, canonicalized).
        other: the state dict to move (float64, canonicalized).
        max_iter: sweeps at most.
        seed: order of the classes.
        groups: permutation groups to solve (default: all).
        fixed: permutation groups whose permutation is held (their signs are matched).
        rotations: solve the GL/orthogonal rotations between sweeps.
        warm: ``other`` is expected to be nearly matched already (a later
            round of :func:`wsym.align.alignment.reference_alignment`): every solve warm.

    Example:
        >>> import torch, wsym
        >>> from wsym.group.elements import act, GroupElement
        >>> mlp = torch.nn.Sequential(torch.nn.Linear(3, 5), torch.nn.ReLU(), torch.nn.Linear(5, 2))
        >>> spec = wsym.detect(mlp, torch.randn(2, 3))
        >>> sd = {k: v.double() for k, v in mlp.state_dict().items()}
        >>> moved = spec.act(spec.sample(seed=0, kinds=["permutation"]), sd)
        >>> back = act(spec, GroupElement(tuple(weight_matching(spec, sd, moved))), moved)
        >>> all(torch.equal(back[k], sd[k]) for k in sd)
        True
    """
    todo = plans(spec, groups, fixed)
    ref_units: dict = {}  # read on a class's first solve (a skipped class never reads it)
    moved_at: dict[int, int] = {}  # class -> step at which it last moved
    solved_at: dict[int, int] = {}  # group -> step at which it was last solved
    rng = random.Random(seed)
    comps: list = []
    current, clock, memo = other, 0, {}
    dtype = next((v.dtype for v in other.values() if v.is_floating_point()), torch.float64)
    rotation_tol = max(ROTATION_TOL, 10 * round_off(dtype))  # float32's SVDs move by ~1e-6
    lone = lone_sign_rows(spec, ref)  # the reference's, read once
    for _ in range(max_iter):
        changed = False
        order = todo[:]
        rng.shuffle(order)
        for plan in order:
            i = plan.group
            if i in solved_at and all(moved_at.get(c, -1) < solved_at[i] for c in plan.coupled):
                continue
            clock += 1
            solved_at[i] = clock
            if i not in ref_units:
                ref_units[i] = class_units(spec, ref, plan)
            step = match_class(spec, plan, ref_units[i], current, memo, warm)
            if step:
                clock += 1
                current = _apply(spec, current, step, comps, moved_at, clock)
                changed = True
        flips = lone_signs(spec, lone, current) if lone else []
        if flips:
            clock += 1
            current = _apply(spec, current, flips, comps, moved_at, clock)
            changed = True
        if rotations:
            turn = procrustes(spec, ref, current, tol=rotation_tol)
            if turn:
                clock += 1
                current = _apply(spec, current, turn, comps, moved_at, clock)
                changed = True
        if not changed:
            break
    return comps


def lone_sign_rows(spec: SymmetrySpec, sd: dict) -> dict[tuple[int, ...], list]:
    """``{sign groups of one class: odd_patterns}`` for the classes no permutation acts on."""
    permuted = {g.cls for g in spec.groups if kind_of(g).permutes}
    by_class: dict[int, list[int]] = {}
    for i, g in enumerate(spec.groups):
        if kind_of(g).flips and g.cls not in permuted and not g.index:
            by_class.setdefault(g.cls, []).append(i)
    out = {}
    for groups in by_class.values():
        patterns = odd_patterns(spec, sd, groups)
        if patterns:
            out[tuple(groups)] = patterns
    return out


def lone_signs(spec: SymmetrySpec, ref_rows: dict, other: dict) -> list[tuple[int, torch.Tensor]]:
    """Flips of the sign groups of :func:`lone_sign_rows` (``ref_rows``: the reference's).

    The sign groups of one class are solved together, per unit: an entry that
    several of them negate (a depthwise chain of BatchNorms: each one's sign meets
    the next one's on the same channel) is multiplied by the product of their
    signs, so the overlap ``sum_e ref_e other_e prod_s s`` is maximized over every
    combination of signs (:func:`best_signs`). Exact copies give no flip.
    """
    comps = []
    for groups, patterns_ref in ref_rows.items():
        patterns = odd_patterns(spec, other, list(groups))
        overlap: dict[tuple[int, ...], torch.Tensor] = {}
        for (pattern, rows_ref), (_, rows) in zip(patterns_ref, patterns, strict=True):
            corr = (rows_ref.double() * rows.double()).sum(1)
            overlap[pattern] = overlap.get(pattern, 0.0) + corr
        for i, signs in zip(groups, best_signs(len(groups), overlap), strict=True):
            if (signs < 0).any():
                comps.append((i, signs))
    return comps


#: Sign groups of one class solved by enumeration up to this many (2^k per unit).
JOINT_SIGNS = 10


def best_signs(k: int, overlap: dict[tuple[int, ...], torch.Tensor]) -> torch.Tensor:
    """``(k, n)`` signs maximizing ``sum_pattern overlap[pattern] * prod_{s in pattern} signs_s``.

    Per unit, over all ``2^k`` combinations up to :data:`JOINT_SIGNS` groups (the
    identity wins ties); beyond, one group at a time with the others held, until
    no flip gains.

    Example:
        >>> best_signs(2, {(0,): torch.tensor([1.0]), (0, 1): torch.tensor([-2.0])})
        tensor([[ 1.],
                [-1.]], dtype=torch.float64)
    """
    n = len(next(iter(overlap.values())))
    if k <= JOINT_SIGNS:
        combos = torch.tensor(list(itertools.product((1.0, -1.0), repeat=k)), dtype=torch.float64)
        score = sum(c * combos[:, list(p)].prod(1, keepdim=True) for p, c in overlap.items())
        return combos[score.argmax(0)].T.contiguous()
    signs = torch.ones(k, n, dtype=torch.float64)
    for _ in range(k):
        moved = False
        for j in range(k):
            gain = sum(c * signs[list(p)].prod(0) for p, c in overlap.items() if j in p)
            flip = gain < 0
            if flip.any():
                signs[j] = torch.where(flip, -signs[j], signs[j])
                moved = True
        if not moved:
            break
    return signs


def procrustes(
    spec: SymmetrySpec, ref: dict, other: dict, tol: float = 1e-12
) -> list[tuple[int, torch.Tensor]]:
    """Per GL/orthogonal group, the rotation of ``other``'s blocks closest to ``ref``'s.

    Canonicalization leaves each GL block balanced (``G^T G = H^T H``); what is
    left of the group is ``O(h)``, and its canonical representative (singular
    vectors with a sign rule) is arbitrary as a match between two different
    networks. Per index (head), ``R = U V^T`` from the SVD ``U S V^T`` of
    ``sum_blocks X_other^T X_ref`` (orthogonal Procrustes; Kabsch's determinant
    fix for special orthogonal groups) maximizes ``sum tr(R^T X_other^T X_ref)``
    over rotations, both factors moving together (``x R`` and ``x R^-T = x R``).
    Identical blocks give ``R = I``, so exact recovery is kept. Rotations within
    ``tol`` of the identity are left out.
    """
    comps = []
    for i, g in enumerate(spec.groups):
        if not kind_of(g).matrix:
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
        if float((rot - eye).abs().max()) > tol:
            comps.append((i, rot))
    return comps
