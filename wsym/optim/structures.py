r"""Structured inverse preconditioners :math:`U`, block-diagonal over layers, for learned LLQR.

A model's trainable parameters are split into *blocks*: every module whose own
``weight`` has two or more axes (linear, convolution, embedding) gives one matrix block
:math:`V = [W_{(m, n)} \mid b] \in \mathbb{R}^{m \times n'}` (the weight reshaped to
``(out, rest)``, its bias appended as a last column); every other parameter (norm
gains, positional tables, biases of modules without a matrix) is an elementwise entry.
The structures, from poorest to richest:

===============  ============================================================  ===========
structure        :math:`U V` on a matrix block                                 elsewhere
===============  ============================================================  ===========
``diagonal``     :math:`D \odot V`, :math:`D > 0`                              :math:`d \odot v`
``kfac``         :math:`G V A`, :math:`G, A \succ 0` (:math:`U = A \otimes G`) :math:`d \odot v`
``eigen``        :math:`Q_G [(Q_G^\top V Q_A) \odot S] Q_A^\top`, :math:`S > 0`  :math:`d \odot v`
``dense``        :math:`M \operatorname{vec} V`, :math:`M \succ 0`               :math:`d \odot v`
===============  ============================================================  ===========

``eigen`` is the eigenbasis-corrected Kronecker structure (George et al. 2018): the
eigenbases :math:`Q_A, Q_G` of the learned Kronecker factors with a free positive
scale per eigen-direction; it contains ``kfac`` (:math:`S = \lambda_G \lambda_A^\top`).
``dense`` (one full matrix per block, for blocks of at most :data:`DENSE_LIMIT`
entries) is the richest block-diagonal structure; it contains all the others.

Every structure is *learned* through a parametrization relative to its current value
(``U_0``), so that one inner learning rate means a relative change for every block:
:math:`D = D_0 e^{r}`, :math:`S = S_0 e^{r}`, and for the positive-definite factors
:math:`M = R_0 (I + X)(I + X)^\top R_0^\top` with :math:`R_0` the Cholesky factor of
:math:`M_0` and :math:`X` lower triangular; all raw parameters start at zero.

Shapes:
    ``apply`` maps ``{name: (*shape)}`` to ``{name: (*shape)}``.

Example:
    >>> import torch
    >>> model = torch.nn.Linear(3, 2)
    >>> u = Kronecker(blocks_of(model), 2.0)
    >>> out = u.apply({n: torch.ones_like(p) for n, p in model.named_parameters()})
    >>> out["weight"]  # 2 * I (x) I at the start
    tensor([[2., 2., 2.],
            [2., 2., 2.]])
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from wsym.errors import WsymInputError

Params = dict[str, Tensor]
FACTOR_LIMIT = 2048  # Kronecker factors up to this side; larger blocks stay diagonal
DENSE_LIMIT = 1024  # dense blocks up to this many entries


@dataclass(frozen=True)
class Block:
    """One matrix block: the weight (``(m, ...)``, read as ``(m, n)``) and its bias or ``None``."""

    weight: str
    bias: str | None
    shape: tuple[int, ...]

    @property
    def rows(self) -> int:
        """``m``, the weight's first axis."""
        return self.shape[0]

    @property
    def cols(self) -> int:
        """``n'``: the other axes of the weight, plus one for the bias."""
        return math.prod(self.shape[1:]) + (self.bias is not None)

    def matrix(self, table: Params) -> Tensor:
        """The block ``[W | b]`` of ``table`` as a ``(m, n')`` matrix."""
        w = table[self.weight].reshape(self.rows, -1)
        return w if self.bias is None else torch.cat([w, table[self.bias][:, None]], 1)

    def split(self, matrix: Tensor) -> Params:
        """Inverse of :meth:`matrix`."""
        out = {}
        if self.bias is not None:
            out[self.bias], matrix = matrix[:, -1], matrix[:, :-1]
        out[self.weight] = matrix.reshape(self.shape)
        return out


@dataclass(frozen=True)
class Layout:
    """How the trainable parameters split into matrix blocks and elementwise entries."""

    names: tuple[str, ...]
    blocks: tuple[Block, ...]
    shapes: tuple[tuple[int, ...], ...]

    @property
    def rest(self) -> tuple[str, ...]:
        """Parameters in no block, preconditioned elementwise."""
        covered = {n for b in self.blocks for n in (b.weight, b.bias) if n is not None}
        return tuple(n for n in self.names if n not in covered)

    def shape(self, name: str) -> tuple[int, ...]:
        """Shape of parameter ``name``."""
        return self.shapes[self.names.index(name)]


