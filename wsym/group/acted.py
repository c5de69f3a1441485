"""``g . state`` one tensor at a time: the action of :func:`~wsym.group.elements.act`, lazily.

:func:`~wsym.group.elements.act` applies an element's parts in phases
(``_schedule``): a fused phase maps each tensor it touches once
(:func:`~wsym.group.chain.act_chain`), another phase applies its parts one after
the other. :class:`ActedState` computes entry ``key`` alone by running those steps
on that tensor only. A step that reads other tensors (a BatchNorm scaling reads the
running variances, a translation or an expert permutation reads its targets) reads
them as they are at that step, computed the same way; nothing else is touched. The
entries equal :func:`~wsym.group.elements.act`'s bit for bit.

Memory: one tensor (and what one step reads besides it). Cost: the steps that touch
the tensor, each time the entry is asked for.

Example:
    >>> import torch, wsym
    >>> from wsym.group.acted import ActedState
    >>> from wsym.group.elements import act, sample
    >>> from wsym.group.lazy import OwnState
    >>> mlp = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))
    >>> spec = wsym.detect(mlp, torch.randn(2, 3))
    >>> own = OwnState(mlp.state_dict(), torch.float64)
    >>> g = sample(spec, seed=0)
    >>> whole = act(spec, g, dict(own))
    >>> all(torch.equal(ActedState(spec, g, own)[k], whole[k]) for k in whole)
    True
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import Tensor

from wsym.group.chain import _by_axis, _chain
from wsym.group.elements import GroupElement, _check_state, _schedule
from wsym.group.kinds import kind_of
from wsym.group.layout import map_blocks
from wsym.group.lazy import LazyState
from wsym.group.spec import SymmetrySpec


class ActedState(LazyState):
    """``g . source``, each entry computed when asked (:func:`~wsym.group.elements.act`'s values).

    Args:
        spec: the spec ``g`` belongs to.
        g: the group element.
        source: the state acted on.
    """

    def __init__(self, spec: SymmetrySpec, g: GroupElement, source: LazyState):
        shapes = {k: torch.empty(s, device="meta") for k, s in source.shapes.items()}
        _check_state(spec, g, {**shapes, **source.fixed}, spec.layout)
        self.spec, self.source = spec, source
        self.steps = []  # (fused, parts): a fused phase, or one part of another phase
        for fused, parts in _schedule(spec, g):
            self.steps += [(True, parts)] if fused else [(False, [p]) for p in parts]
        self.plans: dict = {}  # fused step -> {key: the parts acting on it}
        self.maps: dict = {}  # fused step -> act_chain's axis maps (no scratch kept)
        aliases = {**source.aliases, **dict(spec.aliases)}
        super().__init__(**(source.like() | {"aliases": aliases}))

    def tensor(self, key: str) -> Tensor:
        """Entry ``key``, computed now."""
        return self.at(key, len(self.steps))

    def at(self, key: str, upto: int) -> Tensor:
        """Entry ``key`` after the first ``upto`` steps."""
        t = self.source[key]
        for i in range(upto):
            t = self._step(i, key, t)
        return t

    def _step(self, i: int, key: str, t: Tensor) -> Tensor:
        fused, parts = self.steps[i]
        if fused:
            fs = self._plan(i).get(key)
            if fs is None:
                return t
            maps = self.maps.setdefault(i, {})
            try:
                if all(mode for _, _, mode, _ in fs):
                    return _by_axis(self.spec, key, t, fs, maps)
                chain = _chain([(c, f) for c, f, *_ in fs])
                return map_blocks(self.spec, key, t, chain, frozenset(c for c, *_ in fs))
            finally:
                for name in [m for m in maps if m[0] == "scratch"]:
                    del maps[name]  # a buffer of the tensor's size: not kept between entries
        ((group, value),) = parts
        if key not in _touched(self.spec, group):
            return t
        out = kind_of(group).act(self.spec, group, value, _AtStep(self, i, key, t))
        return out.get(key, t)

    def _plan(self, i: int) -> dict:
        if i not in self.plans:
            fns: dict = {}
            view = _AtStep(self, i)
            for group, value in self.steps[i][1]:
                for keys, part in kind_of(group).chain_parts(self.spec, group, value, view):
                    for key in keys:
                        fns.setdefault(key, []).append(part)
            self.plans[i] = fns
        return self.plans[i]


class _AtStep(Mapping):
    """The acted state as it is before step ``i`` (``key`` given as ``t``), read entry by entry."""

    def __init__(self, acted: ActedState, i: int, key: str | None = None, t=None):
        self.acted, self.i, self.key, self.t = acted, i, key, t

    def __getitem__(self, k: str) -> Tensor:
        if k == self.key:
            return self.t
        if k in self.acted.fixed:
            return self.acted.fixed[k]
        return self.acted.at(self.acted.aliases.get(k, k), self.i)

    def __iter__(self):
        return iter(self.acted)

    def __len__(self) -> int:
        return len(self.acted)


def _touched(spec: SymmetrySpec, group) -> set[str]:
    """Keys an unfused part may change: its parameters and the keys its target names."""
    out = set(group.params)
    stack = [group.target]
    while stack:
        x = stack.pop()
        if isinstance(x, str):
            if x in spec.layout:
                out.add(x)
        elif isinstance(x, list | tuple):
            stack.extend(x)
    return out
