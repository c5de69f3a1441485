"""Alignment: move one checkpoint onto another's basis, modulo the detected symmetries.

The default (``continuous="auto"``, :mod:`wsym.align.choice`) runs the cheap
alignments below (settled and identity starts, the canonical start; with data
also activation matching) and keeps the one with the lowest objective it can
measure: the weight-matching objective without data, the loss along the path
with batches of ``(inputs, targets)``. Each candidate (``continuous="reference"``)
minimizes the weight-matching objective ``sum_k ||g . other_k - ref_k||^2`` over
the whole group, by rounds of block coordinate descent (derivations in
``docs/alignment.md``):

* **permutations**, by **weights**: coordinate descent over all permutation
  classes at once (Git Re-Basin's weight matching): each class solves a linear
  assignment between the units' slices in every tensor the class touches,
  signs and head rotations maximized inside the pairing score
  (:mod:`wsym.align.matching`), the first round started, on a chain of layers,
  from every class matched once on its settled entries (:mod:`wsym.align.settled`); or by
  **activations**: per class, the correlation of its units' activations at
  every traced site over a few batches, solved by
  linear assignment; classes without a site fall back to weight matching;
* **continuous groups fitted to the reference** (:mod:`wsym.align.continuous`):
  per-unit scales from the quartic's best root, orthogonal Procrustes, the GL
  element per head on both factors, translations exactly.

Both checkpoints have their sign conventions fixed first; raw scales are kept
(matching independently balanced scales made the BatchNorm CNN worse), unless
a checkpoint is far from balanced (``IMBALANCE``), where the canonical start
is taken. ``continuous="canonical"`` is the previous method: both checkpoints
canonicalized in every group but permutations, matched once, GL blocks
rotated onto the reference's by Procrustes, and the result expressed in the
reference's own basis.
"""

from __future__ import annotations

import functools
import math

import torch

from wsym.align.assignment import assignment
from wsym.align.biases import unmatched_biases, without
from wsym.align.canonicalize import canonical_element
from wsym.align.choice import AlignReport, choose, has_targets, path_objective
from wsym.align.continuous import continuous_descent, mismatch, squared_norm
from wsym.align.matching import plans, procrustes, weight_matching
from wsym.align.path import NO_TARGETS, path_fit
from wsym.align.precision import RECOVERED, working, working_dtype
from wsym.align.settled import is_chain, settled_start
from wsym.align.signature import signature_start
from wsym.errors import WsymInputError
from wsym.group.elements import GroupElement, act
from wsym.group.fits import check_spec
from wsym.group.kinds import kind_of, kinds_where
from wsym.group.kinds.modules import refuse_modules
from wsym.group.spec import SymmetrySpec
from wsym.models.arguments import check_state_dict

