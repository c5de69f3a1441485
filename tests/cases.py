"""One registry of detection cases: model factory, example inputs, expected group counts.

Expected counts are the exact group table each architecture must produce; every
reported group is also checked numerically by the tests that use this registry.
"""

from __future__ import annotations

import copy
import warnings
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.func import functional_call
from torch.utils._pytree import tree_flatten

import wsym
from wsym.models.networks import MLP, ResidualCNN, TinyTransformer


@dataclass(frozen=True)
class Case:
    name: str
    build: Any  # () -> nn.Module
    inputs: Any  # () -> Tensor | tuple | dict
    expected: dict
    slow: bool = False
    tol: float = 1e-8  # relative output change allowed when acting in float64


class DataDependentClamp(nn.Module):
    """The issue's example: a clamp that only fires on large activations (export fails)."""

    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(4, 8), nn.Linear(8, 2)

    def forward(self, x):
        h = self.a(x)
        h = h.clamp(-10, 10) if h.abs().max() > 10 else h
        return self.b(torch.relu(h))


class SwiGLU(nn.Module):
    def __init__(self, d=6, h=5):
        super().__init__()
        self.gate, self.up, self.down = nn.Linear(d, h), nn.Linear(d, h), nn.Linear(h, 3)

    def forward(self, x):
        return self.down(nn.functional.silu(self.gate(x)) * self.up(x))


class DepthwiseNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.pw = nn.Conv2d(3, 6, 1)
        self.dw = nn.Conv2d(6, 6, 3, padding=1, groups=6)
        self.head = nn.Linear(6, 4)

    def forward(self, x):
        h = torch.relu(self.dw(torch.relu(self.pw(x))))
        return self.head(h.mean(dim=(2, 3)))


class MHAClassifier(nn.Module):
    def __init__(self):
        super().__init__()
        self.enc = nn.TransformerEncoderLayer(16, 4, 32, dropout=0.0, batch_first=True)
        self.fc = nn.Linear(16, 3)

    def forward(self, x):
        return self.fc(self.enc(x).mean(1)).log_softmax(-1)


class SelfAttention(nn.Module):
    def __init__(self):
        super().__init__()
        self.mha = nn.MultiheadAttention(12, 3, batch_first=True)

    def forward(self, x):
        return self.mha(x, x, x, need_weights=False)[0]


class GQA(nn.Module):
    """Grouped-query attention through scaled_dot_product_attention(enable_gqa=True)."""

    def __init__(self, dim=12, heads=4, kv_heads=2):
        super().__init__()
        self.h, self.kv, self.d = heads, kv_heads, dim // heads
        self.q = nn.Linear(dim, heads * self.d)
        self.k = nn.Linear(dim, kv_heads * self.d)
        self.v = nn.Linear(dim, kv_heads * self.d)
        self.o = nn.Linear(heads * self.d, dim)

    def forward(self, x):
        b, t, _ = x.shape
        q = self.q(x).view(b, t, self.h, self.d).transpose(1, 2)
        k = self.k(x).view(b, t, self.kv, self.d).transpose(1, 2)
        v = self.v(x).view(b, t, self.kv, self.d).transpose(1, 2)
        y = nn.functional.scaled_dot_product_attention(q, k, v, enable_gqa=True)
        return self.o(y.transpose(1, 2).reshape(b, t, -1))


class Radial(nn.Module):
    """A radial activation h * sigmoid(|h|) commutes with rotations of h."""

    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(4, 5), nn.Linear(5, 2)

    def forward(self, x):
        h = self.a(x)
        return self.b(h * torch.sigmoid(h.norm(dim=-1, keepdim=True)))


class RMSResidual(nn.Module):
    """A residual stream read only through weightless RMSNorm: orthogonal."""

    def __init__(self):
        super().__init__()
        self.embed, self.f, self.out = nn.Linear(3, 6), nn.Linear(6, 6), nn.Linear(6, 2)
        self.norm = nn.RMSNorm(6, elementwise_affine=False)

    def forward(self, x):
        h = self.embed(x)
        h = h + self.f(self.norm(h))
        return self.out(self.norm(h))


