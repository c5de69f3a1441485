"""The Ray backend: a Ray-built zoo equals the local one; a dead worker's members are retried."""

import os
from pathlib import Path

import pytest
import torch

import wsym.zoo
from wsym.zoo import backends

ray = pytest.importorskip("ray")

TINY = {"hyperparameters": {"epochs": 30}, "shard_size": 2}


@pytest.fixture(scope="module")
def local_ray():
    here = Path(__file__).resolve().parent  # workers import this checkout's wsym and tests
    path = os.pathsep.join([str(here.parent), str(here)])
    ray.init(
        num_cpus=2,
        include_dashboard=False,
        log_to_driver=False,
        runtime_env={"env_vars": {"PYTHONPATH": path}},
    )
    yield
    ray.shutdown()


def files(path):
    return {p.relative_to(path): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()}


def test_ray_built_zoo_equals_local_member_for_member(tmp_path, local_ray):
    local = wsym.zoo.build(
        "diagonal", members=5, out=tmp_path / "local", progress=False, overrides=TINY
    )
    remote = wsym.zoo.build(
        "diagonal",
        members=5,
        out=tmp_path / "ray",
        progress=False,
        overrides=TINY,
        backend="ray",
        workers=2,
    )
    assert files(local.path) == files(remote.path)
    for i in local.ids:
        for k, v in local.state_dict(i).items():
            assert torch.equal(v, remote.state_dict(i)[k])


def flaky_unit(config, zoo_seed, ids):
    """Kill the worker process the first time each unit runs; train it on the retry."""
    marker = Path(config["marker_dir"]) / f"unit-{ids[0]}"
    if not marker.exists():
        marker.write_text("died once")
        os._exit(1)
    from wsym.zoo.backends import train_unit

    return train_unit(config, zoo_seed, ids)


def test_a_dead_worker_is_retried(tmp_path, local_ray):
    config = wsym.zoo.load_preset("diagonal", TINY)
    units = [[0, 1], [2, 3]]
    expected = {tuple(ids): backends.train_unit(config, 0, ids) for ids in units}
    config = {**config, "marker_dir": str(tmp_path)}
    runs = backends.run_units(units, config, 0, backend="ray", unit_fn=flaky_unit)
    got = {tuple(ids): results for ids, results in runs}
    assert sorted(got) == sorted(expected)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["unit-0", "unit-2"]  # each died once
    for ids, results in got.items():
        for a, b in zip(results, expected[ids], strict=True):
            assert a.id == b.id and repr(a.metrics) == repr(b.metrics)  # nan-aware
            assert all(torch.equal(a.state_dict[k], b.state_dict[k]) for k in a.state_dict)


def test_ray_measured_zoo_equals_local(tmp_path, local_ray):
    """Sharpness and tau over a zoo, one Ray task per member, equal the local run's."""
    from wsym.zoo.measure import measure_sharpness

    zoo = wsym.zoo.build(
        "diagonal", members=5, out=tmp_path / "zoo", progress=False, overrides=TINY
    )
    options = {"measures": ("adaptive", "euclidean"), "batch": 40, "steps": 3, "boot": 50}
    local = measure_sharpness(zoo.path, tmp_path / "local", progress=False, **options)
    remote = measure_sharpness(
        zoo.path, tmp_path / "ray", backend="ray", workers=2, progress=False, **options
    )
    assert [r["id"] for r in remote.rows] == zoo.ids
    for a, b in zip(local.rows, remote.rows, strict=True):
        assert a.keys() == b.keys()
        for k in a:
            assert a[k] == pytest.approx(b[k], rel=1e-12, abs=0)
    assert local.tau == remote.tau
    assert all(t is not None for t in local.tau.values())