# Canonicalized before matching: every kind but the permutations. Sign conventions read off
# two different networks need not agree unit by unit, so weight matching also matches signs
# (signed units).
NO_PERMUTATION = kinds_where(permutes=False)
SIGNS = kinds_where(flips=True)
# Balancing sweeps stop when a sweep moves less than this (canonical forms then agree to about
# 1e-11 relative, far below what the matching scores resolve; 15-20% fewer sweeps than the
# 1e-12 of wsym.canonicalize). Each checkpoint only moves inside its orbit, whatever the tol.
CANON_TOL = 1e-10
# Rounds of matching and continuous fits stop when a round lowers the objective by less than
# this, relative (trained pairs of benchmarks/alignment.py: the first round takes >99% of the
# drop, the second <0.5%, a third <1e-6: at 1e-2 two rounds run, with the same barriers as
# three to 0.006 and 20% less time on the small pairs).
ROUND_TOL = 1e-2
# "auto" (default): the candidates of AUTO run, the lowest objective kept (wsym.align.choice);
# a candidate on the reference wins outright (a planted element of the group is undone).
CONTINUOUS = ("auto", "reference", "canonical", "canonical+reference")
# The default's candidates: name -> (continuous, settled start); with data also DATA_CANDIDATES.
# "signature" runs first: a planted copy is undone by it, and the first candidate on the
# reference ends the run (the others are not run).
AUTO = {
    "signature": ("signature+reference", False),  # canonical, from sorted unit signatures
    "settled": ("reference", True),
    "identity": ("reference", False),
    "canonical": ("canonical+reference", False),
}
# These win only by landing on the reference: "signature" always (a start for planted copies,
# wsym.align.signature); without the path loss also "canonical", which has the lowest
# weight-matching objective on every MLP pair of benchmarks/alignment.py and higher barriers
# than the settled start there (docs/merging.md).
RECOVERY_ONLY = frozenset({"signature"})
RECOVERY_ONLY_WITHOUT_DATA = RECOVERY_ONLY | {"canonical"}
# With the path loss also these: name -> (method, continuous, residual); "canonical once" is
# continuous="canonical" (no refinement: the best of all on the BN CNN pairs).
DATA_CANDIDATES = {
    "canonical once": ("weights", "canonical", "permutation"),
    "activations+weights": ("activations+weights", "reference", "permutation"),
    "activations": ("activations", "reference", "permutation"),
    "rotation act": ("activations", "reference", "rotation"),
}
# "activations+weights": activation matching's permutations as the start of weight matching,
# which then moves every class (the "activations" method holds the classes with a site).
METHODS = ("weights", "activations", "activations+weights")
# residual="rotation": a pre-LN residual stream rotated onto the reference's (wsym.align.residual)
RESIDUAL = ("permutation", "rotation")
# biases="auto": the biases of units that do not read a normalization's output are left out of
# weight matching's pairing scores (wsym.align.biases); "matched": every parameter is in them.
BIASES = ("auto", "matched")
# refine="path": the continuous groups then fitted to the loss along the path (wsym.align.path);
# "auto" (default): "path" for continuous="auto" where the path loss can be taken (model and
# batches of (inputs, targets)), else "none".
REFINE = ("auto", "none", "path")
# With the path fit under continuous="auto", the candidates with the lowest path loss that are
# refined, the lowest of all kept. The best unrefined candidate is not always the best refined
# one (benchmarks/alignment.py's small ViT: identity or canonical once lead before the fit,
# rotation act after it, at 0.16 against 0.52); of the two lowest, one was the best refined
# candidate on every order of the ViT, the tiny transformer, the CNN and the w=256 MLP when all
# were refined (3-5x the time).
REFINED = 2
# The values of residual= and refine= that need the model, batches and continuous "auto" or
# "reference", with the value to use instead.
NEEDS_MODEL = {"residual": (("rotation",), "permutation"), "refine": (("path",), "none")}
DATA_METHODS = ("activations", "activations+weights")
# continuous="reference" matches raw weights where both checkpoints are near their balanced
# point: every unit within this factor (log) of its balanced scale, every GL block's balancing
# element within this square-rooted condition number. Trained pairs of benchmarks/alignment.py
# stay within e^1.3; a copy moved by scales in 1e-2..1e2 is past e^4, where raw weight
# matching pairs the wrong units and the canonical start is taken instead.
IMBALANCE = math.log(10.0)
# residual="rotation" without data: rounds of (matching, fits, stream rotation) at most
ROTATION_ROUNDS = 20