class DiagonalNet(nn.Module):
    """y = x^T (u * v): coordinates cannot move (inputs), but u_i v_i is all that matters."""

    def __init__(self, d=6):
        super().__init__()
        self.u, self.v = nn.Parameter(torch.randn(d)), nn.Parameter(torch.randn(d))

    def forward(self, x):
        return x @ (self.u * self.v)


class Concat(nn.Module):
    """Two branches concatenated along channels: each branch's channels permute alone."""

    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Conv2d(2, 3, 1), nn.Conv2d(2, 4, 3, padding=1)
        self.c, self.head = nn.Conv2d(7, 5, 1), nn.Linear(5, 2)

    def forward(self, x):
        h = torch.relu(torch.cat([self.a(x), self.b(x)], dim=1))
        return self.head(torch.relu(self.c(h)).mean(dim=(2, 3)))


class TiedEmbedding(nn.Module):
    """Output head tied to the input embedding: both move as one tensor."""

    def __init__(self):
        super().__init__()
        self.embed, self.mid = nn.Embedding(11, 8), nn.Linear(8, 8)
        self.head = nn.Linear(8, 11, bias=False)
        self.head.weight = self.embed.weight

    def forward(self, x):
        return self.head(torch.relu(self.mid(self.embed(x))))


def _group_norm_net():
    net = nn.Sequential(
        nn.Conv2d(2, 6, 3),
        nn.GroupNorm(3, 6),
        nn.ReLU(),
        nn.Conv2d(6, 4, 1),
        nn.Flatten(),
        nn.Linear(36, 3),
    )
    return net


def _resnet18():
    import torchvision

    return torchvision.models.resnet18()


def _vit(depth=12, **kw):
    import timm

    return timm.create_model("vit_tiny_patch16_224", pretrained=False, depth=depth, **kw)


def _bert():
    import transformers

    cfg = transformers.BertConfig(
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        vocab_size=100,
    )
    return transformers.BertModel(cfg)


def mixtral_config(transformers, layers: int = 1, experts: int = 2):
    """A tiny Mixtral: hidden size 16, two heads (one key/value head), top-2 routing."""
    return transformers.MixtralConfig(
        hidden_size=16,
        num_hidden_layers=layers,
        num_attention_heads=2,
        num_key_value_heads=1,
        intermediate_size=16,
        vocab_size=32,
        num_local_experts=experts,
        max_position_embeddings=16,
    )


def _llama():
    import transformers

    cfg = transformers.LlamaConfig(
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=64,
        max_position_embeddings=64,
    )
    return transformers.LlamaForCausalLM(cfg)


def _e3nn():
    from e3nn import nn as enn
    from e3nn import o3

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.l1 = o3.Linear("4x0e + 3x1o", "8x0e + 4x0e + 4x1o")
            self.gate = enn.Gate("8x0e", [torch.relu], "4x0e", [torch.sigmoid], "4x1o")
            self.l2 = o3.Linear("8x0e + 4x1o", "2x0e + 1x1o")

        def forward(self, x):
            return self.l2(self.gate(self.l1(x)))

    return Net()


