"""Rotating a pre-LN transformer's residual stream (``wsym.align(..., residual="rotation")``).

The spec's residual-stream class is a permutation class: ``S_n`` is what detection
verifies. A pre-LN stream admits more. Every read of the stream goes through a
LayerNorm whose gain and bias are the norm's scaling group's
``e = -1`` entries; every other entry of the class (embeddings, positions, a class
token, each attention out-projection and MLP down-projection, their biases) is a
write. With each norm's gain folded into its consumers (the norm's own scaling
and sign groups at ``s = |g|``, ``sign(g)``: gain 1, bias ``b / g``, consumer
columns ``W g``), the map ``x -> Q x`` on the stream, every write multiplied by
``Q`` and every read by ``Q^T``, keeps the function for every orthogonal ``Q``
with ``Q 1 = 1``: such a ``Q`` commutes with the centring, keeps the std, and the
(gain 1) norm gives ``LN(Q x) = Q LN(x)`` once its bias is rotated too.
Derivation in ``docs/alignment.md``.

Here ``Q`` acts as a matrix group on the class's rows (``x -> x M``, ``M = Q^T``),
kept in a spec of its own beside the detected one (:class:`Frame`): it is no
verified group of the spec, so :func:`verify_rotation` checks it on the real
module before it is used, and refuses (one line) what is not such a stream.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from wsym.errors import WsymInputError
from wsym.group.elements import GroupElement, act
from wsym.group.kinds import Scaling, kind_of
from wsym.group.layout import class_params
from wsym.group.spec import Group, SymmetrySpec, leaves
from wsym.group.units import block_matrices

# RMSNorm streams admit every orthogonal Q in principle; the activation fit does not recover
# a planted one exactly yet, so they are refused (residual_streams) until it does.
NORMS = (torch.nn.LayerNorm,)
# Largest relative output change a random stream rotation may cause at the folded
# reference (float64; round-off is near 1e-15, a wrong stream changes outputs by O(1)).
VERIFY_TOL = 1e-9


@dataclass(frozen=True)
class Stream:
    """A pre-LN residual stream: its class, permutation group and norms.

    Attributes:
        cls: the atom class of the stream.
        permutation: index of the stream's permutation group in the spec.
        norms: ``(scaling group, sign group or -1, gain key, gain exponent)`` per norm.
        centered: every norm subtracts the mean (LayerNorm): ``Q`` must fix ``1``.
    """

    cls: int
    permutation: int
    norms: tuple[tuple[int, int, str, int], ...]
    centered: bool


def residual_streams(spec: SymmetrySpec, model: torch.nn.Module) -> list[Stream]:
    """The pre-LN residual streams of ``spec``: permutation classes read only through norms.

    A class qualifies when every parity-1 entry (a read) is in the scaling group of
    a LayerNorm of ``model`` whose gain is an axis of the class; the gain
    is told by the module (its ``weight``), not by its name.

    Raises:
        WsymInputError: no such stream.
    """
    gains = {}
    for module in model.modules():
        if isinstance(module, NORMS) and getattr(module, "weight", None) is not None:
            gains[id(module.weight)] = isinstance(module, torch.nn.LayerNorm)
    keys = {key: gains[id(p)] for key, p in model.named_parameters() if id(p) in gains}
    out = []
    for i, g in enumerate(spec.groups):
        if kind_of(g).permutes and not g.index:
            stream = _stream(spec, i, keys)
            if stream is not None:
                out.append(stream)
    if not out:
        raise WsymInputError(
            "residual='rotation' found no pre-LN residual stream (a permutation class read only "
            "through LayerNorm gains); use residual='permutation'"
        )
    return out


def _stream(spec: SymmetrySpec, i: int, gain_keys: dict) -> Stream | None:
    cls = spec.groups[i].cls
    occurrences = [
        (key, leaf)
        for key, dims in spec.layouts
        for t in dims
        for leaf in leaves(t)
        if leaf.cls == cls
    ]
    norms, covered, centered = [], set(), True
    for j, g in enumerate(spec.groups):
        gain = next((k for k in g.params if k in gain_keys), None)
        if type(kind_of(g)) is not Scaling or g.cls != cls or g.index or gain is None:
            continue
        exps = dict(g.exponents)
        var = next(leaf.var for key, leaf in occurrences if key == gain)
        sign = next(
            (s for s, h in enumerate(spec.groups) if kind_of(h).flips and h.params == g.params), -1
        )
        norms.append((j, sign, gain, exps[var]))
        covered |= set(exps)
        centered = centered and gain_keys[gain]
    reads = {leaf.var for _, leaf in occurrences if leaf.parity == 1}
    if not norms or not reads <= covered:
        return None
    return Stream(cls, i, tuple(norms), centered)


def fold_element(spec: SymmetrySpec, streams: list[Stream], sd: dict) -> GroupElement:
    """The element of ``spec`` that sets every stream norm's gain to 1 (folded into its readers).

    Raises:
        WsymInputError: a gain has a zero entry (nothing to fold it into).
    """
    comps = []
    for stream in streams:
        for scale, sign, key, e in stream.norms:
            gain = sd[key].double()
            if (gain == 0).any():
                raise WsymInputError(
                    f"{key} has zero entries: its norm cannot be folded into its readers; "
                    "use residual='permutation'"
                )
            comps.append((scale, gain.abs() ** (-e)))
            if sign >= 0:
                comps.append((sign, torch.sign(gain)))
    return GroupElement(tuple(comps))


@dataclass(frozen=True)
class Frame:
    """The specs alignment runs in once the streams are folded.

    Attributes:
        work: the detected spec without the streams' norm scaling and sign groups
            (held: the gains stay 1).
        rotated: ``work`` plus one orthogonal group per stream (acted with only,
            never matched or fitted as a block).
        rotations: the indices of those groups in ``rotated``.
        streams: the streams, with group indices of the detected spec.
        held: the streams' permutation groups, indexed in ``work`` (a rotation moves them).
    """

    work: SymmetrySpec
    rotated: SymmetrySpec
    rotations: tuple[int, ...]
    streams: tuple[Stream, ...]
    held: frozenset[int]


def frame_of(spec: SymmetrySpec, streams: list[Stream]) -> Frame:
    """The :class:`Frame` of ``spec`` for ``streams``."""
    dropped = {j for s in streams for scale, sign, _, _ in s.norms for j in (scale, sign)}
    kept = [j for j in range(len(spec.groups)) if j not in dropped]
    work = dataclasses.replace(
        spec,
        groups=tuple(spec.groups[j] for j in kept),
        deviations=tuple(spec.deviations[j] for j in kept) if spec.deviations else (),
    )
    rotations = tuple(
        Group(
            "orthogonal",
            spec.groups[s.permutation].size,
            1,
            # the gains stay 1 (a diagonal, not a vector to rotate)
            tuple(k for k in class_params(spec, s.cls) if k not in {n[2] for n in s.norms}),
            cls=s.cls,
        )
        for s in streams
    )
    rotated = dataclasses.replace(work, groups=work.groups + rotations, deviations=())
    n = len(work.groups)
    held = frozenset(kept.index(s.permutation) for s in streams)
    return Frame(work, rotated, tuple(range(n, n + len(streams))), tuple(streams), held)


def constrained_procrustes(cross: torch.Tensor, centered: bool) -> torch.Tensor:
    """The orthogonal ``M`` maximizing ``tr(M^T cross)``, with ``M 1 = 1`` when ``centered``.

    ``M = 1 1^T / n + E R E^T`` with ``E`` an orthonormal basis of ``1``'s
    complement and ``R = U V^T`` from the SVD of ``E^T cross E`` (orthogonal
    Procrustes on the complement; ``tr(M^T cross)`` splits into the fixed
    ``1^T cross 1 / n`` and ``tr(R^T E^T cross E)``).

    Example:
        >>> q = constrained_procrustes(torch.randn(5, 5, dtype=torch.float64), True)
        >>> bool(torch.allclose(q @ torch.ones(5, dtype=torch.float64), torch.ones(5).double()))
        True
    """
    if not centered:
        u, _, vh = torch.linalg.svd(cross)
        return u @ vh
    basis = complement_basis(cross.shape[0], cross.dtype)
    u, _, vh = torch.linalg.svd(basis.T @ cross @ basis)
    n = cross.shape[0]
    return torch.full((n, n), 1.0 / n, dtype=cross.dtype) + basis @ (u @ vh) @ basis.T


def complement_basis(n: int, dtype=torch.float64) -> torch.Tensor:
    """``(n, n - 1)``: an orthonormal basis of the vectors with zero sum."""
    start = torch.cat([torch.ones(n, 1, dtype=dtype), torch.eye(n, dtype=dtype)[:, : n - 1]], 1)
    return torch.linalg.qr(start)[0][:, 1:]


def weight_rotation(frame: Frame, ref: dict, cur: dict) -> list[tuple[int, torch.Tensor]]:
    """Per stream, the rotation of ``cur``'s stream rows closest to ``ref``'s (both folded)."""
    comps = []
    for i, stream in zip(frame.rotations, frame.streams, strict=True):
        g = frame.rotated.groups[i]
        mats_ref, mats_cur = (
            block_matrices(frame.rotated, ref, g),
            block_matrices(frame.rotated, cur, g),
        )
        cross = sum(mats_cur[k].transpose(-1, -2) @ mats_ref[k] for k in mats_ref)
        comps.append((i, constrained_procrustes(cross.reshape(g.size, g.size), stream.centered)))
    return comps


def activation_rotation(
    frame: Frame, model, ref: dict, cur: dict, batches
) -> list[tuple[int, torch.Tensor]]:
    """Per stream, the rotation of ``cur``'s stream activations closest to ``ref``'s.

    At every traced site of the stream (embeddings, each write, each residual
    sum, each norm output), the centred cross-covariance ``H_cur^T H_ref / m``,
    divided by the square root of the product of both sites' total variances (each site
    weighs the same, as a correlation), summed over the sites; then
    :func:`constrained_procrustes`. The states are folded: every site moves by
    ``x -> x M`` under the rotation.
    """
    from wsym.align.activations import sites_at_states

    wanted = {(node, d) for c, node, d in frame.work.sites if c in {s.cls for s in frame.streams}}
    acts_ref, acts_cur = sites_at_states(model, [ref, cur], batches, wanted)
    comps = []
    for i, stream in zip(frame.rotations, frame.streams, strict=True):
        cross = 0
        for c, node, d in frame.work.sites:
            if c != stream.cls:
                continue
            a, b = acts_ref[(node, d)], acts_cur[(node, d)]
            a, b = a - a.mean(0), b - b.mean(0)
            norm = (a.pow(2).sum() * b.pow(2).sum()).sqrt().clamp_min(1e-300)
            cross = cross + b.T @ a / norm
        comps.append((i, constrained_procrustes(cross, stream.centered)))
    return comps


def verify_rotation(frame: Frame, model, state: dict, example_inputs, seed: int = 0) -> None:
    """Refuse, in one line, streams whose random rotation changes ``model``'s output at ``state``.

    Every stream is rotated at once (one random ``Q`` each); ``state`` is folded;
    the check runs in float64 on random inputs of the example's shape
    (:class:`wsym.group.verify.Probe`).
    """
    from wsym.group.floor import relative
    from wsym.group.verify import Probe

    probe = Probe(model, example_inputs, seed=seed)
    gen = torch.Generator().manual_seed(seed)
    turns = []
    for i, stream in zip(frame.rotations, frame.streams, strict=True):
        n = frame.rotated.groups[i].size
        noise = torch.randn(n, n, generator=gen, dtype=torch.float64)
        turns.append((i, constrained_procrustes(noise, stream.centered)))
    change = relative(probe(act(frame.rotated, GroupElement(tuple(turns)), state)), probe(state))
    if not change <= VERIFY_TOL:
        classes = ", ".join(str(s.cls) for s in frame.streams)
        raise WsymInputError(
            f"residual='rotation': rotating the stream of class {classes} changes the "
            f"output by {change:.1e} (not a pre-LN stream); use residual='permutation'"
        )
