"""Leave the user's module exactly as it was: values, flags and hooks restored after detection.

Detection runs the module's own forward pass (recording, the guard paths,
verification). A forward that writes its buffers (a step counter, an
exponential moving average, BatchNorm's running statistics in training mode)
would otherwise hand the user back a changed model.
"""

from __future__ import annotations

import contextlib
import warnings

import torch

from wsym.errors import SymmetryWarning

# the per-module hook tables ``register_*_hook`` writes into
HOOK_TABLES = (
    "_forward_hooks",
    "_forward_hooks_with_kwargs",
    "_forward_hooks_always_called",
    "_forward_pre_hooks",
    "_forward_pre_hooks_with_kwargs",
    "_backward_hooks",
    "_backward_pre_hooks",
    "_state_dict_hooks",
    "_state_dict_pre_hooks",
    "_load_state_dict_pre_hooks",
    "_load_state_dict_post_hooks",
)


@contextlib.contextmanager
def untouched(model: torch.nn.Module):
    """Restore, on exit, every parameter's and buffer's value, the training flags and hooks.

    Buffers' values are written back in place (the tensors keep their identity);
    a parameter or buffer the forward replaced by a new tensor is put back.
    Holds one copy of the buffers, none of the parameters (a model can be
    large): a parameter written in place (its version counter moved) cannot be
    restored and is named in a :class:`~wsym.errors.SymmetryWarning`.

    Example:
        >>> m = torch.nn.BatchNorm1d(3).train()
        >>> with untouched(m):
        ...     _ = m(torch.randn(4, 3))
        >>> float(m.running_mean.abs().sum()), int(m.num_batches_tracked)
        (0.0, 0)
    """
    modules = list(model.modules())
    buffers = [
        (mod, name, t, t.detach().clone())
        for mod in modules
        for name, t in mod._buffers.items()
        if t is not None
    ]
    params = [(mod, name, p, _version(p)) for mod in modules for name, p in mod._parameters.items()]
    flags = [(mod, mod.training) for mod in modules]
    hooks = [
        (mod, table, dict(getattr(mod, table)))
        for mod in modules
        for table in HOOK_TABLES
        if hasattr(mod, table)
    ]
    try:
        yield
    finally:
        with torch.no_grad():
            for mod, name, t, saved in buffers:
                mod._buffers[name] = t  # a buffer reassigned in forward is put back
                if t.shape != saved.shape:
                    mod._buffers[name] = saved
                elif not torch.equal(t, saved):
                    t.copy_(saved)
        for mod, name, p, version in params:
            mod._parameters[name] = p
            if p is not None and _version(p) != version:
                warnings.warn(
                    f"the forward pass wrote parameter {name} in place; it cannot be restored",
                    SymmetryWarning,
                    stacklevel=3,
                )
        for mod, training in flags:
            mod.training = training
        for mod, table, saved in hooks:
            current = getattr(mod, table)
            current.clear()
            current.update(saved)


def _version(t) -> int:
    try:
        return -1 if t is None else t._version
    except RuntimeError:  # inference tensors keep no version counter
        return -1


__all__ = ["HOOK_TABLES", "untouched"]
