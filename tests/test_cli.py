"""Tests of the ``wsym`` command line.

Tests marked ``# needs wsym.detect`` run the real detector end to end; the others
replace ``wsym.detect`` and ``wsym.detect.tracing`` with fakes, so they exercise every CLI
path (parsing, model building, checkpoints, exit codes, output) on their own.
"""

import json
import subprocess
import sys
import types

import networkx as nx
import pytest
import torch

import wsym
from wsym.cli import main as cli
from wsym.io import save_state_dict

LINEAR = ["--model", "torch.nn:Linear", "--config", "in_features=4,out_features=3"]
TINY_BERT = (
    "hidden_size=16,num_hidden_layers=1,num_attention_heads=2,"
    "intermediate_size=32,vocab_size=50,max_position_embeddings=16"
)


class FakeSpec:
    def __init__(self, model, inputs):
        self.model = model
        self.inputs = inputs
        self.graph = nx.DiGraph([("input", "output")])

    def table(self):
        return f"FAKE TABLE {type(self.model).__name__}"

    def to_json(self):
        return json.dumps({"model": type(self.model).__name__})


@pytest.fixture
def fake_core(monkeypatch):
    """Stand-ins for wsym.detect and wsym.detect.tracing.write_graph; records the calls."""
    calls = {"detect": [], "write_graph": []}

    def detect(model, inputs):
        spec = FakeSpec(model, inputs)
        calls["detect"].append(spec)
        return spec

    def write_graph(graph, path):
        calls["write_graph"].append((graph, path))
        path.write_text("graph")

    graph_module = types.ModuleType("wsym.detect.tracing")
    graph_module.write_graph = write_graph
    monkeypatch.setattr(wsym, "detect", detect, raising=False)
    monkeypatch.setitem(sys.modules, "wsym.detect.tracing", graph_module)
    monkeypatch.setattr(wsym, "graph", graph_module, raising=False)
    return calls


def run(capsys, *argv):
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def assert_one_error_line(err):
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("wsym: error: ")
    assert "Traceback" not in err


# --- help and argparse ---------------------------------------------------------


@pytest.mark.parametrize("argv", [["--help"], ["detect", "--help"], ["tour", "--help"]])
def test_help_has_an_example(capsys, argv):
    code, out, _ = run(capsys, *argv)
    assert code == 0
    assert "example" in out and "wsym " in out.split("example", 1)[1]


def test_detect_help_lists_options(capsys):
    _, out, _ = run(capsys, "detect", "--help")
    for option in ["--model", "--input", "--config", "--checkpoint", "--json", "--graph", "--seed"]:
        assert option in out


@pytest.mark.parametrize(
    "argv",
    [
        [],
        ["frobnicate"],
        ["detect"],
        ["detect", "--model", "torchvision:resnet18"],
        ["detect", "--model", "x:y", "--input", "1", "--seed", "abc"],
    ],
)
def test_usage_errors_exit_2(capsys, argv):
    code, _, err = run(capsys, *argv)
    assert code == 2
    assert "usage" in err


# --- input errors exit 2 before anything slow ----------------------------------


@pytest.mark.parametrize(
    "argv, fragment",
    [
        (["--model", "resnet18", "--input", "1,3,8,8"], "spell a model as"),
        (["--model", "torchvision:resnet1", "--input", "1,3,8,8"], "did you mean"),
        (["--model", "torchvision:resnet18", "--input", "1,3,x"], "bad input shape"),
        (["--model", "torchvision:resnet18", "--input", "1", "--config", "a"], "bad config"),
        ([*LINEAR, "--input", "2,4", "--graph", "out.png"], ".graphml or .json"),
        ([*LINEAR, "--input", "2,4", "--checkpoint", "missing.pt"], "not found"),
        ([*LINEAR, "--input", "2,4", "--checkpoint", "w.npz"], "unsupported checkpoint"),
        (["--model", "hf:bert", "--config", TINY_BERT, "--input", "1,3,8"], "batch,seq"),
    ],
)
def test_input_errors_exit_2(capsys, fake_core, tmp_path, monkeypatch, argv, fragment):
    monkeypatch.chdir(tmp_path)
    code, out, err = run(capsys, "detect", *argv)
    assert code == 2
    assert fragment in err
    assert_one_error_line(err)
    assert out == "" and fake_core["detect"] == []


