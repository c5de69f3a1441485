"""SymmetrySpec: the verified parameter-space symmetries of one architecture.

The spec is a small, immutable, data-free description. Each parameter (and
buffer) of the state dict has a *layout*: one tree per tensor dimension whose
leaves are atom classes (``Leaf``), nested as products (``view``) or
concatenations (slices). Each :class:`Group` acts on one class:

====================  =========================================================
kind                  action on every leaf of its class (parity p)
====================  =========================================================
``permutation``       reorder the axis
``scaling``           multiply by ``s**e`` (``e`` the leaf's exponent), s > 0
``sign``              multiply by ``(+-1)**e``
``norm_scaling``      as scaling, plus BatchNorm weight corrections
``gl``                ``x -> x M`` (p = 0) or ``x M^-T`` (p = 1), one M per index
``orthogonal``        as gl with M orthogonal
``translation``       add a constant to a block of one parameter
====================  =========================================================

A ``module_permutation`` exchanges whole sibling modules (the experts of an
``nn.ModuleList``, named in ``target``) and reorders the router rows of ``cls``.

A group with ``index`` classes has one copy per index value (``count`` copies):
one GL(h) per attention head, or one S_n / (R+)^n / Z2^n per expert of a mixture
of experts whose experts are stacked in one tensor (:mod:`wsym.detect.experts`).

The group -> (parameter, axis) map is stored; the parameter -> groups map is
derived (:meth:`SymmetrySpec.groups_of`). What each kind means (sampling,
action, inverse, composition, generators) lives in its class,
:mod:`wsym.group.kinds`. The spec is an immutable value: memos and the traced
graph are kept beside it (:mod:`wsym.group.memo`).
"""

from __future__ import annotations

import functools
import json
from dataclasses import asdict, dataclass

from wsym.errors import WsymInputError
from wsym.group.fits import check_element, check_fits
from wsym.group.memo import attach_graph, derived, graph_of
from wsym.models.arguments import check_module

KINDS = (
    "permutation",
    "scaling",
    "sign",
    "gl",
    "orthogonal",
    "translation",
    "norm_scaling",
    "module_permutation",
)


@dataclass(frozen=True)
class Leaf:
    """An atom of a parameter axis: class id, size, parity, occurrence id.

    ``relabel`` (empty: none) is a fixed relabeling of the class's units along
    this axis: position ``k`` holds unit ``relabel[k]``. After a channel shuffle
    ``sigma`` the next layer reads the channels of the layer before in shuffled
    order, so a permutation ``pi`` of them acts there as ``sigma^-1 pi sigma``.
    The block reader (:mod:`wsym.group.layout`) hands every consumer such a
    block in the class's own order, so no kind needs to know.
    """

    cls: int
    size: int
    parity: int
    var: int
    relabel: tuple[int, ...] = ()

    def __post_init__(self):
        if self.relabel:
            _check_relabel(self.relabel, self.size)


def _check_relabel(relabel: tuple, size: int) -> None:
    if relabel and sorted(relabel) != list(range(size)):
        raise WsymInputError(
            f"an axis's relabel must be a permutation of range({size}), "
            f"not {relabel[:8]}...; pass a spec written by wsym"
        )


@dataclass(frozen=True)
class Split:
    """A product (``"prod"``) or concatenation (``"cat"``) of sub-axes.

    ``relabel`` as for :class:`Leaf`: position ``k`` of the axis holds position
    ``relabel[k]`` of the product or concatenation (a shuffle of concatenated classes).
    """

    mode: str
    children: tuple
    relabel: tuple[int, ...] = ()

    def __post_init__(self):
        _check_relabel(self.relabel, self.size)

    @functools.cached_property  # a frozen value: computed once (not a field)
    def size(self) -> int:
        """Number of entries along this axis."""
        sizes = [c.size for c in self.children]
        if self.mode == "cat":
            return sum(sizes)
        out = 1
        for s in sizes:
            out *= s
        return out


