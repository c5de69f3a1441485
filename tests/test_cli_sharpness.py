"""Tests of ``wsym sharpness`` (real detector, a small MLP on mnist1d)."""

import itertools
import json
import math

import pytest
import torch

import wsym
from wsym.cli import main as cli
from wsym.io import load_state_dict, save_state_dict
from wsym.io.datasets import load as load_data
from wsym.models.registry import build_model

DATA = ["--data", "mnist1d", "--batch-size", "64", "--batches", "2", "--steps", "3"]
MLP = ["--model", "wsym:mlp", "--config", "d_in=40", *DATA]


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """A float64 checkpoint of the MLP and its copy rescaled by a scaling symmetry."""
    root = tmp_path_factory.mktemp("sharpness")
    torch.manual_seed(0)
    model = build_model("wsym:mlp", {"d_in": 40})
    sd = {k: v.double() for k, v in model.state_dict().items()}
    spec = wsym.detect(model, torch.randn(8, 40))
    rescaled = spec.act(spec.sample(seed=1, kinds=["scaling"]), sd)
    assert max(float((rescaled[k] - sd[k]).abs().max()) for k in sd) > 1e-3
    paths = {"a": root / "a.safetensors", "rescaled": root / "rescaled.pt"}
    save_state_dict(sd, paths["a"])
    save_state_dict(rescaled, paths["rescaled"])
    return {k: str(v) for k, v in paths.items()}


def run(capsys, *argv):
    code = cli.main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def value(capsys, checkpoint, measure):
    code, out, err = run(
        capsys, "sharpness", *MLP, "--checkpoint", checkpoint, "--measure", measure, "--json"
    )
    assert code == 0, err
    return json.loads(out)["value"]


def assert_one_error_line(err):
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("wsym: error: ") and "Traceback" not in err


def test_help_has_an_example(capsys):
    code, out, _ = run(capsys, "sharpness", "--help")
    assert code == 0
    assert "wsym sharpness " in out.split("examples:", 1)[1]
    for option in ["--model", "--checkpoint", "--data", "--batches", "--measure", "--rho"]:
        assert option in out


@pytest.mark.parametrize("measure", ["adaptive", "euclidean"])
def test_prints_the_value_of_the_python_call(capsys, files, measure):
    """The printed number is ``wsym.sharpness`` on the checkpoint and the first batches."""
    code, out, err = run(
        capsys, "sharpness", *MLP, "--checkpoint", files["a"], "--measure", measure
    )
    assert code == 0, err
    name, number = out.split()
    assert name == measure
    model = build_model("wsym:mlp", {"d_in": 40}).double()
    model.load_state_dict(load_state_dict(files["a"]))
    batches = list(itertools.islice(load_data("mnist1d").batches("train", 64), 2))
    expected = wsym.sharpness(
        model, batches, torch.nn.functional.cross_entropy, measure=measure, seed=0, steps=3
    )
    assert expected > 0
    assert float(number) == pytest.approx(expected, rel=1e-7)


def test_json_report(capsys, files):
    code, out, err = run(
        capsys,
        *["sharpness", *MLP, "--checkpoint", files["a"], "--measure", "adaptive"],
        *["--rho", "0.1", "--average", "--json"],
    )
    assert code == 0, err
    report = json.loads(out)
    assert report["measure"] == "adaptive" and report["rho"] == 0.1
    assert report["checkpoint"] == files["a"] and report["data"] == "mnist1d"
    assert report["model"] == "wsym:mlp" and report["average"] is True
    assert math.isfinite(report["value"])
    assert report["stderr"] > 0  # the average case's standard error


@pytest.mark.filterwarnings("ignore::wsym.errors.SymmetryWarning")
def test_average_prints_the_standard_error(capsys, files):
    code, out, err = run(
        capsys,
        *["sharpness", *MLP, "--checkpoint", files["a"], "--measure", "geodesic-mix"],
        "--average",
    )
    assert code == 0, err
    name, number, plus_minus, error = out.split()
    assert name == "geodesic-mix" and plus_minus == "+-"
    assert math.isfinite(float(number)) and float(error) > 0


def test_adaptive_is_invariant_to_rescaling_euclidean_is_not(capsys, files):
    adaptive = [value(capsys, files[name], "adaptive") for name in ("a", "rescaled")]
    assert adaptive[1] == pytest.approx(adaptive[0], rel=1e-3)
    euclidean = [value(capsys, files[name], "euclidean") for name in ("a", "rescaled")]
    assert abs(euclidean[1] - euclidean[0]) > 1e-3 * abs(euclidean[0])


@pytest.mark.filterwarnings("ignore::wsym.errors.SymmetryWarning")
def test_geodesic_detects_the_spec_from_data(capsys, files):
    """Detected from the data's inputs, the quotient makes the value blind to the rescaling."""
    geodesic = [value(capsys, files[name], "geodesic-mix") for name in ("a", "rescaled")]
    assert geodesic[0] > 0
    assert geodesic[1] == pytest.approx(geodesic[0], rel=1e-6)
