"""residual='rotation': a pre-LN residual stream rotated onto the reference's."""

import pytest
import torch
from cases import BY_NAME
from test_canon import double
from test_detect import as_float64, outputs

import wsym
from wsym.align import residual
from wsym.align.continuous import mismatch
from wsym.align.matching import weight_matching
from wsym.errors import WsymInputError
from wsym.group.elements import GroupElement, act

PRE_LN = ["tiny-transformer", "tiny-transformer-rotary", "tiny-transformer-tokens"]
METHODS = ["weights", "activations", "activations+weights"]


def batches(name, n=3):
    torch.manual_seed(5)
    return [(torch.cat([BY_NAME[name].inputs() for _ in range(16)]), None) for _ in range(n)]


def pair(model, name):
    """The case's weights with generic norm gains (some negative), and an independent copy."""
    sds = []
    for seed in (0, 1):
        torch.manual_seed(seed)
        sd = double(BY_NAME[name].build().state_dict() if seed else model.state_dict())
        gen = torch.Generator().manual_seed(seed + 10)
        for m_name, m in model.named_modules():
            if isinstance(m, torch.nn.LayerNorm):
                shape = sd[f"{m_name}.weight"].shape
                sd[f"{m_name}.weight"] = torch.randn(shape, generator=gen, dtype=torch.float64)
                sd[f"{m_name}.bias"] = torch.randn(shape, generator=gen, dtype=torch.float64)
        sds.append(sd)
    return sds


def folded(spec, model, ref, other):
    """``(frame, ref folded, other folded, ref's fold)``."""
    streams = residual.residual_streams(spec, model)
    f_ref = residual.fold_element(spec, streams, ref)
    f_other = residual.fold_element(spec, streams, other)
    frame = residual.frame_of(spec, streams)
    return frame, act(spec, f_ref, ref), act(spec, f_other, other), f_ref


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("name", PRE_LN)
def test_rotation_alignment_keeps_the_function(detected, name, method):
    model, inputs, spec = detected(name)
    ref, other = pair(model, name)
    aligned = wsym.align(
        ref, other, spec, method, residual="rotation", model=model, batches=batches(name)
    )
    net, x = as_float64(model, inputs)
    before, after = outputs(net, other, x), outputs(net, aligned, x)
    assert float((after - before).abs().max()) <= 1e-9 * float(before.abs().max())
    # in the reference's basis the gains are the reference's at both ends
    for _, _, key, _ in residual.residual_streams(spec, model)[0].norms:
        assert torch.allclose(aligned[key], ref[key], rtol=1e-12, atol=0)


@pytest.mark.parametrize("name", PRE_LN)
def test_rotation_never_raises_the_objective_over_the_permutation_only_start(detected, name):
    model, _, spec = detected(name)
    ref, other = pair(model, name)
    aligned = wsym.align(ref, other, spec, residual="rotation", model=model, batches=batches(name))
    frame, ref_f, other_f, f_ref = folded(spec, model, ref, other)
    start = act(
        frame.work, GroupElement(tuple(weight_matching(frame.work, ref_f, other_f))), other_f
    )
    after = mismatch(spec, ref_f, act(spec, f_ref, aligned))
    assert after < 0.99 * mismatch(spec, ref_f, start)


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("name", PRE_LN)
def test_planted_rotation_is_recovered_exactly(detected, name, method):
    model, _, spec = detected(name)
    ref, _ = pair(model, name)
    frame, ref_f, _, f_ref = folded(spec, model, ref, ref)
    (i,) = frame.rotations
    gen = torch.Generator().manual_seed(3)
    q = residual.constrained_procrustes(
        torch.randn(
            frame.rotated.groups[i].size,
            frame.rotated.groups[i].size,
            generator=gen,
            dtype=torch.float64,
        ),
        centered=True,
    )
    planted = act(frame.rotated, GroupElement(((i, q),)), ref_f)
    planted = spec.act(spec.sample(seed=2, scale=(0.5, 2.0), kinds=["scaling", "sign"]), planted)
    assert mismatch(spec, ref, planted) > 1e-2 * mismatch(
        spec, ref, {k: 0 * v for k, v in ref.items()}
    )
    back = wsym.align(
        ref, planted, spec, method, residual="rotation", model=model, batches=batches(name)
    )
    assert mismatch(spec, ref, back) <= 1e-12 * mismatch(spec, ref, planted)


