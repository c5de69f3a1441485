r"""Float64 depthwise convolutions as shifted multiply-adds: the probe's faster exact path.

PyTorch's CPU kernels have no fast float64 depthwise convolution: a grouped
convolution runs one small matrix product per channel, so on models built on
depthwise convolutions (EfficientNet, ConvMixer, MaxViT's MBConv blocks) a float64
forward pass costs 3-8 float32 ones. Written out, a depthwise convolution is a sum
of :math:`k_h k_w` shifted copies of its input, each scaled per channel:

.. math::

    y_{n c i j} = b_c + \sum_{p < k_h,\, q < k_w} w_{c p q}\,
        \bar x_{n c,\, s_h i + d_h p,\, s_w j + d_w q}

(:math:`\bar x` the zero-padded input, :math:`s` the stride, :math:`d` the
dilation; with a channel multiplier :math:`m`, output channel :math:`c` reads input
channel :math:`\lfloor c / m \rfloor`). :class:`ShiftedDepthwise` evaluates
``aten.convolution`` that way for float64 2-D depthwise convolutions: one
``addcmul_`` per kernel tap, over the outputs that tap reaches inside the input
(channels-last where the channels outnumber the output pixels; a strided one reads
one phase of the input per tap). The sum runs in another order than the kernel's,
so the two agree to float64 round-off
(``tests/test_depthwise.py``); every forward pass of a :class:`~wsym.group.verify.Probe`,
its numerical floor included, runs through the same path, so the floor still
measures the round-off of what is compared.

Shapes:
    input ``(N, C, H, W)``, weight ``(m C, 1, k_h, k_w)``, bias ``(m C,)`` or None,
    output ``(N, m C, H_out, W_out)``.

Example:
    >>> import torch
    >>> conv = torch.nn.Conv2d(8, 8, 3, padding=1, groups=8).double()
    >>> x = torch.randn(2, 8, 5, 5, dtype=torch.float64)
    >>> with ShiftedDepthwise():
    ...     y = conv(x)
    >>> bool((y - conv(x)).abs().max() < 1e-12)
    True
"""

from __future__ import annotations

import torch
from torch.utils._python_dispatch import TorchDispatchMode

_CONVOLUTION = torch.ops.aten.convolution.default


class ShiftedDepthwise(TorchDispatchMode):
    """Run float64 2-D depthwise ``aten.convolution`` calls as shifted multiply-adds.

    Every other operation (float32 convolutions, grouped ones with several input
    channels per group, transposed ones) runs unchanged.
    """

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is _CONVOLUTION and not kwargs and _depthwise64(*args):
            return shifted_depthwise(*args[:6])
        return func(*args, **kwargs)


def _depthwise64(x, weight, bias, stride, padding, dilation, transposed, output_padding, groups):
    return (
        x.dtype == torch.float64
        and weight.dtype == torch.float64
        and x.ndim == 4
        and not transposed
        and groups > 1
        and x.shape[1] == groups
        and weight.shape[1] == 1
        and weight.shape[0] % groups == 0
    )


def shifted_depthwise(x, weight, bias, stride, padding, dilation, last=None) -> torch.Tensor:
    """The depthwise convolution of ``x`` with ``weight`` as a sum of shifted products.

    Each tap adds into the outputs whose input lies inside the unpadded ``x``
    (padding contributes zeros, so it is never built). Where the channels
    outnumber the output pixels (or ``last``), the sum runs channels-last (each
    tap's multiply-add then reads whole rows of channels). With a stride, ``x`` is
    first split into its ``s_h s_w`` phases (``x[a::s_h, b::s_w]``), so that every
    tap reads one contiguous window of one phase.
    """
    n, c, h, w = x.shape
    multiplier = weight.shape[0] // c
    if multiplier > 1:  # output channel o reads input channel o // multiplier
        x = x.repeat_interleave(multiplier, dim=1)
    c_out, kh, kw = weight.shape[0], *weight.shape[2:]
    (sh, sw), (ph, pw), (dh, dw) = stride, padding, dilation
    h_out = (h + 2 * ph - dh * (kh - 1) - 1) // sh + 1
    w_out = (w + 2 * pw - dw * (kw - 1) - 1) // sw + 1
    last = c_out >= h_out * w_out if last is None else last
    if last:  # (N, H, W, C), taps (k_h k_w, C)
        x = x.permute(0, 2, 3, 1)
        taps = weight.reshape(c_out, kh * kw).t().contiguous()
        out = x.new_zeros(n, h_out, w_out, c_out)
    else:
        taps = weight.reshape(1, c_out, kh * kw, 1, 1).movedim(2, 0)
        out = x.new_zeros(n, c_out, h_out, w_out)
    at = (lambda t, i, j: t[:, i, j]) if last else (lambda t, i, j: t[:, :, i, j])
    phases = {
        (a, b): at(x, slice(a, None, sh), slice(b, None, sw)).contiguous()
        for a in range(sh)
        for b in range(sw)
    }
    for p in range(kh):
        i0, i1, r = _inside(dh * p - ph, sh, h, h_out)
        for q in range(kw):
            j0, j1, col = _inside(dw * q - pw, sw, w, w_out)
            if i0 < i1 and j0 < j1:
                src = phases[r % sh, col % sw]
                window = at(
                    src, slice(r // sh, r // sh + i1 - i0), slice(col // sw, col // sw + j1 - j0)
                )
                at(out, slice(i0, i1), slice(j0, j1)).addcmul_(window, taps[p * kw + q])
    if last:
        out = out.permute(0, 3, 1, 2).contiguous()
    if bias is not None:
        out.add_(bias.reshape(1, -1, 1, 1))
    return out


def _inside(offset: int, stride: int, size: int, n_out: int) -> tuple[int, int, int]:
    """Outputs ``[lo, hi)`` reading ``stride * i + offset`` in ``[0, size)``; the first input."""
    lo = max(0, -(offset // stride))  # ceil(-offset / stride), for offset < 0
    hi = min(n_out, (size - 1 - offset) // stride + 1) if size - 1 - offset >= 0 else 0
    return lo, hi, stride * lo + offset


def has_depthwise(model: torch.nn.Module) -> bool:
    """Whether ``model`` holds a 2-D depthwise convolution (the probe then takes this path)."""
    return any(
        isinstance(m, torch.nn.Conv2d) and m.groups > 1 and m.groups == m.in_channels
        for m in model.modules()
    )