def align(
    sd_ref: dict,
    sd_other: dict,
    spec: SymmetrySpec,
    method: str = "weights",
    *,
    continuous: str = "auto",
    residual: str = "permutation",
    biases: str = "auto",
    refine: str = "auto",
    loss_fn=None,
    model: torch.nn.Module | None = None,
    batches=None,
    max_iter: int = 100,
    seed: int = 0,
    dtype: torch.dtype | None = None,
    with_report: bool = False,
):
    """``sd_other`` moved onto ``sd_ref``'s basis (same function as ``sd_other``).

    Memory: one copy of each state dict at the working ``dtype`` (none where
    they are at it already) and the moved copy of ``sd_other``; the matching
    reads one class's tensors at a time.

    Args:
        sd_ref: the reference state dict (of the architecture ``spec`` describes).
        sd_other: the state dict to move.
        spec: the :class:`~wsym.group.spec.SymmetrySpec`.
        method: ``"weights"``, ``"activations"`` (needs ``model`` and ``batches``;
            classes with a traced site keep activation matching's permutation) or
            ``"activations+weights"`` (activation matching's permutations as the
            start of weight matching, which moves every class on).
        continuous: ``"auto"`` (default): the cheap candidates run and the one
            with the lowest objective kept (:mod:`wsym.align.choice`): the
            ``"reference"`` alignment from the settled start and from the identity,
            the ``"canonical+reference"`` one, and, given ``model`` and ``batches``,
            ``method="activations+weights"``, ``"activations"`` and (on a pre-LN
            residual stream) ``"activations"`` with ``residual="rotation"``; the
            objective is the weight-matching one without data and the loss along
            the path (statistics reset) with batches of ``(inputs, targets)``;
            a candidate on ``sd_ref`` (to 1e-8 relative) wins outright; the
            ``"signature"`` start (:mod:`wsym.align.signature`, for planted copies)
            and, without the path loss, the canonical candidate win only so.
            ``"reference"``: from the raw weights (from the
            canonical alignment where a checkpoint is far from balanced, see
            ``IMBALANCE``), the
            permutations matched and the continuous groups fitted to
            ``sd_ref`` (:mod:`wsym.align.continuous`), alternately, until the
            weight-matching objective stops dropping; ``"canonical"``: both
            checkpoints canonicalized in their continuous groups, matched
            once; ``"canonical+reference"``: the canonical alignment, then
            refined as ``"reference"`` (robust to a checkpoint rescaled by
            orders of magnitude, which raw matching is not).
        residual: ``"permutation"`` (default): the residual stream moves by the
            spec's permutations; ``"rotation"``: a pre-LN transformer's stream by
            an orthogonal ``Q`` (``Q 1 = 1``) after every norm's gain is folded into
            its readers (:mod:`wsym.align.residual`; needs ``model`` and
            ``batches``, verified on the model first): from the activations at
            every stream site for the data methods, else alternating with the
            weight matching. Only with ``continuous="reference"``.
        biases: ``"auto"`` (default): the permutation matching of ``continuous="reference"``
            leaves out of its pairing scores the biases of units that do not read a
            normalization's output (:mod:`wsym.align.biases`; they still move with their
            units and count in the continuous fits and the objective); ``"matched"``:
            every parameter is in the scores (the previous default).
        refine: ``"auto"`` (default): ``"path"`` under ``continuous="auto"`` where
            ``model`` and ``batches`` of ``(inputs, targets)`` are given, else
            ``"none"``. ``"path"``: after the alignment, the continuous groups
            (scales, GL and orthogonal blocks, the residual rotation) are fitted by
            gradient descent to the loss along the linear path from ``sd_ref``
            (:mod:`wsym.align.path`; needs ``model`` and ``batches`` with targets),
            kept only where that loss drops. Under ``continuous="auto"`` the
            ``REFINED`` candidates with the lowest path loss are refined and the
            lowest of all kept (a refined one is reported as ``"<candidate> + path"``);
            a candidate on ``sd_ref`` is not refined. ``"none"``: no path fit
            (3-8x faster with data on benchmarks/alignment.py).
        loss_fn: ``loss_fn(outputs, targets)`` for ``refine="path"`` (default
            cross-entropy).
        model: the module (activation matching runs it at both state dicts).
        batches: iterable of ``(inputs, targets)``; only the inputs are used.
        max_iter: sweeps of weight matching.
        seed: order of the classes in weight matching.
        dtype: working precision, ``torch.float32`` or ``torch.float64``; None:
            float64 up to ``wsym.align.precision.FLOAT64_LIMIT`` parameters, float32
            above. The result has ``sd_other``'s dtypes.
        with_report: return ``(aligned, AlignReport)``
            (:class:`wsym.align.choice.AlignReport`: which candidate won, every
            candidate's objective; for another ``continuous``, the one candidate).

    Example:
        >>> import torch, wsym
        >>> mlp = torch.nn.Sequential(torch.nn.Linear(3, 6), torch.nn.ReLU(), torch.nn.Linear(6, 2))
        >>> spec = wsym.detect(mlp, torch.randn(2, 3))
        >>> sd = {k: v.double() for k, v in mlp.state_dict().items()}
        >>> moved = spec.act(spec.sample(seed=4), sd)
        >>> back = wsym.align(sd, moved, spec)
        >>> max(float((back[k] - sd[k]).abs().max()) for k in sd) < 1e-9
        True
    """
    check_same_architecture(spec, sd_ref, sd_other)
    refuse_modules(spec, "alignment")
    if method not in METHODS:
        raise WsymInputError(
            f"unknown alignment method {method!r}; use one of {', '.join(METHODS)}"
        )
    if continuous not in CONTINUOUS:
        raise WsymInputError(
            f"unknown continuous alignment {continuous!r}; use one of {', '.join(CONTINUOUS)}"
        )
    if method in DATA_METHODS and (model is None or batches is None):
        raise WsymInputError(
            f"method={method!r} needs model= and batches=; or use method='weights'"
        )
    checked = (continuous, model, batches)
    _check_option(
        "residual",
        residual,
        RESIDUAL,
        "residual alignment",
        " (the rotation is verified on the model)",
        *checked,
    )
    if biases not in BIASES:
        raise WsymInputError(f"unknown biases {biases!r}; use one of {', '.join(BIASES)}")
    _check_option("refine", refine, REFINE, "refinement", " of (inputs, targets)", *checked)
    batches = list(batches) if batches is not None else None
    if refine == "auto":
        path_ready = has_targets(model, batches) and continuous == "auto"
        refine = "path" if path_ready else "none"
    if refine == "path" and not has_targets(model, batches):
        raise WsymInputError(NO_TARGETS)
    options = {"model": model, "batches": batches, "max_iter": max_iter, "seed": seed}
    dtype = working_dtype(sd_other, dtype)
    ref_w, other_w = working(sd_ref, dtype), working(sd_other, dtype)
    path_loss = None
    if refine == "path":
        path_loss = loss_fn if loss_fn is not None else torch.nn.functional.cross_entropy
    run = functools.partial(
        _one_alignment,
        spec,
        ref_w,
        other_w,
        out_like=sd_other,
        biases=biases,
        path_loss=path_loss,
        **options,
    )
    if continuous != "auto":
        moved = run(method, continuous, residual)
        if not with_report:
            return moved
        return moved, AlignReport(continuous, "weights", {continuous: float("nan")})
    cands = _candidates(spec, method, residual, model, batches)
    moved, report = choose(
        spec,
        sd_ref,
        [(name, functools.partial(run, *args, path_loss=None)) for name, args in cands.items()],
        model=model,
        batches=batches,
        loss_fn=loss_fn,
        recovery_only=RECOVERY_ONLY if has_targets(model, batches) else RECOVERY_ONLY_WITHOUT_DATA,
    )
    if path_loss is not None and not report.recovered:
        moved, report = _refined_best(moved, report, cands, run, model, sd_ref, batches, path_loss)
    return (moved, report) if with_report else moved


