"""Tests of ``wsym canon``, ``align``, ``merge`` and ``barrier`` (real detector, small MLPs)."""

import json
import os

import pytest
import torch

import wsym
from wsym.cli import main as cli
from wsym.io import load_state_dict, save_state_dict
from wsym.models.registry import build_model

CONFIG = "d_in=40"
MODEL = ["--model", "wsym:mlp", "--config", CONFIG]
MLP = [*MODEL, "--input", "8,40"]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def mlp_state(seed, **config):
    torch.manual_seed(seed)
    model = build_model("wsym:mlp", {"d_in": 40, **config})
    return model, {k: v.double() for k, v in model.state_dict().items()}


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """Float64 checkpoints: a, its moved copy, an independent b, and the spec of the MLP."""
    root = tmp_path_factory.mktemp("checkpoints")
    model, sd = mlp_state(0)
    spec = wsym.detect(model, torch.randn(8, 40))
    moved = spec.act(spec.sample(seed=1), sd)
    paths = {
        "a": root / "a.safetensors",
        "moved": root / "moved.safetensors",
        "b": root / "b.pt",
        "spec": root / "spec.json",
    }
    save_state_dict(sd, paths["a"])
    save_state_dict(moved, paths["moved"])
    save_state_dict(mlp_state(1)[1], paths["b"])
    paths["spec"].write_text(spec.to_json())
    return {k: str(v) for k, v in paths.items()}


def run(capsys, *argv):
    code = cli.main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def max_difference(sd_a, sd_b):
    assert sd_a.keys() == sd_b.keys()
    return max(float((sd_a[k].double() - sd_b[k].double()).abs().max()) for k in sd_a)


def assert_one_error_line(err):
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("wsym: error: ") and "Traceback" not in err


# --- help ------------------------------------------------------------------------


@pytest.mark.parametrize("command", ["canon", "align", "merge", "barrier"])
def test_help_has_an_example(capsys, command):
    code, out, _ = run(capsys, command, "--help")
    assert code == 0
    examples = out.split("examples:", 1)[1]
    assert f"wsym {command} " in examples
    for option in ["--model", "--config", "--input", "--spec", "--json", "--seed", "--out"]:
        assert option in out


# --- results -----------------------------------------------------------------------


def test_canon_is_invariant_to_a_moved_copy(capsys, files, tmp_path):
    outs = [tmp_path / "a.canon.safetensors", tmp_path / "moved.canon.safetensors"]
    for name, out in zip(["a", "moved"], outs, strict=True):
        code, stdout, err = run(capsys, "canon", *MLP, files[name], "--out", out)
        assert code == 0, err
        assert f"written to {out}" in stdout
    canon_a, canon_moved = (load_state_dict(out) for out in outs)
    assert max_difference(canon_a, canon_moved) < 1e-6
    assert max_difference(canon_a, load_state_dict(files["a"])) > 1e-3  # it did move


def test_canon_with_a_saved_spec_matches_detection(capsys, files, tmp_path):
    detected, saved = tmp_path / "detected.pt", tmp_path / "saved.pt"
    assert run(capsys, "canon", *MLP, files["a"], "--out", detected)[0] == 0
    code, out, err = run(
        capsys, "canon", *MODEL, "--spec", files["spec"], files["a"], "--out", saved, "--json"
    )
    assert code == 0, err
    assert json.loads(out)["groups"] == 4
    assert max_difference(load_state_dict(detected), load_state_dict(saved)) < 1e-12


@pytest.mark.parametrize("method", ["weights", "activations", "activations+weights"])
def test_align_of_a_moved_copy_has_zero_distance(capsys, files, tmp_path, method):
    out = tmp_path / "aligned.safetensors"
    argv = [*MLP, files["a"], files["moved"], "--out", out, "--json", "--method", method]
    code, stdout, err = run(capsys, "align", *argv, "--data", "mnist1d")
    assert code == 0, err
    report = json.loads(stdout)
    assert report["distance_before"] > 1.0
    assert report["distance_after"] < 1e-6
    assert max_difference(load_state_dict(out), load_state_dict(files["a"])) < 1e-8


def test_align_prints_distances(capsys, files, tmp_path):
    out = tmp_path / "aligned.pt"
    code, stdout, err = run(capsys, "align", *MLP, files["a"], files["b"], "--out", out)
    assert code == 0, err
    assert "L2 distance to" in stdout and "before" in stdout and "after" in stdout
    aligned, b = load_state_dict(out), load_state_dict(files["b"])
    assert aligned.keys() == b.keys() and max_difference(aligned, b) > 1e-3


