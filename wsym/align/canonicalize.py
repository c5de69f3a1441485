"""Canonical forms: one representative per orbit of the detected symmetry group.

Continuous groups are brought to the *minimum-norm* point of their orbit (the
balanced representative), group by group, sweeping until nothing moves:

* scaling: per unit, the ``s`` minimizing ``sum_occ s^(2e) |w_occ|^2`` (incoming
  and outgoing norms balance; a convex problem in ``log s``, solved by Newton);
* norm_scaling: unit-norm inputs to the BatchNorm (its running statistics and
  weight follow exactly);
* gl: per head, the balanced factorization of the product ``G H^T`` from its SVD
  (``G^T G = H^T H``), computed from QR factors without forming the product;
* orthogonal: principal axes of the stacked blocks;
* translation: the zero (key bias) or zero-mean (logit bias) representative.

Then discrete conventions: each unit's largest flippable entry is made positive
(sign), the largest entry of each GL/orthogonal column is made positive, and
units are sorted by permutation-invariant keys (their squared norm, then their
sum). ``canonicalize(act(g, sd)) == canonicalize(sd)`` for every element ``g``.
A group with one copy per index value (one ``S_n`` per expert of a mixture of
experts) is balanced, signed and sorted per copy; the experts' own permutation
sorts them by keys that no permutation inside an expert changes.
"""

from __future__ import annotations

import math
import warnings

import torch

from wsym.align.precision import working, working_dtype
from wsym.errors import SymmetryWarning
from wsym.group.elements import GroupElement, act
from wsym.group.fits import check_fits
from wsym.group.kinds import kind_of, kinds_where
from wsym.group.kinds.modules import refuse_modules
from wsym.group.memo import derived
from wsym.group.spec import SymmetrySpec
from wsym.group.units import (
    block_classes,
    block_matrices,
    odd_rows,
    own_odd_rows,
    shared_odd,
    unit_matrix,
    unit_sums,
)

# The continuous kinds, in the order each sweep balances them.
CONTINUOUS = ("norm_scaling", "scaling", "gl", "orthogonal", "translation")
assert set(CONTINUOUS) == set(kinds_where(continuous=True))
# Balancing sweeps over-relax scaling steps (s**omega instead of s; successive
# over-relaxation): the fixed point is the same, and coupled layers converge in about 2/3
# of the sweeps (trained pairs of benchmarks/alignment.py: MLP 13 instead of 21, BatchNorm
# CNN 21 instead of 37, tiny transformer 13 instead of 20).
OVER_RELAXATION = {"scaling": 1.1, "norm_scaling": 1.2}
# A sweep whose largest move is below eps**(1/4) of the working dtype (0.019 in float32)
# and has not set a new low for this many sweeps is at the round-off floor: converging
# sweeps set a new low every sweep. Float32 GL blocks of random BERTs move by 2e-5..1e-3
# forever (1000 sweeps, 115 s on BERT-small, where 2 sweeps do the work).
STALLED_SWEEPS = 5


def canonicalize(
    state_dict: dict,
    spec: SymmetrySpec,
    *,
    kinds=None,
    tol: float | None = None,
    dtype: torch.dtype | None = None,
) -> dict:
    """The canonical representative of ``state_dict``'s orbit (same dtypes as the input).

    Memory: one copy of ``state_dict`` at the working ``dtype`` (none where it is
    at it already); each step replaces only the tensors it moves.

    Args:
        state_dict: a state dict of the architecture ``spec`` was detected on.
        spec: its :class:`~wsym.group.spec.SymmetrySpec`.
        kinds: restrict to these group kinds (default: all).
        tol: convergence tolerance of the continuous sweeps (default ``1e-12``
            in float64, ``1e-6`` in float32).
        dtype: working precision (``wsym.align.precision.working_dtype``: float64
            up to ``FLOAT64_LIMIT`` parameters, float32 above, by default).

    Example:
        >>> import torch, wsym
        >>> mlp = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))
        >>> spec = wsym.detect(mlp, torch.randn(2, 3))
        >>> sd = {k: v.double() for k, v in mlp.state_dict().items()}
        >>> moved = spec.act(spec.sample(seed=1), sd)
        >>> a, b = wsym.canonicalize(sd, spec), wsym.canonicalize(moved, spec)
        >>> all(torch.allclose(a[k], b[k]) for k in a)
        True
    """
    check_fits(spec, state_dict, "wsym.canonicalize")  # here, not in canonical_element:
    # optimizers reach it diverged
    dtype = working_dtype(state_dict, dtype)
    if tol is None:
        tol = 1e-12 if dtype == torch.float64 else 1e-6
    canon, _ = canonical_element(state_dict, spec, kinds=kinds, tol=tol, dtype=dtype)
    return {k: v.to(state_dict[k].dtype) for k, v in canon.items()}


