"""The one block reader: gather/scatter against the readers it replaces (float64).

``wsym.group.layout.gather`` equals ``wsym.group.units.block_matrices``' old reading and
``wsym.sharpness.blocks.gather_group`` (GL and GL(1) scaling blocks: same shapes, same
order), ``scatter`` equals ``wsym.sharpness.blocks.scatter_group``, is the inverse of
gathering on the entries read and its adjoint.
"""

import pytest
import torch

from wsym.group.kinds import kind_of
from wsym.group.layout import gather, scatter
from wsym.sharpness.blocks import gather_group, scatter_group
from wsym.sharpness.geometry import Pair

NAMES = [
    "mlp-relu",
    "linear-linear",
    "residual-cnn",
    "tiny-transformer",
    "tiny-transformer-rotary",
    "tiny-transformer-tokens",
    "concat",
    "group-norm",
    "radial",
    "mha",
    "gqa",
    "bert",
    "llama",
    "e3nn-gate",
]


def _params(model, seed=0) -> dict:
    gen = torch.Generator().manual_seed(seed)
    return {
        n: torch.randn(p.shape, generator=gen, dtype=torch.float64)
        for n, p in model.named_parameters()
    }


@pytest.mark.parametrize("name", NAMES)
def test_gather_and_scatter_replace_the_old_readers(detected, name):
    model, _, spec = detected(name)
    params = _params(model)
    gen = torch.Generator().manual_seed(1)
    checked = 0
    for group in spec.groups:
        kind = kind_of(group)
        if not (kind.matrix or group.kind == "scaling"):
            continue
        parts = gather(spec, group, params)
        if group.kind == "gl" or (group.kind == "scaling" and set(parts) == {0, 1}):
            old = gather_group(spec, group, params)
            assert set(old) == set(parts)
            for k in old:
                assert torch.equal(old[k], parts[k]), (group.kind, k)
            if set(parts) == {0, 1}:
                pair = Pair(torch.randn_like(parts[0]), torch.randn_like(parts[1]))
                new = scatter(spec, group, {0: pair.G, 1: pair.H}, params)
                ref = scatter_group(spec, group, pair, params)
                assert set(new) == set(ref)
                assert all(torch.equal(new[p], ref[p]) for p in ref), group.kind
                checked += 1
        if not parts:
            continue
        back = scatter(spec, group, parts, params)  # inverse on the entries read
        for p, t in back.items():
            read = scatter(spec, group, {k: torch.ones_like(v) for k, v in parts.items()}, params)
            assert torch.equal(t[read[p] != 0], params[p][read[p] != 0])
        y = {k: torch.randn(v.shape, generator=gen, dtype=torch.float64) for k, v in parts.items()}
        lhs = sum(float((v * y[k]).sum()) for k, v in parts.items())
        rhs = sum(float((params[p] * t).sum()) for p, t in scatter(spec, group, y, params).items())
        assert abs(lhs - rhs) < 1e-10 * (1 + abs(lhs))  # adjoint
    assert checked or name == "radial"  # radial: one orthogonal group only
