"""Sharpness over a zoo (``wsym.zoo.measure``): per member as a lone call, resumable, refused."""

import json

import pytest

import wsym
import wsym.zoo
from wsym.cli.main import main
from wsym.errors import WsymInputError
from wsym.sharpness.correlation import kendall
from wsym.zoo import measure

TINY = {"hyperparameters": {"epochs": 30}, "shard_size": 2}
OPTIONS = {"measures": ("adaptive", "euclidean"), "batch": 40, "steps": 3, "boot": 50}


@pytest.fixture(scope="module")
def zoo(tmp_path_factory):
    out = tmp_path_factory.mktemp("zoo") / "diagonal"
    return wsym.zoo.build("diagonal", members=5, out=out, progress=False, overrides=TINY)


def test_each_row_is_the_members_own_sharpness_and_tau_is_kendalls(zoo, tmp_path):
    result = measure.measure_sharpness(zoo.path, tmp_path / "run", progress=False, **OPTIONS)
    data = zoo.dataset()
    x, y = data.x_train[:40].double(), data.y_train[:40].double()
    for row in result.rows:
        model = zoo.model(row["id"]).double()
        model.load_state_dict(zoo.state_dict(row["id"]))
        assert row["gap"] == zoo.row(row["id"])["gap"]
        value = wsym.sharpness(
            model, [(x, y)], measure.regression_loss, measure="adaptive", rho=0.05, steps=3
        )
        assert row["adaptive"] == pytest.approx(value, rel=1e-12)
    gaps = [r["gap"] for r in result.rows]
    for m in OPTIONS["measures"]:
        assert result.tau[m] == kendall([r[m] for r in result.rows], gaps, 50)
    written = json.loads((tmp_path / "run" / measure.TAU).read_text())
    assert written["tau"]["adaptive"]["tau"] == result.tau["adaptive"].tau


def test_a_finished_member_is_not_measured_again(zoo, tmp_path, monkeypatch):
    first = measure.measure_sharpness(zoo.path, tmp_path / "run", progress=False, **OPTIONS)
    (tmp_path / "run" / measure.MEMBERS / "member-000003.json").unlink()
    (tmp_path / "run" / measure.MEMBERS / ".member-000001.json.tmp").write_text("{")  # torn
    calls, original = [], measure.measure_member

    def counted(job, member):
        calls.append(member)
        return original(job, member)

    monkeypatch.setattr(measure, "measure_member", counted)
    again = measure.measure_sharpness(zoo.path, tmp_path / "run", progress=False, **OPTIONS)
    assert calls == [3]
    assert again.rows == first.rows and again.tau == first.tau
    assert not list((tmp_path / "run" / measure.MEMBERS).glob(".*"))


def test_bad_input_is_one_line_and_writes_nothing(zoo, tmp_path):
    cases = [
        ({"backend": "slurm"}, "unknown zoo backend"),
        ({"measures": ("sharp",)}, "unknown sharpness measure"),
        ({"rho": -1.0}, "rho must be"),
        ({"workers": 0}, "--workers must be positive"),
    ]
    for change, message in cases:
        with pytest.raises(WsymInputError, match=message) as err:
            measure.measure_sharpness(
                zoo.path, tmp_path / "run", progress=False, **{**OPTIONS, **change}
            )
        assert "\n" not in str(err.value)
    with pytest.raises(WsymInputError, match="not a zoo directory"):
        measure.measure_sharpness(tmp_path / "missing", tmp_path / "run", progress=False)
    assert not (tmp_path / "run").exists()
    measure.measure_sharpness(zoo.path, tmp_path / "run", progress=False, **OPTIONS)
    with pytest.raises(WsymInputError, match="other settings"):
        measure.measure_sharpness(
            zoo.path, tmp_path / "run", progress=False, **{**OPTIONS, "steps": 4}
        )


def test_cli_measures_and_refuses(zoo, tmp_path, capsys):
    args = ["zoo", "sharpness", str(zoo.path), "--out", str(tmp_path / "run"), "--quiet"]
    args += ["--measures", "adaptive", "euclidean", "--batch", "40", "--steps", "3", "--boot", "50"]
    assert main([*args, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["members"] == 5 and set(report["tau"]) == {"adaptive", "euclidean"}
    assert main([*args, "--address", "HEAD:6379"]) == 2
    assert "--address needs --backend ray" in capsys.readouterr().err
    missing = ["zoo", "sharpness", str(tmp_path / "nozoo"), "--out", str(tmp_path / "r2")]
    assert main(missing) == 2
    assert capsys.readouterr().err.count("\n") == 1