def test_merge_of_a_moved_copy_is_the_original(capsys, files, tmp_path):
    out = tmp_path / "merged.safetensors"
    code, _, err = run(capsys, "merge", *MLP, files["a"], files["moved"], "--out", out)
    assert code == 0, err
    assert max_difference(load_state_dict(out), load_state_dict(files["a"])) < 1e-8


def test_merge_of_three(capsys, files, tmp_path):
    out = tmp_path / "merged.pt"
    argv = [*MLP, files["a"], files["moved"], files["b"], "--out", out, "--json"]
    code, stdout, err = run(capsys, "merge", *argv)
    assert code == 0, err
    assert json.loads(stdout)["checkpoints"] == [files["a"], files["moved"], files["b"]]
    assert load_state_dict(out).keys() == load_state_dict(files["a"]).keys()


def test_barrier_writes_png_and_json(capsys, files, tmp_path):
    out = tmp_path / "barrier"
    argv = [*MODEL, files["a"], files["b"], "--data", "mnist1d", "--steps", "3", "--out", out]
    code, stdout, err = run(capsys, "barrier", *argv)
    assert code == 0, err
    assert "loss barrier: naive" in stdout and "aligned" in stdout
    assert (out / "barrier.png").read_bytes().startswith(PNG_MAGIC)
    report = json.loads((out / "barrier.json").read_text())
    assert set(report["curves"]) == {"naive", "aligned"}
    assert len(report["curves"]["aligned"]["losses"]) == 3
    assert report["barrier"]["naive"] == report["curves"]["naive"]["barrier"]
    assert sorted(os.listdir(out)) == ["barrier.json", "barrier.png"]  # no temporary files


def test_barrier_without_alignment(capsys, files, tmp_path):
    out = tmp_path / "barrier"
    argv = [*MLP, files["a"], files["b"], "--data", "mnist1d", "--steps", "2", "--out", out]
    code, stdout, err = run(capsys, "barrier", *argv, "--align", "none", "--json")
    assert code == 0, err
    report = json.loads(stdout)
    assert set(report["curves"]) == {"naive"} and report["align"] == "none"
    assert json.loads((out / "barrier.json").read_text()) == report


# --- bad input: exit 2, one line, nothing written -----------------------------------


@pytest.fixture
def bad_files(tmp_path):
    """Checkpoints that are wrong for ``wsym:mlp d_in=40``, in a directory of their own."""
    root = tmp_path / "inputs"
    root.mkdir()
    _, other_arch = mlp_state(2, d_out=5)
    save_state_dict(other_arch, root / "other_arch.safetensors")
    _, nan = mlp_state(3)
    nan["2.weight"][3, 5] = float("nan")
    save_state_dict(nan, root / "nan.pt")
    return {
        "other_arch": str(root / "other_arch.safetensors"),
        "nan": str(root / "nan.pt"),
        "missing": str(root / "missing.safetensors"),
    }


def commands(files, good, bad, out_dir):
    return {
        "canon": ["canon", *MLP, bad, "--out", out_dir / "c.pt"],
        "align": ["align", *MLP, good, bad, "--out", out_dir / "a.pt"],
        "merge": ["merge", *MLP, good, files["moved"], bad, "--out", out_dir / "m.pt"],
        "barrier": ["barrier", *MLP, good, bad, "--data", "mnist1d", "--out", out_dir / "b"],
    }


@pytest.mark.parametrize("command", ["canon", "align", "merge", "barrier"])
@pytest.mark.parametrize(
    "bad, fragment",
    [
        ("other_arch", "does not fit the model: 2 shape mismatches (4.bias"),
        ("nan", "has NaN values in tensor '2.weight' (1 of 4096 entries)"),
        ("missing", "missing.safetensors not found"),
    ],
)
def test_bad_checkpoints_exit_2_and_write_nothing(
    capsys, files, bad_files, tmp_path, command, bad, fragment
):
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    argv = commands(files, files["a"], bad_files[bad], out_dir)[command]
    code, stdout, err = run(capsys, *argv)
    assert code == 2
    assert fragment in err and bad_files[bad] in err
    assert_one_error_line(err)
    assert stdout == "" and list(out_dir.iterdir()) == []