def canonical_element(
    state_dict: dict,
    spec: SymmetrySpec,
    *,
    kinds=None,
    tol: float = 1e-12,
    max_sweeps: int = 1000,
    dtype: torch.dtype = torch.float64,
) -> tuple[dict, GroupElement]:
    """``(canonical state dict at dtype, g)`` with ``act(g, state_dict) == canonical``."""
    refuse_modules(spec, "canonicalize", kinds)
    work = working(state_dict, dtype)
    if dtype != torch.float64:  # float32 sweeps move by round-off (~1e-6) forever below this
        tol = max(tol, 1e-5)
    kinds = set(kinds) if kinds is not None else {g.kind for g in spec.groups}
    comps: list = []
    last: dict[int, int] = {}  # group -> position of its latest component in comps

    def apply(i, value):
        nonlocal work
        work = act(spec, GroupElement(((i, value),)), work)
        _record(spec, comps, last, i, value)

    order = [
        i
        for kind in CONTINUOUS
        for i, g in enumerate(spec.groups)
        if g.kind == kind and kind in kinds
    ]
    _warn_degenerate(spec, work, order)
    floor, lowest, stalled = torch.finfo(dtype).eps ** 0.25, math.inf, 0
    touches = {i: _writes(spec.groups[i]) for i in order}
    neighbours = {i: [j for j in order if j != i and touches[i] & touches[j]] for i in order}
    solved_at: dict[int, int] = {}
    moved_at: dict[int, float] = {}
    step = 0
    for _ in range(max_sweeps):
        moved = 0.0
        for i in order:
            if _settled(i, neighbours[i], solved_at, moved_at):
                continue
            step += 1
            solved_at[i] = step
            value, size = _continuous(spec, work, i)
            if size > 0:
                omega = OVER_RELAXATION.get(spec.groups[i].kind, 1.0)
                apply(i, value.pow(omega) if omega != 1.0 else value)
                if size > 0:  # its neighbours' answers change (and its own if over-relaxed)
                    moved_at[i] = step + (0.5 if omega != 1.0 else 0.0)
            moved = max(moved, size)
        if moved < tol:
            break
        stalled = stalled + 1 if floor > moved >= lowest else 0
        lowest = min(lowest, moved)
        if stalled >= STALLED_SWEEPS:
            break
    for i, value in _discrete_conventions(spec, kinds, lambda: work):
        apply(i, value)
    for i, g in enumerate(spec.groups):
        if g.kind in kinds and kind_of(g).permutes:
            perm = _order(unit_matrix(spec, work, g.cls, group=g))
            if (perm != torch.arange(perm.shape[-1])).any():
                apply(i, perm)
    return work, GroupElement(tuple(comps))


def _settled(i: int, neighbours, solved_at: dict, moved_at: dict) -> bool:
    """Whether group ``i``'s balancing step would be the identity: solved, nothing moved since.

    A balancing step is a projection onto the group's balanced set given the other
    groups' state, so it changes only after a group sharing a tensor with it moved (or
    after its own over-relaxed step, which overshoots its fixed point).
    """
    if i not in solved_at:
        return False
    since = solved_at[i]
    return moved_at.get(i, -1) <= since and all(moved_at.get(j, -1) < since for j in neighbours)


