"""The analysis context: tensor layouts over atoms, couplings and exponent relations.

A *layout* is one entry per tensor dimension; each entry is a row-major list of
factors, a factor being an atom id or a :class:`Dep` (an axis whose atom depends
on the index of another axis of the same tensor, as after ``view(B, T, 3, H, d)``
of a fused query/key/value projection that is then unbound along the ``3``).

Besides coupling atoms (permutation structure, parities), rules record linear
relations between the *exponents* with which a diagonal element (a positive
scale, or a sign) acts on each occurrence; :mod:`wsym.detect.solve` solves them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from math import prod

from wsym.detect.atoms import AtomTable, SplitConflict


@dataclass(frozen=True)
class Dep:
    """An axis whose atom is ``parts[i]`` at index ``i`` of the axis with atom ``key``."""

    key: int
    parts: tuple[tuple[int, ...], ...]


Dim = list  # list[int | Dep]
Layout = list  # list[Dim]

SYSTEMS = ("scale", "sign")


@dataclass
class Context:
    """State of one analysis pass over a traced graph."""

    indexed_sites: frozenset = frozenset()
    atoms: AtomTable = field(default_factory=AtomTable)
    layouts: dict = field(default_factory=dict)
    relations: list = field(default_factory=list)
    owner: dict = field(default_factory=dict)
    site_of: dict = field(default_factory=dict)
    hits: set = field(default_factory=set)
    warnings: list = field(default_factory=list)
    bn_corrections: list = field(default_factory=list)
    attentions: list = field(default_factory=list)
    softmaxes: list = field(default_factory=list)
    events: list = field(default_factory=list)
    allowed_buffers: set = field(default_factory=set)
    sub_axes: dict = field(default_factory=dict)
    op: str = ""  # the operation being read, named in explanations
    pins: list = field(default_factory=list)  # (system, atom, op): an exponent forced to 0
    relabels: list = field(default_factory=list)  # (output, input, units, node): a shuffle
    factored: frozenset = frozenset()  # shuffles read as their (g, C/g) factors
    merged: dict = field(default_factory=dict)  # class root -> Relabel, once resolved
    shuffles: dict = field(default_factory=dict)  # a spelled-out shuffle's last view -> its start

    # -- atoms and layouts -------------------------------------------------
    def new(self, size: int, owner: tuple | None = None, split=None) -> int:
        """A new atom; ``owner`` is ``(atom, i)`` when it is the i-th sub-axis of ``atom``."""
        a = self.atoms.new(size, split)
        if owner is not None:
            self.owner[a] = owner
        return a

    def fresh(self, shape, reason: str | None = None) -> Layout:
        """A layout of new atoms for ``shape`` (blocked with ``reason`` if given)."""
        layout = [[self.new(int(n))] if int(n) > 1 else [] for n in shape]
        if reason is not None:
            self.block(layout, reason)
        return layout

    def child(self, a: int, i: int) -> int:
        """The i-th sub-axis of occurrence ``a`` (whose class is split).

        Splits live on class roots; every occurrence gets sub-axes of its own,
        coupled to the root's with the occurrence's parity, so that exponent
        relations stay attached to the tensor they are about.
        """
        key = (a, i)
        if key not in self.sub_axes:
            root, parity = self.atoms.find(a)
            shared = self.atoms.split[root][1][i]
            if self.owner.get(shared) == key:
                self.sub_axes[key] = shared
            else:
                c = self.new(self.atoms.size[shared], owner=key)
                self.atoms.union(c, shared, parity)
                self.sub_axes[key] = c
        return self.sub_axes[key]

    def children(self, a: int) -> tuple[str, list[int]] | None:
        """``(mode, sub-axes of occurrence a)``, or None if its class is not split."""
        split = self.atoms.split_of(a)
        if split is None:
            return None
        return split[0], [self.child(a, i) for i in range(len(split[1]))]

    def split_class(self, a: int, mode: str, sizes: list[int]) -> list[int]:
        """Split the (unsplit) class of ``a``; return the sub-axes of occurrence ``a``."""
        root = self.atoms.root(a)
        shared = [self.new(n, owner=(root, i)) for i, n in enumerate(sizes)]
        self.atoms.set_split(root, mode, shared)
        return [self.child(a, i) for i in range(len(sizes))]

    def expand(self, atoms: list[int]) -> list[int]:
        """Occurrence-level expansion of product splits (cat-split atoms are kept)."""
        out: list[int] = []
        for a in atoms:
            ch = self.children(a)
            if ch is not None and ch[0] == "prod":
                out.extend(self.expand(ch[1]))
            else:
                out.append(a)
        return out

    def like(self, layout: Layout) -> Layout:
        """A fresh layout with the structure of ``layout`` (dependent axes keep their key)."""
        out = []
        for dim in layout:
            new_dim = []
            for f in dim:
                if isinstance(f, Dep):
                    parts = tuple(tuple(self.new(self.atoms.size[a]) for a in p) for p in f.parts)
                    new_dim.append(Dep(f.key, parts))
                else:
                    new_dim.append(self.new(self.atoms.size[f]))
            out.append(new_dim)
        return out

    def dim_size(self, dim: Dim) -> int:
        """Number of entries along ``dim``."""
        return prod(self._factor_size(f) for f in dim)

    def _factor_size(self, f) -> int:
        if isinstance(f, Dep):
            return sum(prod(self.atoms.size[a] for a in p) for p in f.parts) // len(f.parts)
        return self.atoms.size[f]

    def block(self, layout: Layout, reason: str) -> None:
        """Forbid any action on every atom of ``layout``."""
        for dim in layout:
            self.block_dim(dim, reason)

    def block_dim(self, dim: Dim, reason: str) -> None:
        """Forbid any action on the atoms of one dimension."""
        if self.op and self.op.split()[0] not in reason:
            reason = f"{reason} at {self.op}"
        for f in dim:
            if isinstance(f, Dep):
                for part in f.parts:
                    for a in part:
                        self.atoms.block(a, reason)
                self.atoms.block(f.key, reason)
            else:
                self.atoms.block(f, reason)

    def mark(self, dim: Dim, *kinds: str) -> None:
        """Record that the continuous ``kinds`` cannot act on the classes of ``dim``."""
        for a in self._atoms_of(dim):
            self.atoms.mark(a, *kinds, why=self.op)

    def _atoms_of(self, dim: Dim) -> list[int]:
        out = []
        for f in dim:
            if isinstance(f, Dep):
                out.extend(a for p in f.parts for a in p)
            else:
                out.append(f)
        return out

    def warn(self, message: str) -> None:
        """Record a warning once."""
        if message not in self.warnings:
            self.warnings.append(message)

    # -- coupling ----------------------------------------------------------
    def couple(self, da: Dim, db: Dim, parity: int = 0, scale="eq", sign="eq", breaks=()):
        """Couple two dimensions of equal size atom by atom.

        ``parity`` 1 is a contraction (``x @ W``); ``scale``/``sign`` give the
        exponent relation per system: ``"eq"`` (equal, or opposite when
        ``parity`` is 1), ``"zero"`` (neither side may move) or ``None``.
        """
        try:
            pairs = self._align(da, db)
        except SplitConflict as err:
            self.block_dim(da, f"incompatible reshapes ({err})")
            self.block_dim(db, f"incompatible reshapes ({err})")
            return
        for a, b in pairs:
            try:
                self.atoms.union(a, b, parity)
            except SplitConflict as err:
                self.atoms.block(a, f"incompatible reshapes ({err})")
                self.atoms.block(b, f"incompatible reshapes ({err})")
                continue
            for system, rel in (("scale", scale), ("sign", sign)):
                if rel == "eq":
                    self.relations.append((system, "lin", (a, b), (1, -1 if parity == 0 else 1)))
                elif rel == "zero":
                    self.relations.append((system, "lin", (a,), (1,)))
                    self.relations.append((system, "lin", (b,), (1,)))
                    self.pins.append((system, a, self.op))
            if breaks:
                self.atoms.mark(a, *breaks, why=self.op)

    def event(self, dims: list[Dim], context: list[Layout]) -> None:
        """Record that ``dims`` are contracted or reduced together, among the ``context`` tensors.

        A transform that varies along an axis contracted here (a head index) is
        only valid if the axis it acts on is contracted with it.
        """
        atoms = [a for d in dims for a in self._atoms_of(d)]
        present = [a for lay in context for d in lay for a in self._atoms_of(d)]
        self.events.append((atoms, present))

    def relate(self, system: str, dims: list[Dim], coefs: tuple) -> None:
        """Record sum_i coefs[i] * e(dims[i]) = 0, atom by atom (dims already coupled)."""
        expanded = [self.expand(self._plain(d)) for d in dims]
        for atoms in zip(*expanded, strict=True):
            self.relations.append((system, "lin", atoms, coefs))
            if len(atoms) == 1:
                self.pins.append((system, atoms[0], self.op))

    def _plain(self, dim: Dim) -> list[int]:
        if any(isinstance(f, Dep) for f in dim):
            raise SplitConflict("dependent axis used where a plain one is needed")
        return list(dim)

    def _align(self, da: Dim, db: Dim) -> list[tuple[int, int]]:
        if any(isinstance(f, Dep) for f in da) or any(isinstance(f, Dep) for f in db):
            return self._align_dep(da, db)
        a = [x for x in self.expand(da) if self.atoms.size[x] > 1]
        b = [x for x in self.expand(db) if self.atoms.size[x] > 1]
        pairs = []
        while a and b:
            x, y = a.pop(0), b.pop(0)
            sx, sy = self.atoms.size[x], self.atoms.size[y]
            if sx == sy:
                pairs.append((x, y))
            elif sx > sy:
                a[:0] = self._split_prod(x, [sy, sx // sy], sx % sy)
                b.insert(0, y)
            else:
                b[:0] = self._split_prod(y, [sx, sy // sx], sy % sx)
                a.insert(0, x)
        if a or b:
            raise SplitConflict("dimensions of different sizes coupled")
        return pairs

    def _align_dep(self, da: Dim, db: Dim) -> list[tuple[int, int]]:
        if len(da) != 1 or len(db) != 1 or not isinstance(da[0], Dep) or not isinstance(db[0], Dep):
            raise SplitConflict("dependent axis coupled with a plain one")
        fa, fb = da[0], db[0]
        if len(fa.parts) != len(fb.parts):
            raise SplitConflict("dependent axes of different arity")
        pairs = []
        for pa, pb in zip(fa.parts, fb.parts, strict=True):
            pairs.extend(self._align(list(pa), list(pb)))
        return pairs

    def _split_prod(self, atom: int, sizes: list[int], remainder: int) -> list[int]:
        """Split an unsplit atom's class as a product; return the sub-axes of ``atom``."""
        if remainder or self.atoms.split_of(atom) is not None:
            raise SplitConflict(f"cannot factor an axis of size {self.atoms.size[atom]} as {sizes}")
        return self.split_class(atom, "prod", sizes)

    # -- concatenation and slicing ----------------------------------------
    def concat(self, pieces: list[Dim]) -> int:
        """A new atom that is the concatenation of ``pieces`` (each a dim)."""
        nonempty = [p for p in pieces if self.dim_size(p) > 0]
        if len(nonempty) == 1:  # nothing is joined: a copy of the one piece
            out = self.new(self.dim_size(nonempty[0]))
            self.couple([out], nonempty[0])
            return out
        segs = []
        for piece in pieces:
            seg = self.new(self.dim_size(piece))
            if self.atoms.size[seg] > 1:
                seg_dim = [seg]
                self.couple(seg_dim, piece)
            segs.append(seg)
        out = self.new(sum(self.atoms.size[s] for s in segs))
        for i, s in enumerate(segs):
            self.owner[s] = (out, i)
        self.atoms.set_split(out, "cat", segs)
        return out

    def segment(self, dim: Dim, start: int, stop: int) -> Dim:
        """The sub-dimension ``dim[start:stop]``, refining cat splits as needed."""
        n = self.dim_size(dim)
        if start <= 0 and stop >= n:
            return dim
        plain = [x for x in self.expand(self._plain(dim)) if self.atoms.size[x] > 1]
        if len(plain) != 1:
            raise SplitConflict("slice of a product axis")
        pieces = self._cat_pieces(plain[0], start, stop)
        if len(pieces) == 1 and self.atoms.size[pieces[0]] == stop - start:
            out = self.new(stop - start)
            if stop - start > 1:
                self.couple([out], [pieces[0]])
            return [out] if stop - start > 1 else []
        return [self.concat([[p] for p in pieces])]

    def _cat_pieces(self, atom: int, start: int, stop: int) -> list[int]:
        size = self.atoms.size[atom]
        split = self.children(atom)
        if split is None:
            bounds = sorted({0, max(0, start), min(size, stop), size})
            sizes = [b - a for a, b in zip(bounds, bounds[1:], strict=False)]
            split = ("cat", self.split_class(atom, "cat", sizes))
        if split[0] != "cat":
            raise SplitConflict("slice of a product axis")
        pieces, offset = [], 0
        for child in split[1]:
            cs = self.atoms.size[child]
            lo, hi = max(start, offset), min(stop, offset + cs)
            if lo < hi:
                if lo == offset and hi == offset + cs:
                    pieces.append(child)
                else:
                    pieces.extend(self._cat_pieces(child, lo - offset, hi - offset))
            offset += cs
        return pieces
