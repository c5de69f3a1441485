"""Verification one tensor at a time (``stream=True``) against the whole-state path.

The streamed probe computes every state (generic weights, acted, cast, perturbed)
tensor by tensor while the forward pass reads it (:mod:`wsym.group.lazy`,
:mod:`wsym.group.acted`); it must give the whole path's outputs bit for bit, so the
same groups, the same deviations and the same refusals.
"""

import warnings

import pytest
import torch
from torch import nn

from wsym.detect import detection_trace, find_candidates, verify_candidates
from wsym.errors import SymmetryWarning
from wsym.group.elements import act, sample
from wsym.group.lazy import LazyState
from wsym.group.verify import acted, float64_probe, screen


def _candidates(model, x):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return find_candidates(detection_trace(model, x), model)


def _tiny_llama():
    transformers = pytest.importorskip("transformers")
    cfg = transformers.LlamaConfig(
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=64,
        tie_word_embeddings=True,
    )
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(cfg).eval(), torch.randint(0, 64, (1, 6))


def _tiny_bert():
    transformers = pytest.importorskip("transformers")
    cfg = transformers.BertConfig(
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=48,
        vocab_size=64,
        max_position_embeddings=16,
    )
    torch.manual_seed(0)
    return transformers.BertModel(cfg).eval(), torch.randint(0, 64, (1, 6))


def _tiny_gpt2():
    transformers = pytest.importorskip("transformers")
    cfg = transformers.GPT2Config(n_embd=32, n_layer=2, n_head=4, vocab_size=64, n_positions=16)
    torch.manual_seed(0)
    return transformers.GPT2Model(cfg).eval(), torch.randint(0, 64, (1, 6))


def _resnet18():
    torchvision = pytest.importorskip("torchvision")
    torch.manual_seed(0)
    return torchvision.models.resnet18(num_classes=5).eval(), torch.randn(1, 3, 32, 32)


def _vit():
    timm = pytest.importorskip("timm")
    torch.manual_seed(0)
    model = timm.create_model(
        "vit_tiny_patch16_224", img_size=32, patch_size=8, depth=2, num_classes=3
    )
    return model.eval(), torch.randn(1, 3, 32, 32)


STOCK = [_tiny_llama, _tiny_bert, _tiny_gpt2, _resnet18, _vit]


@pytest.mark.parametrize("build", STOCK, ids=lambda f: f.__name__.strip("_"))
def test_streamed_verification_finds_the_whole_paths_groups(build):
    model, x = build()
    spec = _candidates(model, x)
    whole = screen(spec, float64_probe(model, x, stream=False))
    streamed = screen(spec, float64_probe(model, x, stream=True))
    assert streamed == whole  # same deviations, bit for bit, and the same refusals
    assert len(spec.groups) > 0


def test_lazy_states_equal_the_whole_ones_bit_for_bit():
    model, x = _tiny_llama()  # tied embeddings: an alias in every state
    spec = _candidates(model, x)
    a, b = float64_probe(model, x, stream=False), float64_probe(model, x, stream=True)
    assert isinstance(b.generic, LazyState) and not isinstance(a.generic, LazyState)
    assert all(torch.equal(a.generic[k], b.generic[k]) for k in a.generic)
    g = sample(spec, seed=3, scale=(0.1, 10.0), moving=True)
    ma, mb = act(spec, g, a.generic), acted(spec, g, b.generic)
    assert all(torch.equal(ma[k], mb[k]) for k in ma)
    assert torch.equal(a(ma), b(mb))
    assert a.floor(a.generic) == b.floor(b.generic)
    a32, b32 = a.in_dtype(torch.float32), b.in_dtype(torch.float32)
    assert torch.equal(a32(a32.generic), b32(b32.generic))
    assert a32.floor(a32.generic) == b32.floor(b32.generic)


def test_batchnorm_scalings_read_their_running_variances_lazily():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 6, 3), nn.BatchNorm2d(6), nn.ReLU(), nn.Conv2d(6, 2, 3))
    model.eval()
    x = torch.randn(2, 3, 9, 9)
    spec = _candidates(model, x)
    assert "norm_scaling" in {g.kind for g in spec.groups}
    a, b = float64_probe(model, x, stream=False), float64_probe(model, x, stream=True)
    g = sample(spec, seed=1, scale=(0.1, 10.0), moving=True)
    ma, mb = act(spec, g, a.generic), acted(spec, g, b.generic)
    assert all(torch.equal(ma[k], mb[k]) for k in ma)
    assert screen(spec, a) == screen(spec, b)


class Block(nn.Module):
    """A residual MLP block; ``mix`` multiplies the hidden units by fixed distinct factors."""

    def __init__(self, d=6, h=8, mix=False):
        super().__init__()
        self.up, self.down = nn.Linear(d, h), nn.Linear(h, d)
        self.mix = mix

    def forward(self, x):
        z = torch.relu(self.up(x))
        if self.mix:  # breaks the permutation of this block's hidden units (not their scaling)
            z = z * torch.linspace(0.5, 2.0, z.shape[-1], dtype=z.dtype)
        return x + self.down(z)


def _blocks(mix_at=None):
    torch.manual_seed(0)
    blocks = [Block(mix=i == mix_at) for i in range(3)]
    return nn.Sequential(nn.Linear(4, 6), *blocks, nn.Linear(6, 3)).eval()


def test_a_false_group_planted_in_one_block_is_refused():
    x = torch.randn(3, 4)
    clean, broken = _blocks(), _blocks(mix_at=2)
    broken.load_state_dict(clean.state_dict())
    spec = _candidates(clean, x)  # block "3"'s hidden permutation: holds here, not in broken
    planted = [
        i
        for i, g in enumerate(spec.groups)
        if g.kind == "permutation" and "3.up.weight" in g.params
    ]
    assert len(planted) == 1
    devs, failed = screen(spec, float64_probe(broken, x, stream=True))
    assert failed == planted  # only the planted group is refused; the other blocks' hold
    assert devs[planted[0]] > 1e-3  # changed the outputs by far more than round-off
    assert (devs, failed) == screen(spec, float64_probe(broken, x, stream=False))
    with pytest.warns(SymmetryWarning, match="dropped unverified permutation group on 3.up"):
        kept = verify_candidates(spec, broken, x, stream=True)
    assert len(kept.groups) == len(spec.groups) - 1
    assert not any(g.kind == "permutation" and "3.up.weight" in g.params for g in kept.groups)