def _record(spec: SymmetrySpec, comps: list, last: dict, i: int, value) -> None:
    """Append ``(i, value)``, or fold it into group ``i``'s last component.

    Balancing sweeps apply each continuous group once per sweep; where every
    component since the group's last one commutes with it, the two are one
    component (``s_old * s_new`` for scalings, ``M_old @ M_new`` for GL and
    orthogonal blocks). The element stays the same (up to round-off) and is
    shorter to apply and to invert: one component per group instead of one
    per sweep. ``last`` (group -> position of its latest component) is kept up
    to date; a component since ``i``'s last blocks the fold only if its group
    does not commute with ``i`` (:func:`_non_commuting`), so the check costs
    ``i``'s neighbours, not the components since.
    """
    group = spec.groups[i]
    kind = kind_of(group)
    j = last.get(i)
    if j is not None and kind.continuous and _linear(kind):
        if all(last.get(k, -1) < j for k in _non_commuting(spec, i)):
            # x -> x M_old -> x M_old M_new on the class axis; scales multiply
            comps[j] = (i, kind.compose(group, value, comps[j][1]))
            return
    last[i] = len(comps)
    comps.append((i, value))


def _non_commuting(spec: SymmetrySpec, i: int) -> tuple[int, ...]:
    """The groups whose components may not commute with group ``i``'s (memoized).

    Only groups touching (writing, or reading as a BatchNorm correction) a tensor
    that ``i`` touches can fail :func:`_commute`.
    """

    def touched(g) -> set:
        return _writes(g) | _reads(g)

    def index():
        out: dict = {}
        for k, g in enumerate(spec.groups):
            for key in touched(g):
                out.setdefault(key, set()).add(k)
        return out

    def find():
        by_key = derived(spec, ("touch_index",), index)
        near = set().union(*(by_key[key] for key in touched(spec.groups[i]))) - {i}
        return tuple(sorted(k for k in near if not _commute(spec, i, k)))

    return derived(spec, ("non_commuting", i), find)


def _commute(spec: SymmetrySpec, i: int, k: int) -> bool:
    """Whether components of groups ``i`` and ``k`` commute whatever their values.

    Groups on disjoint tensors do; so do linear actions on different axes of a
    tensor, and diagonal ones on any axes, unless one writes what the other's
    BatchNorm correction reads (the running variance).
    """
    a, b = spec.groups[i], spec.groups[k]
    writes_a, writes_b = _writes(a), _writes(b)
    reads_a, reads_b = _reads(a), _reads(b)
    if reads_a & writes_b or reads_b & writes_a:
        return False
    if not writes_a & writes_b:
        return True
    ka, kb = kind_of(a), kind_of(b)
    if ka.diagonal and kb.diagonal:
        return True
    return _linear(ka) and _linear(kb) and a.cls != b.cls


def _linear(kind) -> bool:
    """Diagonal or matrix kinds: linear actions on the class axes."""
    return kind.diagonal or kind.matrix


def _writes(g) -> set:
    keys = set(g.params) | {w for w, _, _, _ in g.corrections}
    return keys | {p for p, _ in kind_of(g).extra_axes(g)}


def _reads(g) -> set:
    """The running variances a group's BatchNorm corrections read."""
    return {rv for _, rv, _, _ in g.corrections}


def _warn_degenerate(spec: SymmetrySpec, sd: dict, order) -> None:
    """GL/orthogonal blocks with fewer rows than their size have no unique canonical form."""
    for i in order:
        g = spec.groups[i]
        if kind_of(g).matrix:
            mats = block_matrices(spec, sd, g)
            sides = 1 if kind_of(g).self_dual else 2  # GL needs both factors
            if len(mats) < sides or any(m.shape[-2] < g.size for m in mats.values()):
                warnings.warn(
                    f"{g.notation} on {', '.join(g.params[:2])} has fewer rows than its size: "
                    "its canonical form is not unique and it is left as it is",
                    SymmetryWarning,
                    stacklevel=4,
                )