CASES = [
    Case(
        "mlp-relu",
        lambda: MLP(6, [5, 4], 3),
        lambda: torch.randn(3, 6),
        {"permutation": 2, "scaling": 2},
    ),
    Case(
        "mlp-tanh",
        lambda: MLP(6, [5, 4], 3, "tanh"),
        lambda: torch.randn(3, 6),
        {"permutation": 2, "sign": 2},
    ),
    Case(
        "mlp-gelu", lambda: MLP(6, [5, 4], 3, "gelu"), lambda: torch.randn(3, 6), {"permutation": 2}
    ),
    Case(
        "mlp-leaky",
        lambda: MLP(6, [5], 3, "leaky_relu"),
        lambda: torch.randn(3, 6),
        {"permutation": 1, "scaling": 1},
    ),
    Case("linear-linear", lambda: MLP(6, [5], 3, "identity"), lambda: torch.randn(3, 6), {"gl": 1}),
    Case("swiglu", SwiGLU, lambda: torch.randn(3, 6), {"permutation": 1, "scaling": 1, "sign": 1}),
    Case(
        "depthwise", DepthwiseNet, lambda: torch.randn(2, 3, 5, 5), {"permutation": 1, "scaling": 2}
    ),
    Case(
        "residual-cnn",
        lambda: ResidualCNN(channels=4),
        lambda: torch.randn(2, 1, 6, 6),
        {"norm_scaling": 3, "permutation": 2, "scaling": 2, "sign": 3},
    ),
    Case(
        "tiny-transformer",
        lambda: TinyTransformer(patch=4, seq=6, dim=8, heads=2, depth=1, hidden=12),
        lambda: torch.randn(2, 6, 4),
        {"gl": 2, "permutation": 3, "scaling": 4, "sign": 3, "translation": 1},
    ),
    Case(
        "tiny-transformer-rotary",
        lambda: TinyTransformer(patch=4, seq=6, dim=8, heads=2, depth=1, hidden=12, rotary=True),
        lambda: torch.randn(2, 6, 4),
        {"gl": 1, "orthogonal": 1, "permutation": 3, "scaling": 4, "sign": 3},
    ),
    Case(
        "tiny-transformer-tokens",
        lambda: TinyTransformer(vocab=11, seq=6, dim=8, heads=2, depth=2, hidden=12),
        lambda: torch.randint(0, 11, (2, 6)),
        {"gl": 4, "permutation": 5, "scaling": 7, "sign": 5, "translation": 2},
    ),
    # a class tied to the inputs cannot be permuted, but its diagonal groups survive
    Case("diagonal-net", DiagonalNet, lambda: torch.randn(5, 6), {"scaling": 1, "sign": 1}),
    Case("concat", Concat, lambda: torch.randn(2, 2, 5, 5), {"permutation": 3, "scaling": 3}),
    Case(
        "tied-embedding",
        TiedEmbedding,
        lambda: torch.randint(0, 11, (2, 5)),
        {"permutation": 1, "scaling": 1},
    ),
    # whole groups permute (S_3) and channels within a group (S_2); the 1x1 conv and the
    # linear layer after the flatten form a GL pair
    Case(
        "group-norm", _group_norm_net, lambda: torch.randn(2, 2, 5, 5), {"permutation": 3, "gl": 1}
    ),
    Case("radial", Radial, lambda: torch.randn(3, 4), {"orthogonal": 1}),
    Case("rmsnorm-residual", RMSResidual, lambda: torch.randn(3, 3), {"orthogonal": 1}),
    Case(
        "mha",
        SelfAttention,
        lambda: torch.randn(2, 5, 12),
        {"gl": 2, "permutation": 1, "translation": 1},
    ),
    Case(
        "transformer-encoder-layer",
        MHAClassifier,
        lambda: torch.randn(2, 5, 16),
        {"gl": 2, "permutation": 2, "scaling": 2, "sign": 1, "translation": 2},
    ),
    Case("gqa", GQA, lambda: torch.randn(2, 5, 12), {"gl": 2, "permutation": 2, "translation": 1}),
    Case(
        "resnet18",
        _resnet18,
        lambda: torch.randn(1, 3, 32, 32),
        {"norm_scaling": 20, "permutation": 12, "scaling": 12, "sign": 20},
        slow=True,
    ),
    Case(
        "vit_tiny_patch16_224",
        _vit,
        lambda: torch.randn(1, 3, 224, 224),
        {"gl": 24, "permutation": 25, "scaling": 25, "sign": 25, "translation": 12},
        slow=True,
    ),
    Case(
        "bert",
        _bert,
        lambda: {"input_ids": torch.randint(0, 100, (2, 7))},
        {"gl": 4, "permutation": 4, "translation": 2},
    ),
    # GQA through repeat_kv (expand), rotary embeddings (query/key: SO(2) per pair),
    # RMSNorm with weights, SwiGLU; the residual stream is read in float32 by HF's RMSNorm
    Case(
        "llama",
        _llama,
        lambda: {"input_ids": torch.randint(0, 64, (2, 6))},
        {"gl": 1, "orthogonal": 1, "permutation": 4, "scaling": 4, "sign": 4},
        tol=1e-6,
    ),
    Case(
        "e3nn-gate", _e3nn, lambda: torch.randn(5, 13), {"permutation": 2, "scaling": 2, "sign": 1}
    ),
]

