"""Model zoos: every preset builds, the directory format, reproducibility, bad input, CLI."""

import json
import math

import pytest
import torch

import wsym
import wsym.io.resources
import wsym.zoo
from wsym.cli import main as cli
from wsym.errors import WsymInputError
from wsym.zoo import store

TINY = {"hyperparameters": {"epochs": 1, "train_fraction": 0.05}, "shard_size": 2}
PRESETS = [
    "mnist1d-mlp",
    "mnist1d-mlp-widths",
    "mnist1d-cnn",
    "digits-cnn",
    "seq-transformer",
    "diagonal",
]


def tiny(name):
    if name == "diagonal":
        return {"hyperparameters": {"epochs": 20}, "shard_size": 2}
    return TINY


@pytest.mark.parametrize("name", PRESETS)
def test_every_preset_builds_a_small_zoo(tmp_path, name):
    zoo = wsym.zoo.build(
        name, members=3, out=tmp_path, seed=1, progress=False, overrides=tiny(name)
    )
    assert len(zoo) == 3 and zoo.ids == [0, 1, 2]
    assert sorted(zoo.split("train") + zoo.split("val") + zoo.split("test")) == [0, 1, 2]
    regression = name == "diagonal"
    assert zoo.manifest["gap"] == (
        "test_loss - train_loss" if regression else "train_acc - test_acc"
    )
    for row in zoo.table:
        model = zoo.model(row["id"])
        sd = zoo.state_dict(row["id"])
        assert list(sd) == list(model.state_dict())  # exactly the module's keys
        model.load_state_dict(sd)
        out = model.eval()(zoo.example_inputs())
        assert out.shape[0] == 8 and torch.isfinite(out).all()
        assert row["steps"] > 0 and row["epoch"] == row["epochs"]
        if regression:
            assert math.isnan(row["train_acc"])
            assert row["gap"] == pytest.approx(row["test_loss"] - row["train_loss"])
        else:
            assert row["gap"] == pytest.approx(row["train_acc"] - row["test_acc"])
            assert 0 <= row["test_acc"] <= 1
    assert len(zoo.state_dicts()) == 3


def test_stored_buffers_are_the_trained_running_statistics(tmp_path):
    zoo = wsym.zoo.build("digits-cnn", members=2, out=tmp_path, progress=False, overrides=TINY)
    for member in zoo.ids:
        sd = zoo.state_dict(member)
        assert int(sd["bn1.num_batches_tracked"]) == zoo.row(member)["steps"]
        assert not torch.equal(sd["bn1.running_mean"], torch.zeros_like(sd["bn1.running_mean"]))


def test_detect_runs_on_a_zoo_member(tmp_path):
    zoo = wsym.zoo.build("mnist1d-mlp", members=1, out=tmp_path, progress=False, overrides=TINY)
    model = zoo.model(0)
    model.load_state_dict(zoo.state_dict(0))
    spec = wsym.detect(model, zoo.example_inputs())
    assert {g.kind for g in spec.groups} >= {"permutation", "scaling"}


def files(path):
    return {p.relative_to(path): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()}


def test_same_preset_and_seed_give_identical_files_whatever_the_workers(tmp_path):
    a = wsym.zoo.build(
        "mnist1d-mlp", members=5, out=tmp_path / "a", seed=3, progress=False, overrides=TINY
    )
    b = wsym.zoo.build(
        "mnist1d-mlp",
        members=5,
        out=tmp_path / "b",
        seed=3,
        progress=False,
        overrides=TINY,
        workers=2,
    )
    assert files(a.path) == files(b.path)
    c = wsym.zoo.build(
        "mnist1d-mlp", members=5, out=tmp_path / "c", seed=4, progress=False, overrides=TINY
    )
    assert not torch.equal(a.state_dict(0)["0.weight"], c.state_dict(0)["0.weight"])