@pytest.mark.parametrize(
    "argv, fragment",
    [
        (["merge", *MLP, "A", "--out", "m.pt"], "at least two checkpoints"),
        (["align", *MLP, "A", "A", "--out", "x.pt", "--method", "activations"], "--data NAME"),
        (
            ["merge", *MLP, "A", "A", "--out", "m.pt", "--method", "activations+weights"],
            "--data NAME",
        ),
        (["merge", *MLP, "A", "A", "--out", "m.pt", "--reset-batchnorm"], "--data NAME"),
        (["align", *MLP, "A", "A", "--out", "x.pt", "--residual", "rotation"], "--data NAME"),
        (
            [
                "align",
                *MLP,
                "A",
                "A",
                "--out",
                "x.pt",
                "--residual",
                "rotation",
                "--data",
                "mnist1d",
            ],
            "no pre-LN residual stream",
        ),
        (["canon", *MODEL, "A", "--out", "c.pt"], "pass --input SHAPE"),
        (["canon", *MLP, "A", "--out", "c.npz"], "unsupported suffix"),
        (["canon", *MLP, "A", "--out", "no/such/dir/c.pt"], "does not exist"),
        (["barrier", *MLP, "A", "A", "--data", "mnist1d", "--steps", "1", "--out", "b"], "steps"),
        (["canon", *MODEL, "--spec", "nope.json", "A", "--out", "c.pt"], "nope.json not found"),
        (["canon", *MLP, "--config", "x", "A", "--out", "c.pt"], "bad config"),
        (["barrier", *MLP, "A", "A", "--data", "cifar10", "--out", "b"], "unknown dataset"),
    ],
)
def test_bad_options_exit_2(capsys, files, tmp_path, monkeypatch, argv, fragment):
    monkeypatch.chdir(tmp_path)
    argv = [files["a"] if a == "A" else a for a in argv]
    code, stdout, err = run(capsys, *argv)
    assert code == 2
    assert fragment in err
    assert_one_error_line(err)
    assert stdout == "" and os.listdir(tmp_path) == []


@pytest.mark.parametrize(
    "argv",
    [
        ["barrier", *MLP, "A", "A", "--out", "b"],  # --data is required
        ["align", *MLP, "A", "A", "--out", "x.pt", "--method", "nearest"],
    ],
)
def test_usage_errors_exit_2(capsys, files, argv):
    code, _, err = run(capsys, *[files["a"] if a == "A" else a for a in argv])
    assert code == 2 and "usage" in err


def test_spec_of_another_model_exits_2(capsys, files, tmp_path):
    model, _ = mlp_state(0, d_in=12)
    (tmp_path / "small.json").write_text(wsym.detect(model, torch.randn(4, 12)).to_json())
    out = tmp_path / "c.pt"
    argv = [*MODEL, "--spec", tmp_path / "small.json", files["a"], "--out", out]
    code, _, err = run(capsys, "canon", *argv)
    assert code == 2 and "does not fit the model" in err
    assert_one_error_line(err)
    assert not out.exists()


def test_data_that_does_not_fit_exits_2(capsys, files, tmp_path):
    out = tmp_path / "b"
    argv = [*MLP, files["a"], files["b"], "--data", "digits", "--out", out]
    code, _, err = run(capsys, "barrier", *argv)
    assert code == 2 and "dataset digits" in err and "does not fit wsym:mlp" in err
    assert_one_error_line(err)
    assert not out.exists()


def test_failed_plot_leaves_nothing(capsys, files, tmp_path, monkeypatch):
    def broken(self, path, **kwargs):
        path.write_bytes(b"partial")
        raise RuntimeError("disk full")

    monkeypatch.setattr(wsym.Curve, "plot", broken)
    out = tmp_path / "b"
    argv = [*MLP, files["a"], files["b"], "--data", "mnist1d", "--steps", "2", "--out", out]
    code, _, err = run(capsys, "barrier", *argv, "--align", "none")
    assert code == 1 and "disk full" in err
    assert not out.exists()


TRANSFORMER = [
    "--model",
    "wsym:transformer",
    "--config",
    "patch=4,seq=10,dim=8,heads=2,depth=1,hidden=12",
    "--input",
    "8,10,4",
]


def test_align_with_a_rotated_residual_stream_keeps_the_function(capsys, tmp_path):
    models, paths = [], []
    for seed in (0, 1):
        torch.manual_seed(seed)
        model = build_model(
            "wsym:transformer",
            {"patch": 4, "seq": 10, "dim": 8, "heads": 2, "depth": 1, "hidden": 12},
        )
        models.append(model)
        paths.append(tmp_path / f"t{seed}.safetensors")
        save_state_dict({k: v.double() for k, v in model.state_dict().items()}, paths[-1])
    out = tmp_path / "aligned.safetensors"
    argv = [*TRANSFORMER, *paths, "--out", out, "--residual", "rotation", "--data", "mnist1d-seq"]
    code, stdout, err = run(capsys, "align", *argv, "--json")
    assert code == 0, err
    assert json.loads(stdout)["residual"] == "rotation"
    aligned, x = load_state_dict(out), torch.randn(5, 10, 4, dtype=torch.float64)
    net = models[1].double().eval()
    with torch.no_grad():
        before = net(x)
        net.load_state_dict(aligned)
        after = net(x)
    assert float((after - before).abs().max()) <= 1e-9 * float(before.abs().max())
