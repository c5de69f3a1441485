"""Hugging Face model directories in and out: layout, round trip, atomic writes, bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import wsym
from wsym.cli.main import main
from wsym.errors import WsymInputError
from wsym.io import hf

transformers = pytest.importorskip("transformers")

TINY = dict(
    hidden_size=16,
    num_hidden_layers=2,
    num_attention_heads=2,
    intermediate_size=32,
    vocab_size=64,
    max_position_embeddings=32,
)
IDS = torch.randint(0, 64, (2, 8), generator=torch.Generator().manual_seed(0))


def _saved(root: Path, name: str, *, sharded: bool, seed: int = 0, cls=None) -> Path:
    torch.manual_seed(seed)
    cls = cls or transformers.BertModel
    model = cls(transformers.BertConfig(**TINY)).eval()
    out = root / name
    model.save_pretrained(out, max_shard_size="20KB" if sharded else "10GB")
    return out


def _outputs(path: Path) -> torch.Tensor:
    model = transformers.AutoModel.from_pretrained(path, local_files_only=True).eval()
    with torch.no_grad():
        return model(input_ids=IDS).last_hidden_state


def _spec(model):
    return wsym.detect(model, {"input_ids": IDS})


@pytest.mark.parametrize("sharded", [False, True])
def test_canonical_round_trip_keeps_outputs_and_layout(tmp_path, sharded):
    src = _saved(tmp_path, "a", sharded=sharded)
    model, sd = hf.build_from_directory(src)
    canon = wsym.canonicalize(sd, _spec(model))
    layout = hf.read_directory(src)
    hf.save_directory(canon, layout, tmp_path / "out")
    written = hf.read_directory(tmp_path / "out")
    assert written.shards == layout.shards and written.indexed == sharded
    assert json.loads((tmp_path / "out" / "config.json").read_text()) == layout.config
    moved = max(float((canon[k] - sd[k]).abs().max()) for k in layout.keys)
    assert moved > 1e-3  # the canonical form is another point of the orbit
    assert torch.allclose(_outputs(tmp_path / "out"), _outputs(src), atol=1e-6, rtol=0)
    if sharded:
        index = json.loads((tmp_path / "out" / hf.INDEX).read_text())
        old = json.loads((src / hf.INDEX).read_text())
        assert index["weight_map"] == old["weight_map"]
        assert index["metadata"]["total_size"] == old["metadata"]["total_size"]


def test_tied_weights_and_head_classes_round_trip(tmp_path):
    src = _saved(tmp_path, "mlm", sharded=True, cls=transformers.BertForMaskedLM)
    model, sd = hf.build_from_directory(src)
    assert type(model).__name__ == "BertForMaskedLM"
    hf.save_directory(sd, hf.read_directory(src), tmp_path / "out")
    again = transformers.BertForMaskedLM.from_pretrained(tmp_path / "out", local_files_only=True)
    with torch.no_grad():
        assert torch.equal(again(input_ids=IDS).logits, model(input_ids=IDS).logits)


def test_interrupted_write_leaves_the_old_directory(tmp_path, monkeypatch):
    src = _saved(tmp_path, "a", sharded=True)
    out = _saved(tmp_path, "out", sharded=True, seed=1)
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    _, sd = hf.build_from_directory(src)
    calls = []

    def failing(tensors, file):
        calls.append(file)
        if len(calls) == 2:
            raise KeyboardInterrupt
        real(tensors, file)

    real = hf._write_shard
    monkeypatch.setattr(hf, "_write_shard", failing)
    with pytest.raises(KeyboardInterrupt):
        hf.save_directory(sd, hf.read_directory(src), out)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a", "out"]  # no temporary left


def test_cli_align_writes_a_directory_from_pretrained_loads(tmp_path):
    a = _saved(tmp_path, "a", sharded=True)
    model, sd = hf.build_from_directory(a)
    spec = _spec(model)
    moved = spec.act(spec.sample(seed=3, kinds=["permutation"]), sd)
    b = tmp_path / "b"
    hf.save_directory(moved, hf.read_directory(a), b)
    code = main(["align", str(a), str(b), "--out", str(tmp_path / "c")])  # 2 x 16 tokens
    assert code == 0
    _, aligned = hf.build_from_directory(tmp_path / "c")
    assert max(float((aligned[k] - sd[k]).abs().max()) for k in sd) < 1e-5
    assert torch.allclose(_outputs(tmp_path / "c"), _outputs(b), atol=1e-6, rtol=0)
    assert hf.read_directory(tmp_path / "c").shards == hf.read_directory(a).shards


def _cli_error(capsys, argv) -> str:
    capsys.readouterr()  # what saving the fixtures printed
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1
    return err[0]


def test_bad_directories_are_one_line_exit_2_nothing_written(tmp_path, capsys):
    a = _saved(tmp_path, "a", sharded=True)
    out = tmp_path / "out"
    no_config = tmp_path / "noconfig"
    no_config.mkdir()
    (no_config / "model.safetensors").write_bytes(
        (a / next(iter(hf.read_directory(a).shards))).read_bytes()
    )
    msg = _cli_error(capsys, ["canon", str(no_config), "--input", "2,8", "--out", str(out)])
    assert "noconfig has no config.json" in msg and "save_pretrained" in msg

    missing = tmp_path / "missing"
    missing.mkdir()
    for p in a.iterdir():
        (missing / p.name).write_bytes(p.read_bytes())
    shard = sorted(hf.read_directory(a).shards)[-1]
    (missing / shard).unlink()
    msg = _cli_error(capsys, ["canon", str(missing), "--input", "2,8", "--out", str(out)])
    assert f"names shard {shard}, which is missing" in msg and "copy the missing shard" in msg

    wrong = tmp_path / "wrong"
    wrong.mkdir()
    for p in a.iterdir():
        (wrong / p.name).write_bytes(p.read_bytes())
    config = json.loads((wrong / "config.json").read_text())
    config["intermediate_size"] = 48
    (wrong / "config.json").write_text(json.dumps(config))
    msg = _cli_error(capsys, ["canon", str(wrong), "--input", "2,8", "--out", str(out)])
    assert "wrong does not fit the model" in msg and "intermediate.dense.weight" in msg

    msg = _cli_error(
        capsys, ["canon", str(a), "--input", "2,8", "--out", str(out), "--dtype", "int8"]
    )
    assert "--dtype int8" in msg and "float32" in msg
    msg = _cli_error(
        capsys, ["canon", str(a), "--input", "2,8", "--out", str(out), "--dtype", "float16"]
    )
    assert "cannot run in float16" in msg and "--dtype float32" in msg
    assert not out.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a", "missing", "noconfig", "wrong"]


def test_python_errors_name_the_file(tmp_path):
    with pytest.raises(WsymInputError, match="has no config.json"):
        hf.read_directory(tmp_path)
    with pytest.raises(WsymInputError, match="not found"):
        hf.read_directory(tmp_path / "nowhere")


def test_default_example_input_comes_from_the_config():
    from wsym.cli.prepare import default_shape

    assert default_shape(transformers.BertConfig(**TINY)) == (2, 16)
    short = transformers.BertConfig(**{**TINY, "max_position_embeddings": 8})
    assert default_shape(short) == (2, 8)
    vit = transformers.ViTConfig(image_size=32, num_channels=3)
    assert default_shape(vit) == (2, 3, 32, 32)
    with pytest.raises(WsymInputError, match="--input SHAPE"):
        default_shape(transformers.PretrainedConfig())