BY_NAME = {c.name: c for c in CASES}


def scaled_mlp_population(n: int, seed: int = 0) -> tuple[list[dict], torch.Tensor]:
    """``n`` random ``MLP(4, [6], 3)`` state dicts, each scaled by a target in [0.3, 3]."""
    gen = torch.Generator().manual_seed(seed)
    sds, ys = [], []
    for _ in range(n):
        torch.manual_seed(int(torch.randint(0, 2**31, (1,), generator=gen)))
        m = MLP(4, [6], 3)
        scale = float(torch.empty(1).uniform_(0.3, 3.0, generator=gen))
        sds.append({k: v * scale for k, v in m.state_dict().items()})
        ys.append(scale)
    return sds, torch.tensor(ys)


def fit_scaled_mlps(sds: list, y, **kwargs):
    """``wsym.metanet.fit`` on states of :func:`scaled_mlp_population` (``MLP(4, [6], 3)``)."""
    from wsym.metanet import fit

    return fit(lambda: MLP(4, [6], 3), sds, y, example_inputs=torch.randn(2, 4), **kwargs)


# -- stock models for the invariant measures (random weights, float64, eval mode) --------


def _flat_outputs(model, state, inputs):
    args, kwargs = ((), inputs) if isinstance(inputs, dict) else ((inputs,), {})
    with torch.no_grad():
        out = functional_call(model, state, args, kwargs, tie_weights=False)
    leaves = [t for t in tree_flatten(out)[0] if torch.is_tensor(t) and t.is_floating_point()]
    return torch.cat([t.reshape(-1) for t in leaves])


def independent_deviation(model, x, spec, seeds=(0,), fresh_seed=5) -> float:
    """Worst relative output change, independently of ``wsym.group.verify``.

    Acts with ``spec.sample(seed, scale=(0.1, 10))`` and compares float64
    outputs (every output tensor) on ``x`` (a Tensor, or a dict of keyword
    inputs), on fresh inputs and on those x20 (float inputs; token ids are kept).
    """
    m64 = copy.deepcopy(model).double().eval()
    sd = m64.state_dict()
    gen = torch.Generator().manual_seed(fresh_seed)

    def inputs(factor):
        def one(t):
            if not t.is_floating_point():
                return t
            if factor is None:
                return t.double()
            return factor * torch.randn(t.shape, generator=gen, dtype=torch.float64)

        return {k: one(v) for k, v in x.items()} if isinstance(x, dict) else one(x)

    worst = 0.0
    for seed in seeds:
        moved = spec.act(spec.sample(seed=seed, scale=(0.1, 10)), sd)
        gen.manual_seed(fresh_seed)
        for xx in (inputs(None), inputs(1.0), inputs(20.0)):
            y0, y1 = _flat_outputs(m64, sd, xx), _flat_outputs(m64, moved, xx)
            worst = max(worst, float((y1 - y0).abs().max() / y0.abs().max()))
    return worst


def stock_output(o):
    if torch.is_tensor(o):
        return o
    return o.last_hidden_state if hasattr(o, "last_hidden_state") else o.logits


def _stock_gpt2():
    import transformers

    cfg = transformers.GPT2Config(n_embd=16, n_layer=2, n_head=2, vocab_size=32, n_positions=16)
    return transformers.GPT2Model(cfg)


def _stock_cnn():
    model = ResidualCNN(channels=4)
    gen = torch.Generator().manual_seed(5)
    for m in model.modules():  # running statistics away from (0, 1): norm_scaling moves them
        if isinstance(m, torch.nn.BatchNorm2d):
            m.running_mean.copy_(torch.randn(m.running_mean.shape, generator=gen))
            m.running_var.copy_(torch.rand(m.running_var.shape, generator=gen) + 0.5)
    return model


def _stock_ids(vocab, shape):
    return lambda: {"input_ids": torch.randint(0, vocab, shape, generator=stock_generator())}


def stock_generator():
    return torch.Generator().manual_seed(7)


