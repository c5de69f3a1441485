"""Random architectures for property-based tests: hypothesis strategies over block recipes.

A *recipe* is a plain, printable tuple ``(family, width, blocks, training)``:
``family`` is ``"vector"`` (inputs ``(B, width)``), ``"sequence"`` (``(B, T, width)``,
attention allowed) or ``"conv"`` (``(B, width, L)``, features on the channel axis);
each block is one of

* ``("linear", width, activation)`` -- a linear map (a 1-D convolution of kernel 1
  or 3 in the conv family) and an activation from
  :data:`wsym.models.networks.ACTIVATIONS`;
* ``("norm", kind)`` -- LayerNorm, RMSNorm or BatchNorm (GroupNorm or BatchNorm in
  the conv family);
* ``("gate", width, activation)`` -- ``act(W_g x) * (W_u x)`` (GLU / SwiGLU style);
* ``("attention", heads, head_dim)`` -- :class:`wsym.models.networks.Attention` between
  two linear maps (sequence family only);
* ``("residual", blocks)`` -- ``x + f(x)``, ``f`` the inner blocks, width-preserving;
* ``("concat", blocks_a, blocks_b)`` -- two branches concatenated on the feature axis.

:func:`build` turns a recipe into ``(module, example_inputs)`` (a final linear head
to 2 outputs, pooled over positions); hypothesis shrinks a failing recipe to a
minimal model, printed as the recipe itself.

Example:
    >>> model, x = build(("vector", 3, (("linear", 4, "relu"),), False))
    >>> tuple(model(x).shape)
    (5, 2)
"""

from __future__ import annotations

import torch
from hypothesis import strategies as st
from torch import nn

from wsym.models.networks import ACTIVATIONS, Attention

FAMILIES = ("vector", "sequence", "conv")
NORMS = {
    "vector": ("layer", "rms", "batch"),
    "sequence": ("layer", "rms"),
    "conv": ("group", "batch"),
}
BATCH, POSITIONS = 5, 4