def _discrete_conventions(spec: SymmetrySpec, kinds: set, state):
    """Sign flips, and the column signs of GL/orthogonal blocks, in dependency order.

    A convention read from a block is only orbit-invariant once every other
    class in that block has its own convention fixed; so classes are settled
    one by one, each from the blocks that are ready (inputs come first, as in
    a feed-forward pass). Several sign groups on one class (a residual stream
    read by several LayerNorms or BatchNorms) may negate some of the same
    entries: each is settled from the entries that only it negates among those
    still pending. Yields ``(group index, value)`` to apply in turn.
    """
    todo = [
        i
        for i, g in enumerate(spec.groups)
        if (kind_of(g).flips or kind_of(g).matrix) and g.kind in kinds
    ]

    def own(i):  # a sign group reads entries no other pending sign group of its class negates
        g = spec.groups[i]
        others = shared_odd(spec, i, todo)
        return not kind_of(g).flips or any(e % 2 and v not in others for v, e in g.exponents)

    while todo:
        pending = {spec.groups[i].cls for i in todo}
        free = [
            i
            for i in todo
            if not (block_classes(spec, spec.groups[i]) & (pending - {spec.groups[i].cls}))
        ]
        ready = next((i for i in free if own(i)), free[0] if free else None)
        if ready is None:  # a cycle: settle the first one from every block (best effort)
            ready = todo[0]
        todo.remove(ready)
        g = spec.groups[ready]
        if kind_of(g).flips:  # shared with the sign groups still pending
            rows = own_odd_rows(spec, state(), ready, todo, pending - {g.cls})
            rows = rows if rows is not None else odd_rows(spec, state(), g)
            value = _column_signs(rows.transpose(-1, -2))
            if (value < 0).any():
                yield ready, value
        else:
            value, size = _continuous(spec, state(), ready)
            if size > 0:
                yield ready, value


def _continuous(spec: SymmetrySpec, sd: dict, i: int) -> tuple[object, float]:
    """The canonicalizing value of continuous group ``i`` and how far it is from identity."""
    g = spec.groups[i]
    kind = kind_of(g)
    if kind.diagonal:
        s = _balance(unit_sums(spec, sd, g), normalize=kind.one_sided)
        return s, float(s.log().abs().max())
    if kind.additive:
        key, _, mode = g.target
        c = -sd[key].mean() if mode == "uniform" else -sd[key]
        ref = sd[key].abs().max().clamp_min(torch.finfo(sd[key].dtype).tiny)
        return c, float(_translated(spec, g, sd, c).abs().max() / ref)
    m = (
        _principal(block_matrices(spec, sd, g), g.special)
        if kind.self_dual
        else _gl(block_matrices(spec, sd, g))
    )
    eye = torch.eye(g.size, dtype=m.dtype)
    return m, float((m - eye).abs().max())


def _translated(spec, g, sd, c) -> torch.Tensor:
    """How much a translation by ``c`` moves its parameter."""
    key = g.target[0]
    moved = act(spec, GroupElement(((spec.groups.index(g), c),)), {key: sd[key]} | _others(sd, g))
    return moved[key] - sd[key]


def _others(sd: dict, g) -> dict:
    return {k: v for k, v in sd.items() if k in g.params}


def _normalized(sums: dict[int, torch.Tensor]) -> torch.Tensor:
    """Per unit, the scale bringing the entries of the smallest exponent to unit norm."""
    e0 = min(sums, key=abs)
    u = -0.5 * torch.log(sums[e0].clamp_min(1e-300)) / e0
    return torch.where(sums[e0] > 0, u.exp(), torch.ones_like(u))


