"""The settled start of weight matching: greedy order, no unmatched axis read, copies recovered."""

import pytest
import torch
from cases import BY_NAME
from test_canon import double
from test_detect import as_float64, outputs

import wsym
from wsym.align.assignment import assignment
from wsym.align.continuous import mismatch
from wsym.align.matching import plans
from wsym.align.settled import settled_start, settled_weight
from wsym.models.networks import MLP


def _mlp(widths=(5, 6), seed=0):
    torch.manual_seed(seed)
    model = MLP(4, list(widths), 3)
    return model, wsym.detect(model, torch.randn(3, 4)), double(model.state_dict())


def test_an_mlp_is_settled_from_the_input_on():
    """Entries per unit whose other axes are settled: the input layer first, then the next."""
    _, spec, sd = _mlp()
    hidden = [g.cls for g in spec.groups if g.kind == "permutation"]
    both = set(hidden)
    assert settled_weight(spec, hidden[0], both)[0] == 4 + 1  # 0.weight rows, 0.bias
    assert settled_weight(spec, hidden[1], both)[0] == 3 + 1  # 4.weight columns, 2.bias
    assert settled_weight(spec, hidden[1], {hidden[1]})[0] == 5 + 3 + 1  # 2.weight rows too
    assert settled_weight(spec, hidden[1], both)[1] == {"2.weight"}


def test_the_start_is_layerwise_matching_on_settled_entries():
    """Against a direct computation: hidden 1 on [W1, b1], then hidden 2 on [W2, b2, W3^T]."""
    _, spec, ref = _mlp(seed=0)
    _, _, other = _mlp(seed=1)
    comps, moved = settled_start(spec, ref, other, plans(spec))

    def rows(sd, *keys):
        return torch.cat([sd[k].reshape(sd[k].shape[0], -1) for k in keys], 1)

    p1 = assignment(rows(ref, "0.weight", "0.bias") @ rows(other, "0.weight", "0.bias").T)
    w2 = other["2.weight"][:, p1]
    cur = {"2.weight": w2, "2.bias": other["2.bias"], "4.weight.T": other["4.weight"].T}
    want = {"2.weight": ref["2.weight"], "2.bias": ref["2.bias"], "4.weight.T": ref["4.weight"].T}
    p2 = assignment(rows(want, *want) @ rows(cur, *cur).T)
    assert torch.equal(moved["0.weight"], other["0.weight"][p1])
    assert torch.equal(moved["2.weight"], w2[p2])
    assert torch.equal(moved["4.weight"], other["4.weight"][:, p2])


@pytest.mark.parametrize("widths", [(5, 6), (7, 7, 7)])
def test_a_permuted_copy_is_recovered_by_the_start_alone(widths):
    _, spec, sd = _mlp(widths)
    moved = spec.act(spec.sample(seed=3, kinds=["permutation"]), sd)
    _, back = settled_start(spec, sd, moved, plans(spec))
    assert all(torch.equal(back[k], sd[k]) for k in sd)


def test_held_classes_count_as_settled_and_do_not_move():
    _, spec, ref = _mlp(seed=0)
    _, _, other = _mlp(seed=1)
    first = next(i for i, g in enumerate(spec.groups) if g.kind == "permutation")
    comps, moved = settled_start(spec, ref, other, plans(spec, fixed={first}))
    assert all(i != first for i, _ in comps)
    assert torch.equal(moved["0.weight"], other["0.weight"])


@pytest.mark.parametrize("name", ["mlp-relu", "residual-cnn", "tiny-transformer"])
def test_the_default_from_the_settled_start_keeps_the_function(detected, name):
    model, inputs, spec = detected(name)
    ref = double(model.state_dict())
    torch.manual_seed(7)
    other = double(BY_NAME[name].build().state_dict())
    aligned = wsym.align(ref, other, spec)
    net, x = as_float64(model, inputs)
    before, after = outputs(net, other, x), outputs(net, aligned, x)
    assert float((after - before).abs().max()) <= 1e-9 * float(before.abs().max())
    assert mismatch(spec, ref, aligned) <= mismatch(spec, ref, other) * (1 + 1e-12)


def test_only_a_chain_of_layers_gets_the_settled_start(detected):
    """MLPs are chains; a pre-LN transformer's stream couples to every block (identity start)."""
    from wsym.align.settled import is_chain

    _, spec, _ = _mlp((5, 6, 7))
    assert is_chain(spec, plans(spec))
    _, _, transformer = detected("tiny-transformer")
    assert not is_chain(transformer, plans(transformer))


def test_off_a_chain_the_default_is_the_identity_start(detected, monkeypatch):
    import sys

    module = sys.modules["wsym.align.alignment"]
    calls = []
    monkeypatch.setattr(module, "settled_start", lambda *a, **k: calls.append(1))
    model, _, spec = detected("tiny-transformer")
    ref = double(model.state_dict())
    torch.manual_seed(7)
    wsym.align(ref, double(BY_NAME["tiny-transformer"].build().state_dict()), spec)
    assert calls == []
