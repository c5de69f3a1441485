"""``wsym predict`` on a user's checkpoint: ``--input`` and the out-of-distribution flag."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, safe_open, save_file

import wsym.metanet
from wsym.cli import main as cli
from wsym.io import save_state_dict
from wsym.io.resources import MODELS, ZOOS
from wsym.metanet.files import META_KEY
from wsym.models.networks import MLP
from wsym.zoo import load

MLP_MODEL = MODELS / "metanet-mnist1d-mlp.safetensors"


def _run(args, capsys) -> tuple[int, str, str]:
    capsys.readouterr()
    code = cli.main(args)
    out = capsys.readouterr()
    return code, out.out, out.err


def _digits_mlp(d_in: int, widths: list[int], steps: int = 300) -> dict:
    """An MLP trained on sklearn's digits (first ``d_in`` pixels): another task than mnist1d."""
    from sklearn.datasets import load_digits

    x, y = load_digits(return_X_y=True)
    x, y = torch.tensor(x[:, :d_in] / 16.0, dtype=torch.float32), torch.tensor(y)
    torch.manual_seed(0)
    m = MLP(d_in, widths, 10)
    opt = torch.optim.Adam(m.parameters(), 1e-2)
    for _ in range(steps):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(m(x), y).backward()
        opt.step()
    return m.state_dict()


def test_predict_reads_a_digits_mlp_through_model_and_input(tmp_path, capsys):
    ckpt = tmp_path / "digits.safetensors"
    save_state_dict(MLP(64, [64, 64], 10).state_dict(), ckpt)
    args = ["predict", "--checkpoint", str(ckpt), "--model", "wsym:mlp", "--config", "d_in=64"]
    code, out, _ = _run([*args, "--input", "8,64", "--json"], capsys)
    assert code == 0
    said = json.loads(out)
    assert said["out_of_distribution"] in (True, False)
    assert said["distance"] >= 0 and said["threshold"] > 0


def test_another_task_is_flagged_and_a_zoo_member_is_not(tmp_path, capsys):
    ckpt = tmp_path / "digits40.safetensors"
    save_state_dict(_digits_mlp(40, [32, 32]), ckpt)
    code, out, _ = _run(["predict", "--checkpoint", str(ckpt), "--json"], capsys)
    assert code == 0
    said = json.loads(out)
    assert said["metanet"].endswith(MLP_MODEL.name)
    assert said["out_of_distribution"] is True and said["distance"] > said["threshold"]
    code, out, _ = _run(["predict", "--checkpoint", str(ckpt)], capsys)
    assert "out of distribution: YES" in out
    zoo = load(ZOOS / "mnist1d-mlp")
    member = next(r["id"] for r in zoo.table if r["split"] == "test")
    assert (
        wsym.metanet.load(MLP_MODEL).novelty(zoo.state_dict(member))["out_of_distribution"] is False
    )


def test_a_file_without_training_statistics_says_unknown(tmp_path, capsys):
    with safe_open(str(MLP_MODEL), "pt") as f:
        meta = json.loads(f.metadata()[META_KEY])
    meta.pop("novelty")
    old = tmp_path / "old.safetensors"
    save_file(load_file(str(MLP_MODEL)), str(old), metadata={META_KEY: json.dumps(meta)})
    ckpt = tmp_path / "net.safetensors"
    save_state_dict(MLP(40, [32, 32], 10).state_dict(), ckpt)
    code, out, _ = _run(
        ["predict", "--checkpoint", str(ckpt), "--metanet", str(old), "--json"], capsys
    )
    assert code == 0 and json.loads(out)["out_of_distribution"] is None
    code, out, _ = _run(["predict", "--checkpoint", str(ckpt), "--metanet", str(old)], capsys)
    assert "out of distribution: unknown" in out


@pytest.mark.parametrize(
    "extra, needle",
    [
        (["--input", "8,64"], "--input needs --model"),
        (["--model", "wsym:mlp", "--input", "8,x"], "bad input shape"),
    ],
)
def test_predict_input_errors_are_one_line(tmp_path, capsys, extra, needle):
    ckpt = tmp_path / "net.safetensors"
    save_state_dict(MLP(40, [32, 32], 10).state_dict(), ckpt)
    code, _, err = _run(["predict", "--checkpoint", str(ckpt), *extra], capsys)
    assert code == 2 and needle in err and len(err.strip().splitlines()) == 1
