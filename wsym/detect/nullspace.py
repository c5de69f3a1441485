"""Exact nullspaces of the exponent relations (rationals for scales, GF(2) for signs)."""

from __future__ import annotations

from fractions import Fraction
from math import gcd, lcm


def _collapse(variables, rows, modulus: int | None):
    """Merge variables tied by two-term rows; return (rep, sign, zero set, remaining rows)."""
    parent = {v: v for v in variables}
    sign = {v: 1 for v in variables}

    def find(v):
        s = 1
        while parent[v] != v:
            s *= sign[v]
            v = parent[v]
        return v, s

    zeros, rest = set(), []
    for row in rows:
        row = {k: c for k, c in row.items() if (c % modulus if modulus else c)}
        if len(row) == 1:
            zeros.add(next(iter(row)))
        elif len(row) == 2 and (
            modulus or abs(list(row.values())[0]) == abs(list(row.values())[1])
        ):
            (a, ca), (b, cb) = row.items()
            (ra, sa), (rb, sb) = find(a), find(b)
            rel = 1 if modulus else (-1 if ca == cb else 1)  # e_a = rel * e_b
            if ra != rb:
                parent[rb] = ra
                sign[rb] = sa * rel * sb
            elif sa != rel * sb:
                zeros.add(a)
        elif row:
            rest.append(row)
    rep = {v: find(v) for v in variables}
    zero_reps = {rep[z][0] for z in zeros}
    reduced = []
    for row in rest:
        r: dict = {}
        for k, c in row.items():
            rk, s = rep[k]
            if rk in zero_reps:
                continue
            r[rk] = r.get(rk, 0) + c * s
        r = {k: c for k, c in r.items() if (c % modulus if modulus else c)}
        if r:
            reduced.append(r)
    return rep, zero_reps, reduced


def _rref_nullspace(cols, rows, modulus: int | None):
    """Nullspace basis of ``rows`` (dicts over ``cols``), one vector per free column."""
    idx = {c: i for i, c in enumerate(cols)}
    mat = []
    for row in rows:
        vec = [Fraction(0)] * len(cols) if not modulus else [0] * len(cols)
        for k, c in row.items():
            vec[idx[k]] += c if not modulus else c % modulus
        mat.append(vec)
    pivots, r = [], 0
    for c in range(len(cols)):
        pr = next(
            (i for i in range(r, len(mat)) if (mat[i][c] % modulus if modulus else mat[i][c])), None
        )
        if pr is None:
            continue
        mat[r], mat[pr] = mat[pr], mat[r]
        if not modulus:
            piv = mat[r][c]
            mat[r] = [x / piv for x in mat[r]]
        for i in range(len(mat)):
            if i != r and (mat[i][c] % modulus if modulus else mat[i][c]):
                f = mat[i][c]
                mat[i] = [
                    (x - f * y) % modulus if modulus else x - f * y
                    for x, y in zip(mat[i], mat[r], strict=True)
                ]
        pivots.append(c)
        r += 1
    free = [c for c in range(len(cols)) if c not in pivots]
    basis = []
    for f in free:
        vec = [Fraction(0)] * len(cols)
        vec[f] = Fraction(1)
        for row_i, pc in enumerate(pivots):
            vec[pc] = -mat[row_i][f] if not modulus else (-mat[row_i][f]) % modulus
        basis.append(vec)
    return basis


def nullspace(variables, rows, modulus: int | None = None) -> list[dict]:
    """Integer basis of {e : sum_k row[k] e_k = 0 for every row}, over Q or GF(modulus)."""
    variables = list(variables)
    rep, zero_reps, reduced = _collapse(variables, rows, modulus)
    cols = sorted({r for r, _ in rep.values() if r not in zero_reps}, key=variables.index)
    out = []
    for vec in _rref_nullspace(cols, reduced, modulus):
        full = {}
        for v in variables:
            rk, s = rep[v]
            if rk in zero_reps:
                continue
            x = vec[cols.index(rk)] * s
            if modulus:
                x = int(x) % modulus
            if x:
                full[v] = x
        out.append(full)
    return [_integral(v) for v in out] if not modulus else out


def _integral(vec: dict) -> dict:
    if not vec:
        return vec
    den = lcm(*(Fraction(x).denominator for x in vec.values()))
    ints = {k: int(Fraction(x) * den) for k, x in vec.items()}
    g = 0
    for x in ints.values():
        g = gcd(g, abs(x))
    first = next(iter(ints.values()))
    s = 1 if first > 0 else -1
    return {k: s * x // g for k, x in ints.items()}


def row_basis(vectors: list[dict], modulus: int | None = None) -> list[dict]:
    """A reduced basis of the span of ``vectors`` (row echelon form, integral)."""
    keys = sorted({k for v in vectors for k in v}, key=str)
    idx = {k: i for i, k in enumerate(keys)}
    mat = []
    for v in vectors:
        row = [Fraction(0)] * len(keys)
        for k, x in v.items():
            row[idx[k]] = Fraction(x) if not modulus else Fraction(int(x) % modulus)
        mat.append(row)
    out, r = [], 0
    for c in range(len(keys)):
        pr = next(
            (i for i in range(r, len(mat)) if (int(mat[i][c]) % modulus if modulus else mat[i][c])),
            None,
        )
        if pr is None:
            continue
        mat[r], mat[pr] = mat[pr], mat[r]
        if not modulus:
            mat[r] = [x / mat[r][c] for x in mat[r]]
        for i in range(len(mat)):
            if i != r and (int(mat[i][c]) % modulus if modulus else mat[i][c]):
                f = mat[i][c]
                mat[i] = [
                    Fraction(int(x - f * y) % modulus) if modulus else x - f * y
                    for x, y in zip(mat[i], mat[r], strict=True)
                ]
        r += 1
    for row in mat[:r]:
        vec = {keys[i]: x for i, x in enumerate(row) if x}
        out.append(_integral(vec) if not modulus else {k: int(x) for k, x in vec.items()})
    return out
