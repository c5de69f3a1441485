"""What the horizontal projection needs that depends on names and shapes only.

:class:`Structure` (memoized per spec and parameter shapes by :func:`structure`) maps
every parameter entry to its position in a geometry's flat tangent layout, lays the
scaling generators out as a gather, and finds which generators are coupled (solved by
conjugate gradients) and which are decoupled (solved exactly). :class:`TangentLayout`
is a flat layout the linear maps of :class:`wsym.sharpness.vertical.Horizontal` run
on: every entry, or the reduced set the coupled generators touch.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import numpy as np
import torch
from scipy.sparse import coo_matrix
from scipy.sparse.csgraph import connected_components
from torch import Tensor

from wsym.group.memo import derived
from wsym.group.spec import SymmetrySpec
from wsym.sharpness.exponents import exponent_entries, vertical_torus


def components(n: int, pairs: Tensor) -> list[int]:
    """Connected components of the graph on ``range(n)`` with edges ``pairs`` ``(k, 2)``.

    Returns one label per node (equal for nodes of one component); a sparse graph
    search (scipy), linear in nodes and edges.
    """
    pairs = pairs.long().reshape(-1, 2).numpy()
    graph = coo_matrix(
        (np.ones(len(pairs), dtype=np.int8), (pairs[:, 0], pairs[:, 1])), shape=(n, n)
    )
    return connected_components(graph, directed=False)[1].tolist()


@dataclass(frozen=True)
class TangentLayout:
    """A flat tangent layout for the linear maps: all entries, or CG's reduced set.

    ``slots`` leading plain entries with metric weights ``slot_inv``; per stack its
    ``(G, H)`` slices (None: not in the layout); the scaling gather ``sup``/``idx``/``val``
    (``exps``: the exponents alone, ``val`` times theta) and the translation directions
    ``D`` restricted to the layout's entries (``d_rows``, ``d_vals``: its nonzero rows, the
    only ones the linear maps touch).
    """

    n: int
    slots: int
    slot_inv: Tensor
    views: list
    sup: Tensor
    idx: Tensor
    val: Tensor
    D: Tensor
    exps: Tensor
    d_rows: Tensor
    d_vals: Tensor


class Structure:
    """What a :class:`Horizontal` needs that depends on names and shapes only (memoized).

    The scaling generators as a gather: tangent entry ``support[j]`` carries up to ``K``
    units ``idx[:, j]`` (``n_units`` marks an empty slot) with exponents ``exps[:, j]``;
    ``param_of[j]`` is its index among the parameters. ``cg_units`` / ``cg_stacks``: the
    coefficients coupled to others (solved by CG); the rest are solved exactly.
    """

    def __init__(self, geom, spec: SymmetrySpec):
        q, params, names = geom.quotient, geom.params, geom.names
        self.shapes = [t.shape for t in geom.coordinates()]
        self.sizes = [s.numel() for s in self.shapes]
        n = sum(self.sizes)
        total = sum(params[k].numel() for k in names)
        # each parameter entry's position in the flat tangent layout (a partition)
        numbers = torch.arange(1, total + 1, dtype=torch.float64)
        placed = torch.cat([x.reshape(-1) for x in geom.to_tangent(numbers)]) if n else numbers
        self.pos = torch.zeros(total, dtype=torch.long)
        hit = placed.nonzero().squeeze(1)
        self.pos[placed[hit].round().long() - 1] = hit
        k = len(geom.slots)
        self.slots = sum(self.sizes[:k])
        offsets = torch.tensor([0, *self.sizes]).cumsum(0).tolist()
        self.views = [
            (
                slice(offsets[k + 2 * s], offsets[k + 2 * s + 1]),
                slice(offsets[k + 2 * s + 1], offsets[k + 2 * s + 2]),
            )
            for s in range(len(q.stacks))
        ]
        self.groups = vertical_torus(spec, params, {i for i, _ in q.blocks})
        rows, cols, exps = exponent_entries(spec, self.groups, names, params)
        self.n_units = sum(spec.groups[i].size for i in self.groups)
        t = self.pos[rows]
        order = torch.argsort(t, stable=True)
        t, cols, exps, rows = t[order], cols[order], exps[order], rows[order]
        self.support, run, counts = torch.unique_consecutive(
            t, return_inverse=True, return_counts=True
        )
        starts = torch.cumsum(counts, 0) - counts
        rank = torch.arange(len(t)) - starts[run]
        width = int(counts.max()) if len(counts) else 0
        self.idx = torch.full((width, len(self.support)), self.n_units, dtype=torch.long)
        self.exps = torch.zeros((width, len(self.support)), dtype=torch.float64)
        self.idx[rank, run], self.exps[rank, run] = cols, exps
        self.param_of = rows[starts] if len(t) else rows
        unit_group = torch.repeat_interleave(
            torch.arange(len(self.groups)),
            torch.tensor([spec.groups[i].size for i in self.groups], dtype=torch.long),
        )
        self.cg_units, self.cg_stacks = self._coupled(unit_group, n, len(q.stacks))

    def _coupled(self, unit_group: Tensor, n: int, n_s: int) -> tuple[Tensor, list]:
        """Connected components of "shares a tangent entry or a block" among the generators.

        The Gram matrix is block-diagonal over them; a stack alone, or a scaling group
        alone whose units touch disjoint plain entries, is solved exactly by its
        preconditioner, the others by CG.
        """
        n_e = len(self.groups)
        stack_of = torch.full((n,), -1, dtype=torch.long)
        for s_, (g, h) in enumerate(self.views):
            stack_of[g], stack_of[h] = s_, s_
        grp = torch.cat([unit_group, torch.tensor([-1])])[self.idx]  # (K, support); -1: empty
        where = stack_of[self.support]
        pairs, inner = [], set()
        for j in range(len(grp)):
            hit = (where >= 0) & (grp[j] >= 0)
            pairs.append(torch.stack([grp[j][hit], n_e + where[hit]], 1))
            if j:
                both = (grp[0] >= 0) & (grp[j] >= 0)
                pairs.append(torch.stack([grp[0][both], grp[j][both]], 1))
                inner |= set(grp[0][both & (grp[0] == grp[j])].tolist())
        roots = components(n_e + n_s, torch.cat(pairs) if pairs else torch.zeros(0, 2))
        size = Counter(roots)
        cg = [size[roots[i]] > 1 or i in inner for i in range(len(roots))]
        groups = torch.tensor(cg[:n_e], dtype=torch.bool)
        units = groups[unit_group] if n_e else torch.zeros(0, dtype=torch.bool)
        return units, cg[n_e:]


def structure(geom, spec: SymmetrySpec) -> Structure:
    """The :class:`Structure` of ``geom`` (a Geodesic), memoized per spec, names and shapes."""
    key = ("horizontal", tuple((n, tuple(geom.params[n].shape)) for n in geom.names))
    return derived(spec, key, lambda: Structure(geom, spec))