def test_mismatched_checkpoint_exits_2(capsys, fake_core, tmp_path):
    path = tmp_path / "w.safetensors"
    save_state_dict({"weight": torch.zeros(3, 5), "extra": torch.zeros(1)}, path)
    code, _, err = run(capsys, "detect", *LINEAR, "--input", "2,4", "--checkpoint", str(path))
    assert code == 2
    assert "missing key (bias)" in err and "unexpected key (extra)" in err
    assert "weight: model [3, 4] vs checkpoint [3, 5]" in err
    assert_one_error_line(err)
    assert fake_core["detect"] == []


def test_malicious_checkpoint_exits_2(capsys, fake_core, tmp_path):
    class Payload:
        def __reduce__(self):
            return (exec, (f"open({str(tmp_path / 'pwned')!r}, 'w').close()",))

    path = tmp_path / "evil.pt"
    torch.save({"weight": Payload()}, path)
    code, _, err = run(capsys, "detect", *LINEAR, "--input", "2,4", "--checkpoint", str(path))
    assert code == 2 and "not a weights-only checkpoint" in err
    assert_one_error_line(err)
    assert not (tmp_path / "pwned").exists()


def test_truncated_checkpoint_exits_2(capsys, fake_core, tmp_path):
    path = tmp_path / "w.safetensors"
    save_state_dict(torch.nn.Linear(4, 3).state_dict(), path)
    path.write_bytes(path.read_bytes()[:-7])
    code, _, err = run(capsys, "detect", *LINEAR, "--input", "2,4", "--checkpoint", str(path))
    assert code == 2 and "truncated or corrupt" in err
    assert_one_error_line(err)


# --- the detect flow, with the core faked ---------------------------------------


def test_detect_prints_table(capsys, fake_core):
    code, out, err = run(capsys, "detect", *LINEAR, "--input", "2,4")
    assert code == 0, err
    assert out.strip() == "FAKE TABLE Linear"
    (spec,) = fake_core["detect"]
    assert spec.inputs.shape == (2, 4) and not spec.model.training


def test_detect_json(capsys, fake_core):
    code, out, _ = run(capsys, "detect", *LINEAR, "--input", "2,4", "--json")
    assert code == 0
    assert json.loads(out) == {"model": "Linear"}


def test_detect_loads_checkpoint(capsys, fake_core, tmp_path):
    trained = torch.nn.Linear(4, 3)
    path = tmp_path / "w.pt"
    torch.save({"state_dict": trained.state_dict(), "epoch": 9}, path)
    code, _, err = run(capsys, "detect", *LINEAR, "--input", "2,4", "--checkpoint", str(path))
    assert code == 0, err
    (spec,) = fake_core["detect"]
    assert torch.equal(spec.model.weight, trained.weight)
    assert torch.equal(spec.model.bias, trained.bias)


def test_detect_seed_fixes_weights_and_inputs(capsys, fake_core):
    for seed in ["1", "1", "2"]:
        assert run(capsys, "detect", *LINEAR, "--input", "2,4", "--seed", seed)[0] == 0
    first, again, other = fake_core["detect"]
    assert torch.equal(first.inputs, again.inputs)
    assert torch.equal(first.model.weight, again.model.weight)
    assert not torch.equal(first.inputs, other.inputs)
    assert not torch.equal(first.model.weight, other.model.weight)


@pytest.mark.parametrize("suffix", [".graphml", ".json"])
def test_detect_writes_graph(capsys, fake_core, tmp_path, suffix):
    out_path = tmp_path / f"g{suffix}"
    code, _, err = run(capsys, "detect", *LINEAR, "--input", "2,4", "--graph", str(out_path))
    assert code == 0, err
    ((graph, path),) = fake_core["write_graph"]
    assert path == out_path and isinstance(graph, nx.DiGraph)


def test_detect_hf_model_gets_token_ids(capsys, fake_core):
    code, _, err = run(
        capsys, "detect", "--model", "hf:bert", "--config", TINY_BERT, "--input", "2,8"
    )
    assert code == 0, err
    (spec,) = fake_core["detect"]
    assert set(spec.inputs) == {"input_ids"} and spec.inputs["input_ids"].shape == (2, 8)


