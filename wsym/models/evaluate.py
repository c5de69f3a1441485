"""The one evaluation loop: mean loss and accuracy of a model over batches.

The loss is averaged over examples (each batch's mean loss weighted by its size);
accuracy is the fraction of examples whose argmax output is the target, counted on
classification batches (outputs ``(B, C)``, integer targets; other batches count as
wrong). The model runs in eval mode, its training flags restored afterwards.

Example:
    >>> import torch
    >>> model = torch.nn.Linear(3, 2)
    >>> x, y = torch.randn(4, 3), torch.tensor([0, 1, 0, 1])
    >>> loss, acc = evaluate(model, [(x, y)])
    >>> 0.0 <= acc <= 1.0
    True
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch
from torch import nn
from torch.func import functional_call
from torch.nn import functional as F

from wsym.models.calling import eval_mode, model_inputs

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


@torch.no_grad()
def evaluate(
    model: nn.Module,
    batches: Iterable[tuple],
    loss_fn: LossFn | None = None,
    *,
    state_dict: dict[str, torch.Tensor] | None = None,
) -> tuple[float, float]:
    """Mean loss and accuracy of ``model`` (at ``state_dict`` if given) over ``batches``.

    Args:
        model: the module; its own weights are used unless ``state_dict`` is given.
        batches: iterable of ``(inputs, targets)``; inputs a Tensor, a tuple of positional
            inputs or a dict of keyword inputs. A Tensor input (and the targets) moves to
            the weights' device, a floating one to their dtype.
        loss_fn: ``loss_fn(outputs, targets) -> mean loss``; cross-entropy if ``None``.
        state_dict: weights to evaluate at (``torch.func.functional_call``), the module's
            own left untouched.

    Returns:
        ``(mean loss, accuracy)``; ``(nan, nan)`` when ``batches`` is empty.
    """
    loss_fn = F.cross_entropy if loss_fn is None else loss_fn
    weight = _first_weight(model, state_dict)
    total, loss_sum, correct = 0, 0.0, 0
    with eval_mode(model):
        for inputs, targets in batches:
            inputs, targets = batch_to(weight, inputs, targets)
            args, kwargs = model_inputs(model, inputs)
            if state_dict is None:
                out = model(*args, **kwargs)
            else:
                out = functional_call(model, state_dict, args, kwargs)
            n = targets.shape[0]
            loss_sum += float(loss_fn(out, targets)) * n
            if out.ndim == 2 and not targets.is_floating_point():
                correct += int((out.argmax(-1) == targets).sum())
            total += n
    if total == 0:
        return float("nan"), float("nan")
    return loss_sum / total, correct / total


def _first_weight(model: nn.Module, state_dict: dict | None) -> torch.Tensor | None:
    if state_dict is not None:
        return next((v for v in state_dict.values() if v.is_floating_point()), None)
    return next(model.parameters(), None)


def batch_to(weight: torch.Tensor | None, inputs, targets: torch.Tensor) -> tuple:
    """A batch moved to ``weight``'s device, a floating Tensor input also to its dtype.

    Tuple and dict inputs are left as they are; without a weight nothing moves.
    """
    if weight is None:
        return inputs, targets
    if isinstance(inputs, torch.Tensor):
        dtype = weight.dtype if inputs.is_floating_point() else inputs.dtype
        inputs = inputs.to(weight.device, dtype)
    return inputs, targets.to(weight.device)