def _refined_best(moved, report, cands, run, model, sd_ref, batches, loss_fn):
    """``(moved, report)``: the :data:`REFINED` best candidates refined, the lowest path kept.

    ``moved`` is the chosen candidate unrefined; it stays where no refined one is lower.
    """
    ranked = sorted(
        (v, name)
        for name, v in report.values.items()
        if name in cands and name not in RECOVERY_ONLY and v == v
    )[:REFINED]
    values, best, best_name = dict(report.values), moved, report.chosen
    for _, name in ranked:
        refined = run(*cands[name])
        values[f"{name} + path"] = value = path_objective(model, sd_ref, refined, batches, loss_fn)
        if value < values[best_name]:
            best, best_name = refined, f"{name} + path"
    return best, AlignReport(best_name, report.objective, values)


def _candidates(spec, method, residual, model, batches) -> dict:
    """The default's candidates, ``name -> (method, continuous, residual, settle)``."""
    if residual != "permutation":  # the rotated alignment has one start
        return {f"residual {residual}": (method, "reference", residual, False)}
    out = {name: (method, cont, residual, settle) for name, (cont, settle) in AUTO.items()}
    if not (method == "weights" and is_chain(spec, plans(spec))):
        out.pop("settled")  # the settled start runs only there: the same as the identity start
    if has_targets(model, batches) and method == "weights":
        for name, (meth, cont, res) in DATA_CANDIDATES.items():
            out[name] = (meth, cont, res, False)  # a stream it cannot rotate: passed over
    return out


