"""Stacked MLPs with a hand-written backward: the fast path of batched zoo training.

``M`` members of one MLP architecture (a :class:`torch.nn.Sequential` of
``Linear`` layers with element-wise activations between them) train as one
stacked model. Layer ``l`` of every member lives in one *augmented* tensor
``A_l`` ``(M, out_l, in_l + 1)`` whose last column is the bias, so with inputs
carrying a trailing column of ones, ``h_aug (M, B, in_l + 1)``,

* forward: ``z_l = h_aug A_l^T`` ``(M, B, out_l)`` (one ``bmm``),
  ``h_{l+1} = act(z_l) * mask_l`` (inverted dropout mask, or none);
* loss: mean softmax cross-entropy per member, summed over members, so
  ``dL/dz_L = (softmax(z_L) - onehot(y)) / B`` (computed on ``z_L^T``
  ``(M, C, B)``: a softmax over a middle axis is far faster than over a short last one);
* backward: ``dL/dA_l = dz_l^T h_aug`` (one ``bmm``: weight and bias gradient
  at once), ``dL/dh_l = dz_l A_l[:, :, :in_l]`` and
  ``dz_{l-1} = act'(z_{l-1}) * mask_{l-1} * dL/dh_l``.

No autograd graph is built: a training step is a dozen batched kernels, which
is several times faster than ``autograd`` on these tiny layers. Every member's
products are computed on their own (batched matmuls), so a member's gradient
does not depend on the others in the stack. :func:`loss_gradients` is checked
against autograd in float64 (``tests/test_zoo_train.py``).

Example:
    >>> from torch import nn
    >>> base = nn.Sequential(nn.Linear(4, 3), nn.ReLU(), nn.Linear(3, 2))
    >>> spec = mlp_spec(base, [])
    >>> state = {k: v.expand(5, *v.shape) for k, v in base.state_dict().items()}
    >>> params = pack(state, spec)
    >>> [tuple(p.shape) for p in params]
    [(5, 3, 5), (5, 2, 4)]
    >>> x, y = with_ones(torch.randn(5, 8, 4)), torch.randint(0, 2, (5, 8))
    >>> [tuple(g.shape) for g in loss_gradients(params, x, y, {}, spec)]
    [(5, 3, 5), (5, 2, 4)]
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F

_aten = torch.ops.aten

#: Activations the fast path differentiates by hand: module type -> name.
ACTIVATIONS = {
    nn.ReLU: "relu",
    nn.Tanh: "tanh",
    nn.GELU: "gelu",
    nn.LeakyReLU: "leaky_relu",
    nn.Sigmoid: "sigmoid",
    nn.Identity: "identity",
}
_FORWARD = {
    "relu": torch.relu,
    "tanh": torch.tanh,
    "gelu": F.gelu,
    "leaky_relu": F.leaky_relu,
    "sigmoid": torch.sigmoid,
    "identity": lambda z: z,
}


@dataclass(frozen=True)
class MLPSpec:
    """A plain MLP: its ``Linear`` names, the activation after each, its dropout sites.

    ``activations[l]`` / ``dropout[l]`` belong to the output of ``layers[l]``
    (``None``: no activation / no dropout there; the last layer has neither).
    """

    layers: tuple[str, ...]
    activations: tuple[str | None, ...]
    dropout: tuple[str | None, ...]


def mlp_spec(base: nn.Module, sites: list[str]) -> MLPSpec | None:
    """The :class:`MLPSpec` of ``base`` if it is a plain MLP, else ``None``.

    A plain MLP is a :class:`torch.nn.Sequential` of ``Linear`` layers with at
    most one default-argument activation after each and no activation after the
    last; ``sites`` (dropout) must be activation modules of it.
    """
    if not isinstance(base, nn.Sequential):
        return None
    layers: list[str] = []
    acts: list[str | None] = []
    drops: list[str | None] = []
    for name, module in base.named_children():
        if isinstance(module, nn.Linear) and module.bias is not None:
            layers.append(name)
            acts.append(None)
            drops.append(None)
        elif type(module) in ACTIVATIONS and layers and acts[-1] is None:
            if isinstance(module, nn.LeakyReLU) and module.negative_slope != 0.01:
                return None
            if isinstance(module, nn.GELU) and module.approximate != "none":
                return None
            acts[-1] = ACTIVATIONS[type(module)]
            drops[-1] = name if name in sites else None
        else:
            return None
    if not layers or acts[-1] is not None or any(s not in drops for s in sites):
        return None
    return MLPSpec(tuple(layers), tuple(acts), tuple(drops))


def pack(state: dict[str, torch.Tensor], spec: MLPSpec) -> list[torch.Tensor]:
    """Stacked state dict ``{name: (M, ...)}`` -> augmented layers ``(M, out, in + 1)``."""
    return [
        torch.cat([state[f"{n}.weight"], state[f"{n}.bias"].unsqueeze(-1)], dim=-1).contiguous()
        for n in spec.layers
    ]


def unpack(params: list[torch.Tensor], spec: MLPSpec) -> dict[str, torch.Tensor]:
    """Augmented layers -> stacked state dict views ``{name.weight, name.bias}``."""
    state = {}
    for name, a in zip(spec.layers, params, strict=True):
        state[f"{name}.weight"] = a[..., :-1]
        state[f"{name}.bias"] = a[..., -1]
    return state


def with_ones(x: torch.Tensor) -> torch.Tensor:
    """``x`` ``(..., d)`` with a trailing column of ones ``(..., d + 1)``."""
    return torch.cat([x, x.new_ones(*x.shape[:-1], 1)], dim=-1)


def activation(name: str, z: torch.Tensor) -> torch.Tensor:
    """The activation ``name`` (a value of :data:`ACTIVATIONS`) applied to ``z``."""
    return _FORWARD[name](z)


def forward(state: dict[str, torch.Tensor], x: torch.Tensor, spec: MLPSpec) -> torch.Tensor:
    """Outputs ``(M, B, C)`` of the stacked members (state dict form) on ``x`` ``(M, B, d)``.

    No dropout: this is the evaluation forward.
    """
    h = x
    for name, act in zip(spec.layers, spec.activations, strict=True):
        weight, bias = state[f"{name}.weight"], state[f"{name}.bias"]
        h = torch.baddbmm(bias.unsqueeze(1), h, weight.transpose(1, 2))
        if act == "relu":
            h.relu_()  # h is fresh: no second (M, B, width) tensor
        elif act is not None:
            h = _FORWARD[act](h)
    return h


def loss_gradients(
    params: list[torch.Tensor],
    x: torch.Tensor,
    y: torch.Tensor,
    masks: dict[str, torch.Tensor],
    spec: MLPSpec,
    out: list[torch.Tensor] | None = None,
) -> list[torch.Tensor]:
    """Gradients of ``sum_m mean_b CE(f_m(x_mb), y_mb)`` w.r.t. the augmented layers.

    Args:
        params: augmented layers ``A_l`` ``(M, out_l, in_l + 1)`` (:func:`pack`).
        x: inputs with a column of ones ``(M, B, d + 1)`` (:func:`with_ones`).
        y: class labels ``(M, B)`` (int64).
        masks: inverted dropout masks ``(M, B, width)`` by dropout site; a site
            missing from ``masks`` is not dropped.
        spec: the MLP (:func:`mlp_spec`).
        out: tensors shaped like ``params`` to write the gradients into, or ``None``.

    Returns:
        ``dL/dA_l``, shaped like ``params`` (``out`` when given).
    """
    return LossGradients(params, spec, y.shape[1], out)(x, y, masks)


class LossGradients:
    """:func:`loss_gradients` of fixed parameter tensors and batch size, buffers made once.

    Training calls the same stack thousands of times, so every intermediate
    (pre-activations, activations with their column of ones, the transposed
    logits, back-propagated errors) gets a buffer here once, and a call is
    only the kernels, each writing into its buffer. ``params`` and ``out``
    are held, not copied: a call sees the parameters' current values.

    Args:
        params: augmented layers ``A_l`` ``(M, out_l, in_l + 1)``.
        spec: the MLP (:func:`mlp_spec`).
        batch: examples per member and call, ``B``.
        out: tensors shaped like ``params`` to write the gradients into, or ``None``.
        mask_rows: the members (a range of rows) that the dropout masks of a call
            belong to, the others having none (as if their masks were all ones).
    """

    def __init__(
        self,
        params: list[torch.Tensor],
        spec: MLPSpec,
        batch: int,
        out: list[torch.Tensor] | None = None,
        mask_rows: slice = slice(None),
    ):
        m, kw = len(params[0]), {"dtype": params[0].dtype}
        self.params, self.spec, self.batch = params, spec, batch
        self.grads = out if out is not None else [torch.empty_like(a) for a in params]
        hidden = params[:-1]
        self.h = [torch.ones(m, batch, a.shape[1] + 1, **kw) for a in hidden]  # h_aug
        z = [torch.empty(m, batch, a.shape[1], **kw) for a in hidden]
        body = [h[..., :-1] for h in self.h]
        self.mask_rows = mask_rows
        # forward, hidden layer i: (A_i^T, z_i, act(z_i) * mask, its masked rows, activation,
        # dropout site)
        self.hidden = [
            (
                a.transpose(1, 2),
                z[i],
                body[i],
                body[i][mask_rows],
                spec.activations[i],
                spec.dropout[i],
            )
            for i, a in enumerate(hidden)
        ]
        classes = params[-1].shape[1]
        self.logits_t = torch.empty(m, classes, batch, **kw)
        self.probs_t = torch.empty(m, classes, batch, **kw)
        self.last_input_t = self.h[-1].transpose(1, 2) if hidden else None
        self.minus_one = torch.full((m, 1, batch), -1.0, **kw)
        # backward, layer i >= 1: (dL/dA_i, h_aug_i, dz_i^T, dz_i, A_i, dh buffer, dh, ...)
        dz = [torch.empty(m, batch, a.shape[1], **kw) for a in hidden]
        errors = [*dz, self.probs_t.transpose(1, 2)]  # dz_i (M, B, out_i), i = 0..last
        self.backward = []
        for i in range(len(params) - 1, 0, -1):
            dh = torch.empty(m, batch, params[i].shape[2], **kw)
            self.backward.append(
                (
                    self.grads[i],
                    self.h[i - 1],
                    errors[i].transpose(1, 2),
                    errors[i],
                    params[i],
                    dh,
                    dh[..., :-1],
                    i - 1,
                    z[i - 1],
                    body[i - 1],
                    dz[i - 1],
                    dz[i - 1][mask_rows],
                )
            )
        self.first_error_t = errors[0].transpose(1, 2)
        self.masks: list[torch.Tensor | None] = [None] * len(hidden)

    def __call__(
        self, x: torch.Tensor, y: torch.Tensor, masks: dict[str, torch.Tensor]
    ) -> list[torch.Tensor]:
        """The gradients (into ``out``) on inputs ``x`` ``(M, B, d + 1)`` and labels ``y``."""
        used = self.masks  # each hidden layer's dropout mask, or None
        h = x
        for i, (weight_t, z, body, masked, act, site) in enumerate(self.hidden):
            torch.bmm(h, weight_t, out=z)
            if act == "relu":
                torch.clamp_min(z, 0.0, out=body)
            else:
                body.copy_(_FORWARD[act](z))
            mask = used[i] = masks.get(site) if site is not None else None
            if mask is not None:
                masked.mul_(mask)
            h = self.h[i]
        # the logits transposed, (M, C, B): softmax over a middle axis is ~20x faster on CPU
        # than over a short last axis
        last_input_t = self.last_input_t if self.hidden else x.transpose(1, 2)
        torch.bmm(self.params[-1], last_input_t, out=self.logits_t)
        probs_t = torch.softmax(self.logits_t, 1, out=self.probs_t)
        probs_t.scatter_add_(1, y.unsqueeze(1), self.minus_one)
        probs_t.mul_(1.0 / self.batch)  # now dL/dz_last, transposed
        for grad, inputs, dz_t, dz, a, dh_buffer, dh, j, z, body, dz_prev, masked in self.backward:
            torch.bmm(dz_t, inputs, out=grad)
            torch.bmm(dz, a, out=dh_buffer)
            act, mask = self.hidden[j][4], used[j]
            if act == "relu":  # body = relu(z) * mask > 0 exactly where the derivative is nonzero
                _aten.threshold_backward.grad_input(dh, body, 0.0, grad_input=dz_prev)
                if mask is not None:
                    masked.mul_(mask)
            else:
                if mask is not None:
                    dh = dh.clone()
                    dh[self.mask_rows] *= mask
                dz_prev.copy_(_activation_backward(act, dh, z))
        grads = self.grads
        torch.bmm(self.first_error_t, x, out=grads[0])
        return grads


def _activation_backward(act: str, grad: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
    """``grad * act'(z)`` for the non-ReLU activations."""
    if act == "tanh":
        return _aten.tanh_backward(grad, torch.tanh(z))
    if act == "sigmoid":
        return _aten.sigmoid_backward(grad, torch.sigmoid(z))
    if act == "gelu":
        return _aten.gelu_backward(grad, z)
    if act == "leaky_relu":
        return _aten.leaky_relu_backward(grad, z, 0.01, False)
    return grad.contiguous()  # identity