def blocks_of(model: nn.Module) -> Layout:
    """The :class:`Layout` of ``model``: one block per module with a matrix ``weight``."""
    params = {n: p for n, p in model.named_parameters() if p.requires_grad}
    blocks = []
    for prefix, module in model.named_modules():
        weight = module._parameters.get("weight")
        name = f"{prefix}.weight" if prefix else "weight"
        if weight is None or weight.ndim < 2 or name not in params:
            continue
        bias = module._parameters.get("bias")
        bias_name = f"{prefix}.bias" if prefix else "bias"
        ok = bias is not None and bias.shape == weight.shape[:1] and bias_name in params
        blocks.append(Block(name, bias_name if ok else None, tuple(weight.shape)))
    return Layout(tuple(params), tuple(blocks), tuple(tuple(p.shape) for p in params.values()))


def _positive_definite(m0: Tensor, x: Tensor | None) -> Tensor:
    """``R0 (I + X)(I + X)^T R0^T`` with ``R0 = chol(M0)``, ``X`` lower triangular (or ``M0``)."""
    if x is None:
        return m0
    r0 = _cholesky(m0)
    f = r0 @ (torch.eye(len(m0), dtype=m0.dtype) + torch.tril(x))
    return f @ f.T


def _cholesky(m: Tensor) -> Tensor:
    """Cholesky factor of a symmetric positive-definite ``m``; round-off is cured by a ridge."""
    m = 0.5 * (m + m.T)
    r, info = torch.linalg.cholesky_ex(m)
    if int(info) == 0:
        return r
    lam, q = torch.linalg.eigh(m)
    floor = 1e-12 * max(float(lam.abs().max()), 1e-300)
    return torch.linalg.cholesky((q * lam.clamp_min(floor)) @ q.T)


class Structure:
    """Base: a structured positive-definite :math:`U` with a relative parametrization.

    Subclasses keep their value in tensors (:meth:`state`), build :math:`Ug` from raw
    parameters (:meth:`raw`, zeros = the current value) and average with another
    instance of the same layout (:meth:`average`).
    """

    name = ""

    def __init__(self, layout: Layout, scale: float, dtype=torch.float64):
        self.layout, self.dtype = layout, dtype
        self.diag = {n: torch.full(layout.shape(n), scale, dtype=dtype) for n in layout.rest}

    def raw(self) -> list[Tensor]:
        """Raw parameters of the inner loop, zeros (the current :math:`U`), requiring grad."""
        return [torch.zeros_like(d, requires_grad=True) for d in self.diag.values()]

    def apply(self, grads: Params, raw: list[Tensor] | None = None) -> Params:
        """:math:`U g` at the current value (``raw=None``) or at the raw parameters."""
        extra = None if raw is None else raw[: len(self.diag)]
        out = {}
        for i, (n, d) in enumerate(self.diag.items()):
            d = d if extra is None else d * torch.exp(extra[i])
            out[n] = d.to(grads[n]) * grads[n]
        rest = None if raw is None else raw[len(self.diag) :]
        out.update(self._apply_blocks(grads, rest))
        return {n: out[n] for n in grads}

    def _apply_blocks(self, grads: Params, raw: list[Tensor] | None) -> Params:
        raise NotImplementedError

    def update(self, raw: list[Tensor]) -> None:
        """Set the value to the one the raw parameters describe."""
        with torch.no_grad():
            for d, r in zip(self.diag.values(), raw, strict=False):
                d.mul_(torch.exp(r))
            self._update_blocks(raw[len(self.diag) :])

    def _update_blocks(self, raw: list[Tensor]) -> None:
        raise NotImplementedError

    def scale(self, factor: float) -> None:
        r""":math:`U \leftarrow c\, U`."""
        for d in self.diag.values():
            d.mul_(factor)
        self._scale_blocks(factor)

    def _scale_blocks(self, factor: float) -> None:
        raise NotImplementedError

    def average(self, new: Structure, beta: float) -> None:
        r""":math:`U \leftarrow \beta U + (1 - \beta) U_{new}` (on the factors for ``kfac``)."""
        for n, d in self.diag.items():
            d.mul_(beta).add_(new.diag[n], alpha=1 - beta)
        self._average_blocks(new, beta)

    def _average_blocks(self, new: Structure, beta: float) -> None:
        raise NotImplementedError

    def finite(self) -> bool:
        """Whether every tensor of the value is finite."""
        return all(bool(torch.isfinite(t).all()) for t in _tensors(self.__dict__))

    def copy(self) -> Structure:
        """An independent copy."""
        out = object.__new__(type(self))
        out.__dict__ = {k: _clone(v) for k, v in self.__dict__.items()}
        return out


def _tensors(v):
    if isinstance(v, Tensor):
        yield v
    elif isinstance(v, Structure):
        yield from _tensors(v.__dict__)
    elif isinstance(v, dict):
        for t in v.values():
            yield from _tensors(t)
    elif isinstance(v, tuple):
        for t in v:
            yield from _tensors(t)


