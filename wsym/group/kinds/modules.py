"""Module permutations: exchange whole sibling modules (the experts of an ``nn.ModuleList``).

A mixture of experts that keeps its ``E`` experts as separate modules computes
the same function when the experts are renumbered together with the router's
rows: expert ``u``'s tensors become those of expert ``perm[u]`` and router row
``u`` becomes row ``perm[u]``. No tensor axis carries the expert index, so the
group names its modules: ``target`` holds, per expert, its state-dict keys in
one order shared by all experts (``target[u][j]`` and ``target[v][j]`` are the
same tensor of two experts), and ``cls`` is the router rows' class.

A value is a permutation of ``range(E)`` as for :class:`~wsym.group.kinds.finite.Permutation`
(its sampling, inverse and composition). Acting reorders the router rows and
moves whole tensors between keys: it is neither local nor fusable, and consumers
that read one permutation per class (canonicalization, weight matching, the
meta-networks) refuse it (:func:`refuse_modules`).

Example:
    >>> import torch
    >>> from wsym.group.spec import Group
    >>> g = Group("module_permutation", 2, 1, ("r", "a", "b"), cls=-1, target=(("a",), ("b",)))
    >>> out = ModulePermutation().act(None, g, torch.tensor([1, 0]), {"r": None, "a": 1, "b": 2})
    >>> out["a"], out["b"]
    (2, 1)
"""

from __future__ import annotations

from wsym.group.kinds.finite import Permutation
from wsym.group.layout import map_blocks
from wsym.group.spec import Group, SymmetrySpec


class ModulePermutation(Permutation):
    """``S_E`` on whole modules: each expert's tensors and its router row move together."""

    name = "module_permutation"
    permutes = False  # not a permutation of one class's units: class readers must not take it
    fusable = False
    local = False
    axis_map = ""

    def extra_axes(self, group: Group) -> list[tuple[str, int]]:
        """The leading axis of every expert tensor (they move as a whole)."""
        return [(key, 0) for keys in group.target for key in keys]

    def act(self, spec: SymmetrySpec, group: Group, value, state: dict) -> dict:
        """Router rows reordered along the class; expert ``u`` takes ``value[u]``'s tensors."""
        moved = {key for keys in group.target for key in keys}
        out = {}
        if group.cls >= 0:
            fn = self.block_fn(group, value)
            for key in group.params:
                if key not in moved:
                    out[key] = map_blocks(spec, key, state[key], fn, group.cls)
        for u, keys in enumerate(group.target):
            for key, source in zip(keys, group.target[int(value[u])], strict=True):
                out[key] = state[source]
        return out


def refuse_modules(spec: SymmetrySpec, who: str, kinds=None) -> None:
    """One-line :class:`~wsym.errors.WsymInputError` where ``spec`` permutes whole modules."""
    if kinds is not None and "module_permutation" not in kinds:
        return
    if any(g.kind == "module_permutation" for g in spec.groups):
        from wsym.errors import WsymInputError

        raise WsymInputError(
            f"{who} reads one permutation per class, and this spec permutes whole modules "
            "(the experts of a ModuleList): leave the module_permutation kind out "
            "(kinds=...) or drop those groups from the spec"
        )
