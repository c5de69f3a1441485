"""``wsym metanet train|eval``: progress on stderr, the run-time estimate, where the time went."""

from __future__ import annotations

import io
import json
import math

import pytest
import torch

pytest.importorskip("torch_geometric")

from wsym.cli import main as cli
from wsym.cli import metanet as cli_metanet
from wsym.metanet.population import load_population, save_population, train_population
from wsym.reference import MLP


def _factory():
    return MLP(64, [8], 10)


@pytest.fixture(scope="module")
def pop(tmp_path_factory):
    torch.set_num_threads(1)
    p = train_population(
        _factory, "digits", 16, epochs=(1, 3), train_sizes=(50, 1000), flatten=True
    )
    d = tmp_path_factory.mktemp("pop")
    save_population(p, d)
    return load_population(d, _factory), d


def test_eval_announces_its_estimate_and_its_json_stays_parseable(pop, monkeypatch, capsys):
    p, d = pop
    monkeypatch.setattr(cli_metanet, "open_zoo", lambda path: p)
    monkeypatch.setattr(cli_metanet, "ANNOUNCE_SECONDS", 0.0)  # announce even this short run
    args = ["metanet", "eval", "--zoo", str(d), "--seeds", "2", "--epochs", "2", "--json"]
    assert cli.main([*args, "--predictors", "metanet,statnn"]) == 0
    out, err = capsys.readouterr()
    report = json.loads(out)  # stdout holds the JSON only
    assert "estimated to take up to" in err and "baselines not estimated" in err
    assert "metanet eval" in err and "4/4 fits" in err  # the progress bar, on stderr
    timing = report["timing"]
    stages = {"metanet: graphs and scoring", "metanet: statistics branch", "metanet: graph branch"}
    assert stages | {"statnn", "detect and load", "total"} == set(timing)
    assert all(v >= 0 for v in timing.values())
    assert sum(v for k, v in timing.items() if k != "total") <= timing["total"] + 1e-6
    assert err.strip().splitlines()[-1].startswith(f"time {timing['total']:.0f}s: ")


def test_a_short_run_says_nothing_beforehand_and_train_reports_its_stages(
    pop, tmp_path, monkeypatch, capsys
):
    p, d = pop
    monkeypatch.setattr(cli_metanet, "open_zoo", lambda path: p)
    out = tmp_path / "m.safetensors"
    args = ["metanet", "train", "--zoo", str(d), "--out", str(out), "--epochs", "3"]
    assert cli.main([*args, "--patience", "3"]) == 0
    stdout, err = capsys.readouterr()
    assert "estimated" not in err  # seconds, not minutes
    assert "metanet train" in err and "epochs" in err
    assert "time: graph building" in stdout and "graph branch" in stdout


def test_announce_speaks_from_a_minute_on():
    stream = io.StringIO()
    cli_metanet.announce({"graph building": 30.0, "metanet": 29.0}, stream)
    assert stream.getvalue() == ""
    cli_metanet.announce({"graph building": 30.0, "metanet": 150.0, "baselines": math.nan}, stream)
    said = stream.getvalue()
    assert "up to ~3 min" in said and "metanet ~2.5 min" in said
    assert "baselines not estimated" in said