@dataclass(frozen=True)
class Group:
    """One group factor of the symmetry group.

    Attributes:
        kind: one of :data:`KINDS`.
        size: units the group acts on (gl/orthogonal: the block size h).
        count: independent copies (e.g. one GL(h) per attention head).
        params: state-dict keys this group changes.
        cls: the atom class it acts on (-1 for translations).
        index: classes whose index selects the copy (gl/orthogonal: one matrix per head;
            permutation/scaling/sign: one element per expert of stacked expert tensors,
            value ``(*index, size)``; every block of ``cls`` holds each index class once).
        exponents: ``(occurrence, exponent)`` pairs (scaling, sign, norm_scaling).
        corrections: BatchNorm ``(weight, running_var, eps, u)`` (norm_scaling).
        target: translation ``(param, classes, mode)``; mode "full" or "uniform";
            module_permutation: per module, its state-dict keys (in one shared order).
        special: orthogonal only: determinant +1 (rotations, as for rotary pairs).
    """

    kind: str
    size: int
    count: int
    params: tuple[str, ...]
    cls: int = -1
    index: tuple[int, ...] = ()
    exponents: tuple[tuple[int, int], ...] = ()
    corrections: tuple[tuple[str, str, float, int], ...] = ()
    target: tuple = ()
    special: bool = False

    @property
    def notation(self) -> str:
        """The group in the usual notation, e.g. ``GL(16)^4`` or ``S_128``."""
        return kind_of(self).notation(self)

    @property
    def dimension(self) -> int:
        """Dimension of the group (0 for finite groups)."""
        return kind_of(self).dimension(self)

    @property
    def continuous(self) -> bool:
        """Whether the group is a Lie group of positive dimension (not a finite group)."""
        return kind_of(self).continuous


def _tree_to_json(t):
    if isinstance(t, Leaf):
        return ["leaf", t.cls, t.size, t.parity, t.var] + ([list(t.relabel)] if t.relabel else [])
    return [t.mode, [_tree_to_json(c) for c in t.children]] + (
        [list(t.relabel)] if t.relabel else []
    )


def _tree_from_json(x):
    if x[0] == "leaf":
        return Leaf(*x[1:5], relabel=tuple(x[5]) if len(x) > 5 else ())
    relabel = tuple(x[2]) if len(x) > 2 else ()
    return Split(x[0], tuple(_tree_from_json(c) for c in x[1]), relabel=relabel)


def leaves(tree) -> list[Leaf]:
    """Leaves of a layout tree, in order."""
    if isinstance(tree, Leaf):
        return [tree]
    return [leaf for c in tree.children for leaf in leaves(c)]


