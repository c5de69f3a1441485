"""Conserved quantities of gradient flow on a GL block.

For a loss ``l(G H^T)``, with ``R = dl/d(G H^T)``, the gradients are ``R H`` and
``R^T G``, so ``d/dt (G^T G) = -(G^T R H + H^T R^T G) = d/dt (H^T H)`` along gradient
flow: ``C = G^T G - H^T H`` is constant. A gradient-descent step of size ``lr``
changes it by exactly ``lr^2 (grad_G^T grad_G - grad_H^T grad_H)``; weight decay
``wd`` multiplies it by ``(1 - lr wd)^2`` per step (geometric decay).

For a linear pair ``W2 W1`` (``G = W2``, ``H = W1^T``) this is ``W2^T W2 - W1 W1^T``.
"""

from __future__ import annotations

from torch import Tensor

from wsym.sharpness.geometry.block import Pair, as_pair


def conserved(block: Pair | tuple[Tensor, Tensor]) -> Tensor:
    """``G^T G - H^T H`` for each block: shape ``(..., h, h)``, symmetric.

    Args:
        block: G ``(..., n, h)``, H ``(..., m, h)``.

    Example:
        >>> import torch
        >>> G, H = torch.randn(8, 5, 2), torch.randn(8, 4, 2)  # 8 heads
        >>> conserved((G, H)).shape
        torch.Size([8, 2, 2])
    """
    G, H = as_pair(block)
    return G.mT @ G - H.mT @ H
