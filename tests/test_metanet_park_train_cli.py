"""``wsym metanet train|eval`` on a park zoo: the universal meta-network, progress, timing."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("torch_geometric")

import wsym.metanet
from wsym.cli import common as cli_common
from wsym.cli import main as cli
from wsym.io.resources import MODELS
from wsym.metanet.park import ParkPredictor
from wsym.zoo import load

ROOT = MODELS.parent
PARK_ZOO = ROOT / "data" / "zoos" / "mnist1d-park"
SMALL = ["--max-members", "12", "--epochs", "1", "--patience", "1", "--hidden", "8"]


@pytest.fixture(scope="module")
def park():
    if not PARK_ZOO.is_dir():
        pytest.skip("no park zoo in this checkout")
    return str(PARK_ZOO)


def test_train_on_a_park_fits_one_network_for_its_architectures(park, tmp_path, capsys):
    out = tmp_path / "park.safetensors"
    assert cli.main(["metanet", "train", "--zoo", park, "--out", str(out), *SMALL]) == 0
    stdout, err = capsys.readouterr()
    assert "metanet train (park): graph epoch 1, val tau" in err and "1/1 epochs" in err
    assert "park metanet" in stdout and "test_arch tau" in stdout
    for stage in ("detect and load", "invariant graphs", "statistics branch", "graph branch"):
        assert stage in stdout.splitlines()[-1]
    p = wsym.metanet.load(out)
    assert isinstance(p, ParkPredictor)
    families = {s.spec.to_json() for s in p.schemas.values()}
    assert len(families) > 3  # more than one architecture read: the mixed zoo
    card = out.with_suffix(".md").read_text()
    assert "one network, every park architecture" in card and "--max-members 12" in card
    zoo = load(park)
    r = next(r for r in zoo.table if r["split"] == "test_arch")
    p.example_inputs = zoo.example_inputs()  # to detect an architecture it was not given
    y = p.predict((zoo.model(r["id"]), zoo.state_dict(r["id"])))
    assert y.isfinite().all()


def test_eval_on_a_park_ablates_the_branches_and_says_where_the_time_went(
    park, monkeypatch, capsys
):
    monkeypatch.setattr(cli_common, "ANNOUNCE_SECONDS", 0.0)  # announce even this short run
    args = ["metanet", "eval", "--zoo", park, *SMALL, "--seeds", "2", "--json"]
    assert cli.main([*args, "--predictors", "park,statnn"]) == 0
    out, err = capsys.readouterr()
    report = json.loads(out)
    assert "estimated to take up to" in err and "metanet fits" in err
    assert "4/4 fits" in err  # per predictor and seed, the graph epoch beside it
    assert "park eval: wsym park metanet, gap, seed 1, graph epoch 1/1, val tau" in err
    rows = report["rows"]
    assert set(rows) == {
        "wsym park metanet",
        "statistics branch alone",
        "graph branch alone",
        "StatNN per layer, padded",
    }
    for name in ("wsym park metanet", "statistics branch alone", "graph branch alone"):
        assert len(rows[name]["test/gap"]) == len(rows[name]["test_arch/gap"]) == 2
        assert rows[name]["invariance"] <= 1e-5
    assert rows["StatNN per layer, padded"]["invariance"] > 1e-3  # raw weights: not invariant
    timing = report["timing"]
    assert {"detect and load", "invariant graphs", "wsym park metanet: graph branch"} <= set(timing)
    assert sum(v for k, v in timing.items() if k != "total") <= timing["total"] + 1e-6
    assert err.strip().splitlines()[-1].startswith(f"time {timing['total']:.0f}s: ")


@pytest.mark.parametrize(
    ("extra", "said"),
    [
        (["--predictors", "park,nfn"], "unknown park predictor 'nfn'"),
        (["--plot", "x.png"], "--plot is for single-architecture zoos"),
        (["--target", "train_loss"], "--target on a park is one of"),
        (["--max-members", "2"], "--max-members must be >= 4"),
    ],
)
def test_bad_park_eval_options_are_one_line_errors(park, extra, said, capsys):
    assert cli.main(["metanet", "eval", "--zoo", park, *extra]) == 2
    err = capsys.readouterr().err
    assert said in err and len(err.strip().splitlines()) == 1


def test_max_members_is_refused_on_a_single_architecture_zoo(tmp_path, capsys):
    mlp = str(ROOT / "data" / "zoos" / "mnist1d-mlp")
    out = str(tmp_path / "m.safetensors")
    assert cli.main(["metanet", "train", "--zoo", mlp, "--out", out, "--max-members", "8"]) == 2
    assert "--max-members is for park zoos" in capsys.readouterr().err
