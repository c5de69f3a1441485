"""The park zoo's (``mnist1d-park``) CNN and transformer families, beside its MLPs.

Both take mnist1d signals ``(B, 40)`` as the MLP does, so the three families of
the park train on one dataset.

* :class:`ParkCNN1d` -- ``depth`` conv1d layers of ``channels`` channels (the
  first from one input channel), each optionally followed by BatchNorm, then
  ReLU; with ``residual``, every layer after the first adds its input back
  (``h + relu(bn(conv(h)))``); global average pooling and a linear head.
* :class:`PatchTransformer` -- :class:`~wsym.reference.TinyTransformer` on the
  signal cut into ``40 / patch`` patches of ``patch`` samples.

Example:
    >>> ParkCNN1d(channels=4, depth=3, kernel=3, batchnorm=1, residual=1)(torch.randn(2, 40)).shape
    torch.Size([2, 10])
    >>> PatchTransformer(dim=8, heads=2, depth=1, hidden=16)(torch.randn(2, 40)).shape
    torch.Size([2, 10])
"""

from __future__ import annotations

import torch
from torch import nn

from wsym.reference import TinyTransformer


class ParkCNN1d(nn.Module):
    """``depth`` conv1d(-BatchNorm)-ReLU layers, optionally residual, pooled, linear head.

    Args:
        channels: channels of every conv layer.
        depth: number of conv layers (>= 1).
        kernel: odd kernel size ("same" padding).
        batchnorm: BatchNorm1d after each conv (truthy) or none.
        residual: layers 2..depth add their input (truthy) or not.
        classes: outputs.

    Shapes:
        input ``(B, length)``, output ``(B, classes)``.
    """

    def __init__(
        self,
        channels: int = 8,
        depth: int = 2,
        kernel: int = 5,
        batchnorm: int = 1,
        residual: int = 0,
        classes: int = 10,
    ):
        super().__init__()
        self.residual = bool(residual)
        ins = [1] + [channels] * (depth - 1)
        self.convs = nn.ModuleList(nn.Conv1d(c, channels, kernel, padding=kernel // 2) for c in ins)
        norms = [nn.BatchNorm1d(channels) if batchnorm else nn.Identity() for _ in ins]
        self.norms = nn.ModuleList(norms)
        self.head = nn.Linear(channels, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Logits for signals ``(B, length)``."""
        h = x.unsqueeze(1)
        for i, (conv, norm) in enumerate(zip(self.convs, self.norms, strict=True)):
            out = torch.relu(norm(conv(h)))
            h = h + out if self.residual and i > 0 else out
        return self.head(h.mean(dim=2))


class PatchTransformer(TinyTransformer):
    """:class:`~wsym.reference.TinyTransformer` on signals ``(B, length)`` cut into patches.

    Keyword arguments are :class:`~wsym.reference.TinyTransformer`'s (``vocab`` is 0);
    ``seq * patch`` must equal the signal length.

    Shapes:
        input ``(B, seq * patch)``, output ``(B, classes)``.
    """

    def __init__(self, patch: int = 4, seq: int = 10, **kwargs):
        super().__init__(vocab=0, patch=patch, seq=seq, **kwargs)
        self.patch = patch

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Logits for signals ``(B, seq * patch)``."""
        return super().forward(x.reshape(x.shape[0], -1, self.patch))
