"""A zoo build killed with SIGKILL at arbitrary moments resumes to exactly the uninterrupted zoo."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import wsym.io.resources
import wsym.zoo
from wsym.zoo import store

MEMBERS = 10


@pytest.fixture(scope="module")
def preset(tmp_path_factory):
    """Diagonal networks, one member per shard, ~0.1-0.3 s each: a build of a few seconds."""
    config = json.loads((wsym.io.resources.PRESETS / "diagonal.json").read_text())
    config["shard_size"] = 1
    config["hyperparameters"]["epochs"] = 100
    config["hyperparameters"]["batch_size"] = 10
    path = tmp_path_factory.mktemp("preset") / "kill-diagonal.json"
    path.write_text(json.dumps(config))
    return path


def command(preset, out):
    return [
        sys.executable,
        "-m",
        "wsym.cli.main",
        "zoo",
        "build",
        "--preset",
        str(preset),
        "--members",
        str(MEMBERS),
        "--out",
        str(out),
        "--seed",
        "5",
        "--quiet",
    ]


def env():
    root = str(Path(__file__).resolve().parents[1])
    return {**os.environ, "PYTHONPATH": root + os.pathsep + os.environ.get("PYTHONPATH", "")}


def recorded(out):
    table = out / store.TABLE
    return max(len(table.read_text().splitlines()) - 1, 0) if table.is_file() else 0


def kill_after(preset, out, members_done):
    """Start a build and SIGKILL it once ``members_done`` members are recorded."""
    proc = subprocess.Popen(command(preset, out), env=env(), stderr=subprocess.PIPE)
    deadline = time.monotonic() + 120
    while recorded(out) < members_done and proc.poll() is None:
        assert time.monotonic() < deadline, "build made no progress"
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    return proc.returncode


def files(path):
    return {p.relative_to(path): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()}


def test_killed_builds_resume_to_the_uninterrupted_zoo(tmp_path, preset):
    reference = tmp_path / "reference"
    subprocess.run(command(preset, reference), env=env(), check=True)
    out = tmp_path / "killed"
    kills = 0
    for members_done in (2, 4, 7):  # three kills, each after more members are done
        if kill_after(preset, out, members_done) == -signal.SIGKILL:
            kills += 1
        done = recorded(out)
        assert done < MEMBERS or kills < 3  # killed mid-way (unless the build outran us)
        rows = wsym.zoo.load(out).table
        assert [r["id"] for r in rows] == sorted({r["id"] for r in rows})  # none duplicated
    assert kills >= 2
    subprocess.run(command(preset, out), env=env(), check=True)
    assert files(out) == files(reference)  # manifest, table and every shard, byte for byte
    zoo = wsym.zoo.load(out)
    assert zoo.ids == list(range(MEMBERS))
