"""Linear mode connectivity: loss and accuracy along the segment between two checkpoints."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass

import torch

from wsym.align.repair import Repair
from wsym.errors import WsymInputError
from wsym.models.arguments import check_batches, check_loss, check_module, check_state_dict
from wsym.models.evaluate import evaluate


@dataclass(frozen=True)
class Curve:
    """Loss (and accuracy) at ``alphas`` along ``(1 - a) sd_a + a sd_b``.

    ``barrier`` is the largest excess of the loss over the straight line between
    the endpoint losses; ``accuracy_barrier`` the largest accuracy deficit.
    """

    alphas: tuple[float, ...]
    losses: tuple[float, ...]
    accuracies: tuple[float, ...]
    barrier: float
    accuracy_barrier: float

    @classmethod
    def from_points(cls, alphas, losses, accuracies) -> Curve:
        """A curve from its points, with both barriers computed."""
        line = [(1 - a) * losses[0] + a * losses[-1] for a in alphas]
        acc_line = [(1 - a) * accuracies[0] + a * accuracies[-1] for a in alphas]
        return cls(
            alphas=tuple(alphas),
            losses=tuple(losses),
            accuracies=tuple(accuracies),
            barrier=max(loss - b for loss, b in zip(losses, line, strict=True)),
            accuracy_barrier=max(b - c for c, b in zip(accuracies, acc_line, strict=True)),
        )

    def to_json(self) -> str:
        """The curve as JSON."""
        return json.dumps(asdict(self))

    def plot(
        self, path, title: str = "", other: Curve | None = None, labels=("curve", "other")
    ) -> None:
        """Write a PNG of the loss (and accuracy) along the path, optionally beside ``other``."""
        import matplotlib.pyplot as plt

        curves = {labels[0]: self} if other is None else {labels[0]: self, labels[1]: other}
        fig = figure(curves, title)
        fig.savefig(path, dpi=110)
        plt.close(fig)


def figure(curves: dict[str, Curve], title: str = ""):
    """A matplotlib figure of loss and accuracy along each labelled path."""
    import matplotlib.pyplot as plt

    fig, (ax_l, ax_a) = plt.subplots(1, 2, figsize=(9, 3.4))
    for label, curve in curves.items():
        ax_l.plot(
            curve.alphas, curve.losses, marker="o", label=f"{label} (barrier {curve.barrier:.3f})"
        )
        ax_a.plot(curve.alphas, curve.accuracies, marker="o", label=label)
    ax_l.set(xlabel="interpolation α", ylabel="loss", title=title or "loss along the path")
    ax_a.set(xlabel="interpolation α", ylabel="accuracy", title="accuracy")
    ax_l.legend()
    ax_a.legend()
    fig.tight_layout()
    return fig


def interpolate(
    model: torch.nn.Module,
    sd_a: dict,
    sd_b: dict,
    batches,
    loss_fn,
    steps: int = 11,
    *,
    repair: bool | str = False,
    repair_batches=None,
) -> Curve:
    """Evaluate ``model`` at ``steps`` points of the segment from ``sd_a`` to ``sd_b``.

    Args:
        model: the module whose state dicts these are.
        sd_a: the start of the segment.
        sd_b: its end (typically aligned to ``sd_a`` first).
        batches: iterable of ``(inputs, targets)``.
        loss_fn: ``loss_fn(outputs, targets)`` -> mean loss of the batch.
        steps: number of points, endpoints included.
        repair: at every point, REPAIR (:mod:`wsym.align.repair`): BatchNorm
            statistics recomputed, other units' pre-activation mean and std
            set to the interpolation of the endpoints'; ``"batchnorm"``: only
            the BatchNorm statistics recomputed.
        repair_batches: batches to measure the statistics on (default ``batches``).
    """
    who = "wsym.interpolate"
    check_module(model, who)
    check_state_dict(sd_a, who, "sd_a")
    check_state_dict(sd_b, who, "sd_b")
    for k, v in sd_a.items():
        if k not in sd_b or tuple(sd_b[k].shape) != tuple(v.shape):
            got = tuple(sd_b[k].shape) if k in sd_b else "no entry"
            raise WsymInputError(
                f"{k} has shape {tuple(v.shape)} in sd_a and {got} in sd_b; pass two state "
                "dicts of the same architecture"
            )
    batches = check_batches(batches, who)
    check_loss(loss_fn, who)
    if not isinstance(steps, int) or steps < 2:
        raise WsymInputError(f"steps must be an integer >= 2, got {steps!r}; pass e.g. steps=11")
    alphas = [i / (steps - 1) for i in range(steps)]
    fix = None
    if repair:
        on = batches if repair_batches is None else repair_batches
        fix = Repair(model, [sd_a, sd_b], on, units=repair != "batchnorm")
    losses, accuracies = [], []
    for a in alphas:
        sd = {
            k: ((1 - a) * v.to(torch.float64) + a * sd_b[k].to(torch.float64)).to(v.dtype)
            if v.is_floating_point()
            else v
            for k, v in sd_a.items()
        }
        if fix is not None:
            sd = fix(sd, [1 - a, a])
        loss, acc = evaluate(model, batches, loss_fn, state_dict=sd)
        losses.append(loss)
        accuracies.append(acc)
    return Curve.from_points(alphas, losses, accuracies)
