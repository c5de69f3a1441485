"""A small, deterministic training loop for classifiers on :mod:`wsym.io.datasets` datasets.

Plain minibatch SGD or Adam on the cross-entropy, nothing else: no schedules,
no augmentation, no logging. Shuffling orders come from a private generator
seeded by ``seed``, so a run on the CPU is a function of the model's initial
weights, the data and the arguments.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn
from torch.nn import functional as F

from wsym.errors import WsymInputError
from wsym.io.datasets import Dataset
from wsym.models.evaluate import batch_to, evaluate

OPTIMIZERS = ("sgd", "adam")

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def train(
    model: nn.Module,
    data: Dataset,
    *,
    epochs: int,
    lr: float,
    batch_size: int = 128,
    optimizer: str = "sgd",
    momentum: float = 0.9,
    weight_decay: float = 0.0,
    seed: int = 0,
) -> dict[str, float]:
    """Train ``model`` in place on ``data`` with the cross-entropy loss.

    Calls ``torch.manual_seed(seed)`` first (for stochastic layers such as
    dropout); the model's initial weights are whatever they are on entry.
    Each epoch visits the training set once in an order drawn from a generator
    seeded by ``seed``. Inputs are moved to the device and floating dtype of
    the model's first parameter.

    Args:
        model: classifier mapping a batch of inputs to logits ``(B, classes)``.
        data: dataset whose ``train`` split is trained on.
        epochs: passes over the training set.
        lr: learning rate.
        batch_size: examples per step.
        optimizer: ``"sgd"`` (with ``momentum``) or ``"adam"``.
        momentum: SGD momentum; ignored by Adam.
        weight_decay: L2 penalty passed to the optimizer.
        seed: seed of torch's global RNG and of the shuffling orders.

    Returns:
        ``train_loss``, ``train_accuracy``, ``test_loss``, ``test_accuracy`` of
        the final model (evaluation mode, whole splits) and ``steps`` taken.

    Example:
        >>> from wsym.io.datasets import load
        >>> from wsym.models.networks import MLP
        >>> _ = torch.manual_seed(0)
        >>> model = nn.Sequential(nn.Flatten(), MLP(64, [32], 10))
        >>> result = train(model, load("digits"), epochs=1, lr=0.1)
        >>> sorted(result)
        ['steps', 'test_accuracy', 'test_loss', 'train_accuracy', 'train_loss']
    """
    if epochs < 0:
        raise WsymInputError(f"epochs must be >= 0, got {epochs}")
    torch.manual_seed(seed)
    opt = _make_optimizer(model, optimizer, lr, momentum, weight_decay)
    orders = torch.Generator().manual_seed(seed)
    steps = 0
    weight = next(model.parameters(), None)
    for _ in range(epochs):
        model.train()
        order_seed = int(torch.randint(0, 2**62, (1,), generator=orders))
        for inputs, targets in data.batches("train", batch_size, seed=order_seed, shuffle=True):
            inputs, targets = batch_to(weight, inputs, targets)
            opt.zero_grad(set_to_none=True)
            F.cross_entropy(model(inputs), targets).backward()
            opt.step()
            steps += 1
    train_loss, train_accuracy = evaluate(model, data.batches("train", 1024))
    test_loss, test_accuracy = evaluate(model, data.batches("test", 1024))
    return {
        "train_loss": train_loss,
        "train_accuracy": train_accuracy,
        "test_loss": test_loss,
        "test_accuracy": test_accuracy,
        "steps": float(steps),
    }


def _make_optimizer(
    model: nn.Module, name: str, lr: float, momentum: float, weight_decay: float
) -> torch.optim.Optimizer:
    params = [p for p in model.parameters() if p.requires_grad]
    if name == "sgd":
        return torch.optim.SGD(params, lr=lr, momentum=momentum, weight_decay=weight_decay)
    if name == "adam":
        return torch.optim.Adam(params, lr=lr, weight_decay=weight_decay)
    raise WsymInputError(f"unknown optimizer {name!r}; use one of {', '.join(OPTIMIZERS)}")