def test_growing_a_zoo_keeps_its_members_and_equals_a_fresh_build(tmp_path):
    small = wsym.zoo.build(
        "mnist1d-mlp", members=3, out=tmp_path / "g", progress=False, overrides=TINY
    )
    before = files(small.path / store.SHARDS)
    grown = wsym.zoo.build(
        "mnist1d-mlp", members=6, out=tmp_path / "g", progress=False, overrides=TINY
    )
    fresh = wsym.zoo.build(
        "mnist1d-mlp", members=6, out=tmp_path / "f", progress=False, overrides=TINY
    )
    after = files(grown.path / store.SHARDS)
    assert all(after[name] == data for name, data in before.items())  # nothing rewritten
    assert [r["shard"] for r in grown.table][:3] == [r["shard"] for r in small.table]
    for i in range(6):  # MLPs: bit for bit, whatever the shard layout
        for k, v in fresh.state_dict(i).items():
            assert torch.equal(v, grown.state_dict(i)[k])
    assert [r["gap"] for r in grown.table] == [r["gap"] for r in fresh.table]
    assert grown.manifest["member_splits"] == fresh.manifest["member_splits"]


def test_a_finished_zoo_is_not_retrained(tmp_path, monkeypatch):
    wsym.zoo.build("mnist1d-mlp", members=2, out=tmp_path, progress=False, overrides=TINY)
    import wsym.zoo.backends as backends

    monkeypatch.setattr(backends, "train_unit", lambda *a: pytest.fail("retrained"))
    assert (
        len(wsym.zoo.build("mnist1d-mlp", members=2, out=tmp_path, progress=False, overrides=TINY))
        == 2
    )


def test_a_shard_written_but_not_recorded_is_recovered(tmp_path):
    zoo = wsym.zoo.build("mnist1d-mlp", members=4, out=tmp_path, progress=False, overrides=TINY)
    table = (tmp_path / store.TABLE).read_text()
    lines = table.splitlines(keepends=True)
    (tmp_path / store.TABLE).write_text("".join(lines[:3]))  # as if killed before the table
    (tmp_path / store.SHARDS / ".members-000002-000003.safetensors.tmp-1").write_bytes(b"half")
    again = wsym.zoo.build("mnist1d-mlp", members=4, out=tmp_path, progress=False, overrides=TINY)
    assert (tmp_path / store.TABLE).read_text() == table
    assert again.table == zoo.table
    assert not list((tmp_path / store.SHARDS).glob(".*"))


# --- bad input -------------------------------------------------------------------------


def test_unknown_preset(tmp_path):
    with pytest.raises(WsymInputError, match="unknown zoo preset 'nope'"):
        wsym.zoo.build("nope", members=2, out=tmp_path)


def test_a_directory_holding_another_zoo_is_refused_and_left_alone(tmp_path):
    wsym.zoo.build("mnist1d-mlp", members=2, out=tmp_path, progress=False, overrides=TINY)
    before = files(tmp_path)
    for kwargs in (
        {"seed": 1, "overrides": TINY},
        {"overrides": None},
        {"overrides": TINY, "preset": "digits-cnn"},
    ):
        kwargs = {"preset": "mnist1d-mlp", **kwargs}
        with pytest.raises(WsymInputError, match="holds a different zoo"):
            wsym.zoo.build(members=3, out=tmp_path, progress=False, **kwargs)
    assert files(tmp_path) == before