def _clone(v):
    if isinstance(v, Tensor):
        return v.clone()
    if isinstance(v, Structure):
        return v.copy()
    if isinstance(v, dict):
        return {k: _clone(t) for k, t in v.items()}
    if isinstance(v, tuple) and v and isinstance(v[0], Tensor):
        return tuple(t.clone() for t in v)
    return v


class Diagonal(Structure):
    r""":math:`U = \operatorname{diag}(d)`, every entry its own positive scale."""

    name = "diagonal"

    def __init__(self, layout: Layout, scale: float, dtype=torch.float64):
        super().__init__(layout, scale, dtype)
        self.blocks = {
            b.weight: torch.full((b.rows, b.cols), scale, dtype=dtype) for b in layout.blocks
        }

    def raw(self):
        """Log-scales, relative to the current value."""
        extra = [torch.zeros_like(d, requires_grad=True) for d in self.blocks.values()]
        return super().raw() + extra

    def _apply_blocks(self, grads, raw):
        out = {}
        for i, b in enumerate(self.layout.blocks):
            d = self.blocks[b.weight]
            d = d if raw is None else d * torch.exp(raw[i])
            out.update(b.split(d.to(grads[b.weight]) * b.matrix(grads)))
        return out

    def _update_blocks(self, raw):
        for d, r in zip(self.blocks.values(), raw, strict=True):
            d.mul_(torch.exp(r))

    def _scale_blocks(self, factor):
        for d in self.blocks.values():
            d.mul_(factor)

    def _average_blocks(self, new, beta):
        for n, d in self.blocks.items():
            d.mul_(beta).add_(new.blocks[n], alpha=1 - beta)


class Kronecker(Structure):
    r""":math:`U = A \otimes G` per block (:math:`UV = G V A`), factors positive definite.

    The factors are balanced after every update (:math:`\operatorname{Tr} A = n'`), so
    that averaging the factors of two preconditioners is well defined.
    """

    name = "kfac"

    def __init__(self, layout: Layout, scale: float, dtype=torch.float64):
        super().__init__(layout, scale, dtype)
        self.blocks = {
            b.weight: (torch.eye(b.cols, dtype=dtype), scale * torch.eye(b.rows, dtype=dtype))
            for b in layout.blocks
        }

    def raw(self):
        """Lower-triangular ``X`` for each factor, relative to the current value."""
        out = super().raw()
        for a, g in self.blocks.values():
            out += [torch.zeros_like(t, requires_grad=True) for t in (a, g)]
        return out

    def factors(self, raw: list[Tensor] | None = None) -> dict[str, tuple[Tensor, Tensor]]:
        """``{weight: (A, G)}`` at the current value or at ``raw``."""
        out = {}
        for i, (n, (a, g)) in enumerate(self.blocks.items()):
            xa, xg = (None, None) if raw is None else (raw[2 * i], raw[2 * i + 1])
            out[n] = (_positive_definite(a, xa), _positive_definite(g, xg))
        return out

    def _apply_blocks(self, grads, raw):
        out = {}
        factors = self.factors(raw)
        for b in self.layout.blocks:
            a, g = factors[b.weight]
            v = b.matrix(grads)
            out.update(b.split((g @ v.to(a) @ a).to(v)))
        return out

    def _update_blocks(self, raw):
        for n, (a, g) in self.factors(raw).items():
            self.blocks[n] = _balanced(a.detach(), g.detach())

    def _scale_blocks(self, factor):
        self.blocks = {n: (a, factor * g) for n, (a, g) in self.blocks.items()}

    def _average_blocks(self, new, beta):
        self.blocks = {
            n: (beta * a + (1 - beta) * new.blocks[n][0], beta * g + (1 - beta) * new.blocks[n][1])
            for n, (a, g) in self.blocks.items()
        }


def _balanced(a: Tensor, g: Tensor) -> tuple[Tensor, Tensor]:
    t = float(torch.diagonal(a).mean())
    return a / t, g * t