def _one_alignment(
    spec,
    ref_w,
    other_w,
    method,
    continuous,
    residual,
    settle=True,
    *,
    out_like,
    biases,
    path_loss,
    **options,
) -> dict:
    """``other_w`` aligned to ``ref_w`` by one method (the body of :func:`align`).

    Both are at the working dtype; the result has ``out_like``'s dtypes.
    """
    model, batches, seed = options["model"], options["batches"], options["seed"]
    dtype = _dtype_of(ref_w)
    if residual == "rotation":
        moved = _rotation_alignment(spec, ref_w, other_w, method, path_loss=path_loss, **options)
        return _like(moved, out_like)
    if (
        continuous == "reference"
        and max(imbalance(spec, ref_w), imbalance(spec, other_w)) > IMBALANCE
    ):
        continuous = "canonical+reference"
    if continuous == "reference":
        # Sign conventions first (an isometry: the objective is the same in either basis), so
        # that copies differing by sign flips start matched; scales stay as they are.
        ref, g_ref = canonical_element(ref_w, spec, kinds=SIGNS, dtype=dtype)
        other, _ = canonical_element(other_w, spec, kinds=SIGNS, dtype=dtype)
        unmatched = unmatched_biases(spec) if biases == "auto" else frozenset()
        moved = reference_alignment(
            spec, ref, other, method, unmatched=unmatched, settle=settle, **options
        )
        if path_loss is not None:
            moved = _refined(spec, model, ref, moved, batches, path_loss, seed)
        moved = act(spec, g_ref.inverse(), moved)
    else:
        signature = continuous == "signature+reference"  # the default's candidate only
        moved = _canonical_alignment(spec, ref_w, other_w, method, signature=signature, **options)
        if continuous.endswith("+reference"):
            moved = reference_alignment(spec, ref_w, moved, method, **options)
        if path_loss is not None:  # "canonical" refined only as the default's candidate
            moved = _refined(spec, model, ref_w, moved, batches, path_loss, seed)
    return _like(moved, out_like)


def _like(moved: dict, out_like: dict) -> dict:
    """``moved`` in ``out_like``'s dtypes (entries it lacks as they are)."""
    return {k: v.to(out_like[k].dtype) if k in out_like else v for k, v in moved.items()}


