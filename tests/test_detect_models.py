"""The models named in issue #16, each checked independently of ``wsym.group.verify``.

The check acts with ``spec.sample(seed, scale=(0.1, 10))`` and compares float64
outputs on the example inputs, fresh inputs and fresh inputs scaled by 20 (the
sweep in ``benchmarks/architectures.py`` does the same over ~130 models).
"""

import warnings

import pytest
import torch
from cases import independent_deviation, mixtral_config
from torch.func import functional_call

import wsym
from wsym.errors import SymmetryWarning

torchvision = pytest.importorskip("torchvision")


def detect(model, x):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SymmetryWarning)
        return wsym.detect(model.eval(), x)


VISION = [
    ("mobilenet_v2", {}, 32),  # relu6_ was listed as positively homogeneous
    ("shufflenet_v2_x0_5", {}, 32),  # norm_scaling groups 3e-8 off on x20 inputs
    ("mnasnet0_5", {}, 32),
    ("googlenet", {"init_weights": False}, 64),  # default aux_logits: 22.8 GB before
]


@pytest.mark.parametrize("name, kwargs, size", VISION, ids=[v[0] for v in VISION])
def test_torchvision_models_named_in_the_issue(name, kwargs, size):
    torch.manual_seed(0)
    model = torchvision.models.get_model(name, weights=None, **kwargs)
    x = torch.randn(2, 3, size, size)
    spec = detect(model, x)
    assert spec.groups
    assert independent_deviation(model, x, spec) < 1e-11
    # the documented pattern: act on a state dict and load it back (mnasnet needs _metadata)
    model.load_state_dict(spec.act(spec.sample(seed=0), model.state_dict()))


def test_googlenet_aux_classifiers_are_dead_code_in_eval_mode():
    torch.manual_seed(0)
    model = torchvision.models.googlenet(weights=None, init_weights=False)
    spec = detect(model, torch.randn(2, 3, 64, 64))
    touched = {p for g in spec.groups for p in g.params}
    assert not any(p.startswith("aux") for p in touched)
    assert not any(g.kind == "gl" for g in spec.groups)


TIMM = [
    ("ghostnet_050", 32),  # norm_scaling on one half of a cat-split class: 5.7e-7
    ("edgenext_xx_small", 64),  # Python scalars as op arguments crashed the analysis
    ("xcit_nano_12_p16_224", 224),
]


@pytest.mark.parametrize("name, size", TIMM, ids=[t[0] for t in TIMM])
def test_timm_models_named_in_the_issue(name, size):
    timm = pytest.importorskip("timm")
    torch.manual_seed(0)
    kwargs = {"depth": 2} if name.startswith("xcit") else {}
    model = timm.create_model(name, pretrained=False, **kwargs)
    x = torch.randn(1, 3, size, size)
    spec = detect(model, x)
    assert spec.groups
    assert independent_deviation(model, x, spec) < 1e-11


def _mixtral_config(transformers):
    """A one-layer Mixtral with two experts."""
    return mixtral_config(transformers)


def test_mixtral_without_float64_kernel_is_verified_in_float32():
    transformers = pytest.importorskip("transformers")
    cfg = _mixtral_config(transformers)
    torch.manual_seed(0)
    model = transformers.MixtralModel(cfg).eval()
    ids = torch.randint(0, 32, (1, 6))
    with pytest.warns(SymmetryWarning) as record:
        spec = wsym.detect(model, {"input_ids": ids})
    messages = [str(w.message) for w in record]
    if not any("float32 instead" in m for m in messages):
        pytest.skip("this transformers version runs Mixtral in float64")
    assert all("\n" not in m for m in messages)
    assert spec.groups
    sd = model.state_dict()
    moved = spec.act(spec.sample(seed=0, scale=(0.1, 10)), sd)
    with torch.no_grad():
        y0 = functional_call(model, sd, (), {"input_ids": ids}).last_hidden_state
        y1 = functional_call(model, moved, (), {"input_ids": ids}).last_hidden_state
    assert (y1 - y0).abs().max() < 1e-4 * y0.abs().max()


def test_mixtral_with_eager_experts_fails_in_one_line(capfd):
    """Data-dependent expert dispatch (``nonzero``): one line says why and what to change."""
    transformers = pytest.importorskip("transformers")
    cfg = _mixtral_config(transformers)
    cfg._experts_implementation = "eager"
    model = transformers.MixtralModel(cfg).eval()
    ids = torch.randint(0, 32, (1, 6))
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", SymmetryWarning)
            spec = wsym.detect(model, {"input_ids": ids})
    except wsym.errors.WsymInputError as err:
        assert "\n" not in str(err) and "data-dependent output shape" in str(err)
    else:  # a later transformers may dispatch without data-dependent control flow
        assert spec.groups  # then what it reports holds (float32: Mixtral may lack float64)
        sd = model.state_dict()
        moved = spec.act(spec.sample(seed=0, scale=(0.1, 10)), sd)
        with torch.no_grad():
            y0 = functional_call(model, sd, (), {"input_ids": ids}).last_hidden_state
            y1 = functional_call(model, moved, (), {"input_ids": ids}).last_hidden_state
        assert (y1 - y0).abs().max() < 1e-4 * y0.abs().max()
    assert capfd.readouterr().err.count("\n") <= 2  # no FX graph dump


HEADS = [  # the sweep's tiny configs; head permutations pass the relative-position tables
    ("swin", {"image_size": 32, "patch_size": 4, "embed_dim": 16, "depths": [1, 1],
              "num_attention_heads": [2, 4], "window_size": 4},
     {"gl": 4, "permutation": 4, "scaling": 6, "sign": 6, "translation": 2},
     "relative_position_bias_table", {2, 4}),
    ("t5", {"d_model": 32, "d_ff": 64, "d_kv": 8, "num_layers": 2, "num_heads": 4,
            "vocab_size": 100},
     {"gl": 12, "permutation": 7, "scaling": 14, "sign": 10},
     "relative_attention_bias", {4}),
]  # fmt: skip


@pytest.mark.parametrize("kind, config, expected, table, heads", HEADS, ids=[h[0] for h in HEADS])
def test_swin_and_t5_heads_permute(kind, config, expected, table, heads):
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    model = transformers.AutoModel.from_config(
        transformers.AutoConfig.for_model(kind, **config)
    ).eval()
    gen = torch.Generator().manual_seed(0)
    if kind == "swin":
        x = {"pixel_values": torch.randn(2, 3, 32, 32, generator=gen)}
    else:
        ids = torch.randint(3, 100, (2, 8), generator=gen)
        x = {"input_ids": ids, "decoder_input_ids": ids[:, :5]}
    spec = detect(model, x)
    assert spec.kinds() == expected, spec.table()
    moving = [
        g for g in spec.groups if g.kind == "permutation" and any(table in p for p in g.params)
    ]
    assert {g.size for g in moving} == heads
    assert independent_deviation(model, x, spec, seeds=(0, 1)) < 1e-11
