"""``wsym predict`` with the shipped park meta-network: one checkpoint of each park family."""

from __future__ import annotations

import json
import math

import pytest
import torch

pytest.importorskip("torch_geometric")

import wsym.metanet
from wsym.cli import main as cli
from wsym.io import save_state_dict
from wsym.io.resources import MODELS
from wsym.zoo import load

ROOT = MODELS.parent
PARK_MODEL = MODELS / "metanet-mnist1d-park.safetensors"
PARK_ZOO = ROOT / "data" / "zoos" / "mnist1d-park"


def _one_per_family(zoo) -> dict:
    out = {}
    for r in zoo.table:
        family = r["architecture"]["name"]
        if r["split"] in ("test", "test_arch") and family not in out:
            out[family] = r["id"]
    return out


def test_predict_accepts_every_park_family(tmp_path, capsys):
    if not PARK_ZOO.is_dir():
        pytest.skip("no park zoo in this checkout")
    zoo = load(PARK_ZOO)
    members = _one_per_family(zoo)
    assert len(members) == 3  # mlp, cnn and transformer families
    predictor = wsym.metanet.load(PARK_MODEL)
    for family, i in members.items():
        ckpt = tmp_path / f"{family}.safetensors"
        save_state_dict(zoo.state_dict(i), ckpt)
        capsys.readouterr()
        args = ["predict", "--checkpoint", str(ckpt), "--metanet", str(PARK_MODEL), "--json"]
        assert cli.main(args) == 0, family
        gap = json.loads(capsys.readouterr().out)["gap"]
        assert math.isfinite(gap)
        assert gap == pytest.approx(float(predictor.predict(zoo.state_dict(i))))


def test_predict_without_metanet_picks_the_shipped_model_that_reads_the_checkpoint(
    tmp_path, capsys
):
    if not PARK_ZOO.is_dir():
        pytest.skip("no park zoo in this checkout")
    zoo = load(PARK_ZOO)
    cnn = _one_per_family(zoo)["park_cnn1d"]
    ckpt = tmp_path / "cnn.safetensors"
    save_state_dict(zoo.state_dict(cnn), ckpt)
    capsys.readouterr()
    assert cli.main(["predict", "--checkpoint", str(ckpt), "--json"]) == 0
    said = json.loads(capsys.readouterr().out)
    assert said["metanet"].endswith("metanet-mnist1d-park.safetensors")  # the MLP model refuses it
    default_zoo = load(ROOT / "data" / "zoos" / "mnist1d-mlp")
    mlp = tmp_path / "mlp.safetensors"
    save_state_dict(default_zoo.state_dict(0), mlp)
    assert cli.main(["predict", "--checkpoint", str(mlp), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["metanet"].endswith(
        "metanet-mnist1d-mlp.safetensors"
    )


def test_predict_accepts_a_park_architecture_no_zoo_member_has(tmp_path, capsys):
    if not PARK_ZOO.is_dir():
        pytest.skip("no park zoo in this checkout")
    from wsym.zoo.architectures import build_architecture
    from wsym.zoo.space import architecture_space

    zoo = load(PARK_ZOO)
    seen = {json.dumps(r["architecture"], sort_keys=True) for r in zoo.table}
    new = [
        c
        for c in architecture_space(zoo.manifest["config"])
        if json.dumps(c, sort_keys=True) not in seen
    ]
    cnn = next(c for c in new if c["name"] == "park_cnn1d")
    torch.manual_seed(0)
    ckpt = tmp_path / "new.safetensors"
    save_state_dict(build_architecture(cnn).state_dict(), ckpt)
    args = ["predict", "--checkpoint", str(ckpt), "--metanet", str(PARK_MODEL), "--json"]
    assert cli.main(args) == 0
    assert math.isfinite(json.loads(capsys.readouterr().out)["gap"])
