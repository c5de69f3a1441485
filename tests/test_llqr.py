"""Learned LLQR: the LQR objective against a dense float64 reference, structures, optimizers."""

import copy

import pytest
import torch
from torch import nn
from torch.nn import functional as F

from wsym.errors import WsymInputError
from wsym.models.networks import MLP
from wsym.optim import LLQR, LLQRSAM, LQRPreconditioner
from wsym.optim.lqr import Linearization, damping_value, fit
from wsym.optim.structures import STRUCTURES, Dense, Eigen, Kronecker, blocks_of
from wsym.testing.oracles.curvature import dense_hessian
from wsym.testing.oracles.optim import (
    block_optimum,
    dense_curvature,
    flatten,
    structure_groups,
    symmetric_block_optimum,
    unflatten,
)

RICHER = ("diagonal", "kfac", "eigen", "dense")


def _problem(model, n=64, d=5, classes=3, chunks=8, damping=0.1):
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(n, d, generator=gen, dtype=torch.float64)
    y = torch.randint(0, classes, (n,), generator=gen)
    out = model(x)
    loss = F.cross_entropy(out, y)
    dz = torch.autograd.grad(loss, out)[0]
    params = {k: p.detach() for k, p in model.named_parameters()}
    lin = Linearization(model, params, x, "cross_entropy")
    grads = lin.gradients(dz, chunks)
    lam = damping_value(lin, grads, damping)
    full = torch.autograd.grad(F.cross_entropy(model(x), y), list(model.parameters()))
    return lin, grads, lam, dict(zip(params, full, strict=True)), x, y


def _learned(structure, model, lin, grads, lam, steps=200):
    layout = blocks_of(model)
    u = STRUCTURES[structure](layout, 1.0 / (lam / 0.1))
    if structure == "eigen":
        kron = Kronecker(layout, 1.0 / (lam / 0.1))
        fit(kron, lin, grads, 0.1, steps=steps, lam=lam)
        u.rebase(kron)
        u.reset_scales()
    return u, fit(u, lin, grads, 0.1, steps=steps, lam=lam)


def _reference(model, lin, grads, lam, full):
    names = list(full)
    c = dense_curvature(lin, lam)
    optimum = sum(
        -0.5 * float(flatten(g, names) @ torch.linalg.solve(c, flatten(g, names))) for g in grads
    ) / len(grads)
    return c, optimum, torch.linalg.solve(c, flatten(full, names))


def _cosine(u, full, exact):
    names = list(full)
    step = flatten(u.apply({n: t.double() for n, t in full.items()}), names)
    return float(step @ exact / (step.norm() * exact.norm()))


def test_dense_curvature_is_the_gauss_newton_matrix():
    torch.manual_seed(0)
    model = nn.Linear(5, 3).double()  # linear in the parameters: Gauss-Newton = Hessian
    lin, _, _, _, x, y = _problem(model)
    hessian = dense_hessian(model, [(x, y)], F.cross_entropy)
    # dense_hessian flattens weight then bias, as flatten does
    torch.testing.assert_close(dense_curvature(lin, 0.0), hessian)


def _block_reference(model, lin, grads, lam, full):
    """The richest structure's own optima: block-diagonal PSD (FISTA) and symmetric (bound)."""
    names = list(full)
    c = dense_curvature(lin, lam)
    g = torch.stack([flatten(t, names) for t in grads], 1)
    groups = structure_groups(blocks_of(model))
    u, value = block_optimum(c, g, groups)
    bound = symmetric_block_optimum(c, g, groups)[1]
    return u @ flatten(full, names), value, bound


def _cosine_to(u, full, target):
    step = flatten(u.apply({n: t.double() for n, t in full.items()}), list(full))
    return float(step @ target / (step.norm() * target.norm()))


@pytest.mark.parametrize("hidden", [[], [4]])
def test_learned_step_approaches_exact_step_as_structure_grows(hidden):
    torch.manual_seed(0)
    model = MLP(5, hidden, 3).double()
    lin, grads, lam, full, _, _ = _problem(model)
    _, optimum, exact = _reference(model, lin, grads, lam, full)
    best_step, best, bound = _block_reference(model, lin, grads, lam, full)
    tol = 1e-9 * abs(optimum)
    assert optimum - tol <= bound <= best + tol  # all U, symmetric blocks, PSD blocks: nested
    learned, values, cosines = {}, {}, {}
    for s in RICHER:
        learned[s], values[s] = _learned(s, model, lin, grads, lam)
        cosines[s] = _cosine(learned[s], full, exact)
        assert values[s] >= bound - 1e-9 * abs(bound)  # never below the structure's optimum
    # nested structures reach lower objectives: kfac in eigen, everything in dense
    assert values["eigen"] <= values["kfac"] + 1e-9
    assert values["dense"] <= min(values.values()) + 1e-9
    assert cosines["kfac"] > cosines["diagonal"]
    assert cosines["dense"] > cosines["diagonal"]
    # the richest structure reaches its own optimum: the best block-diagonal U
    assert values["dense"] == pytest.approx(best, rel=1e-3)
    assert _cosine_to(learned["dense"], full, best_step) >= 0.99
    if not hidden:  # one layer: block-diagonal is no restriction, the optimum is C^-1
        assert cosines["dense"] >= 0.99
        assert best == pytest.approx(optimum, rel=1e-6)
        assert values["dense"] == pytest.approx(optimum, rel=1e-6)
    else:  # two layers: the cross-layer blocks of C^-1 are what no block-diagonal U holds
        cross = float(best_step @ exact / (best_step.norm() * exact.norm()))
        assert best > optimum + 1e-2 * abs(optimum)
        assert cross < 0.99
        assert cosines["dense"] == pytest.approx(cross, abs=5e-3)


