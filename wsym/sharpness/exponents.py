"""The scaling generators as exponent tables, and the translation directions.

A scaling unit ``u`` multiplies entry ``e`` by ``s_u ** E[e, u]``; its generator is
``theta * (E @ a)`` (``docs/geometry.md``, section 3). Translations add a constant: a
``full`` one moves every entry of its target, a ``uniform`` one all of them alike.
"""

from __future__ import annotations

import torch
from torch import Tensor

from wsym.group.kinds import kind_of
from wsym.group.kinds.translation import translate
from wsym.group.layout import map_blocks
from wsym.group.spec import SymmetrySpec
from wsym.group.units import per_class_only


def vertical_torus(spec: SymmetrySpec, params: dict[str, Tensor], skip: set[int]) -> list[int]:
    """Scaling / norm_scaling groups that move parameters only, minus the block groups.

    A BatchNorm's norm_scaling moves its running statistics too: with them fixed (eval
    mode) it is no symmetry of the parameters, so it has no vertical direction.
    """
    buffers = set(spec.buffers)
    out = []
    for i, g in enumerate(spec.groups):
        kind = kind_of(g)
        if i in skip or not (kind.diagonal and kind.continuous):
            continue
        if g.corrections or buffers & set(g.params):
            continue  # BatchNorm: the running statistics move too
        if any(p in params for p in g.params):
            out.append(i)
    return out


def exponent_matrix(
    spec: SymmetrySpec, groups: list[int], names: list[str], params: dict[str, Tensor]
) -> Tensor:
    """Sparse ``E`` ``(entries, units)``: the exponent of each unit on each parameter entry.

    Rows follow the flat concatenation of ``names``; columns the units of ``groups``
    in turn. ``theta * (E @ a)`` is the generator of the scalings ``s = exp(a)``.
    """
    rows, cols, vals = exponent_entries(spec, groups, names, params)
    shape = (sum(params[n].numel() for n in names), sum(spec.groups[i].size for i in groups))
    index = torch.stack([rows, cols])
    return torch.sparse_coo_tensor(index, vals, shape, check_invariants=False).coalesce()


def exponent_entries(
    spec: SymmetrySpec, groups: list[int], names: list[str], params: dict[str, Tensor]
) -> tuple[Tensor, Tensor, Tensor]:
    """``(rows, cols, exponents)`` of :func:`exponent_matrix`, not coalesced."""
    offsets, start = {}, 0
    for n in names:
        offsets[n] = start
        start += params[n].numel()
    rows, cols, vals = [], [], []
    col = 0
    for i in groups:
        g = spec.groups[i]
        per_class_only(g, "the sharpness measures' scaling gauge")
        exps = dict(g.exponents)
        for p in g.params:
            if p not in offsets:
                continue
            ids = torch.arange(params[p].numel(), dtype=torch.float64).reshape(params[p].shape)

            def grab(block, lv, p=p, g=g, exps=exps, col=col):
                for ax, leaf in enumerate(lv):
                    e = exps.get(leaf.var, 0)
                    if leaf.cls != g.cls or not e:
                        continue
                    shape = [1] * block.ndim
                    shape[ax] = -1
                    units = torch.arange(leaf.size).reshape(shape).expand(block.shape)
                    rows.append(block.reshape(-1).long() + offsets[p])
                    cols.append(units.reshape(-1) + col)
                    vals.append(torch.full((block.numel(),), float(e), dtype=torch.float64))
                return block

            map_blocks(spec, p, ids, grab)
        col += g.size
    if not rows:
        empty = torch.zeros(0, dtype=torch.long)
        return empty, empty, torch.zeros(0, dtype=torch.float64)
    return torch.cat(rows), torch.cat(cols), torch.cat(vals)


def translation_directions(
    spec: SymmetrySpec, names: list[str], params: dict[str, Tensor]
) -> tuple[Tensor, Tensor]:
    """``(full, uniform)``: 0/1 mask of full-translation entries, directions ``(entries, k)``."""
    offsets, start = {}, 0
    for n in names:
        offsets[n] = start
        start += params[n].numel()
    full = torch.zeros(start, dtype=torch.float64)
    uniform = []
    for g in spec.groups:
        if not kind_of(g).additive or g.target[0] not in offsets:
            continue
        key, _, mode = g.target
        t = params[key].detach().double()
        ones = torch.ones((), dtype=torch.float64) if mode == "uniform" else torch.ones_like(t)
        moved = translate(g, ones, torch.zeros_like(t), list(spec.layout[key]))
        sl = slice(offsets[key], offsets[key] + t.numel())
        if mode == "uniform":
            d = torch.zeros(start, dtype=torch.float64)
            d[sl] = moved.reshape(-1)
            uniform.append(d)
        else:
            full[sl] = torch.maximum(full[sl], (moved != 0).double().reshape(-1))
    return full, (torch.stack(uniform, 1) if uniform else full.new_zeros(start, 0))
