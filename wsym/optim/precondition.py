r"""Fisher-estimated inverse preconditioners :math:`U` (LLQR's ``fisher-*`` options).

LLQR (Dufort-Labbé et al. 2026) *learns* a block-diagonal inverse preconditioner
by minimizing the LQR objective of the step :math:`-U g` (:mod:`wsym.optim.learned`,
the default of :class:`~wsym.optim.LLQR` and :class:`~wsym.optim.LLQRSAM`). The
classes here *estimate* it instead, as wsym did before: :math:`U` is the damped
inverse of a structured approximation of the Fisher (equal to the GGN for
cross-entropy), with labels sampled from the model (the true Fisher, not the
empirical one; :mod:`wsym.sharpness.curvature`):

* :class:`DiagonalFisher`: :math:`U = (\hat F + \delta)^{-1}` with the diagonal Fisher;
* :class:`KroneckerFisher`: per ``nn.Linear``, :math:`U = (A \otimes G + \delta I)^{-1}`
  with the K-FAC factors (exact damping, through cached eigendecompositions), the
  diagonal one elsewhere (convolutions, norms, embeddings);
* :class:`FixedDiagonal`: a given :math:`U` (quadratic models, experiments).

These are the structured solutions K-FAC and diagonal natural gradient use; they
are not the minimizers of the LQR objective within each structure, which the
learned preconditioner approximates (``docs/llqr.md``). The damping is relative:
:math:`\delta = \text{damping} \times m` with :math:`m = \operatorname{Tr}\hat F / P` the
mean curvature over all ``P`` parameters, so it does not depend on the loss scale.
Scale of :math:`U` (``normalize``):

* ``"curvature"`` (default): :math:`U = (m + \delta)(\hat F + \delta)^{-1}`, equal to 1
  in directions of mean curvature, below 1 in sharper ones, at most
  :math:`1 + 1/\text{damping}` in flat ones, so the base optimizer's learning rate
  keeps its meaning for typical directions;
* ``"trace"``: :math:`U / (\operatorname{Tr} U / P)`, mean eigenvalue 1 (dominated by
  the flattest, damped directions: it shrinks the informative ones);
* ``None``: the plain inverse :math:`(\hat F + \delta)^{-1}`.

Refresh every ``K`` steps as a slow moving average (LLQR: :math:`\beta \approx 0.95`):
diagonal, :math:`U \leftarrow \beta U + (1-\beta) U_{new}`; K-FAC, on the factors
:math:`A, G` (an average of Kronecker inverses is not Kronecker). The first
estimate is taken as is.

Shapes:
    ``apply`` maps ``{name: (*shape)}`` to ``{name: (*shape)}``.

Example:
    >>> import torch
    >>> u = FixedDiagonal({"w": torch.tensor([2.0, 0.5])})
    >>> u.apply({"w": torch.tensor([1.0, 1.0])})
    {'w': tensor([2.0000, 0.5000])}
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from wsym.errors import WsymInputError
from wsym.sharpness.curvature.fisher import diagonal_fisher
from wsym.sharpness.curvature.kfac import kfac_factors

Params = dict[str, Tensor]
NORMALIZE = ("curvature", "trace", None)


class Preconditioner:
    """Base: :meth:`estimate` refreshes :math:`U` from a batch, :meth:`apply` returns ``U g``."""

    def __init__(
        self,
        beta: float = 0.95,
        damping: float = 0.1,
        samples: int = 1,
        normalize: str | None = "curvature",
    ):
        if not isinstance(beta, int | float) or not 0 <= beta < 1:
            raise WsymInputError(f"beta must be in [0, 1), got {beta!r}; pass e.g. beta=0.95")
        if not isinstance(damping, int | float) or not damping > 0:
            raise WsymInputError(f"damping must be > 0, got {damping!r}; pass e.g. damping=0.1")
        if normalize not in NORMALIZE:
            raise WsymInputError(
                f"normalize must be 'curvature', 'trace' or None, got {normalize!r}"
            )
        self.beta, self.damping, self.samples, self.normalize = beta, damping, samples, normalize
        self.refreshes = 0

    def estimate(
        self, model: nn.Module, params: Params, inputs: Any, output_grad: Tensor | None = None
    ) -> None:
        """Refresh :math:`U` at ``params`` from a batch of ``inputs`` (a moving average).

        ``output_grad``, the loss's gradient with respect to the outputs of that batch,
        is used by learned preconditioners (:mod:`wsym.optim.learned`); the Fisher
        estimates ignore it (they sample labels from the model).
        """
        raise NotImplementedError

    def apply(self, grads: Params) -> Params:
        """:math:`U g`."""
        raise NotImplementedError

    def _average(self, old, new):
        return new if old is None else self.beta * old + (1 - self.beta) * new

    def _fisher(self, model: nn.Module, params: Params, inputs: Any) -> Params:
        try:
            return diagonal_fisher(model, [(inputs, None)], self.samples, self.refreshes, params)
        except ValueError as err:
            raise WsymInputError(f"the Fisher preconditioner needs a classifier: {err}") from err


def finite(params: Params) -> bool:
    """Whether every tensor of ``params`` is finite (a diverged run's refresh is skipped)."""
    return all(bool(torch.isfinite(p).all()) for p in params.values())


class FixedDiagonal(Preconditioner):
    """A given diagonal :math:`U` (``{name: tensor}``, positive); never refreshed."""

    def __init__(self, diagonal: Params):
        super().__init__()
        if any(not bool((u > 0).all()) for u in diagonal.values()):
            raise WsymInputError("FixedDiagonal needs a positive diagonal; pass U = 1 / curvature")
        self.diagonal = diagonal

    def estimate(self, model, params, inputs, output_grad=None):
        """No refresh."""

    def apply(self, grads):
        """:math:`U g`."""
        return {n: self.diagonal[n].to(g) * g for n, g in grads.items()}


class DiagonalFisher(Preconditioner):
    r""":math:`U = (\hat F + \delta)^{-1}`, sampled-label diagonal Fisher (module docstring)."""

    def __init__(self, **kwargs: Any):
        super().__init__(**kwargs)
        self.diagonal: Params | None = None

    def estimate(self, model, params, inputs, output_grad=None):
        """Refresh the diagonal: EMA of the normalized inverse (skipped on non-finite weights)."""
        if not finite(params):
            return
        fisher = self._fisher(model, params, inputs)
        mean = torch.cat([f.reshape(-1) for f in fisher.values()]).mean()
        new = {n: 1.0 / (f + self.damping * mean) for n, f in fisher.items()}
        if self.normalize == "curvature":
            new = {n: u * (1 + self.damping) * mean for n, u in new.items()}
        elif self.normalize == "trace":
            total = torch.cat([u.reshape(-1) for u in new.values()]).mean()
            new = {n: u / total for n, u in new.items()}
        old = self.diagonal
        self.diagonal = {
            n: self._average(None if old is None else old[n], u) for n, u in new.items()
        }
        self.refreshes += 1

    def apply(self, grads):
        """:math:`U g`."""
        return {n: self.diagonal[n].to(g) * g for n, g in grads.items()}


class KroneckerFisher(Preconditioner):
    r"""K-FAC :math:`U = (A \otimes G + \delta I)^{-1}` per ``nn.Linear``, diagonal elsewhere."""

    def __init__(self, **kwargs: Any):
        super().__init__(**kwargs)
        self.factors: dict[str, list] = {}  # module -> [weight, bias, A, G]
        self.rest: Params | None = None  # diagonal Fisher of the other parameters (averaged)
        self.eigen: dict[str, tuple] = {}
        self.scale = 1.0

    def estimate(self, model, params, inputs, output_grad=None):
        """Refresh: EMA of the factors (and of the diagonal Fisher elsewhere), then eigh.

        Skipped (the current :math:`U` kept) when the weights are not finite: a diverged run.
        """
        if not finite(params):
            return
        try:
            new = kfac_factors(model, [(inputs, None)], self.samples, self.refreshes, params)
        except ValueError as err:
            raise WsymInputError(f"the K-FAC preconditioner needs a classifier: {err}") from err
        for m, f in new.items():
            old = self.factors.get(m)
            A = self._average(None if old is None else old[2], f.A)
            G = self._average(None if old is None else old[3], f.G)
            self.factors[m] = [f.weight, f.bias, A, G]
        covered = {n for f in self.factors.values() for n in f[:2] if n is not None}
        rest = {n: p for n, p in params.items() if n not in covered}
        if rest:
            fisher = self._fisher(model, rest, inputs)
            self.rest = {
                n: self._average(None if self.rest is None else self.rest[n], f)
                for n, f in fisher.items()
            }
        self._decompose()
        self.refreshes += 1

    def _decompose(self) -> None:
        spectra, curvature, count = {}, 0.0, 0
        for m, (_, _, A, G) in self.factors.items():
            lam_a, u_a = torch.linalg.eigh(A)
            lam_g, u_g = torch.linalg.eigh(G)
            lam = lam_g.clamp_min(0)[:, None] * lam_a.clamp_min(0)[None, :]
            spectra[m] = (u_a, u_g, lam)
            curvature, count = curvature + float(lam.sum()), count + lam.numel()
        rest = self.rest or {}
        curvature += float(sum(f.sum() for f in rest.values()))
        count += sum(f.numel() for f in rest.values())
        mean = curvature / max(count, 1)
        delta = self.damping * mean
        self.eigen = {m: (u_a, u_g, lam + delta) for m, (u_a, u_g, lam) in spectra.items()}
        self.rest_inverse = {n: 1.0 / (f + delta) for n, f in rest.items()}
        if self.normalize == "curvature":
            self.scale = (1 + self.damping) * mean
        elif self.normalize == "trace":
            trace = sum(float((1.0 / d).sum()) for _, _, d in self.eigen.values())
            trace += float(sum(u.sum() for u in self.rest_inverse.values()))
            self.scale = count / trace
        else:
            self.scale = 1.0

    def apply(self, grads):
        """:math:`U g`, blockwise."""
        out = {
            n: self.scale * self.rest_inverse[n].to(g) * g
            for n, g in grads.items()
            if n in self.rest_inverse
        }
        for m, (weight, bias, _, _) in self.factors.items():
            u_a, u_g, denom = self.eigen[m]
            V = grads[weight]
            if bias is not None:
                V = torch.cat([V, grads[bias].unsqueeze(-1)], -1)
            V = V.to(u_a)
            solved = self.scale * (u_g @ ((u_g.T @ V @ u_a) / denom) @ u_a.T)
            if bias is not None:
                out[bias] = solved[:, -1].to(grads[bias])
                solved = solved[:, :-1]
            out[weight] = solved.to(grads[weight])
        return {n: out.get(n, g) for n, g in grads.items()}


PRECONDITIONERS = {"diagonal": DiagonalFisher, "kfac": KroneckerFisher}
