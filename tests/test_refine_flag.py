"""``refine`` through ``wsym.merge``; ``--refine`` on ``wsym align/merge/barrier``.

Bad values of ``--refine``, ``--residual`` and ``--continuous`` share one check: one
line, exit 2, before any checkpoint or model loads.
"""

import json
import os
import sys

import pytest
import torch
from test_canon import double
from test_cli_checkpoints import MLP, assert_one_error_line, files, run  # noqa: F401

import wsym
from wsym.errors import WsymInputError
from wsym.io import load_state_dict
from wsym.models.networks import MLP as Net
from wsym.models.registry import build_model

MERGE = sys.modules["wsym.align.merge"]
CHECKPOINTS = sys.modules["wsym.cli.checkpoints"]


def spy(monkeypatch, module):
    """Record the ``refine`` each ``module.align`` call gets (the real alignment still runs)."""
    seen, real = [], module.align

    def recording(*args, **kwargs):
        seen.append(kwargs.get("refine"))
        return real(*args, **kwargs)

    monkeypatch.setattr(module, "align", recording)
    return seen


def labelled_batches(net, n=3, size=16):
    torch.manual_seed(5)
    return [(x, net(x).argmax(1)) for x in torch.randn(n, size, 5, dtype=torch.float64)]


def test_merge_passes_refine_to_every_alignment_and_keeps_each_function(monkeypatch):
    torch.manual_seed(0)
    net = Net(5, [8, 6], 3).double()
    spec = wsym.detect(net, torch.randn(2, 5, dtype=torch.float64))
    states = []
    for seed in (1, 2, 3):
        torch.manual_seed(seed)
        states.append(double(Net(5, [8, 6], 3).state_dict()))
    seen = spy(monkeypatch, MERGE)
    batches = labelled_batches(net)
    _, report = wsym.merge(
        states, spec, refine="path", model=net, batches=batches, rounds=1, with_report=True
    )
    assert seen and set(seen) == {"path"}
    x = batches[0][0]
    for sd, aligned in zip(states, report.aligned, strict=True):
        before = torch.func.functional_call(net, sd, (x,))
        after = torch.func.functional_call(net, aligned, (x,))
        assert float((after - before).abs().max()) <= 1e-9 * float(before.abs().max())


@pytest.mark.parametrize(("members", "expected"), [(2, "auto"), (3, "none")])
def test_merge_fits_the_path_by_default_for_two_members_only(monkeypatch, members, expected):
    """MergeMany (three or more) aligns to the mean of the others: no path fit by default."""
    torch.manual_seed(0)
    net = Net(5, [8, 6], 3).double()
    spec = wsym.detect(net, torch.randn(2, 5, dtype=torch.float64))
    states = []
    for seed in range(1, members + 1):
        torch.manual_seed(seed)
        states.append(double(Net(5, [8, 6], 3).state_dict()))
    seen = spy(monkeypatch, MERGE)
    wsym.merge(states, spec, model=net, batches=labelled_batches(net), rounds=1)
    assert seen and set(seen) == {expected}


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        ({"refine": "curve"}, "unknown refinement 'curve'"),
        ({"refine": "path"}, "needs model= and batches="),
    ],
)
def test_merge_refuses_a_bad_refine_in_one_line(kwargs, fragment):
    torch.manual_seed(0)
    net = Net(5, [8, 6], 3).double()
    spec = wsym.detect(net, torch.randn(2, 5, dtype=torch.float64))
    sd = double(net.state_dict())
    with pytest.raises(WsymInputError, match=fragment) as err:
        wsym.merge([sd, sd], spec, **kwargs)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize(
    ("argv", "fragment"),
    [
        (["align", *MLP, "A", "A", "--out", "x.pt", "--refine", "curve"], "unknown --refine"),
        (["merge", *MLP, "A", "A", "--out", "m.pt", "--refine", "curve"], "unknown --refine"),
        (["barrier", *MLP, "A", "A", "--data", "mnist1d", "--out", "b", "--refine", "x"], "x'"),
        (["align", *MLP, "A", "A", "--out", "x.pt", "--refine", "path"], "--data NAME"),
        (
            ["barrier", *MLP, "A", "A", "--data", "mnist1d", "--out", "b", "--refine", "path"]
            + ["--align", "none"],
            "drop --align none",
        ),
        (
            ["merge", *MLP, "A", "A", "--out", "m.pt", "--refine", "path", "--data", "mnist1d"]
            + ["--continuous", "canonical"],
            "works with --continuous auto or reference",
        ),
        (["align", *MLP, "A", "A", "--out", "x.pt", "--residual", "spin"], "unknown --residual"),
        (["merge", *MLP, "A", "A", "--out", "m.pt", "--continuous", "x"], "unknown --continuous"),
        (
            ["barrier", *MLP, "A", "A", "--data", "mnist1d", "--out", "b", "--continuous", "y"],
            "'y'",
        ),
        (
            ["align", *MLP, "A", "A", "--out", "x.pt", "--residual", "rotation"]
            + ["--data", "mnist1d", "--continuous", "canonical"],
            "--residual rotation works with --continuous auto or reference",
        ),
        (
            ["barrier", *MLP, "A", "A", "--data", "mnist1d", "--out", "b", "--residual", "rotation"]
            + ["--align", "none"],
            "drop --align none",
        ),
    ],
)
def test_bad_alignment_options_exit_2_in_one_line(
    capsys,
    files,  # noqa: F811
    tmp_path,
    monkeypatch,
    argv,
    fragment,
):
    monkeypatch.chdir(tmp_path)

    def loads(*args, **kwargs):
        raise AssertionError("the options are checked before anything loads")

    monkeypatch.setattr(CHECKPOINTS, "prepare", loads)
    code, stdout, err = run(capsys, *[files["a"] if a == "A" else a for a in argv])
    assert code == 2
    assert fragment in err
    assert_one_error_line(err)
    assert stdout == "" and os.listdir(tmp_path) == []


@pytest.mark.parametrize("value", ["path", "none"])
@pytest.mark.parametrize("command", ["align", "merge", "barrier"])
def test_the_flag_reaches_the_aligner(capsys, files, tmp_path, monkeypatch, command, value):  # noqa: F811
    seen = spy(monkeypatch, MERGE if command == "merge" else sys.modules["wsym"])
    out = tmp_path / ("b" if command == "barrier" else "x.pt")
    argv = [command, *MLP, files["a"], files["b"], "--out", out, "--data", "mnist1d"]
    code, stdout, err = run(capsys, *argv, "--refine", value, "--json")
    assert code == 0, err
    assert seen == [value]
    report = json.loads(stdout)
    assert report["refine"] == value


def test_align_refined_along_the_path_keeps_the_function(capsys, files, tmp_path):  # noqa: F811
    out = tmp_path / "aligned.safetensors"
    argv = [*MLP, files["a"], files["b"], "--out", out, "--data", "mnist1d", "--refine", "path"]
    code, _, err = run(capsys, "align", *argv)
    assert code == 0, err
    aligned, other = load_state_dict(out), load_state_dict(files["b"])
    net = build_model("wsym:mlp", {"d_in": 40}).double().eval()
    x = torch.randn(16, 40, dtype=torch.float64)
    before = torch.func.functional_call(net, other, (x,))
    after = torch.func.functional_call(net, aligned, (x,))
    assert float((after - before).abs().max()) <= 1e-9 * float(before.abs().max())
    assert max(float((aligned[k] - other[k]).abs().max()) for k in other) > 1e-3  # it moved