def test_preconditioner_refresh_reaches_the_exact_step_and_is_normalized():
    torch.manual_seed(0)
    model = nn.Linear(5, 3).double()
    lin, grads, lam, full, x, y = _problem(model)
    _, _, exact = _reference(model, lin, grads, lam, full)
    pre = LQRPreconditioner("dense", steps=400, chunks=8)
    out = model(x)
    dz = torch.autograd.grad(F.cross_entropy(out, y), out)[0]
    params = {n: p.detach() for n, p in model.named_parameters()}
    pre.estimate(model, params, x, output_grad=dz)
    assert _cosine(pre.u, full, exact) >= 0.99
    quad = [float(sum((g[n] * pre.apply(g)[n]).sum() for n in g)) for g in pre.last_gradients]
    assert sum(quad) / len(quad) == pytest.approx(1.0, rel=1e-9)  # the scale rule


def test_structures_apply_their_matrices():
    torch.manual_seed(0)
    model = nn.Linear(3, 2).double()
    layout = blocks_of(model)
    g = {n: torch.randn_like(p) for n, p in model.named_parameters()}
    names = list(g)
    vec = torch.cat([g["weight"], g["bias"][:, None]], 1)  # the block [W | b]
    kron = Kronecker(layout, 1.0)
    raw = [torch.randn_like(r) * 0.3 for r in kron.raw()]
    kron.update(raw)
    a, gm = kron.blocks["weight"]
    dense_kron = torch.kron(gm, a)  # row-major vec: (G V A)_ij = sum G_ik V_kl A_lj
    ref = (dense_kron @ vec.reshape(-1)).reshape(2, 4)
    out = kron.apply(g)
    torch.testing.assert_close(out["weight"], ref[:, :3])
    torch.testing.assert_close(out["bias"], ref[:, 3])
    eigen = Eigen(layout, 1.0)
    eigen.rebase(kron)
    eigen.reset_scales()  # S = lambda_G lambda_A^T reproduces A (x) G exactly
    for n in names:
        torch.testing.assert_close(eigen.apply(g)[n], out[n])
    dense = Dense(layout, 1.0)
    dense.update([torch.randn_like(r) * 0.3 for r in dense.raw()])
    m = dense.blocks["weight"]
    assert float(torch.linalg.eigvalsh(m).min()) > 0
    ref = (m @ vec.reshape(-1)).reshape(2, 4)
    torch.testing.assert_close(dense.apply(g)["weight"], ref[:, :3])


def test_moving_average_and_eigenbasis_projection():
    torch.manual_seed(0)
    layout = blocks_of(nn.Linear(3, 2).double())
    old, new = Kronecker(layout, 1.0), Kronecker(layout, 1.0)
    new.update([torch.randn_like(r) * 0.3 for r in new.raw()])
    a_old, g_old = old.blocks["weight"]
    a_new, g_new = new.blocks["weight"]
    old.average(new, 0.75)
    torch.testing.assert_close(old.blocks["weight"][0], 0.75 * a_old + 0.25 * a_new)
    torch.testing.assert_close(old.blocks["weight"][1], 0.75 * g_old + 0.25 * g_new)
    eigen = Eigen(layout, 1.0)
    eigen.rebase(new)
    eigen.update([torch.randn_like(r) * 0.5 for r in eigen.raw()])
    g = {"weight": torch.randn(2, 3, dtype=torch.float64), "bias": torch.randn(2).double()}
    before = eigen.apply(g)
    eigen.rebase(new)  # same basis: projection is the identity
    for n in g:
        torch.testing.assert_close(eigen.apply(g)[n], before[n])


def _loader(model, x, y, steps, opt, two_pass):
    losses = []
    for _ in range(steps):

        def closure():
            opt.zero_grad()
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            return loss

        if two_pass:
            losses.append(float(opt.step(closure).detach()))
        else:
            losses.append(float(closure().detach()))
            opt.step()
    return losses