@pytest.mark.parametrize("debug", [[], ["--debug"]])
def test_internal_error_exits_1(capsys, monkeypatch, debug):
    def broken(model, inputs):
        raise RuntimeError("boom\nsecond line")

    monkeypatch.setattr(wsym, "detect", broken, raising=False)
    code, out, err = run(capsys, *debug, "detect", *LINEAR, "--input", "2,4")
    assert code == 1 and out == ""
    assert "wsym: error: RuntimeError: boom" in err
    if debug:
        assert "Traceback" in err
    else:
        assert_one_error_line(err)
        assert "--debug" in err


def test_debug_after_subcommand(capsys, monkeypatch):
    monkeypatch.setattr(wsym, "detect", lambda m, x: 1 / 0, raising=False)
    code, _, err = run(capsys, "detect", "--debug", *LINEAR, "--input", "2,4")
    assert code == 1 and "Traceback" in err and "ZeroDivisionError" in err


def test_tour_runs_every_case_and_reports_failures(capsys, fake_core, monkeypatch):
    cases = (
        ("torch.nn:Linear", "in_features=4,out_features=3", "2,4"),
        ("wsym:no_such_builtin", "", "2,4"),
        ("torch.nn:Identity", "", "3"),
    )
    monkeypatch.setattr(cli, "TOUR_CASES", cases)
    code, out, err = run(capsys, "tour")
    assert code == 1
    assert out.count("== ") == 3
    assert "FAKE TABLE Linear" in out and "FAKE TABLE Identity" in out
    assert "unknown builtin model wsym:no_such_builtin" in err
    assert "1 of 3 tour models failed" in err


def test_tour_cases_build(capsys, fake_core, monkeypatch):
    cases = tuple(case for case in cli.TOUR_CASES if not case[0].startswith("wsym:"))
    monkeypatch.setattr(cli, "TOUR_CASES", cases)
    code, out, err = run(capsys, "tour")
    assert code == 0, err
    assert out.count("FAKE TABLE") == len(cases)


def test_module_entry_point_exit_code():
    result = subprocess.run(
        [sys.executable, "-m", "wsym.cli.main", "detect", "--model", "nope", "--input", "1"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2
    assert_one_error_line(result.stderr)


# --- end to end with the real detector ------------------------------------------


# needs wsym.detect
def test_detect_real_linear_json(capsys):
    code, out, err = run(capsys, "detect", *LINEAR, "--input", "2,4", "--json")
    assert code == 0, err
    json.loads(out)


# needs wsym.detect
def test_detect_real_resnet18_table_and_graph(capsys, tmp_path):
    graph = tmp_path / "resnet.graphml"
    argv = ["--model", "torchvision:resnet18", "--input", "1,3,32,32", "--graph", str(graph)]
    code, out, err = run(capsys, "detect", *argv)
    assert code == 0, err
    assert out.strip() and graph.stat().st_size > 0


# needs wsym.detect
def test_detect_real_hf_bert(capsys):
    code, out, err = run(
        capsys, "detect", "--model", "hf:bert", "--config", TINY_BERT, "--input", "2,8"
    )
    assert code == 0, err
    assert out.strip()


# needs wsym.detect
def test_tour_real(capsys):
    code, out, err = run(capsys, "tour")
    assert code == 0, err
    assert out.count("== ") == len(cli.TOUR_CASES)


@pytest.mark.parametrize("debug", [[], ["--debug"]])
def test_torch_reports_reach_stderr_only_with_debug(capsys, monkeypatch, debug):
    """Detection logs torch.export's report (FX graph dumps) at DEBUG; --debug shows it."""
    import logging

    def detect(model, inputs):
        logging.getLogger("wsym.detect.tracing").debug("torch.export wrote:\nGRAPH DUMP")
        return FakeSpec(model, inputs)

    monkeypatch.setattr(wsym, "detect", detect, raising=False)
    code, _, err = run(capsys, *debug, "detect", *LINEAR, "--input", "2,4")
    assert code == 0
    assert ("GRAPH DUMP" in err) == bool(debug)
    assert logging.getLogger("wsym").level == logging.NOTSET  # restored after the run
