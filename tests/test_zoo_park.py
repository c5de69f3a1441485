"""The park preset (``mnist1d-park``): three families build, whole architectures are held out,
and the detected symmetries of every park architecture leave its outputs unchanged (float64)."""

import itertools
import json

import pytest
import torch
from torch.func import functional_call

import wsym
import wsym.zoo
from wsym.errors import WsymInputError
from wsym.testing import assert_invariant
from wsym.zoo.architectures import build_architecture
from wsym.zoo.backends import plan_member
from wsym.zoo.build import member_split
from wsym.zoo.heldout import HELDOUT_SPLIT, heldout_architectures
from wsym.zoo.presets import architecture_config, load_preset

PARK = "mnist1d-park"
FAMILIES = {"mlp": "mlp", "park_cnn1d": "cnn", "patch_transformer": "transformer"}
# one member per block, every second round of the three families held out: members 3-5
TINY = {
    "hyperparameters": {"epochs": 1, "train_fraction": 0.05},
    "architecture_blocks": {"size": 1, "heldout_every": 2},
    "shard_size": 3,
}


def test_each_family_builds_and_the_heldout_block_has_a_heldout_architecture(tmp_path):
    zoo = wsym.zoo.build(PARK, members=6, out=tmp_path, progress=False, overrides=TINY)
    archs = [row["architecture"] for row in zoo.table]
    assert [FAMILIES[a["name"]] for a in archs] == ["mlp", "cnn", "transformer"] * 2
    assert zoo.split(HELDOUT_SPLIT) == [3, 4, 5]
    heldout = zoo.manifest["heldout_architectures"]
    assert all(a in heldout for a in archs[3:]) and not any(a in heldout for a in archs[:3])
    assert zoo.manifest["member_splits"][HELDOUT_SPLIT] == [3, 4, 5]
    for row in zoo.table:
        assert row["gap"] == pytest.approx(row["train_acc"] - row["test_acc"])
        model = zoo.model(row["id"])
        model.load_state_dict(zoo.state_dict(row["id"]))
        assert model.eval()(zoo.example_inputs()).shape == (8, 10)


def test_the_member_split_holds_out_whole_architectures():
    preset = load_preset(PARK)
    plans = [plan_member(preset, 0, i) for i in range(2000)]
    heldout = [json.dumps(a, sort_keys=True) for a in heldout_architectures(preset)]
    held = {i for i in range(2000) if member_split(preset, 0, i) == HELDOUT_SPLIT}
    seen = {json.dumps(plans[i].architecture, sort_keys=True) for i in range(2000) if i in held}
    rest = {json.dumps(plans[i].architecture, sort_keys=True) for i in range(2000) if i not in held}
    assert seen <= set(heldout) and not seen & rest
    assert {FAMILIES[json.loads(a)["name"]] for a in seen} == set(FAMILIES.values())
    assert 0.10 < len(held) / 2000 < 0.15
    assert len(rest) > 60  # the park spans many architectures
    families = [FAMILIES[p.architecture["name"]] for p in plans]
    counts = [families.count(f) for f in FAMILIES.values()]
    assert max(counts) - min(counts) <= 6  # one block


def test_a_heldout_entry_of_a_missing_family_is_refused(tmp_path):
    preset = load_preset(PARK)
    entries = [h for h in preset["architecture_blocks"]["heldout"] if h["family"] != "cnn"]
    overrides = {**TINY, "architecture_blocks": {**TINY["architecture_blocks"], "heldout": entries}}
    with pytest.raises(WsymInputError, match="no entry with family=cnn"):
        wsym.zoo.build(PARK, members=6, out=tmp_path, progress=False, overrides=overrides)


def _park_architectures():
    """Every structural variant of the park at its smallest widths, and the held-out ones."""
    preset = load_preset(PARK)
    hp = {"kernel": 0, "batchnorm": 0, "residual": 0, "heads": 0, "hidden": 0}
    configs = [
        {**hp, "family": "mlp", "depth": d, "width": 8, "activation": a}
        for d, a in itertools.product(range(1, 5), ["relu", "tanh", "gelu", "leaky_relu"])
    ]
    configs += [
        {
            **hp,
            "family": "cnn",
            "depth": d,
            "width": 4,
            "activation": "relu",
            "kernel": k,
            "batchnorm": bn,
            "residual": res,
        }
        for (d, k), bn, res in itertools.product([(1, 3), (2, 5), (3, 7), (4, 3)], [0, 1], [0, 1])
        if d > 1 or not res
    ]
    configs += [
        {
            **hp,
            "family": "transformer",
            "depth": d,
            "width": 8,
            "heads": h,
            "hidden": 16,
            "activation": a,
        }
        for d, h, a in [(1, 1, "relu"), (1, 2, "gelu"), (1, 4, "relu"), (2, 2, "gelu")]
    ]
    return [architecture_config(preset, c) for c in configs] + heldout_architectures(preset)


def _randomized(model):
    """Float64 state dict with random weights and BatchNorm statistics away from (0, 1)."""
    gen = torch.Generator().manual_seed(0)
    sd = {}
    for key, value in model.state_dict().items():
        value = value.double()
        if key.endswith("running_var"):
            value = torch.rand(value.shape, generator=gen, dtype=torch.float64) + 0.5
        elif value.is_floating_point():
            value = value + 0.3 * torch.randn(value.shape, generator=gen, dtype=torch.float64)
        sd[key] = value
    return sd


ARCHS = _park_architectures()
_FIXED = ("name", "d_in", "d_out", "classes", "patch", "seq")


def _name(config):
    values = [str(v).replace(" ", "") for k, v in config.items() if k not in _FIXED]
    return "-".join([FAMILIES[config["name"]], *values])


@pytest.mark.parametrize("config", ARCHS, ids=[_name(c) for c in ARCHS])
def test_detected_group_of_every_park_architecture_leaves_outputs_unchanged(config):
    model = build_architecture(config).eval()
    x = torch.randn(16, 40, generator=torch.Generator().manual_seed(1))
    spec = wsym.detect(model, x)
    assert spec.groups, "every park architecture has symmetries"
    model = model.double()
    sd = _randomized(model)

    def outputs(state):
        return functional_call(model, state, (x.double(),))

    assert_invariant(outputs, spec, sd, tol=1e-9)