def reference_alignment(
    spec: SymmetrySpec,
    ref: dict,
    other: dict,
    method: str = "weights",
    *,
    model=None,
    batches=None,
    max_iter: int = 100,
    seed: int = 0,
    rounds: int = 10,
    hold: frozenset[int] = frozenset(),
    unmatched: frozenset[str] = frozenset(),
    settle: bool = False,
) -> dict:
    """``other`` (float64) moved by permutation matching and continuous fits, alternately.

    Each round matches the permutations (and signs, rotations) on the current
    weights, then fits every continuous group to ``ref``
    (:func:`wsym.align.continuous.continuous_descent`); every step lowers the
    weight-matching objective or keeps it, and the rounds stop when a round
    lowers it by less than ``ROUND_TOL`` relative. With ``method="activations"``
    the permutations of classes with a traced site come from activations
    first, and stay fixed; with ``"activations+weights"`` they are only the
    start, and weight matching moves them on. The permutation groups in ``hold``
    never move.

    The tensors in ``unmatched`` (:func:`wsym.align.biases.unmatched_biases`) are
    left out of the matching's pairing scores, so the permutation step minimizes
    the objective without them and can raise the whole objective ``D``; the
    continuous fits lower ``D``. The rounds then keep the lowest ``D`` seen, the
    start included: the result's ``D`` is never above that of ``other`` (or of
    the activation-matched start).

    ``settle``: the first round starts from every class matched once on its
    settled entries (:func:`wsym.align.settled.settled_start`) instead of the
    identity (``method="weights"`` only, on a chain of layers:
    :func:`wsym.align.settled.is_chain`).
    """
    fixed: set[int] = set(hold)
    current = other
    if method in DATA_METHODS:
        perms, matched = activation_matching(spec, model, ref, current, batches)
        perms = [(i, p) for i, p in perms if i not in hold]
        current = act(spec, GroupElement(tuple(perms)), current)
        fixed = (matched if method == "activations" else set()) | set(hold)
    value = mismatch(spec, ref, current)
    # on the reference to round-off (1e-8 relative in float64: a recovered copy): nothing to fit
    if value <= RECOVERED[_dtype_of(ref)] ** 2 * squared_norm(spec, ref):
        return current
    best, lowest, scored_ref = current, value, without(ref, unmatched)
    for r in range(rounds):
        start = value
        if r == 0 and settle and method == "weights":
            todo = plans(spec, fixed=fixed)
            if is_chain(spec, todo):
                _, current = settled_start(spec, ref, current, todo, unmatched)
        perms = weight_matching(
            spec,
            scored_ref,
            without(current, unmatched),
            max_iter=max_iter,
            seed=seed,
            fixed=fixed,
            warm=r > 0,
        )
        current = act(spec, GroupElement(tuple(perms)), current)
        current = continuous_descent(spec, ref, current)[1]
        value = mismatch(spec, ref, current)
        if value <= lowest:
            best, lowest = current, value
        if start - value <= ROUND_TOL * max(start, 1e-300):
            break
    return best


def _rotation_alignment(
    spec: SymmetrySpec, ref: dict, other: dict, method: str, path_loss=None, **options
) -> dict:
    """``other`` (float64) aligned with its pre-LN residual streams rotated (:mod:`.residual`).

    Both are folded (every stream norm's gain 1, an element of ``spec`` each), the
    rotation is verified on the model at the folded reference, and the folded
    ``other`` is aligned in the :class:`~wsym.align.residual.Frame`: with data, the
    streams' rotation from their activations, then the other classes as
    ``method`` does with the streams held; without, rounds of weight matching
    and fits alternating with the rotation from the weights. The result is put
    back in ``ref``'s own basis (``ref``'s fold undone).
    """
    from wsym.align import residual

    model, batches = options.pop("model"), options.pop("batches")
    streams = residual.residual_streams(spec, model)
    fold_ref = residual.fold_element(spec, streams, ref)
    ref_f = act(spec, fold_ref, ref)
    cur = act(spec, residual.fold_element(spec, streams, other), other)
    frame = residual.frame_of(spec, streams)
    residual.verify_rotation(frame, model, ref_f, batches[0][0])
    if method in DATA_METHODS:
        turn = residual.activation_rotation(frame, model, ref_f, cur, batches)
        cur = act(frame.rotated, GroupElement(tuple(turn)), cur)
        cur = reference_alignment(
            frame.work, ref_f, cur, method, model=model, batches=batches, hold=frame.held, **options
        )
    else:
        value = mismatch(frame.work, ref_f, cur)
        for _ in range(ROTATION_ROUNDS):
            start = value
            cur = reference_alignment(frame.work, ref_f, cur, rounds=1, **options)
            turn = residual.weight_rotation(frame, ref_f, cur)
            cur = act(frame.rotated, GroupElement(tuple(turn)), cur)
            value = mismatch(frame.work, ref_f, cur)
            if start - value <= ROUND_TOL * max(start, 1e-300):
                break
    if path_loss is not None:
        centered = frozenset(i for i, s in zip(frame.rotations, streams, strict=True) if s.centered)
        cur = _refined(
            frame.rotated, model, ref_f, cur, batches, path_loss, options["seed"], centered
        )
    return act(spec, fold_ref.inverse(), cur)


