"""The main job's report on a tiny zoo: sections, numbers, files, browser rendering."""

import contextlib
import io
import json
import re

import pytest

import wsym.zoo
from wsym.cli.main import main
from wsym.report import browser

TINY = {"hyperparameters": {"epochs": 2, "train_fraction": 0.1}, "shard_size": 4}


@pytest.fixture(scope="module")
def tiny_zoo(tmp_path_factory):
    out = tmp_path_factory.mktemp("zoo")
    wsym.zoo.build("mnist1d-mlp", members=8, out=out, seed=0, progress=False, overrides=TINY)
    return out


@pytest.fixture(scope="module")
def written(tiny_zoo, tmp_path_factory):
    out = tmp_path_factory.mktemp("report")
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        code = main(["report", "--zoo", str(tiny_zoo), "--out", str(out), "--quick", "--json"])
    assert code == 0
    assert json.loads(printed.getvalue())["symmetries"]  # --json prints the numbers
    return out


def test_report_writes_html_and_json(written):
    numbers = json.loads((written / "report.json").read_text())
    html = (written / "report.html").read_text()
    assert set(numbers) >= {"symmetries", "alignment", "invariance", "sharpness", "metanet"}
    assert numbers["symmetries"]["kinds"] == {"permutation": 2, "scaling": 2}
    # moving along the orbit does not change invariant measures, and does change euclidean
    worst = numbers["invariance"]["max_abs_log10_ratio"]
    assert worst["adaptive"] < 1e-6 and worst["euclidean"] > 0.1
    # the whole-group quotient: geodesic measures (worst and average case) and fisher too
    for m in ("geodesic-inv", "geodesic-mix", "geodesic-mix (average)", "fisher"):
        assert worst[m] < 1e-6, m
    # geodesic differs from adaptive (measured ~5e-7 here), far above the invariance floor
    assert numbers["invariance"]["geodesic_vs_adaptive"] > 1e3 * worst["geodesic-mix"]
    average = numbers["invariance"]["values"]["geodesic-mix (average)"]
    assert average["stderr"] > 0  # the average case comes with its standard error
    # alignment only moves along the orbit: same canonical form
    assert numbers["alignment"]["aligned_canonical_deviation"] < 1e-4
    assert len(re.findall(r"<img data-figure=", html)) == 5
    assert "data:image/png;base64," in html and "<script src" not in html  # self-contained


def test_report_bad_zoo_is_a_clear_input_error(tmp_path, capsys):
    assert main(["report", "--zoo", str(tmp_path / "nope"), "--out", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err
    assert "no zoo at" in err and "wsym zoo build" in err
    assert not (tmp_path / "r").exists()


@pytest.mark.skipif(browser.find_chromium() is None, reason="needs Debian's chromium")
def test_every_figure_renders_in_headless_chromium(written, tmp_path):
    shown = browser.check(written / "report.html", tmp_path / "shot.png")
    assert shown["figures"] == 5 and shown["rendered"] == 5
    assert (tmp_path / "shot.png").stat().st_size > 10_000
