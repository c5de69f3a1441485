"""A user's own data for ``--data``: files of tensors and functions (wsym.io.datafile)."""

import json

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

import wsym
from wsym.cli import main as cli
from wsym.errors import WsymInputError
from wsym.io import datasets as data
from wsym.models.registry import build_model


def _tensors(n=12, d=40, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(n, d, generator=gen), torch.randint(0, 10, (n,), generator=gen)


def test_safetensors_with_both_splits(tmp_path):
    x, y = _tensors()
    path = tmp_path / "mine.safetensors"
    save_file({"x_train": x, "y_train": y, "x_test": x[:4] * 2, "y_test": y[:4].clone()}, path)
    ds = data.load(str(path))
    assert torch.equal(ds.x_train, x) and torch.equal(ds.y_train, y)
    assert torch.equal(ds.x_test, x[:4] * 2) and ds.y_test.dtype == torch.int64


def test_npz_inputs_and_targets_serve_both_splits(tmp_path):
    x, y = _tensors()
    path = tmp_path / "mine.npz"
    np.savez(path, inputs=x.double().numpy(), targets=y.int().numpy())
    ds = data.load(str(path))
    assert ds.x_train.dtype == torch.float32 and torch.allclose(ds.x_train, x)
    assert torch.equal(ds.x_test, ds.x_train) and torch.equal(ds.y_test, y)


def test_weights_only_pt_file(tmp_path):
    x, y = _tensors()
    path = tmp_path / "mine.pt"
    torch.save({"x_train": x, "y_train": y}, path)
    assert torch.equal(data.load(str(path)).y_train, y)


def test_function_from_the_working_directory(tmp_path, monkeypatch):
    (tmp_path / "userdata_cwd.py").write_text(
        "import torch\n"
        "def make():\n"
        "    g = torch.Generator().manual_seed(0)\n"
        "    return torch.randn(6, 3, generator=g), torch.arange(6) % 2\n"
    )
    monkeypatch.chdir(tmp_path)
    ds = data.load("userdata_cwd:make")
    assert ds.x_train.shape == (6, 3) and ds.num_classes == 2


@pytest.mark.parametrize(
    ("content", "fragment"),
    [
        ({"x": torch.zeros(3, 2)}, "has no x_train, y_train"),
        ({"x_train": torch.zeros(3, 2), "y_train": torch.zeros(3)}, "labels must be"),
        ({"x_train": torch.zeros(3, 2), "y_train": torch.zeros(2).long()}, "3 inputs and 2"),
        ({"x_train": torch.full((2, 2), float("nan")), "y_train": torch.zeros(2).long()},
         "finite floats"),
    ],
)  # fmt: skip
def test_bad_files_are_one_line(tmp_path, content, fragment):
    path = tmp_path / "bad.safetensors"
    save_file(content, path)
    with pytest.raises(WsymInputError, match=fragment) as excinfo:
        data.load(str(path))
    assert "\n" not in str(excinfo.value)


def test_unknown_name_says_what_is_accepted():
    with pytest.raises(WsymInputError, match=r"\.npz file of x_train"):
        data.load("mnist2d")


def test_cli_sharpness_on_a_users_file(tmp_path, capsys):
    x, y = _tensors(n=64)
    path = tmp_path / "mine.safetensors"
    save_file({"x_train": x, "y_train": y}, path)
    argv = ["sharpness", "--model", "wsym:mlp", "--config", "d_in=40", "--data", str(path)]
    argv += ["--batch-size", "32", "--batches", "1", "--steps", "2", "--measure", "adaptive"]
    code = cli.main([*argv, "--json"])
    out, err = capsys.readouterr()
    assert code == 0, err
    torch.manual_seed(0)  # the CLI's --seed builds the same fresh weights
    model = build_model("wsym:mlp", {"d_in": 40}).double()
    expected = wsym.sharpness(
        model, [(x[:32], y[:32])], torch.nn.functional.cross_entropy, measure="adaptive", steps=2
    )
    assert expected > 0  # the user's file was read: its first batch gives this value
    assert json.loads(out)["value"] == pytest.approx(expected, rel=1e-7)
    code = cli.main([*argv[:5], "--data", str(tmp_path / "absent.npz"), *argv[7:]])
    _, err = capsys.readouterr()
    assert code == 2 and "absent.npz not found" in err