def _refined(spec, model, ref, cur, batches, loss_fn, seed, centered=frozenset()) -> dict:
    """``cur`` moved by the continuous groups fitted to the path (:func:`.path.path_fit`)."""
    comps = path_fit(spec, model, ref, cur, batches, loss_fn, centered=centered, seed=seed)
    return act(spec, GroupElement(tuple(comps)), cur)


def _check_option(name, value, choices, noun, needs, continuous, model, batches) -> None:
    """Refuse, in one line, an unknown ``value`` of the option ``name``.

    Its values in :data:`NEEDS_MODEL` also need ``continuous="reference"`` or ``"auto"``,
    the model and ``batches`` (``needs`` says what for).
    """
    if value not in choices:
        raise WsymInputError(f"unknown {noun} {value!r}; use one of {', '.join(choices)}")
    needing, instead = NEEDS_MODEL[name]
    if value not in needing:
        return
    if continuous not in ("auto", "reference"):
        raise WsymInputError(
            f"{name}={value!r} works with continuous='reference' or 'auto', not {continuous!r}"
        )
    if model is None or not batches:
        raise WsymInputError(
            f"{name}={value!r} needs model= and batches={needs}; or use {name}={instead!r}"
        )


def _canonical_alignment(
    spec: SymmetrySpec, sd_ref: dict, sd_other: dict, method: str, signature=False, **options
) -> dict:
    """Both canonicalized in the continuous groups, matched, expressed in ``sd_ref``'s basis.

    ``signature``: weight matching starts from the units paired by their sorted
    signatures (:mod:`wsym.align.signature`), not from the identity.
    """
    max_iter, seed = options["max_iter"], options["seed"]
    dtype = _dtype_of(sd_ref)
    ref, g_ref = canonical_element(sd_ref, spec, kinds=NO_PERMUTATION, tol=CANON_TOL, dtype=dtype)
    other, _ = canonical_element(sd_other, spec, kinds=NO_PERMUTATION, tol=CANON_TOL, dtype=dtype)
    if signature:
        other = act(spec, signature_start(spec, ref, other), other)
    if method == "weights":
        perms = weight_matching(spec, ref, other, max_iter=max_iter, seed=seed, warm=signature)
    else:
        perms, matched = activation_matching(spec, options["model"], ref, other, options["batches"])
        other = act(spec, GroupElement(tuple(perms)), other)
        fixed = matched if method == "activations" else set()
        perms = weight_matching(spec, ref, other, max_iter=max_iter, seed=seed, fixed=fixed)
    aligned = act(spec, GroupElement(tuple(perms)), other)
    aligned = act(spec, GroupElement(tuple(procrustes(spec, ref, aligned))), aligned)
    return act(spec, g_ref.inverse(), aligned)


def imbalance(spec: SymmetrySpec, sd: dict) -> float:
    """How far ``sd`` is from its balanced point: the largest ``|log s|`` of one balancing step.

    Per scaling unit, ``|log s|`` of the scale that would balance it; per GL
    block, half the log condition number of its balancing element.
    """
    from wsym.align.canonicalize import _continuous

    out = 0.0
    for i, g in enumerate(spec.groups):
        kind = kind_of(g)
        if kind.diagonal and kind.continuous:
            out = max(out, _continuous(spec, sd, i)[1])
        elif kind.matrix and not kind.self_dual:
            m, _ = _continuous(spec, sd, i)
            out = max(out, 0.5 * float(torch.linalg.cond(m).log().max()))
    return out


def _dtype_of(sd: dict) -> torch.dtype:
    """The floating dtype of a working state dict (float64 if it has none)."""
    return next((v.dtype for v in sd.values() if v.is_floating_point()), torch.float64)