@pytest.mark.parametrize("structure", RICHER + ("fisher-diagonal", "fisher-kfac"))
@pytest.mark.parametrize("cls", [LLQR, LLQRSAM])
def test_llqr_optimizers_descend(structure, cls):
    torch.manual_seed(0)
    model = MLP(5, [8], 3).double()
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(64, 5, generator=gen, dtype=torch.float64)
    y = torch.randint(0, 3, (64,), generator=gen)
    opt = cls(model, preconditioner=structure, refresh=5, lr=0.1, momentum=0.9)
    losses = _loader(model, x, y, 15, opt, cls is LLQRSAM)
    assert losses[-1] < 0.9 * losses[0]
    assert opt.preconditioner.refreshes == 3  # steps 0, 5, 10


def test_llqr_sam_perturbation_in_learned_metric():
    torch.manual_seed(0)
    model = MLP(5, [6], 3).double()
    x = torch.randn(32, 5, dtype=torch.float64)
    y = torch.randint(0, 3, (32,))
    opt = LLQRSAM(model, rho=0.3, lr=0.1, preconditioner="eigen", refresh=1)
    model.zero_grad()
    F.cross_entropy(model(x), y).backward()  # the recorder sees the batch
    params = list(model.parameters())
    g = [p.grad.clone() for p in params]
    eps = opt.perturbation(params, g)
    ug = opt.precondition(g)
    quad = float(sum((a * b).sum() for a, b in zip(g, ug, strict=True)))
    c = 0.3 / quad**0.5
    for e, u in zip(eps, ug, strict=True):
        torch.testing.assert_close(e, c * u)


def test_refresh_and_perturbed_pass_leave_batchnorm_statistics_alone():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(5, 4), nn.BatchNorm1d(4), nn.ReLU(), nn.Linear(4, 3)).double()
    x = torch.randn(32, 5, dtype=torch.float64)
    y = torch.randint(0, 3, (32,))
    reference = copy.deepcopy(model)
    reference.train()
    reference(x)
    for cls in (LLQR, LLQRSAM):
        net = copy.deepcopy(model)
        opt = cls(net, lr=0.1, refresh=1)
        _loader(net, x, y, 1, opt, cls is LLQRSAM)
        torch.testing.assert_close(net[1].running_mean, reference[1].running_mean)
        torch.testing.assert_close(net[1].running_var, reference[1].running_var)
        assert int(net[1].num_batches_tracked) == 1


def test_bad_input_raises_one_clear_error():
    model = MLP(5, [4], 3)
    for cls in (LLQR, LLQRSAM):
        for lr in (0, -0.1, float("inf")):
            with pytest.raises(WsymInputError, match="lr must be a positive number"):
                cls(model, lr=lr)
        for k in (0, -1, 2.5):
            with pytest.raises(WsymInputError, match="refresh"):
                cls(model, lr=0.1, refresh=k)
        with pytest.raises(WsymInputError, match="unknown preconditioner 'shampoo'"):
            cls(model, lr=0.1, preconditioner="shampoo")
        with pytest.raises(WsymInputError, match="use 'eigen' or 'kfac'"):
            cls(MLP(64, [64], 10), lr=0.1, preconditioner="dense")
        with pytest.raises(WsymInputError, match="takes the model"):
            cls(list(model.parameters()), lr=0.1)
    with pytest.raises(WsymInputError, match="rho must be a positive number"):
        LLQRSAM(model, lr=0.1, rho=0.0)
    with pytest.raises(WsymInputError, match="steps must be an integer"):
        LQRPreconditioner("kfac", steps=0)
    with pytest.raises(WsymInputError, match="unknown loss"):
        LQRPreconditioner("kfac", loss="hinge")
    pre = LQRPreconditioner("kfac")
    params = {n: p.detach() for n, p in model.named_parameters()}
    with pytest.raises(WsymInputError, match="through LLQR or LLQRSAM"):
        pre.estimate(model, params, torch.randn(4, 5))


def test_unflatten_inverts_flatten():
    table = {"a": torch.randn(2, 3, dtype=torch.float64), "b": torch.randn(4).double()}
    back = unflatten(flatten(table, ["a", "b"]), {n: t.shape for n, t in table.items()})
    for n in table:
        torch.testing.assert_close(back[n], table[n])


@pytest.mark.parametrize("structure", ["fisher-diagonal", "fisher-kfac"])
def test_fisher_refresh_on_diverged_weights_keeps_the_current_u(structure):
    torch.manual_seed(0)
    model = MLP(5, [4], 3).double()
    x, y = torch.randn(32, 5, dtype=torch.float64), torch.randint(0, 3, (32,))
    opt = LLQR(model, preconditioner=structure, refresh=1, lr=0.1)
    _loader(model, x, y, 1, opt, False)
    g = {n: torch.randn_like(p) for n, p in model.named_parameters()}
    before = opt.preconditioner.apply(g)
    with torch.no_grad():
        model[0].weight[0, 0] = float("nan")
    _loader(model, x, y, 1, opt, False)  # the refresh is skipped, not a sampling error
    assert opt.preconditioner.refreshes == 1
    for n in g:
        torch.testing.assert_close(opt.preconditioner.apply(g)[n], before[n])