def test_a_non_empty_directory_without_a_zoo_is_refused(tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(WsymInputError, match="not empty"):
        wsym.zoo.build("mnist1d-mlp", members=2, out=tmp_path, progress=False, overrides=TINY)


@pytest.mark.parametrize("damage", ["truncate", "flip"])
def test_a_corrupt_shard_is_reported_and_never_overwritten(tmp_path, damage):
    wsym.zoo.build("mnist1d-mlp", members=4, out=tmp_path, progress=False, overrides=TINY)
    shard = tmp_path / store.SHARDS / "members-000000-000001.safetensors"
    data = bytearray(shard.read_bytes())
    if damage == "truncate":
        data = data[: len(data) // 2]
    else:
        data[-5] ^= 0xFF
    shard.write_bytes(bytes(data))
    table = (tmp_path / store.TABLE).read_bytes()
    with pytest.raises(WsymInputError, match="corrupt or missing zoo shard .*members-000000"):
        wsym.zoo.build("mnist1d-mlp", members=6, out=tmp_path, progress=False, overrides=TINY)
    with pytest.raises(WsymInputError, match="corrupt zoo shard"):
        wsym.zoo.load(tmp_path).state_dict(0)
    assert shard.read_bytes() == bytes(data) and (tmp_path / store.TABLE).read_bytes() == table
    assert wsym.zoo.load(tmp_path).state_dict(2)  # the other shard still loads


def test_load_errors(tmp_path):
    with pytest.raises(WsymInputError, match="not a zoo directory"):
        wsym.zoo.load(tmp_path)
    zoo = wsym.zoo.build("mnist1d-mlp", members=2, out=tmp_path, progress=False, overrides=TINY)
    with pytest.raises(WsymInputError, match="no finished member 7"):
        zoo.state_dict(7)
    with pytest.raises(WsymInputError, match="unknown member split"):
        zoo.split("validation")


def test_bad_preset_files(tmp_path):
    path = tmp_path / "mine.json"
    path.write_text("{not json")
    with pytest.raises(WsymInputError, match="cannot read zoo preset"):
        wsym.zoo.load_preset(str(path))
    preset = json.loads((wsym.io.resources.PRESETS / "mnist1d-mlp.json").read_text())
    del preset["hyperparameters"]["lr"]
    path.write_text(json.dumps(preset))
    with pytest.raises(WsymInputError, match="lacks hyperparameters.lr"):
        wsym.zoo.load_preset(str(path))


# --- CLI -------------------------------------------------------------------------------


def run(capsys, *argv):
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_cli_build_info_and_plot(tmp_path, capsys):
    preset = tmp_path / "tiny-mlp.json"
    config = json.loads((wsym.io.resources.PRESETS / "mnist1d-mlp.json").read_text())
    config["hyperparameters"].update(epochs=1, train_fraction=0.05)
    config["shard_size"] = 2
    preset.write_text(json.dumps(config))
    out = tmp_path / "zoo"
    code, stdout, err = run(
        capsys, "zoo", "build", "--preset", str(preset), "--members", "3", "--out", str(out)
    )
    assert code == 0, err
    assert "3/3 members" in stdout and "gap = train_acc - test_acc" in stdout
    assert "3/3 members" in err and "members/s" in err  # the bar (tqdm)
    code, stdout, err = run(
        capsys,
        "zoo",
        "build",
        "--preset",
        str(preset),
        "--members",
        "3",
        "--out",
        str(out),
        "--quiet",
    )
    assert code == 0 and err == ""
    png = tmp_path / "gaps.png"
    code, stdout, err = run(capsys, "zoo", "info", str(out), "--plot", str(png), "--json")
    assert code == 0, err
    info = json.loads(stdout)
    assert info["members"] == 3 and info["preset"] == "tiny-mlp"
    assert set(info["gap"]) == {"min", "q25", "median", "q75", "max"}
    assert png.read_bytes()[:4] == b"\x89PNG"


@pytest.mark.parametrize(
    "argv, message",
    [
        (
            ["zoo", "build", "--preset", "nope", "--members", "2", "--out", "{tmp}/z"],
            "unknown zoo preset",
        ),
        (
            ["zoo", "build", "--preset", "mnist1d-mlp", "--members", "0", "--out", "{tmp}/z"],
            "--members must be positive",
        ),
        (["zoo", "info", "{tmp}"], "not a zoo directory"),
        (
            [
                "zoo",
                "build",
                "--preset",
                "mnist1d-mlp",
                "--members",
                "2",
                "--out",
                "{tmp}/z",
                "--address",
                "ray://x:1",
            ],
            "--address needs --backend ray",
        ),
    ],
)
def test_cli_bad_input_is_one_line_exit_2(tmp_path, capsys, argv, message):
    code, _, err = run(capsys, *[a.replace("{tmp}", str(tmp_path)) for a in argv])
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("wsym: error: ") and message in lines[0]
    assert not (tmp_path / "z").exists()


def test_a_concurrent_build_into_the_same_directory_is_refused(tmp_path):
    """A second build while one holds the zoo's lock fails at once, naming the cause."""
    from filelock import FileLock

    out = tmp_path / "zoo"
    held = FileLock(tmp_path / ".zoo.build.lock")
    with held:  # another process building there
        with pytest.raises(WsymInputError, match="another `wsym zoo build` is writing to"):
            wsym.zoo.build("mnist1d-mlp", members=1, out=out, progress=False, overrides=TINY)
    assert not out.exists()  # nothing written
    zoo = wsym.zoo.build("mnist1d-mlp", members=1, out=out, progress=False, overrides=TINY)
    assert len(zoo.table) == 1  # the lock is released after a build, and reusable
    wsym.zoo.build("mnist1d-mlp", members=1, out=out, progress=False, overrides=TINY)