def check_same_architecture(spec: SymmetrySpec, *state_dicts: dict) -> None:
    """One-line errors for state dicts that do not fit ``spec`` or hold NaNs."""
    different = "checkpoints of different architectures?"
    check_spec(spec, "wsym.align")
    for i, sd in enumerate(state_dicts):
        check_state_dict(sd, "wsym.align", f"checkpoint {i + 1}")
    for key, dims in spec.layouts:
        shape = tuple(t.size for t in dims)
        for i, sd in enumerate(state_dicts):
            if key not in sd:
                raise WsymInputError(f"checkpoint {i + 1} has no tensor {key!r}: {different}")
            if tuple(sd[key].shape) != shape:
                got = tuple(sd[key].shape)
                raise WsymInputError(
                    f"{key} has shape {got} in checkpoint {i + 1}, not {shape}: {different}"
                )
            if sd[key].is_floating_point() and not torch.isfinite(sd[key]).all():
                raise WsymInputError(f"{key} holds NaN or infinite values in checkpoint {i + 1}")


def activation_matching(
    spec: SymmetrySpec, model, ref: dict, other: dict, batches
) -> tuple[list, set[int]]:
    """Per class with traced sites, the permutation maximizing activation correlation.

    A class's correlation is summed over all its sites (a residual stream has
    one per block: each sum into it, each LayerNorm output). Sites that a sign
    flip of the class negates (a LayerNorm's output, behind its gain) are left
    out where the class has other sites, and otherwise paired on
    ``|correlation|``; the flips themselves are matched afterwards, on the
    weights. Returns the permutation components and the permutation groups
    they settle (those with a site, moved or not; not the groups with one copy
    per index value, whose sites see every copy's units at once).
    """
    from wsym.align.activations import sites_at_states

    sites: dict[int, list] = {}
    for c, node, d in spec.sites:
        sites.setdefault(c, []).append((node, d))
    groups = {  # a group with one copy per expert is matched on the weights, per copy
        i: g
        for i, g in enumerate(spec.groups)
        if kind_of(g).permutes and g.cls in sites and not g.index
    }
    if not groups:
        return [], set()
    wanted = {s for g in groups.values() for s in sites[g.cls]}
    classes = {g.cls for g in groups.values()}
    flips = _half_flipped(spec, classes)
    states = [ref, other] + ([act(spec, GroupElement(tuple(flips)), ref)] if flips else [])
    acts_ref, acts_other, *moved = sites_at_states(model, states, batches, wanted)
    flipped = _sign_affected(acts_ref, moved[0]) if moved else set()
    comps = []
    for i, g in groups.items():
        kept = [s for s in sites[g.cls] if s not in flipped] or sites[g.cls]
        corr = 0
        for s in kept:
            a, b = acts_ref[s], acts_other[s]
            c = _standardize(a).T @ _standardize(b) / a.shape[0]
            corr = corr + (c.abs() if s in flipped else c)
        perm = assignment(corr)
        if (perm != torch.arange(len(perm))).any():
            comps.append((i, perm))
    return comps, set(groups)


def _half_flipped(spec: SymmetrySpec, classes) -> list:
    """Every sign group of ``classes`` flipping half its units (even indices)."""
    return [
        (i, torch.where(torch.arange(g.size) % 2 == 0, -1.0, 1.0).double())
        for i, g in enumerate(spec.groups)
        if kind_of(g).flips and g.cls in classes
    ]


def _sign_affected(acts_ref: dict, moved: dict) -> set:
    """Sites whose activations change when every sign group of their class flips half its units."""
    return {
        s
        for s, a in acts_ref.items()
        if float((moved[s] - a).abs().max()) > 1e-9 * float(a.abs().max().clamp_min(1e-300))
    }


def _standardize(x: torch.Tensor) -> torch.Tensor:
    x = x - x.mean(0)
    return x / x.std(0).clamp_min(1e-12)
