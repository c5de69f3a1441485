"""``wsym metanet train|eval``: progress on stderr, the run-time estimate, where the time went."""

from __future__ import annotations

import io
import json
import math

import pytest

pytest.importorskip("torch_geometric")

import wsym.zoo
from wsym.cli import common as cli_common
from wsym.cli import main as cli

# short schedules of several lengths on small subsets: a spread of gaps in seconds
SHORT = {"hyperparameters": {"epochs": {"int_uniform": [1, 4]}, "train_fraction": 0.1}}


@pytest.fixture(scope="module")
def zoo_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("zoo") / "mlp"
    wsym.zoo.build("mnist1d-mlp", members=30, out=out, seed=3, progress=False, overrides=SHORT)
    return str(out)


def test_eval_announces_its_estimate_and_its_json_stays_parseable(zoo_dir, monkeypatch, capsys):
    monkeypatch.setattr(cli_common, "ANNOUNCE_SECONDS", 0.0)  # announce even this short run
    args = ["metanet", "eval", "--zoo", zoo_dir, "--seeds", "2", "--epochs", "2", "--json"]
    assert cli.main([*args, "--predictors", "metanet,statnn"]) == 0
    out, err = capsys.readouterr()
    report = json.loads(out)  # stdout holds the JSON only
    assert "estimated to take up to" in err and "baselines not estimated" in err
    assert "4/4 fits" in err  # the progress bar, on stderr: per fit, per seed and epoch
    assert "metanet eval: statnn seed 1" in err and "metanet seed 1 epoch 2/2 val tau" in err
    timing = report["timing"]
    stages = {"metanet: graphs and scoring", "metanet: statistics branch", "metanet: graph branch"}
    assert stages | {"statnn", "detect and load", "total"} == set(timing)
    assert all(v >= 0 for v in timing.values())
    assert sum(v for k, v in timing.items() if k != "total") <= timing["total"] + 1e-6
    assert err.strip().splitlines()[-1].startswith(f"time {timing['total']:.0f}s: ")


def test_a_short_run_says_nothing_beforehand_and_train_reports_its_stages(
    zoo_dir, tmp_path, monkeypatch, capsys
):
    # what counts as short is the threshold's business (test_announce_speaks_from_a_minute_on);
    # here the estimate stays below it whatever the load on the machine
    monkeypatch.setattr(cli_common, "ANNOUNCE_SECONDS", math.inf)
    out = tmp_path / "m.safetensors"
    args = ["metanet", "train", "--zoo", zoo_dir, "--out", str(out), "--epochs", "3"]
    assert cli.main([*args, "--patience", "3"]) == 0
    stdout, err = capsys.readouterr()
    assert "estimated" not in err
    assert "metanet train: val tau" in err and "3/3 epochs" in err
    assert "time: graph building" in stdout and "graph branch" in stdout


def test_announce_speaks_from_a_minute_on():
    stream = io.StringIO()
    cli_common.announce({"graph building": 30.0, "metanet": 29.0}, stream)
    assert stream.getvalue() == ""
    cli_common.announce({"graph building": 30.0, "metanet": 150.0, "baselines": math.nan}, stream)
    said = stream.getvalue()
    assert "up to ~3 min" in said and "metanet ~2.5 min" in said
    assert "baselines not estimated" in said