def _balance(sums: dict[int, torch.Tensor], normalize: bool) -> torch.Tensor:
    """Per-unit minimizer of ``sum_e A_e s^(2e)``, or unit norm where no minimum exists.

    The minimum exists where entries of both exponent signs are nonzero. Elsewhere
    (all exponents of one sign, or ``normalize``: a BatchNorm's input, whose
    scale nothing but the running statistics reads), the entries of the smallest
    exponent are brought to unit norm. A normalized group whose scale another
    layer reads inversely (a BatchNorm's output feeding the next convolution)
    still takes the minimum: normalizing one side of it would fight the next
    BatchNorm's own normalization of the same weights, without end.
    """
    exps = sorted(sums)
    shape = next(iter(sums.values())).shape  # (n,), or (*index, n) per copy
    live = torch.stack([sums[e] for e in exps]).sum(0) > 0
    if exps[0] > 0 or exps[-1] < 0:
        return _normalized(sums)
    if normalize:
        two = _balance(sums, normalize=False)
        pos = sum(v for e, v in sums.items() if e > 0) > 0
        neg = sum(v for e, v in sums.items() if e < 0) > 0
        one = _normalized({e: v for e, v in sums.items() if e > 0})
        return torch.where(pos & neg, two, torch.where(pos, one, _normalized(sums)))
    u = torch.zeros(shape, dtype=sums[exps[0]].dtype)
    if -1 in sums and 1 in sums:
        ok = (sums[-1] > 0) & (sums[1] > 0)
        u = torch.where(
            ok, 0.25 * (sums[-1].clamp_min(1e-300).log() - sums[1].clamp_min(1e-300).log()), u
        )
        if exps == [-1, 1] and bool(ok.all()):  # A s^-2 + B s^2: the closed form is exact
            return u.exp()
    for _ in range(100):
        terms = [(e, sums[e] * torch.exp(2 * e * u)) for e in exps]
        grad = sum(2 * e * t for e, t in terms)
        hess = sum(4 * e * e * t for e, t in terms)
        step = torch.where(hess > 0, grad / hess.clamp_min(1e-300), torch.zeros_like(u)).clamp(
            -5, 5
        )
        u = u - step
        if step.abs().max() < 1e-15:
            break
    return torch.where(live, u.exp(), torch.ones_like(u))


def _gl(mats: dict[int, torch.Tensor]) -> torch.Tensor:
    """Per index, ``M`` with ``G M = U S^1/2`` and ``H M^-T = V S^1/2`` (``G H^T = U S V^T``)."""
    g, h = mats.get(0), mats.get(1)
    size = (g if g is not None else h).shape[-1]
    lead = (g if g is not None else h).shape[:-2]
    eye = torch.eye(size, dtype=(g if g is not None else h).dtype).expand(*lead, size, size).clone()
    if g is None or h is None or g.shape[-2] < size or h.shape[-2] < size:
        return eye
    qg, rg = torch.linalg.qr(g)
    qh, rh = torch.linalg.qr(h)
    uk, s, vkh = torch.linalg.svd(rg @ rh.transpose(-1, -2))
    flip = _column_signs(qg @ uk)
    uk = uk * flip.unsqueeze(-2)
    m = torch.linalg.solve_triangular(rg, uk * s.sqrt().unsqueeze(-2), upper=True)
    good = (s.min(-1).values > 1e-12 * s.max(-1).values.clamp_min(1e-300)) & torch.isfinite(m).all(
        -1
    ).all(-1)
    return torch.where(good[..., None, None], m, eye)


def _principal(mats: dict[int, torch.Tensor], special: bool) -> torch.Tensor:
    """Per index, the rotation onto the principal axes of all stacked blocks."""
    x = torch.cat(list(mats.values()), dim=-2)
    size = x.shape[-1]
    if x.shape[-2] < size:
        return torch.eye(size, dtype=x.dtype).expand(*x.shape[:-2], size, size).clone()
    q, r = torch.linalg.qr(x)
    ur, _, vrh = torch.linalg.svd(r)
    v = vrh.transpose(-1, -2) * _column_signs(q @ ur).unsqueeze(-2)
    if special:
        det = torch.linalg.det(v)
        v[..., :, -1] = v[..., :, -1] * det.sign().unsqueeze(-1)
    return v


def _column_signs(u: torch.Tensor) -> torch.Tensor:
    """Per column, the sign that makes its largest-magnitude entry positive."""
    idx = u.abs().argmax(dim=-2, keepdim=True)
    signs = torch.gather(u, -2, idx).squeeze(-2).sign()
    return torch.where(signs == 0, torch.ones_like(signs), signs)


def _order(units: torch.Tensor) -> torch.Tensor:
    """Units sorted by squared norm, then by sum (both invariant to other permutations).

    Shapes:
        ``units``: ``(*index, n, features)``; returns ``(*index, n)`` (one order per copy).
    """
    keys = (units.pow(2).sum(-1), units.sum(-1))
    order = torch.arange(units.shape[-2]).expand(keys[0].shape).contiguous()
    for key in reversed(keys):  # stable lexicographic sort, descending
        order = order.gather(-1, torch.sort(-key.gather(-1, order), stable=True).indices)
    return order