class Eigen(Structure):
    r"""Eigenbasis-corrected Kronecker: a positive scale per eigen-direction of ``A (x) G``.

    Holds a :class:`Kronecker` (whose eigenbases :math:`Q_A, Q_G` define the basis) and
    the scales :math:`S` (``(m, n')`` per block). :meth:`rebase` moves to the bases of
    new factors, projecting :math:`S` onto them:
    :math:`S \leftarrow (R_G \odot R_G)^\top S (R_A \odot R_A)` with
    :math:`R = Q_{old}^\top Q_{new}` (the diagonal of the old :math:`U` in the new basis).
    """

    name = "eigen"

    def __init__(self, layout: Layout, scale: float, dtype=torch.float64):
        super().__init__(layout, scale, dtype)
        self.kron = Kronecker(layout, scale, dtype)
        self.bases = {
            b.weight: (torch.eye(b.cols, dtype=dtype), torch.eye(b.rows, dtype=dtype))
            for b in layout.blocks
        }
        self.blocks = {
            b.weight: torch.full((b.rows, b.cols), scale, dtype=dtype) for b in layout.blocks
        }

    def rebase(self, kron: Kronecker) -> None:
        """Take the eigenbases of ``kron``'s factors; project the scales onto them."""
        for n, (a, g) in kron.blocks.items():
            qa_old, qg_old = self.bases[n]
            qa, qg = torch.linalg.eigh(a)[1], torch.linalg.eigh(g)[1]
            ra, rg = qa_old.T @ qa, qg_old.T @ qg
            self.blocks[n] = (rg * rg).T @ self.blocks[n] @ (ra * ra)
            self.bases[n] = (qa, qg)
        self.kron = kron

    def reset_scales(self) -> None:
        """Set :math:`S` to the eigenvalues of the Kronecker factors (``U = A (x) G``)."""
        for n, (a, g) in self.kron.blocks.items():
            qa, qg = self.bases[n]
            lam_a = torch.diagonal(qa.T @ a @ qa).clamp_min(1e-30)
            lam_g = torch.diagonal(qg.T @ g @ qg).clamp_min(1e-30)
            self.blocks[n] = lam_g[:, None] * lam_a[None, :]

    def raw(self):
        """Log-scales of :math:`S`, relative to the current value."""
        extra = [torch.zeros_like(s, requires_grad=True) for s in self.blocks.values()]
        return super().raw() + extra

    def _apply_blocks(self, grads, raw):
        out = {}
        for i, b in enumerate(self.layout.blocks):
            qa, qg = self.bases[b.weight]
            s = self.blocks[b.weight]
            s = s if raw is None else s * torch.exp(raw[i])
            v = b.matrix(grads).to(qa)
            out.update(b.split((qg @ ((qg.T @ v @ qa) * s) @ qa.T).to(grads[b.weight])))
        return out

    def _update_blocks(self, raw):
        for s, r in zip(self.blocks.values(), raw, strict=True):
            s.mul_(torch.exp(r))

    def _scale_blocks(self, factor):
        for s in self.blocks.values():
            s.mul_(factor)
        self.kron.scale(factor)

    def _average_blocks(self, new, beta):
        kron = self.kron.copy()
        kron.average(new.kron, beta)
        other = new.copy()
        other.rebase(kron)
        self.rebase(kron)
        for n, s in self.blocks.items():
            s.mul_(beta).add_(other.blocks[n], alpha=1 - beta)


class Dense(Structure):
    """One positive-definite matrix per block (``vec`` row-major), for small blocks only."""

    name = "dense"

    def __init__(self, layout: Layout, scale: float, dtype=torch.float64):
        super().__init__(layout, scale, dtype)
        for b in layout.blocks:
            if b.rows * b.cols > DENSE_LIMIT:
                raise WsymInputError(
                    f"the dense structure needs blocks of at most {DENSE_LIMIT} entries and "
                    f"{b.weight} has {b.rows * b.cols}; use 'eigen' or 'kfac'"
                )
        self.blocks = {
            b.weight: scale * torch.eye(b.rows * b.cols, dtype=dtype) for b in layout.blocks
        }

    def raw(self):
        """Lower-triangular ``X`` per block, relative to the current value."""
        extra = [torch.zeros_like(m, requires_grad=True) for m in self.blocks.values()]
        return super().raw() + extra

    def _apply_blocks(self, grads, raw):
        out = {}
        for i, b in enumerate(self.layout.blocks):
            m = _positive_definite(self.blocks[b.weight], None if raw is None else raw[i])
            v = b.matrix(grads)
            out.update(b.split((m @ v.reshape(-1).to(m)).reshape(v.shape).to(v)))
        return out

    def _update_blocks(self, raw):
        for (n, m), x in zip(list(self.blocks.items()), raw, strict=True):
            self.blocks[n] = _positive_definite(m, x).detach()

    def _scale_blocks(self, factor):
        for m in self.blocks.values():
            m.mul_(factor)

    def _average_blocks(self, new, beta):
        for n, m in self.blocks.items():
            m.mul_(beta).add_(new.blocks[n], alpha=1 - beta)


STRUCTURES = {s.name: s for s in (Diagonal, Kronecker, Eigen, Dense)}


def check_factors(layout: Layout, structure: str) -> None:
    """:class:`WsymInputError` when a Kronecker factor of ``layout`` is too large."""
    if structure in ("kfac", "eigen"):
        for b in layout.blocks:
            if max(b.rows, b.cols) > FACTOR_LIMIT:
                raise WsymInputError(
                    f"{b.weight} has a {b.rows} x {b.cols} block, larger than the Kronecker "
                    f"factors' limit {FACTOR_LIMIT}; use 'diagonal'"
                )