def _linear(family: str, n_in: int, n_out: int, kernel: int = 1) -> nn.Module:
    if family == "conv":
        return nn.Conv1d(n_in, n_out, kernel, padding=kernel // 2)
    return nn.Linear(n_in, n_out)


class _Gate(nn.Module):
    def __init__(self, family, n_in, width, activation):
        super().__init__()
        self.gate, self.up = _linear(family, n_in, width), _linear(family, n_in, width)
        self.act = ACTIVATIONS[activation]()

    def forward(self, x):
        return self.act(self.gate(x)) * self.up(x)


class _Attention(nn.Module):
    def __init__(self, n_in, heads, head_dim):
        super().__init__()
        self.into = nn.Linear(n_in, heads * head_dim)
        self.attn = Attention(heads * head_dim, heads)
        self.back = nn.Linear(heads * head_dim, n_in)

    def forward(self, x):
        return self.back(self.attn(self.into(x)))


class _Residual(nn.Module):
    def __init__(self, inner):
        super().__init__()
        self.inner = inner

    def forward(self, x):
        return x + self.inner(x)


class _Concat(nn.Module):
    def __init__(self, a, b, axis):
        super().__init__()
        self.a, self.b, self.axis = a, b, axis

    def forward(self, x):
        return torch.cat([self.a(x), self.b(x)], dim=self.axis)


def _norm(family: str, kind: str, width: int) -> nn.Module:
    if kind == "layer":
        return nn.LayerNorm(width)
    if kind == "rms":
        return nn.RMSNorm(width, eps=1e-6)
    if kind == "group":
        return nn.GroupNorm(next(g for g in (2, 1) if width % g == 0), width)
    return nn.BatchNorm1d(width)


def _blocks(family: str, width: int, blocks) -> tuple[nn.Sequential, int]:
    """The blocks as one Sequential, and its output width."""
    layers = []
    for block in blocks:
        kind = block[0]
        if kind == "linear":
            _, out, activation = block
            kernel = 3 if family == "conv" and out % 2 else 1
            layers += [_linear(family, width, out, kernel), ACTIVATIONS[activation]()]
            width = out
        elif kind == "norm":
            layers.append(_norm(family, block[1], width))
        elif kind == "gate":
            layers.append(_Gate(family, width, block[1], block[2]))
            width = block[1]
        elif kind == "attention":
            layers.append(_Attention(width, block[1], block[2]))
        elif kind == "residual":
            inner, out = _blocks(family, width, block[1])
            layers.append(_Residual(nn.Sequential(inner, _linear(family, out, width))))
        elif kind == "concat":
            a, wa = _blocks(family, width, block[1])
            b, wb = _blocks(family, width, block[2])
            layers.append(_Concat(a, b, 1 if family == "conv" else -1))
            width = wa + wb
    return nn.Sequential(*layers), width


class Drawn(nn.Module):
    """A drawn architecture: the blocks, pooled over positions, then a linear head."""

    def __init__(self, recipe):
        super().__init__()
        family, width, blocks, _ = recipe
        self.family, self.recipe = family, recipe
        self.body, out = _blocks(family, width, blocks)
        self.head = nn.Linear(out, 2)

    def forward(self, x):
        """Blocks, mean over positions (sequence, conv), head."""
        h = self.body(x)
        if self.family != "vector":
            h = h.mean(dim=2 if self.family == "conv" else 1)
        return self.head(h)


def build(recipe, seed: int = 0) -> tuple[nn.Module, torch.Tensor]:
    """``(module, example_inputs)`` of a recipe, with seeded random weights.

    Norm layers get random affine parameters and (BatchNorm) running statistics,
    so that no group hides behind their identity initialization.
    """
    family, width, _, training = recipe
    gen = torch.Generator().manual_seed(seed)
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = Drawn(recipe)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.LayerNorm | nn.RMSNorm | nn.GroupNorm | nn.BatchNorm1d):
                m.weight.copy_(torch.rand(m.weight.shape, generator=gen) + 0.5)
                if getattr(m, "bias", None) is not None:
                    m.bias.copy_(torch.randn(m.bias.shape, generator=gen))
            if isinstance(m, nn.BatchNorm1d):
                m.running_mean.copy_(torch.randn(m.running_mean.shape, generator=gen))
                m.running_var.copy_(torch.rand(m.running_var.shape, generator=gen) + 0.5)
    model.train(training)
    shape = {"vector": (BATCH, width), "sequence": (BATCH, POSITIONS, width)}
    shape = shape.get(family, (BATCH, width, POSITIONS))
    return model, torch.randn(shape, generator=gen)


ACTIVATION_NAMES = tuple(ACTIVATIONS)
WIDTHS = st.integers(2, 6)


def _block(family: str, depth: int):
    linear = st.tuples(st.just("linear"), WIDTHS, st.sampled_from(ACTIVATION_NAMES))
    norm = st.tuples(st.just("norm"), st.sampled_from(NORMS[family]))
    gate = st.tuples(st.just("gate"), WIDTHS, st.sampled_from(ACTIVATION_NAMES))
    options = [linear, norm, gate]
    if family == "sequence":
        options.append(st.tuples(st.just("attention"), st.integers(1, 2), st.integers(1, 3)))
    if depth > 0:
        inner = _chain(family, depth - 1)
        options.append(st.tuples(st.just("residual"), inner))
        options.append(st.tuples(st.just("concat"), inner, inner))
    return st.one_of(*options)


def _chain(family: str, depth: int):
    return st.lists(_block(family, depth), min_size=1, max_size=3).map(tuple)


@st.composite
def recipes(draw, families=FAMILIES, depth: int = 1, training: bool | None = None):
    """A random recipe (see the module docstring); ``depth`` nests residual/concat blocks."""
    family = draw(st.sampled_from(families))
    flag = draw(st.booleans()) if training is None else training
    return (family, draw(WIDTHS), draw(_chain(family, depth)), flag)


def architectures(families=FAMILIES, depth: int = 1, training: bool | None = None):
    """Strategy of ``(module, example_inputs, recipe)`` for random recipes."""
    return recipes(families, depth, training).map(lambda r: (*build(r), r))


__all__ = ["FAMILIES", "Drawn", "architectures", "build", "recipes"]