def _stock_images(*shape):
    return lambda: torch.randn(shape, generator=stock_generator())


def _stock_timm(name, **kw):
    import timm

    return lambda: timm.create_model(name, pretrained=False, **kw)


STOCK = {
    "mlp3": (lambda: MLP(6, [5, 4, 4], 3), _stock_images(8, 6)),
    "cnn": (_stock_cnn, _stock_images(4, 1, 6, 6)),
    "resnet18": (_resnet18, _stock_images(2, 3, 32, 32)),
    "vit_tiny": (
        _stock_timm("vit_tiny_patch16_224", depth=2, img_size=32),
        _stock_images(2, 3, 32, 32),
    ),
    "convnext_atto": (_stock_timm("convnext_atto"), _stock_images(1, 3, 32, 32)),
    "gpt2": (_stock_gpt2, _stock_ids(32, (2, 6))),
    "llama": (_llama, _stock_ids(64, (2, 6))),
    "bert": (_bert, _stock_ids(100, (2, 6))),
    "e3nn": (_e3nn, _stock_images(5, 13)),
}
"""Stock models for the invariant measures: name -> (factory, inputs)."""
STOCK_HEAVY = {"resnet18", "vit_tiny", "convnext_atto"}
_BUILT: dict = {}


def stock_case(name):
    """(float64 model in eval mode, batches, loss, spec), built once per session."""
    if name not in _BUILT:
        build, inputs = STOCK[name]
        torch.manual_seed(0)
        model = build().double().eval()
        x = inputs()
        x = x.double() if torch.is_tensor(x) else x
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            spec = wsym.detect(model, x)
        with torch.no_grad():
            y = stock_output(model(**x) if isinstance(x, dict) else model(x))
        target = torch.randn(y.shape, generator=stock_generator(), dtype=torch.float64)

        def loss(out, t):
            return ((stock_output(out) - t) ** 2).mean()

        _BUILT[name] = (model, [(x, target)], loss, spec)
    return _BUILT[name]


def moe_gates(x: torch.Tensor, router: torch.Tensor, k: int) -> torch.Tensor:
    """``(S, E)``: softmax over each token's top-k router logits, zero elsewhere."""
    logits = nn.functional.linear(x, router)
    top, idx = logits.topk(k, dim=-1)
    return torch.zeros_like(logits).scatter(-1, idx, top.softmax(-1))


class ListMoE(nn.Module):
    """A top-k mixture of ``e`` ReLU MLP experts kept in an ``nn.ModuleList``, stacked.

    ``fixed``: each expert's output also weighed by a constant of its own (not
    state): renumbering the experts then changes the function.
    """

    def __init__(self, e=3, f=5, d=4, k=2, fixed=False):
        super().__init__()
        self.router = nn.Linear(d, e, bias=False)
        self.experts = nn.ModuleList(
            nn.Sequential(nn.Linear(d, f, bias=False), nn.ReLU(), nn.Linear(f, d, bias=False))
            for _ in range(e)
        )
        self.head = nn.Linear(d, 2)
        self.k, self.fixed = k, fixed

    def forward(self, x):
        gates = moe_gates(x, self.router.weight, self.k)
        if self.fixed:
            gates = gates * torch.arange(1.0, gates.shape[-1] + 1, dtype=gates.dtype)
        y = torch.stack([expert(x) for expert in self.experts], dim=1)
        return self.head(torch.einsum("se,sed->sd", gates, y))


def assert_group_laws(spec, sd: dict) -> None:
    """``g^-1 g = 1`` and ``act(g h) = act(h) after act(g)`` on ``sd`` (float64, to 1e-13)."""
    from wsym.group.elements import GroupElement

    g, h = spec.sample(0, scale=(0.1, 10)), spec.sample(1, scale=(0.1, 10))
    back = spec.act(g.inverse(), spec.act(g, sd))
    assert all(torch.allclose(back[k], sd[k], rtol=1e-13, atol=0) for k in sd)
    both = spec.act(GroupElement(g.components + h.components), sd)
    twice = spec.act(h, spec.act(g, sd))
    assert all(torch.allclose(both[k], twice[k], rtol=1e-13, atol=0) for k in sd)