def test_constrained_procrustes_is_the_best_rotation_fixing_ones():
    gen = torch.Generator().manual_seed(0)
    cross = torch.randn(6, 6, generator=gen, dtype=torch.float64)
    best = residual.constrained_procrustes(cross, centered=True)
    ones = torch.ones(6, dtype=torch.float64)
    assert torch.allclose(best.T @ best, torch.eye(6, dtype=torch.float64), atol=1e-12)
    assert torch.allclose(best @ ones, ones, atol=1e-12)
    basis = residual.complement_basis(6)
    for _ in range(200):  # no random rotation fixing 1 scores higher
        r = torch.linalg.qr(torch.randn(5, 5, generator=gen, dtype=torch.float64))[0]
        other = torch.full((6, 6), 1 / 6, dtype=torch.float64) + basis @ r @ basis.T
        assert float((other * cross).sum()) <= float((best * cross).sum()) + 1e-12


@pytest.mark.parametrize(
    ("name", "needle"),
    [("mlp-relu", "no pre-LN residual stream"), ("bert", "no pre-LN residual stream")],
)
def test_refuses_what_is_not_a_pre_ln_stream(detected, name, needle):
    model, inputs, spec = detected(name)
    sd = double(model.state_dict())
    with pytest.raises(WsymInputError, match=needle):
        wsym.align(sd, sd, spec, residual="rotation", model=model, batches=[(inputs, None)])


class StreamWithReLU(torch.nn.Module):
    """Pre-LN blocks on a stream with a ReLU on it: permutations hold, rotations do not."""

    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Linear(4, 6)
        self.norm1, self.norm2 = torch.nn.LayerNorm(6), torch.nn.LayerNorm(6)
        self.mlp = torch.nn.Linear(6, 6)
        self.head = torch.nn.Linear(6, 3)

    def forward(self, x):
        h = torch.relu(self.embed(x))
        h = h + self.mlp(self.norm1(h))
        return self.head(self.norm2(h))


def test_refuses_a_stream_that_a_rotation_breaks():
    torch.manual_seed(0)
    model, x = StreamWithReLU(), torch.randn(8, 4)
    spec = wsym.detect(model, x)
    sd = double(model.state_dict())
    with pytest.raises(WsymInputError, match="changes the output by"):
        wsym.align(sd, sd, spec, residual="rotation", model=model, batches=[(x, None)])


@pytest.mark.parametrize(
    "option,value,unknown,message",
    [
        ("residual", "rotation", "rotations", "unknown residual"),
        ("refine", "path", "paths", "unknown refinement"),
    ],
)
def test_model_fitted_options_need_the_model_and_reference_fits(
    detected, option, value, unknown, message
):
    """``residual="rotation"`` and ``refine="path"`` are refused alike, each in one line."""
    model, inputs, spec = detected("tiny-transformer")
    sd = double(model.state_dict())
    with pytest.raises(WsymInputError, match="needs model= and batches="):
        wsym.align(sd, sd, spec, **{option: value})
    with pytest.raises(WsymInputError, match="continuous='reference'"):
        wsym.align(
            sd,
            sd,
            spec,
            continuous="canonical",
            model=model,
            batches=[(inputs, None)],
            **{option: value},
        )
    with pytest.raises(WsymInputError, match=message):
        wsym.align(sd, sd, spec, **{option: unknown})


class PreRMSNorm(torch.nn.Module):
    """Two pre-RMSNorm residual MLP blocks (RMSNorm streams are not rotated yet)."""

    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Linear(4, 6)
        self.norms = torch.nn.ModuleList(torch.nn.RMSNorm(6) for _ in range(3))
        self.ups = torch.nn.ModuleList(torch.nn.Linear(6, 8) for _ in range(2))
        self.downs = torch.nn.ModuleList(torch.nn.Linear(8, 6) for _ in range(2))
        self.head = torch.nn.Linear(6, 3)

    def forward(self, x):
        h = self.embed(x)
        for norm, up, down in zip(self.norms, self.ups, self.downs, strict=False):
            h = h + down(torch.relu(up(norm(h))))
        return self.head(self.norms[2](h))


def test_rms_norm_streams_are_refused():
    torch.manual_seed(0)
    model, x = PreRMSNorm().double(), torch.randn(16, 4, dtype=torch.float64)
    spec = wsym.detect(model, x)
    sd = double(model.state_dict())
    with pytest.raises(WsymInputError, match="no pre-LN residual stream"):
        wsym.align(sd, sd, spec, residual="rotation", model=model, batches=[(x, None)])
