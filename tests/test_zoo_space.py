"""A preset's architecture space, and the park meta-network reading architectures it never saw."""

from __future__ import annotations

import json
from collections import Counter

import pytest
import torch

from wsym.errors import WsymInputError
from wsym.io.resources import MODELS
from wsym.zoo.architectures import build_architecture
from wsym.zoo.heldout import heldout_architectures
from wsym.zoo.presets import load_preset
from wsym.zoo.space import ArchitectureSpace, architecture_space, architectures_with

PARK_ZOO = MODELS.parent / "data" / "zoos" / "mnist1d-park"


def _signature(config):
    sd = build_architecture(config).state_dict()
    return {k: tuple(v.shape) for k, v in sd.items() if v.is_floating_point()}


def _text(config):
    return json.dumps(config, sort_keys=True)


def test_park_space_lists_every_architecture_once_held_out_ones_included():
    park = load_preset("mnist1d-park")
    space = architecture_space(park)
    assert Counter(c["name"] for c in space) == {
        "mlp": 64,
        "park_cnn1d": 126,
        "patch_transformer": 36,
    }
    texts = {_text(c) for c in space}
    assert len(texts) == len(space)
    assert {_text(c) for c in heldout_architectures(park)} <= texts
    # a depth-1 CNN has no residual variant: the residual prior is "by" depth
    assert not [c for c in space if c["name"] == "park_cnn1d" and c["depth"] == 1 and c["residual"]]


def test_architectures_sharing_tensors_are_found_together():
    park = load_preset("mnist1d-park")
    mlp = {"name": "mlp", "d_in": 40, "widths": [16, 16], "d_out": 10, "activation": "tanh"}
    found = architectures_with(park, _signature(mlp))
    assert sorted(c["activation"] for c in found) == ["gelu", "leaky_relu", "relu", "tanh"]
    assert {len(c["widths"]) for c in found} == {2}
    assert architectures_with(park, {"0.weight": (3, 3)}) == []


def test_continuous_architecture_prior_is_a_one_line_error():
    park = load_preset("mnist1d-park")
    park["hyperparameters"]["width"] = {"uniform": [4, 8]}
    with pytest.raises(WsymInputError, match="'width'.*continuous prior") as err:
        architecture_space(park)
    assert "\n" not in str(err.value)


def test_space_detects_each_architecture_once():
    space = ArchitectureSpace(load_preset("mnist1d-park"), torch.randn(4, 40))
    cnn = {
        "name": "park_cnn1d", "channels": 4, "depth": 2, "kernel": 3, "batchnorm": 1,
        "residual": 1, "classes": 10,
    }  # fmt: skip
    found = space.specs_with(_signature(cnn))  # with and without the residual connection
    assert [c for c, _ in found] == [{**cnn, "residual": 0}, cnn]
    for _, spec in found:
        assert {g.kind for g in spec.groups} >= {"permutation", "scaling", "norm_scaling"}
    assert all(
        a is b for (_, a), (_, b) in zip(space.specs_with(_signature(cnn)), found, strict=True)
    )


def test_park_predictor_reads_a_bare_checkpoint_of_an_architecture_it_never_saw(tmp_path):
    if not PARK_ZOO.is_dir():
        pytest.skip("no park zoo in this checkout")
    pytest.importorskip("torch_geometric")
    from wsym.metanet import load as load_metanet
    from wsym.metanet.park_fit import fit_zoo
    from wsym.zoo import load

    zoo = load(PARK_ZOO)
    by_split: dict = {}
    for r in zoo.table:
        by_split.setdefault(r["split"], []).append(r["id"])
    ids = {s: v[:6] for s, v in by_split.items()}
    p, _ = fit_zoo(zoo, ids=ids, epochs=1, stat_epochs=2, hidden=8, members=2)
    seen = {_text(r["architecture"]) for r in zoo.table}
    new = next(
        c
        for c in architecture_space(zoo.manifest["config"])
        if c["name"] == "park_cnn1d" and _text(c) not in seen
    )
    torch.manual_seed(0)
    sd = build_architecture(new).state_dict()
    y = float(p.predict(sd))
    assert torch.isfinite(torch.tensor(y))
    p.save(tmp_path / "p.safetensors")
    q = load_metanet(tmp_path / "p.safetensors")
    known = {_text(zoo.row(i)["architecture"]) for v in ids.values() for i in v}
    assert {_text(c) for c in known_configs(q)} >= known  # stored, not detected again
    assert float(q.predict(sd)) == pytest.approx(y, rel=1e-6)


def known_configs(p):
    return [json.loads(t) for t in p.space._specs]
