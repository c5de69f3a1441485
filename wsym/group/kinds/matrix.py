"""Matrix kinds: one invertible ``h x h`` matrix ``M`` per index value, on the class axis.

Rows of parity 0 transform as ``x -> x M``, rows of parity 1 as ``x -> x M^-T``,
so a GL block ``(G, H)`` used through ``G H^T`` becomes ``(G M, H M^-T)``
(the spec's ``G A^-1, H A^T`` with ``A = M^-1``). ``orthogonal`` restricts to
``M^T M = I`` (``SO(h)`` when ``special``). Composition: ``compose(a, b) = b @ a``
(``x M_b`` first, then ``M_a``), inverse ``M^-1``.

One-parameter subgroups ``M = matrix_exp(t a)``, ``a (*index, h, h)`` (skew for
orthogonal groups: coefficients are projected onto skew matrices first). The
generator is ``x a`` on parity-0 rows and ``-x a^T`` on parity-1 rows (summed
over the class axes of a block), its adjoint
``sum_parity0 X^T Y - sum_parity1 Y^T X`` over the blocks' ``(rows, h)`` views
(projected onto skew matrices for orthogonal groups).

Example:
    >>> import torch
    >>> from wsym.group.spec import Group
    >>> g = Group("gl", 2, 3, ("w",), cls=0, index=(1,))
    >>> GL().notation(g), GL().dimension(g), Orthogonal().dimension(g)
    ('GL(2)^3', 12, 3)
"""

from __future__ import annotations

import string

import torch
from torch import Tensor

from wsym.group.kinds.base import Kind, index_sizes, log_uniform, random_orthogonal
from wsym.group.layout import blocks_of, map_blocks
from wsym.group.spec import Group, SymmetrySpec


class GL(Kind):
    """``GL(h)`` per index: invertible changes of basis between two linear maps."""

    name = "gl"
    continuous = True
    matrix = True

    def symbol(self, group: Group) -> str:
        """``GL(h)``."""
        return f"GL({group.size})"

    def copy_dimension(self, h: int) -> int:
        """``h^2``."""
        return h * h

    def sample(self, spec: SymmetrySpec, group: Group, gen, scale=(1e-2, 1e2), moving=False):
        """``U diag(s) V^T``: Haar ``U, V``, log-uniform singular values in ``scale``."""
        idx, n = index_sizes(spec, group), group.size
        u, v = random_orthogonal(idx, n, gen), random_orthogonal(idx, n, gen)
        return (u * log_uniform((*idx, 1, n), scale, gen)) @ v.transpose(-1, -2)

    def inverse(self, group: Group, value):
        """``M^-1``."""
        return torch.linalg.inv(value)

    def compose(self, group: Group, a, b):
        """``M_b @ M_a``: ``x M_b`` first, then ``M_a`` (and ``M^-T`` likewise)."""
        return b @ a

    def block_fn(self, group: Group, value):
        """``x M`` on parity-0 class axes, ``x M^-T`` on parity-1 ones."""
        contra = torch.linalg.inv(value).transpose(-1, -2)

        def fn(t, lv):
            for ax, leaf in enumerate(lv):
                if leaf.cls == group.cls:
                    t = on_axis(t, lv, ax, group, value if leaf.parity == 0 else contra)
            return t

        return fn

    # -- infinitesimal action -------------------------------------------
    def coefficient_shape(self, spec: SymmetrySpec, group: Group) -> tuple[int, ...]:
        """``(*index, h, h)``."""
        return (*index_sizes(spec, group), group.size, group.size)

    def project(self, a: Tensor) -> Tensor:
        """The coefficient space's projection (identity for GL)."""
        return a

    def exp(self, group: Group, a: Tensor):
        """``matrix_exp(a)``."""
        return torch.linalg.matrix_exp(self.project(a))

    def generator(self, spec: SymmetrySpec, group: Group, state: dict, a: Tensor) -> dict:
        """``x a`` on parity-0 rows, ``-x a^T`` on parity-1 rows."""
        a = self.project(a)
        mats = (a, -a.transpose(-1, -2))

        def fn(t, lv):
            out = torch.zeros_like(t)
            for ax, leaf in enumerate(lv):
                if leaf.cls == group.cls:
                    out = out + on_axis(t, lv, ax, group, mats[leaf.parity])
            return out

        return {
            key: map_blocks(spec, key, state[key], fn, group.cls, zero=True) for key in group.params
        }

    def generator_adjoint(self, spec: SymmetrySpec, group: Group, state: dict, y: dict) -> Tensor:
        """``sum X^T Y`` (parity 0) ``- sum Y^T X`` (parity 1) over the class axes."""
        out = 0
        for key in group.params:
            if key not in y:
                continue
            pairs = zip(blocks_of(spec, key, state[key]), blocks_of(spec, key, y[key]), strict=True)
            for (x, lv), (yb, _) in pairs:
                for ax, leaf in enumerate(lv):
                    if leaf.cls == group.cls:
                        c = _cross(x, yb, lv, ax, group)
                        out = out + (c if leaf.parity == 0 else -c.transpose(-1, -2))
        if isinstance(out, int):
            out = torch.zeros(self.coefficient_shape(spec, group), dtype=torch.float64)
        return self.project(out)


class Orthogonal(GL):
    """``O(h)`` (``SO(h)`` when ``special``) per index: rotations of a block."""

    name = "orthogonal"
    self_dual = True

    def symbol(self, group: Group) -> str:
        """``O(h)`` or ``SO(h)``."""
        return f"SO({group.size})" if group.special else f"O({group.size})"

    def copy_dimension(self, h: int) -> int:
        """``h (h - 1) / 2``."""
        return h * (h - 1) // 2

    def sample(self, spec: SymmetrySpec, group: Group, gen, scale=(1e-2, 1e2), moving=False):
        """Haar-random (special) orthogonal matrices."""
        return random_orthogonal(index_sizes(spec, group), group.size, gen, group.special)

    def project(self, a: Tensor) -> Tensor:
        """The skew-symmetric part ``(a - a^T) / 2``."""
        return 0.5 * (a - a.transpose(-1, -2))


def _subscripts(lv, ax: int, group: Group) -> tuple[str, str, str]:
    """Einsum letters: the block's, the matrix's (index, class axis, new axis), new axis."""
    idx_axes = [next(j for j, x in enumerate(lv) if x.cls == c) for c in group.index]
    letters = string.ascii_letters[: len(lv)]
    new = string.ascii_letters[len(lv)]
    return letters, "".join(letters[j] for j in idx_axes) + letters[ax] + new, new


def on_axis(t: Tensor, lv, ax: int, group: Group, mat: Tensor) -> Tensor:
    """``t`` with its class axis ``ax`` multiplied by ``mat`` (one per index value)."""
    letters, m_sub, new = _subscripts(lv, ax, group)
    res = letters[:ax] + new + letters[ax + 1 :]
    return torch.einsum(f"{letters},{m_sub}->{res}", t, mat.to(t.dtype))


def _cross(x: Tensor, y: Tensor, lv, ax: int, group: Group) -> Tensor:
    """``(*index, h, h)``: ``X^T Y`` over the block's other axes (``x`` on ``ax``, ``y`` new)."""
    letters, m_sub, new = _subscripts(lv, ax, group)
    y_sub = letters[:ax] + new + letters[ax + 1 :]
    return torch.einsum(f"{letters},{y_sub}->{m_sub}", x, y)
