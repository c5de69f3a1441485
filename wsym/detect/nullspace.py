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


def rref(rows, order, modulus: int | None) -> dict:
    """Reduced row echelon form of sparse ``rows`` (dicts), columns ranked by ``order``.

    Returns ``{pivot column: row}`` with ``row[pivot] == 1`` and every row zero in
    the other pivot columns: the unique RREF, built one row at a time and touching
    only the entries that are there (the relations of a DenseNet have thousands of
    columns and a handful of entries per row).
    """
    rank = {k: i for i, k in enumerate(order)}
    pivots: dict = {}
    for raw in rows:
        row = _clean({k: (c % modulus if modulus else c) for k, c in raw.items()}, modulus)
        for c in [k for k in row if k in pivots]:  # pivot rows are reduced: one pass
            if c in row:
                row = _axpy(row, pivots[c], -row[c], modulus)
        if not row:
            continue
        c = min(row, key=rank.__getitem__)
        inv = pow(int(row[c]), -1, modulus) if modulus else _reciprocal(row[c])
        row = _clean(
            {k: (v * inv % modulus if modulus else v * inv) for k, v in row.items()}, modulus
        )
        for pc, prow in pivots.items():
            if c in prow:
                pivots[pc] = _axpy(prow, row, -prow[c], modulus)
        pivots[c] = row
    return pivots


def _reciprocal(x):
    """``1 / x`` exactly: an int for ``x = +-1`` (most pivots), else a Fraction.

    Rows stay Python ints until a pivot other than +-1 divides them (ints and
    Fractions mix exactly): Fraction arithmetic was most of solving a DenseNet.
    """
    return int(x) if x in (1, -1) else 1 / Fraction(x)


def _clean(row: dict, modulus: int | None) -> dict:
    return {k: v for k, v in row.items() if v}


def _axpy(a: dict, b: dict, f, modulus: int | None) -> dict:
    """``a + f b`` (mod ``modulus``), zeros dropped."""
    out = dict(a)
    for k, v in b.items():
        x = out.get(k, 0) + f * v
        out[k] = x % modulus if modulus else x
    return _clean(out, modulus)


def _rref_nullspace(cols, rows, modulus: int | None) -> list[dict]:
    """Nullspace basis of ``rows`` (dicts over ``cols``), one vector per free column."""
    pivots = rref(rows, cols, modulus)
    basis = {f: {f: Fraction(1)} for f in cols if f not in pivots}
    for pc, row in pivots.items():
        for f, x in row.items():
            if f != pc:
                basis[f][pc] = (-x) % modulus if modulus else -x
    return [basis[f] for f in cols if f in basis]


def nullspace(variables, rows, modulus: int | None = None) -> list[dict]:
    """Integer basis of {e : sum_k row[k] e_k = 0 for every row}, over Q or GF(modulus)."""
    variables = list(variables)
    rep, zero_reps, reduced = _collapse(variables, rows, modulus)
    cols = list(dict.fromkeys(r for r, _ in rep.values() if r not in zero_reps))
    first = {v: i for i, v in enumerate(variables)}
    cols.sort(key=first.__getitem__)
    members: dict = {}
    for v in variables:
        rk, s = rep[v]
        if rk not in zero_reps:
            members.setdefault(rk, []).append((v, s))
    out = []
    for vec in _rref_nullspace(cols, reduced, modulus):
        full = {}
        for rk, x0 in vec.items():
            for v, s in members[rk]:
                x = int(x0 * s) % modulus if modulus else x0 * s
                if x:
                    full[v] = x
        out.append(dict(sorted(full.items(), key=lambda kv: first[kv[0]])))
    return [_integral(v) for v in out] if not modulus else out


def _integral(vec: dict) -> dict:
    if not vec:
        return vec
    # ints and Fractions both carry numerator and denominator: no Fraction is built
    den = lcm(*(x.denominator for x in vec.values()))
    ints = {k: x.numerator * (den // x.denominator) for k, x in vec.items()}
    g = 0
    for x in ints.values():
        g = gcd(g, abs(x))
    first = next(iter(ints.values()))
    s = 1 if first > 0 else -1
    return {k: s * x // g for k, x in ints.items()}


def row_basis(vectors: list[dict], modulus: int | None = None) -> list[dict]:
    """A reduced basis of the span of ``vectors`` (row echelon form, integral)."""
    keys = sorted({k for v in vectors for k in v}, key=str)
    pivots = rref(
        [{k: int(x) if modulus else x for k, x in v.items()} for v in vectors], keys, modulus
    )
    rank = {k: i for i, k in enumerate(keys)}
    out = []
    for pc in sorted(pivots, key=rank.__getitem__):
        vec = dict(sorted(pivots[pc].items(), key=lambda kv: rank[kv[0]]))
        out.append(_integral(vec) if not modulus else {k: int(x) for k, x in vec.items()})
    return out
