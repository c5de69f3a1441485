"""Baselines, the evaluation table and the metanet CLI on a small trained population."""

from __future__ import annotations

import json

import pytest
import torch

pytest.importorskip("torch_geometric")

import wsym
import wsym.metanet
from wsym.cli import main as cli
from wsym.cli import metanet as cli_metanet
from wsym.io import save_state_dict
from wsym.metanet.baselines import nfn_layers, weight_statistics
from wsym.metanet.evaluate import evaluate, format_table, scatter_plot, zoo_splits
from wsym.metanet.population import load_population, save_population, train_population
from wsym.models.networks import MLP, ResidualCNN


def _factory():
    return MLP(64, [8], 10)


@pytest.fixture(scope="module")
def pop(tmp_path_factory):
    torch.set_num_threads(1)
    p = train_population(
        _factory, "digits", 20, epochs=(1, 3), train_sizes=(50, 1000), flatten=True
    )
    d = tmp_path_factory.mktemp("pop")
    save_population(p, d)
    return load_population(d, _factory), d


def test_population_roundtrip(pop):
    p, _ = pop
    assert len(p.table) == 20 and {r["split"] for r in p.table} == {"train", "val", "test"}
    assert all(abs(r["gap"] - (r["train_acc"] - r["test_acc"])) < 1e-12 for r in p.table)
    splits = zoo_splits(p, "train_size")
    low = max(p.table[i]["train_size"] for i in splits["train"] + splits["val"])
    assert all(p.table[i]["train_size"] >= low for i in splits["test"])


def test_statnn_features_and_claims(pop):
    p, _ = pop
    sd = p.state_dict(0)
    assert weight_statistics(sd).shape == (4 * 7,)
    spec = wsym.detect(p.model(0), p.example_inputs())
    g = spec.sample(seed=0, kinds=["permutation"])
    moved = spec.act(g, sd)
    assert torch.allclose(weight_statistics(sd), weight_statistics(moved), atol=1e-6)


def test_nfn_applies_to_chains_only():
    mlp = MLP(4, [5, 6], 3)
    spec = wsym.detect(mlp, torch.randn(2, 4))
    assert nfn_layers(spec) == [
        ("0.weight", "0.bias"),
        ("2.weight", "2.bias"),
        ("4.weight", "4.bias"),
    ]
    cnn = ResidualCNN(channels=4)
    assert nfn_layers(wsym.detect(cnn, torch.randn(2, 1, 6, 6))) is None


def test_evaluate_every_predictor(pop, tmp_path):
    pytest.importorskip("nfn")
    p, _ = pop
    names = ("metanet", "statnn", "statnn-canonical", "flat-mlp", "nfn", "sharpness:adaptive")
    report = evaluate(p, predictors=names, seeds=(0, 1), metanet_options={"epochs": 3})
    rows = {r["name"]: r for r in report["rows"]}
    assert all(r["status"] == "ok" for r in rows.values()), rows
    assert rows["metanet"]["invariance_all"] < 1e-5
    assert rows["statnn-canonical"]["invariance_all"] < 1e-5
    assert rows["statnn"]["invariance_all"] > 1e-3  # raw statistics move under scaling
    assert rows["flat-mlp"]["invariance_perm"] > 1e-4  # and the flat MLP under permutations
    assert rows["nfn"]["invariance_perm"] < 1e-4
    table = format_table(report)
    assert "| metanet |" in table and "±" in table
    scatter_plot(report, tmp_path / "s.png")
    assert (tmp_path / "s.png").stat().st_size > 1000


def test_cli_train_eval_predict(pop, tmp_path, monkeypatch, capsys):
    p, d = pop
    monkeypatch.setattr(cli_metanet, "open_zoo", lambda path: p)
    out = tmp_path / "m.safetensors"
    assert cli.main(["metanet", "train", "--zoo", str(d), "--out", str(out), "--epochs", "2"]) == 0
    card = out.with_suffix(".md").read_text()
    assert "Kendall tau" in card and "test split: 4 members" in card
    ckpt = tmp_path / "c.safetensors"
    save_state_dict(p.state_dict(3), ckpt)
    capsys.readouterr()
    args = ["predict", "--checkpoint", str(ckpt), "--metanet", str(out), "--json"]
    assert cli.main(args) == 0
    gap = json.loads(capsys.readouterr().out)["gap"]
    assert gap == pytest.approx(float(wsym.metanet.load(out).predict(p.state_dict(3))))
    save_state_dict(MLP(64, [9], 10).state_dict(), ckpt)
    assert cli.main(["predict", "--checkpoint", str(ckpt), "--metanet", str(out)]) == 2
    assert "different architecture" in capsys.readouterr().err
    args = ["metanet", "eval", "--zoo", str(d), "--seeds", "1", "--predictors", "statnn", "--json"]
    assert cli.main(args) == 0
    assert json.loads(capsys.readouterr().out)["rows"][0]["name"] == "statnn"
    assert cli.main(["metanet", "train", "--zoo", str(d), "--out", str(tmp_path / "x.pt")]) == 2
