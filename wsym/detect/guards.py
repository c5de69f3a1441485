"""Value-dependent branches: every outcome of the guards a trace took, analysed and verified.

A forward pass that branches on a tensor's value (``if z.abs().max() < 100:``)
is recorded along one branch only, the one the example inputs took. Groups found
there hold on the inputs that take it; other inputs (larger ones, say) take the
other branch, which neither the analysis nor a verification on similar inputs
sees. So each such guard (a boolean read of a tensor computed from float inputs,
weights or float buffers: :attr:`~wsym.detect.tracing.traced.Traced.guards`) is
forced, one outcome at a time, by :class:`ForcedGuards`, a dispatch mode that
answers the guard's read with the chosen value. Every path of outcomes is then

- recorded and analysed: a group is a candidate only if every path proposes it
  (same kind, same size, same tensor axes);
- verified numerically on the module under that path's outcomes
  (:class:`BranchProbe`), whose outputs also carry the guards' own outcomes, so
  that a group which flips a guard (sends an input down another branch) fails.

A model whose paths cannot all be explored (more than :data:`MAX_PATHS`, a
forced branch that does not run, or a value read into Python as a number,
``x.item() < 100`` or ``x.tolist()``, whose comparisons happen out of torch's
sight: :attr:`~wsym.detect.tracing.traced.Traced.numbers`) keeps no group: each
is reported as conditional in the spec's notes, never as a symmetry.
"""

from __future__ import annotations

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from wsym.detect.tracing.record import VALUE_READS, record
from wsym.group.verify import Probe, float64_probe, screen
from wsym.models.calling import eval_mode, model_inputs

MAX_PATHS = 8  # guard outcome paths explored; beyond, the groups are refused


class ForcedGuards(TorchDispatchMode):
    """Answer the boolean value reads at ``forced``'s positions with its outcomes.

    Positions count every boolean value read (``bool(t)``, ``if t:``) in call
    order. ``natural`` collects what each read would have returned.

    Example:
        >>> x = torch.ones(3)
        >>> with ForcedGuards({0: False}) as mode:
        ...     took = "small" if x.max() < 100 else "large"
        >>> took, mode.natural
        ('large', [True])
    """

    def __init__(self, forced: dict[int, bool]):
        super().__init__()
        self.forced, self.natural = dict(forced), []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if isinstance(out, bool) and func._schema.name in VALUE_READS:
            position = len(self.natural)
            self.natural.append(out)
            out = self.forced.get(position, out)
        return out


class BranchProbe(Probe):
    """A :class:`~wsym.group.verify.Probe` whose passes take the guard outcomes ``forced``.

    Its outputs end with one entry per forced guard: the largest output
    magnitude where the guard's own (unforced) outcome is true, 0 where false.
    A group element that flips a guard thus moves the outputs by about their
    size; one that keeps every guard adds nothing beyond the outputs' own change.
    """

    forced: dict[int, bool] = {}

    def __call__(self, state: dict, mode=None) -> torch.Tensor:
        """The outputs at ``state`` along this path, then the guards' own outcomes."""
        with ForcedGuards(self.forced) as guards:
            out = super().__call__(state, mode)
        size = out.abs().max() if out.numel() else torch.tensor(1.0, dtype=out.dtype)
        seen = [guards.natural[i] if i < len(guards.natural) else False for i in self.forced]
        return torch.cat([out, size * torch.tensor(seen, dtype=out.dtype)])


def paths(model: torch.nn.Module, example_inputs, guards) -> list[dict[int, bool]] | None:
    """Every path of guard outcomes, as ``{position: outcome}``; None beyond :data:`MAX_PATHS`.

    ``guards``: the traced path's ``(position, outcome)`` pairs (none: no path to
    explore, ``[]``). The first path is the example inputs' own. A path forces
    the outcomes of the guards it meets; a guard first met on a forced branch is
    explored both ways in turn. None too where a forced branch fails to run.
    """
    if not guards:
        return []
    todo, found = [{}], []
    while todo:
        forced = todo.pop()
        met = _met(model, example_inputs, forced)
        if met is None:
            return None
        path = {**forced, **met}
        found.append(path)
        todo.extend(
            {**{k: v for k, v in path.items() if k < p}, p: not out}
            for p, out in met.items()
            if p not in forced
        )
        if len(found) + len(todo) > MAX_PATHS:
            return None
    return found


def _met(model, example_inputs, forced) -> dict[int, bool] | None:
    """The value-dependent guards met on the path ``forced`` (None if it fails to run)."""
    args, kwargs = model_inputs(model, example_inputs)
    try:
        with eval_mode(model), ForcedGuards(forced):
            traced = record(model, args, kwargs)
    except Exception:  # noqa: BLE001 - a branch the inputs cannot take: refused
        return None
    return None if traced.numbers else dict(traced.guards)


def unexplored(traced) -> str | None:
    """Why the branches of ``traced`` cannot be explored (None where they can be forced)."""
    if traced.numbers:
        return (
            f"the forward pass reads {traced.numbers[0]} into Python as a number, so a "
            "branch on it cannot be forced"
        )
    return None


def branch_traces(model, example_inputs, found: list[dict[int, bool]]) -> list | None:
    """The recorded trace of each path (None if one fails to record)."""
    args, kwargs = model_inputs(model, example_inputs)
    out = []
    for forced in found:
        try:
            with eval_mode(model), ForcedGuards(forced):
                out.append(record(model, args, kwargs))
        except Exception:  # noqa: BLE001
            return None
    return out


def signature(spec, group) -> tuple:
    """What identifies a group across traces: its kind, size and tensor axes."""
    return group.kind, group.size, tuple(sorted(spec.axes_of(group)))


def failing_on_branches(spec, model, example_inputs, found, seed: int = 0) -> set[int]:
    """Indices of ``spec``'s groups that fail to verify on some path of ``found``."""
    failed: set[int] = set()
    base = float64_probe(model, example_inputs, seed=seed)
    for forced in found:
        probe = _as_branch(base, forced)
        failed |= set(screen(spec, probe, seed=seed)[1])
        probe.release()
    return failed


def _as_branch(probe: Probe, forced: dict[int, bool]) -> BranchProbe:
    branch = BranchProbe.__new__(BranchProbe)
    branch.__dict__.update(probe.__dict__)
    branch._ref, branch._floors, branch._shared = (None, None), {}, {}
    branch.forced = dict(forced)
    return branch


__all__ = [
    "MAX_PATHS",
    "BranchProbe",
    "ForcedGuards",
    "branch_traces",
    "failing_on_branches",
    "paths",
    "signature",
    "unexplored",
]