@dataclass(frozen=True)
class SymmetrySpec:
    """Verified parameter-space symmetries of one architecture.

    Attributes:
        groups: the group factors (their product is the symmetry group found).
        layouts: ``(param, (tree per dim, ...))`` pairs for every state-dict entry.
        aliases: ``(alias, param)`` pairs for tied parameters.
        buffers: state-dict keys that are buffers (running statistics), not parameters.
        sites: ``(class, node, dim)``: a traced activation whose axis ``dim`` is the class
            (for activation matching; node names of :func:`wsym.detect.tracing.export`).
        deviations: verified largest relative output change, per group.
        warnings: operations that blocked symmetries, candidates dropped.
        notes: ``(param, dim, text)``: why a kind of group is absent from that axis
            (the operation that blocked it, a candidate verification dropped);
            read them with :meth:`explain`.
    """

    groups: tuple[Group, ...]
    layouts: tuple[tuple[str, tuple], ...]
    aliases: tuple[tuple[str, str], ...] = ()
    buffers: tuple[str, ...] = ()
    sites: tuple[tuple[int, str, int], ...] = ()
    deviations: tuple[float, ...] = ()
    warnings: tuple[str, ...] = ()
    notes: tuple[tuple[str, int, str], ...] = ()

    # -- beside the value -------------------------------------------------
    @property
    def graph(self):
        """The traced architecture graph (``networkx.DiGraph``) or None.

        It is kept beside the spec (:mod:`wsym.group.memo`), not in it: it is no
        field, takes no part in equality, hashing or serialization, and setting
        it leaves the spec's value unchanged.
        """
        return graph_of(self)

    @graph.setter
    def graph(self, value) -> None:
        attach_graph(self, value)

    # -- derived maps -----------------------------------------------------
    @property
    def layout(self) -> dict[str, tuple]:
        """Param -> tuple of dimension trees (one dict per spec: do not modify it)."""
        return derived(self, "layout", lambda: dict(self.layouts))

    def axes_of(self, group: Group) -> list[tuple[str, int]]:
        """(param, dim) pairs a group acts on."""
        out = []
        for name, dims in self.layouts:
            for d, tree in enumerate(dims):
                if any(leaf.cls == group.cls for leaf in leaves(tree)) and group.cls >= 0:
                    out.append((name, d))
        return out + kind_of(group).extra_axes(group)

    def groups_of(self, param: str) -> list[list[int]]:
        """For each dimension of ``param``, the indices of the groups acting on it."""
        dims = self.layout[param]
        out = []
        for tree in dims:
            classes = {leaf.cls for leaf in leaves(tree)}
            out.append([i for i, g in enumerate(self.groups) if g.cls in classes and g.cls >= 0])
        return out

    def kinds(self) -> dict[str, int]:
        """Number of groups per kind."""
        out: dict[str, int] = {}
        for g in self.groups:
            out[g.kind] = out.get(g.kind, 0) + 1
        return out

    # -- actions (implemented in wsym.group.elements) ---------------------
    def sample(self, seed: int = 0, scale=(1e-2, 1e2), kinds=None):
        """A random element of the product group (or of the listed ``kinds`` only)."""
        from wsym.group.elements import sample

        if not (
            isinstance(scale, tuple | list)
            and len(scale) == 2
            and all(isinstance(v, int | float) and 0 < v < float("inf") for v in scale)
        ):
            raise WsymInputError(
                f"scale must be a pair (low, high) of positive numbers, got {scale!r}; "
                "pass e.g. scale=(0.1, 10)"
            )
        return sample(self, seed=seed, scale=scale, kinds=kinds)

    def act(self, g, state_dict):
        """The state dict ``g . state_dict``; computes the same function.

        Raises:
            WsymInputError: a state dict that does not fit the spec, or non-finite values.
        """
        from wsym.group.elements import act

        check_element(g, "SymmetrySpec.act")
        check_fits(self, state_dict, "SymmetrySpec.act")

        return act(self, g, state_dict)

    def conserved(self, state_dict) -> list:
        """Per continuous group, its conserved quantity of gradient flow at ``state_dict``.

        See :func:`wsym.group.conserved.conserved`.
        """
        from wsym.group.conserved import conserved

        check_fits(self, state_dict, "SymmetrySpec.conserved")
        return conserved(self, state_dict)

    def verify(self, model, example_inputs, **kwargs):
        """Per-group largest relative output deviation under random elements."""
        from wsym.group.verify import verify

        check_module(model, "SymmetrySpec.verify")
        return verify(self, model, example_inputs, **kwargs)

    # -- presentation -----------------------------------------------------
    def table(self) -> str:
        """A plain-text table: kind, group, size, count, verified deviation, parameters touched."""
        rows = [("kind", "group", "dev", "parameters")]
        for i, g in enumerate(self.groups):
            dev = f"{self.deviations[i]:.1e}" if i < len(self.deviations) else "-"
            more = f", ... (+{len(g.params) - 3})" if len(g.params) > 3 else ""
            rows.append((g.kind, g.notation, dev, ", ".join(g.params[:3]) + more))
        widths = [max(len(r[i]) for r in rows) for i in range(3)]
        lines = ["  ".join(r[i].ljust(widths[i]) for i in range(3)) + "  " + r[3] for r in rows]
        summary = ", ".join(f"{n} {k}" for k, n in sorted(self.kinds().items()))
        return "\n".join(lines + [f"{len(self.groups)} groups: {summary or 'none'}"])

    def explain(self, param: str) -> str:
        """Per axis of ``param``: the groups acting on it, and why the others are left out.

        Example:
            >>> import torch, wsym
            >>> from torch import nn
            >>> net = nn.Sequential(nn.Linear(3, 4), nn.GELU(), nn.Linear(4, 2))
            >>> print(wsym.detect(net, torch.randn(5, 3)).explain("0.weight"))
            0.weight
              axis 0 (size 4): S_4 (permutation)
                no GL or orthogonal maps: aten::gelu (gelu) is not linear along it
                no scaling: aten::gelu (gelu) fixes the scale
                no sign: aten::gelu (gelu) fixes the sign
              axis 1 (size 3): none
                no permutation or mixing: model input
                no scaling: model input
                no sign: model input
        """
        target = dict(self.aliases).get(param, param)
        if target not in self.layout:
            raise KeyError(f"{param!r} is not a parameter or buffer of this spec")
        lines = [param]
        for d, (tree, idx) in enumerate(
            zip(self.layout[target], self.groups_of(target), strict=True)
        ):
            acting = ", ".join(f"{self.groups[i].notation} ({self.groups[i].kind})" for i in idx)
            lines.append(f"  axis {d} (size {tree.size}): {acting or 'none'}")
            lines += [f"    {t}" for p, ax, t in self.notes if p == target and ax == d]
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.table()

    def to_json(self) -> str:
        """Serialize (the graph is not included)."""
        return json.dumps(
            {
                "version": 1,
                "groups": [asdict(g) for g in self.groups],
                "layouts": [[p, [_tree_to_json(t) for t in dims]] for p, dims in self.layouts],
                "aliases": [list(a) for a in self.aliases],
                "buffers": list(self.buffers),
                "sites": [list(x) for x in self.sites],
                "deviations": list(self.deviations),
                "warnings": list(self.warnings),
                "notes": [list(n) for n in self.notes],
            }
        )

    @classmethod
    def from_json(cls, text: str) -> SymmetrySpec:
        """Inverse of :meth:`to_json`.

        Raises:
            WsymInputError: text that is not a spec's JSON.
        """
        try:
            return cls._from_dict(json.loads(text))
        except (ValueError, KeyError, TypeError, IndexError, AttributeError) as err:
            raise WsymInputError(
                f"not a SymmetrySpec's JSON ({type(err).__name__}: {str(err)[:120]}); "
                "pass the text spec.to_json() wrote"
            ) from err

    @classmethod
    def _from_dict(cls, d: dict) -> SymmetrySpec:
        groups = tuple(
            Group(
                kind=g["kind"],
                size=g["size"],
                count=g["count"],
                params=tuple(g["params"]),
                cls=g["cls"],
                index=tuple(g["index"]),
                exponents=tuple(tuple(e) for e in g["exponents"]),
                corrections=tuple(tuple(c) for c in g["corrections"]),
                target=_target_from_json(g["kind"], g["target"]),
                special=g.get("special", False),
            )
            for g in d["groups"]
        )
        layouts = tuple((p, tuple(_tree_from_json(t) for t in dims)) for p, dims in d["layouts"])
        return cls(
            groups=groups,
            layouts=layouts,
            aliases=tuple(tuple(a) for a in d["aliases"]),
            buffers=tuple(d.get("buffers", ())),
            sites=tuple(tuple(x) for x in d.get("sites", ())),
            deviations=tuple(d["deviations"]),
            warnings=tuple(d["warnings"]),
            notes=tuple(tuple(n) for n in d.get("notes", ())),
        )


def kind_of(group: Group):
    """The :class:`~wsym.group.kinds.Kind` of ``group`` (imported lazily: kinds read specs)."""
    from wsym.group.kinds import kind_of as _kind_of

    return _kind_of(group)


def _target_from_json(kind: str, t):
    if not t:
        return ()
    if kind == "module_permutation":
        return tuple(tuple(keys) for keys in t)
    return (t[0], tuple(tuple(x) for x in t[1]), t[2])
