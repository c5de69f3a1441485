"""Atoms: the indivisible tensor axes that symmetry groups act on.

Every dimension of every traced tensor is described as a row-major product of
*atoms*. Operations couple atoms (a union-find with a parity bit: parity 0 means
the two axes transform alike, parity 1 contragrediently, as the two sides of a
contraction do). An atom can be *split* after the fact, as a product
(``view(B, T, H, d)``) or as a concatenation (``x[..., :16]``, ``torch.cat``);
a split of one atom applies to its whole class.

An atom class that reaches the model's inputs or outputs, an integer tensor or
an operation the rules do not know is *blocked*: no group acts on it.
"""

from __future__ import annotations

from dataclasses import dataclass, field


class SplitConflict(Exception):
    """Two incompatible factorizations of one atom class were required."""


@dataclass
class AtomTable:
    """Union-find over atoms with parities, splits, blocks and marks."""

    size: list[int] = field(default_factory=list)
    parent: list[int] = field(default_factory=list)
    parity: list[int] = field(default_factory=list)
    split: dict[int, tuple[str, list[int]]] = field(default_factory=dict)
    blocked: dict[int, str] = field(default_factory=dict)
    breaks: dict[int, set[str]] = field(default_factory=dict)
    blame: dict[int, dict[str, str]] = field(default_factory=dict)  # root -> {kind: op}
    conflict: set[int] = field(default_factory=set)
    pinned: set[int] = field(default_factory=set)

    def new(self, size: int, split: tuple[str, list[int]] | None = None) -> int:
        """Create a fresh atom of ``size`` (optionally already split)."""
        self.size.append(int(size))
        self.parent.append(len(self.parent))
        self.parity.append(0)
        a = len(self.size) - 1
        if split is not None:
            self.split[a] = split
        return a

    def find(self, a: int) -> tuple[int, int]:
        """Return ``(root, parity of a relative to root)``."""
        p = 0
        path = []
        while self.parent[a] != a:
            path.append(a)
            p ^= self.parity[a]
            a = self.parent[a]
        root = a
        # path compression with parity
        acc = p
        for x in path:
            nxt_par = self.parity[x]
            self.parent[x] = root
            self.parity[x] = acc
            acc ^= nxt_par
        return root, p

    def root(self, a: int) -> int:
        """The class representative of ``a``."""
        return self.find(a)[0]

    def union(self, a: int, b: int, parity: int = 0) -> None:
        """Couple ``a`` and ``b`` (parity 1: contragredient)."""
        ra, pa = self.find(a)
        rb, pb = self.find(b)
        if ra == rb:
            if pa ^ pb != parity:
                self.conflict.add(ra)
            return
        if self.size[ra] != self.size[rb]:
            raise SplitConflict(f"atoms of sizes {self.size[ra]} and {self.size[rb]} coupled")
        self.parent[rb] = ra
        self.parity[rb] = pa ^ pb ^ parity
        rel = pa ^ pb ^ parity
        if rb in self.blocked:
            self.blocked.setdefault(ra, self.blocked.pop(rb))
        if rb in self.breaks:
            self.breaks.setdefault(ra, set()).update(self.breaks.pop(rb))
        if rb in self.blame:
            mine = self.blame.setdefault(ra, {})
            for kind, op in self.blame.pop(rb).items():
                mine.setdefault(kind, op)
        if rb in self.conflict:
            self.conflict.discard(rb)
            self.conflict.add(ra)
        sa, sb = self.split.get(ra), self.split.pop(rb, None)
        if sb is None:
            return
        if sa is None:
            self.split[ra] = sb
            return
        if sa[0] != sb[0] or [self.size[c] for c in sa[1]] != [self.size[c] for c in sb[1]]:
            self.split[ra] = sa
            raise SplitConflict("incompatible splits of one atom class")
        for ca, cb in zip(sa[1], sb[1], strict=True):
            self.union(ca, cb, rel)

    def block(self, a: int, reason: str) -> None:
        """Forbid permutations and mixing on the class of ``a``, and pin ``a`` itself.

        A pinned occurrence (a model input or output, an operand of an unknown
        op) must not move at all; other occurrences of a blocked class may still
        carry diagonal groups whose exponents vanish on every pinned one.
        """
        self.blocked.setdefault(self.root(a), reason)
        self.pinned.add(a)

    def mark(self, a: int, *kinds: str, why: str = "") -> None:
        """Record that the class of ``a`` cannot carry the continuous ``kinds`` ("gl", "orth").

        ``why``: the operation that rules them out (kept, the first per kind, for explanations).
        """
        r = self.root(a)
        self.breaks.setdefault(r, set()).update(kinds)
        if why:
            mine = self.blame.setdefault(r, {})
            for kind in kinds:
                mine.setdefault(kind, why)

    def split_of(self, a: int) -> tuple[str, list[int]] | None:
        """The split of ``a``'s class, if any."""
        return self.split.get(self.root(a))

    def set_split(self, a: int, mode: str, children: list[int]) -> None:
        """Split the (unsplit) class of ``a`` into ``children``."""
        r = self.root(a)
        assert r not in self.split
        self.split[r] = (mode, children)
