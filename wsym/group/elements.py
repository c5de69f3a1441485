"""Group elements: sampling, inversion and exact action on state dicts.

An element is an ordered list of components ``(group index, value)``; acting
applies them in order, the inverse applies the inverted components in reverse
order, so ``act(inverse(g), act(g, sd)) == sd`` up to round-off for every spec.
What a component means is its kind's (:mod:`wsym.group.kinds`).

Example:
    >>> import torch, wsym
    >>> mlp = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))
    >>> spec = wsym.detect(mlp, torch.randn(2, 3))
    >>> sd = {k: v.double() for k, v in mlp.state_dict().items()}
    >>> g = sample(spec, seed=0)
    >>> back = act(spec, g.inverse(), act(spec, g, sd))
    >>> all(torch.allclose(back[k], sd[k]) for k in sd)
    True
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import torch

from wsym.errors import WsymInputError
from wsym.group.chain import act_chain
from wsym.group.kinds import kind_of
from wsym.group.spec import SymmetrySpec


@dataclass(frozen=True)
class GroupElement:
    """An element of the product group, as ordered components ``(group index, value)``."""

    components: tuple[tuple[int, object], ...]
    inverted: tuple[bool, ...] = ()

    def inverse(self) -> GroupElement:
        """The inverse element."""
        inv = self.inverted or (False,) * len(self.components)
        return GroupElement(tuple(reversed(self.components)), tuple(not f for f in reversed(inv)))

    def parts(self):
        """``(group index, value, inverted)`` in the order they act."""
        inv = self.inverted or (False,) * len(self.components)
        return [(i, v, f) for (i, v), f in zip(self.components, inv, strict=True)]


def sample_group(
    spec: SymmetrySpec, i: int, gen: torch.Generator, scale=(1e-2, 1e2), moving: bool = False
):
    """A random value for group ``i`` (uniform permutations, log-uniform scales).

    With ``moving`` (for verification), permutations are random n-cycles, so that
    every unit moves, and sign vectors flip at least one unit.
    """
    g = spec.groups[i]
    return kind_of(g).sample(spec, g, gen, scale, moving)


def sample(
    spec: SymmetrySpec,
    seed: int = 0,
    scale=(1e-2, 1e2),
    kinds=None,
    groups=None,
    moving: bool = False,
    flip: bool = False,
) -> GroupElement:
    """A random element of the product of ``spec``'s groups (or of ``kinds``/``groups`` only).

    ``moving`` and ``flip`` serve verification: every unit of a permutation
    moves, and ``flip`` negates the sign vectors, so that the elements drawn with
    one seed with and without it flip every unit once between them.
    """
    gen = torch.Generator().manual_seed(seed)
    chosen = range(len(spec.groups)) if groups is None else groups
    comps = []
    for i in chosen:
        if kinds is None or spec.groups[i].kind in kinds:
            value = sample_group(spec, i, gen, scale, moving)
            if flip and kind_of(spec.groups[i]).flips:
                value = -value
            comps.append((i, value))
    return GroupElement(tuple(comps))


def act(spec: SymmetrySpec, g: GroupElement, state_dict: dict) -> dict:
    """``g . state_dict``: a new state dict that computes the same function.

    Entries the spec does not describe are copied unchanged, and so is the state
    dict's ``_metadata`` (module versions that ``load_state_dict`` reads: torchvision's
    MNASNet refuses a state dict without it).
    """
    _check_state(spec, g, state_dict, spec.layout)
    out = OrderedDict(state_dict)
    if hasattr(state_dict, "_metadata"):
        out._metadata = state_dict._metadata
    for fused, parts in _schedule(spec, g):
        if fused:
            act_chain(spec, parts, out)
        else:
            for group, value in parts:
                out.update(kind_of(group).act(spec, group, value, out))
    for alias, key in spec.aliases:
        out[alias] = out[key]
    return out


def acted_tensors(spec: SymmetrySpec, i: int, value, state: dict) -> dict:
    """The tensors of ``state`` that group ``i`` moved by ``value`` changes, acted on.

    Its kind's :meth:`~wsym.group.kinds.base.Kind.act` alone (aliases of those
    tensors included): no checks, no schedule, the other tensors neither read nor
    copied. For the repeated single-group steps of a fit on a state that
    :func:`act` has checked; ``{**state, **acted_tensors(...)}`` is
    ``act(spec, GroupElement(((i, value),)), state)``.

    Example:
        >>> import torch, wsym
        >>> mlp = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))
        >>> spec = wsym.detect(mlp, torch.randn(2, 3))
        >>> sd = {k: v.double() for k, v in mlp.state_dict().items()}
        >>> s = torch.tensor([1.0, 2.0, 3.0, 4.0], dtype=torch.float64)
        >>> moved = acted_tensors(spec, 1, s, sd)
        >>> sorted(moved) == sorted(spec.groups[1].params)
        True
        >>> whole = act(spec, GroupElement(((1, s),)), sd)
        >>> all(torch.equal(moved[k], whole[k]) for k in moved)
        True
    """
    group = spec.groups[i]
    out = kind_of(group).act(spec, group, value, state)
    for alias, key in spec.aliases:
        if key in out:
            out[alias] = out[key]
    return out


def _schedule(spec: SymmetrySpec, g: GroupElement) -> list[tuple[bool, list]]:
    """``g``'s parts in phases ``[(fused, [(group, value), ...])]``, applied in turn.

    Fused phases (even) hold :attr:`~wsym.group.kinds.base.Kind.fusable` parts,
    applied in one :func:`act_chain`; the others hold the rest, one after the
    other. A part goes to the earliest phase of its type after every earlier part
    it does not commute with: parts of :attr:`~wsym.group.kinds.base.Kind.local`
    kinds on disjoint classes commute, so a DenseNet's ~2500 groups act in two
    fused phases (permutations; BatchNorm scalings, signs and scalings), not ~200.
    A part whose kind :attr:`~wsym.group.kinds.base.Kind.reads_state` (a BatchNorm
    scaling reads the running variances) goes after the phase of those parts.
    Within a phase the parts keep their order.
    """
    phases: list[list] = []
    last: dict[int, int] = {}  # class -> last phase that touched it
    barrier = -1  # the last phase of a part not confined to classes
    for i, value, inverted in g.parts():
        group = spec.groups[i]
        kind = kind_of(group)
        value = kind.inverse(group, value) if inverted else value
        fused = kind.fusable
        confined = kind.local and group.cls >= 0
        if confined:  # after the earlier parts on its classes
            lo = max([barrier, *(last.get(c, -1) for c in (group.cls, *group.index))])
        else:  # after every earlier part
            lo = len(phases) - 1
        if kind.reads_state and lo >= 0:  # in a later phase than those: it reads their result
            lo += 1
        phase = max(lo, 0)
        if (phase % 2 == 0) != fused:
            phase += 1
        while len(phases) <= phase:
            phases.append([])
        phases[phase].append((group, value))
        if confined:
            last.update(dict.fromkeys((group.cls, *group.index), phase))
        else:
            barrier = phase
    return [(k % 2 == 0, parts) for k, parts in enumerate(phases) if parts]


def _check_state(spec: SymmetrySpec, g: GroupElement, state_dict: dict, layout: dict) -> None:
    """One-line errors for state dicts that do not fit the spec."""
    for i, _ in g.components:
        for key in spec.groups[i].params:
            if key not in state_dict:
                raise WsymInputError(
                    f"the state dict has no entry {key!r} that the spec acts on; "
                    "pass a state dict of the architecture the spec was detected on"
                )
            expected = tuple(t.size for t in layout[key])
            if tuple(state_dict[key].shape) != expected:
                raise WsymInputError(
                    f"{key} has shape {tuple(state_dict[key].shape)}, the spec expects {expected}; "
                    "pass a state dict of the architecture the spec was detected on"
                )
